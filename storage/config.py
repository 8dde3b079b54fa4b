"""LogConfig: the settings of one log, checked when it is built.

Role: hold and validate segment size limits, the bloom filter size, the fsync policy, retention
limits and the clock. Sizes are in bytes and times in ms; every name says its unit.

Must not know: files or the write path; it only describes them.
Threading: immutable (frozen dataclass); safe to share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from leveret.storage import bloom
from leveret.storage.clock import Clock, system_clock_ms
from leveret.storage.openlogs import OpenLogs

FsyncPolicy = Literal["never", "always"] | int

DEFAULT_MAX_SEGMENT_SIZE_BYTES = 500_000_000
DEFAULT_MAX_SEGMENT_CHUNKS = 256_000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LogConfig:
    """How a log writes, rolls, syncs and retains. See docs/STORAGE-CONTRACT.md."""

    max_segment_size_bytes: int = DEFAULT_MAX_SEGMENT_SIZE_BYTES
    max_segment_chunks: int = DEFAULT_MAX_SEGMENT_CHUNKS
    filter_size_bytes: int = bloom.MIN_SIZE_BYTES
    fsync: FsyncPolicy = "never"  # "never" | "always" | every N ms (an int > 0)
    # under "always": fsync each chunk as it is written (True), or leave the written chunks
    # uncommitted until the owner has them fsynced on any thread (Log.sync_ticket, Log.synced)
    fsync_on_write: bool = True
    max_length_bytes: int | None = None
    max_age_ms: int | None = None
    clock: Clock = system_clock_ms
    # an exclusive flock on the log's folder, held open (one descriptor per log); False: the
    # owner holds a lock over every folder (the broker's on its queues folder), and the log
    # only refuses a second Log of its folder in this process
    folder_lock: bool = True
    # the process's cap on logs holding their active files open (storage/openlogs.py), shared
    # by every log given it; None: this log keeps its two descriptors open until it is closed
    open_logs: OpenLogs | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_segment_size_bytes) or self.max_segment_size_bytes < 1:
            raise ValueError("max_segment_size_bytes must be a positive int")
        if not _is_int(self.max_segment_chunks) or self.max_segment_chunks < 1:
            raise ValueError("max_segment_chunks must be a positive int")
        if not _is_int(self.filter_size_bytes) or not (
            bloom.MIN_SIZE_BYTES <= self.filter_size_bytes <= bloom.MAX_SIZE_BYTES
        ):
            low, high = bloom.MIN_SIZE_BYTES, bloom.MAX_SIZE_BYTES
            raise ValueError(f"filter_size_bytes must be an int in {low}..{high}")
        interval = self.fsync_interval_ms
        if self.fsync not in ("never", "always") and not (interval is not None and interval > 0):
            raise ValueError('fsync must be "never", "always" or an interval in ms (an int > 0)')
        check_retention(self.max_length_bytes, self.max_age_ms)
        if self.open_logs is not None and not isinstance(self.open_logs, OpenLogs):
            raise ValueError("open_logs must be None or an OpenLogs")
        if not callable(self.clock):
            raise ValueError("clock must be a callable returning ms since the epoch")

    @property
    def fsync_interval_ms(self) -> int | None:
        return (
            self.fsync if isinstance(self.fsync, int) and not isinstance(self.fsync, bool) else None
        )


def check_retention(max_length_bytes: int | None, max_age_ms: int | None) -> None:
    if max_length_bytes is not None and (not _is_int(max_length_bytes) or max_length_bytes < 0):
        raise ValueError("max_length_bytes must be None or an int >= 0")
    if max_age_ms is not None and (not _is_int(max_age_ms) or max_age_ms < 0):
        raise ValueError("max_age_ms must be None or an int >= 0")
