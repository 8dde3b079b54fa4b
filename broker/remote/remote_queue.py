"""A queue held by another node of the cluster, as this node's model sees it.

Every node has every queue of the cluster in its vhosts, so that bindings and routing work the
same everywhere; a queue whose record names another node is one of these. It has the queue's
identity, type, flags and arguments, and implements the queue-type interface
(broker/model/queue_type.py) by handing what must happen to the queue (a routed message, a
consumer, a basic.get, a passive queue.declare, a queue.purge or a queue.delete) to its
`Forwarding`, which reaches the holding node: the session serves it as any other queue.

It must not know the link, the tunnel or AMQP: the forwarder (broker/remote/forwarding.py) is
given to it, and implements `Forwarding`.
Single-threaded: every method runs on the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from leveret.broker.model.errors import NotFound, PreconditionFailed
from leveret.broker.model.queue import Queue, QueueOwner

if TYPE_CHECKING:
    from collections.abc import Callable

    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
    from leveret.broker.model.queue_client import QueueClient, QueueMethod
    from leveret.broker.model.queue_type import QueueType

ELSEWHERE = object()  # the exclusive owner of a queue exclusive to a connection on another node


class Forwarding(Protocol):
    """What a RemoteQueue asks of the forwarder, which reaches the holding node."""

    def publish(self, queue: RemoteQueue, message: InboundMessage,
                confirm: Confirm | None) -> bool: ...

    def consume(self, queue: RemoteQueue, consumer: Consumer, client: QueueClient,
                nowait: bool) -> None: ...

    def get(self, queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None: ...

    def resume(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """Subscribe `consumer` on the holder again, telling its client nothing."""
        ...

    def forward(self, queue: RemoteQueue, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> None:
        """Ask the holder `method` (queue.declare, queue.purge or queue.delete); its reply
        goes to `answer`, its error is the client's. Raises node_down if it cannot be asked."""
        ...

    def reachable(self, queue: RemoteQueue) -> bool:
        """Whether the node that holds `queue` can be asked now (a link to it is open)."""
        ...


class Settling(Protocol):
    """The forwarder's channel a remote consumer's deliveries came on: it settles them with
    the holding node, by the holder's delivery tag."""

    def settle(self, tag: int, ok: bool, requeue: bool = False, failed: bool = False) -> None:
        ...

    def ack(self, tag: int) -> None: ...

    def ack_many(self, tags: list[int]) -> None: ...


# what a RemoteQueue hands out: a QueuedMessage (basic.get) or, for a consumer's delivery, the
# pair (the holder's tag, the channel that settles it)
Entry: TypeAlias = "QueuedMessage | tuple[int, Settling]"


class QueuePublisher(Protocol):
    """The forwarder's channel that carries publishes to one remote queue."""

    @property
    def closed(self) -> bool: ...

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> None: ...


def node_down(queue: RemoteQueue) -> NotFound:
    """RabbitMQ's answer for a queue whose home node is down (rabbit_amqqueue:priv_absent,
    reason nodedown). A publish to it is routed and its confirm nacked, as RabbitMQ's
    classic queue type rejects what a queue that went down had not confirmed."""
    return NotFound(f"home node '{queue.node}' of durable {queue.resource} is down or "
                    "inaccessible")


class RemoteQueue(Queue):
    def __init__(self, vhost: QueueOwner, name: str, *, queue_type: str, node: str, durable: bool,
                 auto_delete: bool, arguments: dict[str, Any], exclusive_elsewhere: bool,
                 forwarder: Forwarding | None) -> None:
        super().__init__(vhost, name, durable=durable,
                         exclusive_owner=ELSEWHERE if exclusive_elsewhere else None,
                         auto_delete=auto_delete, arguments=arguments)
        self.type = queue_type
        self.node = node
        self.forwarder = forwarder
        self.redelivers = queue_type != "stream"
        # the forwarder's channel for publishes to this queue, once made
        self.publisher: QueuePublisher | None = None

    # What a channel asks of a queue, handed to the forwarder (broker/remote/forwarding.py).
    # A delivery's handle (`entry`) is a QueuedMessage whose `seq` is the holder's delivery tag
    # and whose `store_ref` is what settles it there; a consumer's `state` is its forwarding.

    @property
    def message_count(self) -> int:
        """Unknown here: queue.declare's counts come from the holding node."""
        return 0

    @property
    def holder(self) -> str | None:
        return self.node

    def reachable(self) -> bool:
        """Whether the holding node can be asked now (a link to it is open)."""
        return self.forwarder is not None and self.forwarder.reachable(self)

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        self.stats_published += 1
        publisher = self.publisher
        if publisher is not None and not publisher.closed:  # the hot path
            publisher.publish(message, confirm)
            return True
        if self.forwarder is None:
            if confirm is not None:
                confirm.reject()
            return True
        return bool(self.forwarder.publish(self, message, confirm))

    def consume(self, consumer: Consumer, client: QueueClient, nowait: bool) -> None:
        """Consumed on the holder; consume-ok (or the holder's error) once it answers."""
        if self.forwarder is None:
            raise node_down(self)
        self.forwarder.consume(self, consumer, client, nowait)

    def resume(self, consumer: Consumer) -> None:
        """A consumer that lost its subscription with a leader subscribes on the holder
        again, with no consume-ok to its client; if the holder cannot take it, the
        consumer's own queue says whether to wait for the next one (`consumer_lost`)."""
        if self.forwarder is None or not self.forwarder.reachable(self):
            if not consumer.queue.consumer_lost(consumer):
                consumer.sink.server_cancel(consumer)
            return
        self.forwarder.resume(self, consumer)

    def serve_get(self, client: QueueClient, no_ack: bool) -> None:
        """The holder's get-ok (or get-empty, or error) becomes the client's."""
        if self.forwarder is None:
            raise node_down(self)
        self.forwarder.get(self, client, no_ack)

    def forward(self, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> bool:
        """A passive queue.declare or a queue.purge is the holder's to answer, with its
        counts; if its node is down, RabbitMQ's 404 for it."""
        if self.forwarder is None:
            raise node_down(self)
        self.forwarder.forward(self, client, method, answer)
        return True

    def forward_delete(self, client: QueueClient, method: QueueMethod,
                       answer: Callable[[QueueMethod], None]) -> bool:
        """queue.delete is the holder's to answer if it can be reached; if its node is down,
        the queue is deleted from the metadata alone (`check_delete`)."""
        if self.forwarder is None or not self.forwarder.reachable(self):
            return False
        self.forwarder.forward(self, client, method, answer)
        return True

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """Deleted here because its node is down: from the metadata alone, as RabbitMQ
        force-deletes a classic queue whose process is gone; but not if_empty, since it may
        hold messages."""
        if if_empty:
            raise PreconditionFailed(f"{self.resource} not empty")

    def add_consumer(self, consumer: Consumer) -> None:
        """Consumers are added by the forwarder once the holder has taken them."""
        self.consumers.append(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        state = consumer.state
        if state is not None:
            state.cancel()

    def dispatch(self) -> None:
        for consumer in list(self.consumers):
            if consumer.state is not None:
                consumer.state.drain()

    def get(self, no_ack: bool) -> QueuedMessage | None:
        """Nothing to take here: basic.get is served by the holder (`serve_get`)."""
        raise NotImplementedError("basic.get of a RemoteQueue goes through serve_get")

    def purge(self) -> int:
        """Nothing to purge here: queue.purge is the holder's (`forward`)."""
        raise NotImplementedError("queue.purge of a RemoteQueue goes through forward")

    # An entry is a QueuedMessage (basic.get) or, for a consumer's delivery, the pair
    # (holder's tag, what settles it).

    def ack(self, entry: Entry, consumer: Consumer | None = None) -> None:
        if isinstance(entry, tuple):
            entry[1].ack(entry[0])
        else:
            entry.store_ref.settle(entry.seq, True)

    def ack_many(self, entries: list[Any], consumer: Consumer | None = None) -> None:
        """The peer's tags of one shadow go to it as one run (see ConsumerShadow.ack_many)."""
        shadow: Any = None
        run: list[int] = []
        for entry in entries:
            if type(entry) is tuple:
                if entry[1] is not shadow:
                    if run:
                        shadow.ack_many(run)
                    shadow, run = entry[1], []
                run.append(entry[0])
            else:
                entry.store_ref.settle(entry.seq, True)
        if run:
            shadow.ack_many(run)

    def reject(self, entry: Entry, consumer: Consumer | None = None) -> None:
        if isinstance(entry, tuple):
            entry[1].settle(entry[0], False, False)
        else:
            entry.store_ref.settle(entry.seq, False, False)

    def requeue(self, entries: list[Any], delivery_failed: bool = True) -> None:
        for entry in entries:
            if type(entry) is tuple:
                entry[1].settle(entry[0], False, True, delivery_failed)
            else:
                entry.store_ref.settle(entry.seq, False, True, delivery_failed)

    def on_delete(self) -> None:
        """The queue is gone from the cluster: its consumers here are cancelled."""
        for consumer in list(self.consumers):
            if consumer.state is not None:
                consumer.state.cancel()
        super().on_delete()


if TYPE_CHECKING:

    def _conforms(queue: RemoteQueue) -> QueueType:
        """mypy checks here that a remote queue implements the queue-type interface."""
        return queue
