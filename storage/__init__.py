"""The log storage engine: an embedded, append-only, segmented log.

It is synchronous and knows nothing of AMQP, pamqp, asyncio, structlog or the broker: it
imports the standard library, crc32c and mmh3, and its own modules only (an import-linter
contract in pyproject.toml). Streams and durable classic queues keep their data in it, and it
can be used on its own. See docs/FORMAT.md for the bytes and docs/STORAGE-CONTRACT.md for the
API the broker codes against; this module re-exports that API.

Modules:

- `log`: the Log, the single writer of a log directory;
- `reader`: independent cursors that read chunks from the files, never past `committed`;
- `chunk`: chunk encoding and decoding, with both CRCs; `bloom`: per-chunk bloom filters;
- `segment`, `index`, `layout`: segment files, index files, file names and headers;
- `locate`: offset specs resolved to a position; `retention`: which segments to delete;
- `recovery`: what is whole when a log is opened; `fence`: a replicated log's fence;
- `shipping`: whole chunks as replication reads them; `tracking`: publisher ids and consumer
  offsets kept inside the log;
- `cache`: recently read chunks shared by one log's readers; `config`: LogConfig; `clock`:
  where "now" comes from; `errors`: typed errors; `inspect`: dumps and checks for the CLI.

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
