"""How a queue answers basic.consume and basic.get: the `QueueClient` it is given; and what
a queue held by another node hands to it: a client's `QueueMethod`.

The session's channel implements it; a queue of this node answers in the same turn, a queue
held by another node (broker/remote) once that node has answered, inside a step the client's
later methods wait for. See queue_type.py for the queue's side.

It must not know AMQP frames, the session or any queue type.
Single-threaded: every member runs on the event loop thread.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.message import QueuedMessage


class Closeable(Protocol):
    def close(self) -> None: ...


class QueueMethod(Protocol):
    """A client's queue.declare (passive), queue.purge or queue.delete, or the holding node's
    reply to one, as a queue type sees it: opaque. The front end that made the method reads
    the reply; a forwarder carries both as they are (AMQP frames, in broker/session and
    broker/remote)."""


class QueueClient(Protocol):
    """The side of a basic.consume or a basic.get that a queue answers (the session's
    channel): consume-ok, get-ok or get-empty, and, for an answer that takes more than this
    turn, a step the client's later methods wait for."""

    @property
    def closed(self) -> bool: ...

    # what the client holds on other nodes for the remote queues it used, closed with it
    remote: Closeable | None

    def consume_started(self, consumer: Consumer, nowait: bool) -> None:
        """The queue took the consumer: consume-ok (unless nowait); it is the client's."""
        ...

    def get_ok(self, entry: QueuedMessage, queue: Any, no_ack: bool, remaining: int) -> None:
        """basic.get found `entry`; `remaining` messages are left."""
        ...

    def get_empty(self) -> None: ...

    def wait_for(self, index: int, step: Coroutine[Any, Any, None]) -> None:
        """Run `step`, which answers the method `index` (class << 16 | method); the client's
        later methods wait until it ends, and an error it raises is that method's."""
        ...
