"""One declared publisher of a stream connection: its confirms and errors, and its counters.

Confirms of one turn go out as one PublishConfirm (and one PublishError) per publisher. It
reaches its connection through the `Connection` Protocol below, so that the session (which holds
its publishers) and this module do not import each other.
Must not know: the stream protocol's commands (publishing.py handles them), the server.
Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Protocol

from leveret.broker.model.message import Confirm
from leveret.broker.model.stream import StreamQueue
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f


class Connection(Protocol):
    """What a publisher needs of its stream connection (`session.StreamSession`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def send(self, data: bytes | memoryview) -> None: ...

    def flush(self) -> None: ...


class Publisher:
    """One declared publisher of a connection."""

    __slots__ = ("acks", "confirmed", "errored", "errors", "id", "published", "queue",
                 "reference", "session", "stream")

    def __init__(self, session: Connection, pid: int, reference: str | None,
                 queue: StreamQueue) -> None:
        self.session = session
        self.id = pid
        self.reference = reference
        self.queue = queue
        self.stream = queue.name
        self.acks: list[int] = []
        self.errors: list[int] = []
        # RabbitMQ's per-publisher counters, in publishing ids (a sub-entry batch is one):
        # added once per Publish frame and once per PublishConfirm / PublishError sent
        self.published = 0
        self.confirmed = 0
        self.errored = 0

    def settled(self, confirm: Confirm) -> None:
        first = not self.acks and not self.errors
        (self.errors if confirm.rejected else self.acks).append(confirm.seq)
        if first:
            self.session.loop.call_soon(self.flush)

    def flush(self) -> None:
        s = self.session
        if self.acks:
            ids, self.acks = self.acks, []
            self.confirmed += len(ids)
            s.send(f.frame(k.PUBLISH_CONFIRM, 1, f.u8(self.id) + f.i32(len(ids))
                           + struct.pack(f">{len(ids)}Q", *ids)))
        if self.errors:
            ids, self.errors = self.errors, []
            self.errored += len(ids)
            s.send(publish_error(self.id, ids, k.INTERNAL_ERROR))
        s.flush()


def publish_error(pid: int, ids: list[int], code: int) -> bytes:
    return f.frame(k.PUBLISH_ERROR, 1, f.u8(pid) + f.i32(len(ids))
                   + b"".join(f.u64(i) + f.u16(code) for i in ids))
