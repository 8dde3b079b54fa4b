"""The queue-type interface: what the session, the stream protocol, the HTTP API and
definitions may ask of a queue, whatever its type.

`QueueType` is implemented by the classic queue (queue.py, durable.py), the stream
(stream.py) and a queue held by another node of the cluster (broker/remote/remote_queue.py);
the next type (quorum queues) is one more implementation, built by its `QueueKind`
(queue_kind.py), which also holds the type's declare-time rules. Whoever holds a queue calls
these members and never asks which type it has: basic.consume and basic.get are served by the
queue itself (`consume`, `serve_get`), which answers through the `QueueClient` it is given, in
this turn or, for a queue on another node, once that node has answered.

A delivery's handle (`entry`) belongs to the queue type (a QueuedMessage for classic queues,
an offset for streams, the holder's tag for a remote queue): the session keeps it unread and
hands it back to settle it.

A client's queue.declare (passive), queue.purge and queue.delete are handed to the node that
holds the queue the same way (`forward`, `forward_delete`): a queue of this node answers that
it did not, and the caller serves the method here. The method and its reply stay opaque
(queue_client.py's `QueueMethod`): only the front end that made them and the forwarder that
carries them read them.

It must not know AMQP frames, the session or the cluster: a queue answers through
`QueueClient` (queue_client.py), which the session's channel implements. The model's queue
types do not import this module (mypy checks them against it at the end of this file, and
remote_queue.py checks itself), so that it closes no import cycle with the vhost.
Single-threaded: every member runs on the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.dedup import DedupCache
    from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
    from leveret.broker.model.queue import ClassicQueue, QueueOwner
    from leveret.broker.model.queue_client import QueueClient, QueueMethod
    from leveret.broker.model.stream import StreamQueue


class QueueType(Protocol):
    """One queue, as every front end sees it."""

    # identity and flags
    kind: str  # "queue", as an exchange's is "exchange": what a binding's destination is
    type: str  # the x-queue-type it was declared with
    name: str
    durable: bool
    auto_delete: bool
    exclusive_owner: object  # the owning session, or None
    arguments: dict[str, Any]
    consumers: list[Consumer]
    had_consumers: bool
    single_active: bool  # x-single-active-consumer on a classic queue: the first one gets all
    unacked: int  # deliveries not yet settled, where the type counts them (else 0)
    deleted: bool
    dedup: DedupCache | None  # a queue-level deduplication cache, when enabled

    # message statistics, bumped by the queue and by the channels (management/rates.py)
    stats_published: int
    stats_delivered: int
    stats_ack: int
    stats_get: int
    stats_get_no_ack: int
    stats_deliver_no_ack: int
    stats_redeliver: int
    stats_get_empty: int

    @property
    def vhost(self) -> QueueOwner:
        """The vhost that holds the queue, as the queue sees it."""
        ...

    @property
    def resource(self) -> str: ...

    @property
    def exclusive(self) -> bool: ...

    @property
    def holder(self) -> str | None:
        """The node that holds the queue when it is another one (None: this node)."""
        ...

    @property
    def redelivers(self) -> bool:
        """Whether a requeued delivery comes back (a stream only gives the credit back)."""
        ...

    @property
    def message_count(self) -> int: ...

    @property
    def message_bytes(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    @property
    def count_on_delete(self) -> int: ...

    # publishing

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        """Take one routed message; False if the queue dropped it (a duplicate)."""
        ...

    # consuming

    def validate_consumer(self, tag: str, no_ack: bool, prefetch: int, global_prefetch: int,
                          arguments: dict[str, Any]) -> None:
        """The type's rules for basic.consume's flags and arguments, before consume-ok."""
        ...

    def check_consume(self, exclusive: bool) -> None:
        """The type's rules for a new consumer among those already here, before consume-ok."""
        ...

    def consumer_queue(self, arguments: dict[str, Any]) -> QueueType:
        """The queue that a consumer with these (checked) arguments joins: this one, or
        where the type keeps what consumers share (a replica stream's leader, for a single
        active consumer group)."""
        ...

    def consume(self, consumer: Consumer, client: QueueClient, nowait: bool) -> None:
        """basic.consume, its rules checked: take the consumer and tell `client`."""
        ...

    def add_consumer(self, consumer: Consumer) -> None: ...

    def remove_consumer(self, consumer: Consumer) -> None: ...

    def dispatch(self) -> None:
        """Deliver to consumers that have credit (credit came back)."""
        ...

    # basic.get

    def serve_get(self, client: QueueClient, no_ack: bool) -> None:
        """basic.get: answer `client` with get-ok or get-empty."""
        ...

    def get(self, no_ack: bool) -> QueuedMessage | None:
        """Take the next message here and now, or None (the holding node's basic.get, and
        the HTTP API's get-messages)."""
        ...

    def touch(self) -> None:
        """A basic.get or a redeclare: the queue is in use (x-expires)."""
        ...

    def consumer_timeout(self, arguments: dict[str, Any] | None) -> int | None:
        """How long (ms) a consumer with these arguments (None: a basic.get) may hold a
        delivery unacked, or None."""
        ...

    def reachable(self) -> bool:
        """Whether the queue can be served now (a queue held by another node: a link to it
        is open)."""
        ...

    def resume(self, consumer: Consumer) -> None:
        """A consumer that lost its subscription with a leader subscribes here again."""
        ...

    def consumer_lost(self, consumer: Consumer) -> bool:
        """Keep a consumer whose serving node went (True), or let it be cancelled."""
        ...

    # settling

    def ack(self, entry: Any, consumer: Consumer | None = None) -> None: ...

    def ack_many(self, entries: list[Any], consumer: Consumer | None = None) -> None: ...

    def reject(self, entry: Any, consumer: Consumer | None = None) -> None: ...

    def requeue(self, entries: list[Any], delivery_failed: bool = True) -> None:
        """Put deliveries back: a client's basic.reject or basic.nack (`delivery_failed`), or
        a closed channel's or basic.recover's return (not a failed delivery)."""
        ...

    # a queue method served by the node that holds the queue

    def forward(self, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> bool:
        """Hand a client's queue.declare (passive) or queue.purge to the node that holds the
        queue, which answers in a step `client` waits for: its reply goes to `answer`, its
        error is the method's. False: the queue is held here and the caller serves the
        method."""
        ...

    def forward_delete(self, client: QueueClient, method: QueueMethod,
                       answer: Callable[[QueueMethod], None]) -> bool:
        """As `forward`, for a client's queue.delete, when the holding node can be reached.
        False: the caller deletes the queue here, `check_delete` first (a queue held here,
        or one whose holder is down, deleted from the metadata alone)."""
        ...

    # purge and delete

    def purge(self) -> int: ...

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """Raise if queue.delete's conditions forbid deleting it here now."""
        ...

    def on_delete(self) -> None: ...

    # lifecycle

    def policy_changed(self) -> None: ...

    def close(self) -> None: ...


if TYPE_CHECKING:

    def _conforms(classic: ClassicQueue, stream: StreamQueue) -> list[QueueType]:
        """mypy checks here that the classic queue and the stream implement the interface."""
        return [classic, stream]
