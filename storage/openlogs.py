"""OpenLogs: a cap on how many logs of a process hold their active files open (an LRU).

Role: a Log keeps two descriptors open (its active segment and its index, for appends). A
process with thousands of logs (a broker node with thousands of queues) would hold two per log;
logs given one shared OpenLogs (LogConfig.open_logs) hold theirs only while they are among the
`capacity` logs used last. A log opened or used is moved to the recent end; when more than
`capacity` logs have their files open, the least recently used ones are asked to release them
(Log.release_files) and reopen them on their next write or sync. A log that has written
something not yet made durable, and not covered by a sync ticket already taken (whose round
holds what it needs), refuses at first, and the next is asked; when every open log has
refused (more logs waiting for an fsync than the cap), the least recently used of them is
asked again with `sync`: it fsyncs what it wrote on the caller's thread, then closes its files. So a write is
never left to a descriptor opened after it for its fsync and its writeback error, and the cap
holds whatever the load (at the cost of those fsyncs, counted in `synced`).

Must not know: files, chunks or fsync policies; it only orders logs and asks them.
Threading: one thread, the logs' own; nothing here is thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

DEFAULT_CAPACITY = 512


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
        self._open: OrderedDict[Releasable, None] = OrderedDict()
        self.released = 0  # files released so far (for tests and figures)
        self.refused = 0  # logs that could not release theirs when asked
        self.synced = 0  # logs fsynced to release their files (more waiting than the cap)

    def __len__(self) -> int:
        return len(self._open)

    @property
    def over(self) -> bool:
        return len(self._open) > self.capacity

    def opened(self, log: Releasable) -> None:
        """`log` has (re)opened its files: it is the most recent; others may release theirs."""
        self._open[log] = None
        self._open.move_to_end(log)
        if len(self._open) > self.capacity:
            self.trim(keep=log)

    def used(self, log: Releasable) -> None:
        """`log` was used with its files open: it is the most recent."""
        if log in self._open:
            self._open.move_to_end(log)

    def closed(self, log: Releasable) -> None:
        """`log` has no file open any more (it released them or was closed)."""
        self._open.pop(log, None)

    def trim(self, keep: Releasable | None = None) -> None:
        """Ask the least recently used logs to release their files until the cap is met. One
        that refuses (writes not yet durable) moves to the recent end, and the next is asked;
        once all have refused, the oldest is asked to fsync and release (one that cannot, a
        failed fsync, keeps its files)."""
        refusals = 0
        tries = 2 * len(self._open)  # every log asked at most twice
        while len(self._open) > self.capacity and tries > 0:
            tries -= 1
            oldest = next(iter(self._open))
            if oldest is not keep:
                force = refusals >= len(self._open) - 1
                if oldest.release_files(sync=force):
                    self._open.pop(oldest, None)
                    self.released += 1
                    self.synced += force
                    continue
                self.refused += 1
            self._open.move_to_end(oldest)
            refusals += 1
