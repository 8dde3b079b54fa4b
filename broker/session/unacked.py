"""One delivery a channel holds until the client settles it (`Channel.unacked`).

Its own module because two writers fill a channel's `unacked`: the channel itself, and the
forwarder (broker/remote/forwarding.py), which writes a remote consumer's deliveries straight
to the client's channel. It must not know either of them.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.model.consumer import Consumer


class Unacked:
    """One delivery awaiting its ack: the queue's handle for it (its type's own: a queued
    message, a stream offset, a remote holder's tag), the queue, and the consumer (None for
    basic.get)."""

    __slots__ = ("consumer", "entry", "queue")

    def __init__(
        self, entry: object, queue: Any, consumer: Consumer | None
    ) -> None:
        self.entry = entry
        self.queue = queue
        self.consumer = consumer
