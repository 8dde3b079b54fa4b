"""The node's write-ahead log: many logs' new bytes made durable by ONE fdatasync of one file
(docs/QUORUM-QUEUES.md, "Many queues").

Role: `WriteAheadLog.append` writes one WRITE record per log of a group commit (its active
segment file, a position in it, the bytes written there since they were last durable) and
fdatasyncs the WAL file once: those bytes are then durable though their own segment files were
not fsynced. `forget` writes a FORGET record for a log whose bytes are about to be removed or
rewritten (a truncated tail, a reset, a deleted log whose folder may be made again), after the
log made its own files durable: replay ignores every record of that log before its last FORGET,
so removed bytes never come back. Past `max_bytes` a new file is started and the old one is
checkpointed on a thread of its own (every segment it has records of fdatasynced in place, then
it is unlinked); appends never wait for that. `replay`, at a node's start before any log opens,
writes every record's bytes back at its position in its segment file (skipping a file that no
longer exists: deleted since), fsyncs them, and deletes the WAL files; a torn last record (its
CRC fails) and everything after it is ignored: its round never completed, so nothing it covered
was acknowledged.

Record: crc32 (of all that follows it), length of what follows the first 8 bytes, kind (1 WRITE,
2 FORGET), position, path length, then the path (a segment file for WRITE, a log's folder for
FORGET; relative to `base`, the data directory, when under it) and the bytes.

Must not know: AMQP, queues, the cluster, the chunk format: it sees files, positions and bytes.
Threading: append, forget and the start of a checkpoint hold one lock (any thread); the
checkpoint itself runs on a thread of its own. `holding` (which WAL may hold records of a log's
folder) is a process-wide registry: a Log asks it before it removes or rewrites bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("leveret.storage.wal")

FILE_MAGIC = b"LVWAL001"
PREFIX = "wal."
_HEAD = struct.Struct("<IIBQH")  # crc32, length after the first 8 bytes, kind, position, path len
WRITE, FORGET = 1, 2
MAX_BYTES = 64 * 1024 * 1024  # a new file, and a checkpoint of the old one, past this size

_holding: dict[str, WriteAheadLog] = {}  # a log folder (realpath) -> the WAL with its records
_holding_lock = threading.Lock()


def holding(folder: str) -> WriteAheadLog | None:
    """The WAL that may hold records of the log in `folder` (its realpath), if any: that log
    must `forget` before it removes or rewrites bytes."""
    return _holding.get(folder)


@dataclass
class Write:
    """One log's bytes for a WRITE record, and the FORGET count of its folder when they were
    taken: a record whose folder was forgotten since is not written (see `append`)."""

    folder: str  # the log's folder (realpath)
    segment: str  # its segment file (absolute)
    position: int
    data: bytes
    forgets: int


def _file_seq(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def wal_files(directory: Path) -> list[Path]:
    """The WAL files in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir()
             if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=_file_seq)


def _encode(kind: int, position: int, path: str, data: bytes | memoryview = b"") -> bytes:
    name = path.encode()
    rest = struct.pack("<BQH", kind, position, len(name)) + name + bytes(data)
    length = struct.pack("<I", len(rest))
    return struct.pack("<I", zlib.crc32(rest, zlib.crc32(length))) + length + rest


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """The node's WAL files in `directory`; paths in records are relative to `base`."""

    def __init__(self, directory: Path, base: Path | None = None,
                 max_bytes: int = MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.base = os.path.realpath(base if base is not None else self.directory.parent)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        existing = wal_files(self.directory)  # (left for the next replay: never ours to drop)
        self._seq = _file_seq(existing[-1]) + 1 if existing else 1
        self._fd = -1
        self._size = 0
        self._segments: set[str] = set()  # segment files the current file has records of
        self._last_seq: dict[str, int] = {}  # a folder -> the newest file with its records
        self._forgets: dict[str, int] = {}
        self._checkpoint: threading.Thread | None = None
        self.checkpoints = self.appends = 0  # (for tests and figures)
        self._open_file()

    # -- writing -------------------------------------------------------------------------------

    def _open_file(self) -> None:
        path = self.directory / f"{PREFIX}{self._seq}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            os.write(fd, FILE_MAGIC)
            os.fdatasync(fd)
            _sync_dir(self.directory)  # the file exists durably before anything counts on it
        except OSError:
            os.close(fd)
            raise
        self._fd, self._size = fd, len(FILE_MAGIC)
        self._segments = set()
        self._names: dict[str, str] = {}  # a segment's path -> as records name it (a cache)

    def _relative(self, path: str) -> str:
        relative = self._names.get(path)
        if relative is None:
            relative = os.path.relpath(path, self.base)
            if relative.startswith(".."):
                relative = path
            self._names[path] = relative
        return relative

    def forgets(self, folder: str) -> int:
        """How many FORGET records `folder` has had: a round takes it with a log's bytes."""
        return self._forgets.get(folder, 0)

    def reserve(self, folders: Iterable[str]) -> None:
        """Before their bytes are taken for a record (on the thread that owns the logs, the
        one that truncates them): mark these logs' folders as held, so that a truncation from
        now on writes a FORGET first and the record, if not yet written, is left out. (Marked
        only when the record is written, a truncation in between would find no mark, write no
        FORGET, and the record written after it would bring the removed bytes back.)"""
        marked = list(folders)
        with self._lock:
            for folder in marked:
                self._last_seq[folder] = self._seq
            with _holding_lock:
                for folder in marked:
                    _holding[folder] = self

    def append(self, writes: Sequence[Write]) -> int:
        """WRITE records for `writes`, then one fdatasync: their bytes are durable when it
        returns. A write whose folder had a FORGET since its bytes were taken is left out (the
        log made those bytes durable in place before the FORGET, and its bytes may since have
        been removed: they must not come back). Returns how many were written; OSError if the
        WAL could not write or fdatasync (nothing of this call is then durable)."""
        with self._lock:
            kept = [w for w in writes if self._forgets.get(w.folder, 0) == w.forgets]
            if not kept:
                return 0
            data = b"".join(_encode(WRITE, w.position, self._relative(w.segment), w.data)
                            for w in kept)
            os.write(self._fd, data)
            os.fdatasync(self._fd)
            self._size += len(data)
            self.appends += 1
            for w in kept:  # (each folder reserved, on the logs' thread: `reserve`)
                self._segments.add(w.segment)
                self._last_seq[w.folder] = self._seq
            if self._size >= self.max_bytes and self._checkpoint is None:
                self._rotate()
            return len(kept)

    def forget(self, folder: str) -> None:
        """A FORGET record for the log in `folder` (realpath), fdatasynced: replay ignores its
        records before this one. The log's own files must be durable first (what it keeps of
        the bytes those records covered). OSError if it could not be made durable."""
        with self._lock:
            record = _encode(FORGET, 0, self._relative(folder))
            os.write(self._fd, record)
            os.fdatasync(self._fd)
            self._size += len(record)
            self._forgets[folder] = self._forgets.get(folder, 0) + 1
            if self._last_seq.pop(folder, None) is not None:
                with _holding_lock:
                    if _holding.get(folder) is self:
                        del _holding[folder]

    # -- checkpoint ----------------------------------------------------------------------------

    def _rotate(self) -> None:
        """(Under the lock.) A new file for the next records; the old one is checkpointed on a
        thread of its own."""
        old_fd, old_seq, segments = self._fd, self._seq, self._segments
        self._seq += 1
        self._open_file()
        os.close(old_fd)
        self._checkpoint = threading.Thread(
            target=self._run_checkpoint, args=(old_seq, segments), name="wal-checkpoint",
            daemon=True)
        self._checkpoint.start()

    def _run_checkpoint(self, seq: int, segments: Iterable[str]) -> None:
        """Make durable in place every segment file `seq` has records of, then unlink it (and
        any older one). On an error the file stays: replay will apply it."""
        try:
            for segment in segments:
                try:
                    fd = os.open(segment, os.O_RDONLY)
                except FileNotFoundError:
                    continue  # deleted since: nothing of it to keep
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            for path in wal_files(self.directory):
                if _file_seq(path) <= seq:
                    os.unlink(path)
            _sync_dir(self.directory)
        except OSError as exc:
            log.error("WAL checkpoint of %s failed (replay will apply it): %s", seq, exc)
            with self._lock:
                self._checkpoint = None
            return
        with self._lock:
            self.checkpoints += 1
            gone = [f for f, last in self._last_seq.items() if last <= seq]
            for folder in gone:
                del self._last_seq[folder]
            with _holding_lock:
                for folder in gone:
                    if _holding.get(folder) is self:
                        del _holding[folder]
            self._checkpoint = None

    def wait_checkpoint(self, timeout: float | None = None) -> None:
        """Wait for a checkpoint in progress (tests, close)."""
        thread = self._checkpoint
        if thread is not None:
            thread.join(timeout)

    def close(self) -> None:
        """At shutdown (once the logs are closed: each synced its files in place)."""
        self.wait_checkpoint()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            with _holding_lock:
                for folder in [f for f, w in _holding.items() if w is self]:
                    del _holding[folder]


# -- replay ------------------------------------------------------------------------------------


@dataclass
class Replayed:
    """What a replay did (logged at start, checked by tests)."""

    files: int = 0
    records: int = 0  # WRITE records read
    applied: int = 0  # written back into a segment file
    missing: int = 0  # of a segment file that no longer exists
    forgotten: int = 0  # before a FORGET of their log
    torn: list[str] = field(default_factory=list)  # files whose tail was torn or corrupt


def _records(data: bytes) -> Iterable[tuple[int, int, str, bytes]]:
    """(kind, position, path, bytes) of each whole record, up to the first torn one."""
    at = len(FILE_MAGIC)
    while at + 8 <= len(data):
        crc, length = struct.unpack_from("<II", data, at)
        end = at + 8 + length
        if length < _HEAD.size - 8 or end > len(data):
            raise ValueError(f"torn record at {at}")
        if zlib.crc32(data[at + 8:end], zlib.crc32(data[at + 4:at + 8])) != crc:
            raise ValueError(f"record at {at} fails its CRC")
        kind, position, path_len = struct.unpack_from("<BQH", data, at + 8)
        start = at + _HEAD.size
        path = data[start:start + path_len].decode()
        yield kind, position, path, data[start + path_len:end]
        at = end
    if at != len(data):
        raise ValueError(f"torn record at {at}")


def replay(directory: Path, base: Path | None = None) -> Replayed:
    """At start, before any log of the node opens: write the WAL's records back into their
    segment files, fsync those, then delete the WAL files. OSError if that fails (the files are
    then kept, for the next start)."""
    directory = Path(directory)
    root = os.path.realpath(base if base is not None else directory.parent)
    done = Replayed()
    files = wal_files(directory)
    pending: list[tuple[str, int, bytes]] = []  # (segment, position, bytes), in order
    for path in files:
        done.files += 1
        data = path.read_bytes()
        if data[:len(FILE_MAGIC)] != FILE_MAGIC:
            done.torn.append(path.name)
            continue
        try:
            for kind, position, name, payload in _records(data):
                where = os.path.join(root, name)
                if kind == WRITE:
                    done.records += 1
                    pending.append((where, position, payload))
                elif kind == FORGET:
                    kept = [p for p in pending if os.path.dirname(p[0]) != where]
                    done.forgotten += len(pending) - len(kept)
                    pending = kept
        except ValueError as exc:
            log.warning("WAL file %s ends in a torn record: %s", path, exc)
            done.torn.append(path.name)
    touched: dict[str, int] = {}
    try:
        for segment, position, payload in pending:
            fd = touched.get(segment)
            if fd is None:
                try:
                    fd = touched[segment] = os.open(segment, os.O_WRONLY)
                except FileNotFoundError:
                    done.missing += 1
                    continue
            os.pwrite(fd, payload, position)
            done.applied += 1
        for fd in touched.values():
            os.fdatasync(fd)
    finally:
        for fd in touched.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    for path in files:
        os.unlink(path)
    if files:
        _sync_dir(directory)
    return done
