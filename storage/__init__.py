"""The log storage engine: an embedded, append-only, segmented log.

It is synchronous and knows nothing of AMQP, pamqp or asyncio. Streams and durable classic
queues keep their data in it, and it can be used on its own. See docs/FORMAT.md for the bytes
and docs/STORAGE-CONTRACT.md for the API the broker codes against.

Threading: a Log and its readers belong to one thread; readers may also run in other processes.
"""

from leveret.storage import inspect
from leveret.storage.chunk import FIRST_APPLICATION_TYPE, ChunkType
from leveret.storage.clock import FakeClock, system_clock_ms
from leveret.storage.config import LogConfig
from leveret.storage.errors import (
    CorruptLogError,
    DiskFullError,
    LogClosedError,
    LogIOError,
    LogLockedError,
    StorageError,
)
from leveret.storage.locate import OffsetSpec
from leveret.storage.log import Log
from leveret.storage.reader import ChunkView, Reader, ReaderFilter
from leveret.storage.tracking import Tracking

__all__ = [
    "FIRST_APPLICATION_TYPE",
    "ChunkType",
    "ChunkView",
    "CorruptLogError",
    "DiskFullError",
    "FakeClock",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogIOError",
    "LogLockedError",
    "OffsetSpec",
    "Reader",
    "ReaderFilter",
    "StorageError",
    "Tracking",
    "inspect",
    "system_clock_ms",
]
