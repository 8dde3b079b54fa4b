"""Typed errors of the storage engine, each carrying the data a caller needs.

Role: the exception hierarchy that every other module raises. CorruptLogError names the file,
the position and the reason; LogIOError wraps an OSError with the file it concerns. The broker
maps these to reply codes in its own single error map.

Must not know: AMQP, reply codes, or anything about the modules that raise them.
Threading: plain immutable-by-convention exception objects; no shared state.
"""

from __future__ import annotations

import errno as errno_codes
from pathlib import Path

_FULL_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG})


class StorageError(Exception):
    """Base class of every error the storage engine raises on purpose."""


class CorruptLogError(StorageError):
    """Bytes on disk that do not follow docs/FORMAT.md, found at a known file and position."""

    def __init__(self, path: Path | str, position: int, reason: str):
        super().__init__(f"{path} at {position}: {reason}")
        self.path = Path(path)
        self.position = position
        self.reason = reason


class LogIOError(StorageError):
    """A file of the log cannot be created, written or synced (the OSError is the cause)."""

    def __init__(
        self,
        path: Path | str,
        reason: str,
        *,
        errno: int | None = None,
        position: int | None = None,
    ):
        where = f" at {position}" if position is not None else ""
        super().__init__(f"{path}{where}: {reason}")
        self.path = Path(path)
        self.reason = reason
        self.errno = errno
        self.position = position


class DiskFullError(LogIOError):
    """A write failed for lack of space (ENOSPC, EDQUOT, or a file size limit, EFBIG)."""


class LogLockedError(StorageError):
    """Another open Log (in this or another process) already writes to this directory."""

    def __init__(self, path: Path | str):
        super().__init__(f"{path}: the log is already open for writing")
        self.path = Path(path)


class LogClosedError(StorageError):
    """The Log or Reader was used after close(), or after a write left it unusable."""


class BadChunk(ValueError):
    """Internal: a chunk's bytes are invalid. Callers add the file and position and re-raise
    it as CorruptLogError; it never escapes the package."""

    def __init__(self, reason: str, position: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.position = position


def io_error(path: Path | str, exc: OSError, position: int | None = None) -> LogIOError:
    """The typed error for an OSError on `path`: DiskFullError when space ran out."""
    reason = exc.strerror or str(exc)
    cls = DiskFullError if exc.errno in _FULL_ERRNOS else LogIOError
    return cls(path, reason, errno=exc.errno, position=position)
