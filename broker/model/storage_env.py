"""What the runtime gives every queue whose messages live in the storage engine.

Streams and durable classic queues each get one `StorageEnv` from the broker: the folder their
logs go under, how a message becomes a record and back (the broker's encoding: the encoded
content header and the body), the fsync policy of their writes, and the syncer that fsyncs
queue logs off the event loop (`syncer.py`). The queue types know
nothing of the encoding, and the folder of a queue is named by its storage id, never by its
name (names are user input).

A stream's messages lie in chunks of two types: USER (records of the broker's encoding) and
STREAM_ENTRIES (messages published over the stream protocol, each record an osiris simple
entry: u32 size, then the AMQP 1.0 message; docs/FORMAT.md 3.2). `entries_as_records` turns
the latter into records of the broker's encoding, for every reader but the stream protocol's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from leveret.broker.model.message import InboundMessage
from leveret.broker.model.syncer import INLINE, Syncer
from leveret.storage.chunk import ChunkType
from leveret.storage.config import FsyncPolicy
from leveret.storage.openlogs import OpenLogs

USER = int(ChunkType.USER)
STREAM_ENTRIES = 32  # an application chunk type (16 and 17 are durable queues')
STREAM_CHUNK_TYPES = (USER, STREAM_ENTRIES)  # the chunk types that hold a stream's messages


def _no_entries(records: Sequence[bytes], stream: str) -> list[bytes]:
    raise ValueError("this environment reads no STREAM_ENTRIES chunks")


@dataclass(frozen=True)
class StorageEnv:
    root: Path
    encode_record: Callable[[InboundMessage], bytes]
    decode_record: Callable[[bytes, int], InboundMessage]  # the record, where it starts
    fsync: str | int = "never"  # "never", "always" or every N ms (storage.LogConfig)
    # STREAM_ENTRIES records as records of the encoding (given the stream's name)
    entries_as_records: Callable[[Sequence[bytes], str], list[bytes]] = _no_entries
    # a stream's chunk bound (stream.ChunkBound): records from min to max, as osiris's writer
    # batches (gen_batch_server's 32 and 8,192), and bytes
    chunk_min_records: int = 32
    chunk_max_records: int = 8192
    chunk_max_bytes: int = 8 * 1024 * 1024
    # who fsyncs a durable or quorum queue's log under "always" (the broker's: a thread pool)
    syncer: Syncer = INLINE
    # a flock per queue folder (a descriptor each), or none: the owner's lock covers them all
    folder_locks: bool = True
    # the node's cap on logs holding their active files open (Config.open_logs), shared by
    # every log of the node's queues and streams; None: each log keeps its files open
    open_logs: OpenLogs | None = None

    @property
    def fsync_policy(self) -> FsyncPolicy:
        """The policy as storage.LogConfig and the committer take it: "never", "always" or
        every N ms (an int; the config's text "200" is 200)."""
        policy = self.fsync
        if policy == "never":
            return "never"
        if policy == "always":
            return "always"
        if isinstance(policy, str) and policy.isdigit():
            return int(policy)
        if isinstance(policy, int) and not isinstance(policy, bool):
            return policy
        raise ValueError(f"fsync must be never, always or a number of ms, not {policy!r}")

    def directory(self, storage_id: str) -> Path:
        return self.root / storage_id
