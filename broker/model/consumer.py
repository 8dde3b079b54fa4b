"""Consumers, and the interface through which a queue hands a message to one.

A queue knows its consumers only through the ConsumerSink they carry (the session's channel):
it asks whether the consumer may take a message now (prefetch, global QoS, a writable socket)
and hands the message over. The sink numbers the delivery and writes the frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from leveret.broker.model.message import QueuedMessage


class ConsumerSink(Protocol):
    def can_send(self, consumer: Consumer) -> bool: ...
    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None: ...
    def server_cancel(self, consumer: Consumer) -> None: ...
    def credit(self, consumer: Consumer) -> int: ...
    def send_records(
        self, consumer: Consumer, offsets: Sequence[int], records: Sequence[bytes]
    ) -> None: ...


class Consumer:
    """One basic.consume on one queue."""

    __slots__ = (
        "arguments",
        "exclusive",
        "no_ack",
        "prefetch",
        "priority",
        "queue",
        "sink",
        "state",
        "tag",
        "tag_bytes",
        "unacked",
    )

    def __init__(
        self,
        tag: str,
        queue: Any,
        sink: ConsumerSink,
        *,
        no_ack: bool = False,
        exclusive: bool = False,
        prefetch: int = 0,
        priority: int = 0,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.tag = tag
        self.tag_bytes = bytes((len(tag.encode()),)) + tag.encode()  # shortstr, for deliver
        self.queue = queue
        self.sink = sink
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.priority = priority
        self.arguments = arguments or {}
        self.unacked = 0
        self.state: Any = None  # queue-type specific state (a stream reader, say)

    def has_credit(self) -> bool:
        return self.no_ack or not self.prefetch or self.unacked < self.prefetch

    def __repr__(self) -> str:
        return f"<Consumer {self.tag!r} on {getattr(self.queue, 'name', '?')!r}>"
