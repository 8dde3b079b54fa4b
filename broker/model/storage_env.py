"""What the runtime gives every queue whose messages live in the storage engine.

Streams and durable classic queues each get one `StorageEnv` from the broker: the folder their
logs go under, how a message becomes a record and back (the broker's encoding: the encoded
content header and the body), and the fsync policy of their writes. The queue types know
nothing of the encoding, and the folder of a queue is named by its storage id, never by its
name (names are user input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from leveret.broker.model.message import InboundMessage
from leveret.storage.config import FsyncPolicy


@dataclass(frozen=True)
class StorageEnv:
    root: Path
    encode_record: Callable[[InboundMessage], bytes]
    decode_record: Callable[[bytes], InboundMessage]
    fsync: str | int = "never"  # "never", "always" or every N ms (storage.LogConfig)

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
