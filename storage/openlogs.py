"""OpenLogs: a cap on how many logs of a process hold their active files open (an LRU).

Role: a Log keeps two descriptors open (its active segment and its index, for appends). A
process with thousands of logs (a broker node with thousands of queues) would hold two per log;
logs given one shared OpenLogs (LogConfig.open_logs) hold theirs only while they are among the
logs used last. A log opened or used is moved to the recent end, and reopens its files on its
next write or sync once it has released them (Log.release_files).

Two bounds. Past the `target` (three quarters of the cap), the least recently used logs are
asked to release their files, a few per open (SCAN): a log that has written something not yet
made durable, and not covered by a sync ticket already taken (whose round holds what it
needs), refuses and moves to the recent end; it releases its files itself once a ticket
covers them or they are synced, if the target is still passed then (Log._over_cap). The
`capacity` is the hard bound: past it, every open log is asked, and if all refuse (more logs
waiting for an fsync than the cap), the least recently used is asked again with `sync`: it
fsyncs what it wrote on the caller's thread, then closes its files. So a write is never left to
a descriptor opened after it for its fsync and its writeback error, and the cap holds whatever
the load, at the cost of those fsyncs (counted in `synced`), which the room between the target
and the cap keeps for bursts.

Must not know: files, chunks or fsync policies; it only orders logs and asks them.
Threading: one thread, the logs' own; nothing here is thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

DEFAULT_CAPACITY = 2048
SCAN = 16  # logs asked per open past the target (refusals cost a call each)


class Releasable(Protocol):
    def release_files(self, sync: bool = False) -> bool:
        """Close the open files if that is safe now (with `sync`: after fsyncing what is not
        durable yet); True if none is left open."""
        ...


class OpenLogs:
    """The logs whose files are open, least recently used first, and their cap."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError("the cap on open logs must be an int >= 1")
        self.capacity = capacity
        self.target = max(1, capacity * 3 // 4)
        self._open: OrderedDict[Releasable, None] = OrderedDict()
        self.released = 0  # files released so far (for tests and figures)
        self.refused = 0  # logs that could not release theirs when asked
        self.synced = 0  # logs fsynced to release their files (more waiting than the cap)

    def __len__(self) -> int:
        return len(self._open)

    @property
    def over(self) -> bool:
        """Past the target: a log that may release its files should."""
        return len(self._open) > self.target

    def opened(self, log: Releasable) -> None:
        """`log` has (re)opened its files: it is the most recent; others may release theirs."""
        self._open[log] = None
        self._open.move_to_end(log)
        if len(self._open) > self.target:
            self.trim(keep=log)

    def used(self, log: Releasable) -> None:
        """`log` was used with its files open: it is the most recent."""
        if log in self._open:
            self._open.move_to_end(log)

    def closed(self, log: Releasable) -> None:
        """`log` has no file open any more (it released them or was closed)."""
        self._open.pop(log, None)

    def trim(self, keep: Releasable | None = None) -> None:
        """Ask the least recently used logs to release their files: up to SCAN of them while
        only the target is passed; past the cap, every one, then the oldest with `sync`."""
        refusals = 0
        while len(self._open) > self.target:
            hard = len(self._open) > self.capacity
            if not hard and refusals >= SCAN:
                return
            if hard and refusals >= 2 * len(self._open):
                return  # (every fsync to release failed: the logs are broken)
            oldest = next(iter(self._open))
            if oldest is not keep:
                force = hard and refusals >= len(self._open) - 1
                if oldest.release_files(sync=force):
                    self._open.pop(oldest, None)
                    self.released += 1
                    self.synced += force
                    continue
                self.refused += 1
            self._open.move_to_end(oldest)
            refusals += 1
