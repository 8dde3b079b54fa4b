"""A queue held by another node of the cluster, as this node's model sees it.

Every node has every queue of the cluster in its vhosts, so that bindings and routing work the
same everywhere; a queue whose record names another node is one of these. It has the queue's
identity, type, flags and arguments, and hands what must happen to the queue (a routed message,
a consumer, a get) to `forwarder`, which reaches the holding node.

It must not know the link or AMQP: the forwarder is given to it.
Single-threaded: every method runs on the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.model.queue import Queue

if TYPE_CHECKING:
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
    from leveret.broker.model.vhost import VHost

ELSEWHERE = object()  # the exclusive owner of a queue exclusive to a connection on another node


class RemoteQueue(Queue):
    def __init__(self, vhost: VHost, name: str, *, queue_type: str, node: str, durable: bool,
                 auto_delete: bool, arguments: dict[str, Any], exclusive_elsewhere: bool,
                 forwarder: Any) -> None:
        super().__init__(vhost, name, durable=durable,
                         exclusive_owner=ELSEWHERE if exclusive_elsewhere else None,
                         auto_delete=auto_delete, arguments=arguments)
        self.type = queue_type
        self.node = node
        self.forwarder = forwarder

    # What a channel asks of a queue, handed to the forwarder (broker/session/forwarding.py).
    # A delivery's handle (`entry`) is a QueuedMessage whose `seq` is the holder's delivery tag
    # and whose `store_ref` is what settles it there; a consumer's `state` is its forwarding.

    publisher: Any = None  # the forwarder's channel for publishes to this queue, once made

    @property
    def redelivers(self) -> bool:  # type: ignore[override]
        return self.type != "stream"

    @property
    def message_count(self) -> int:
        """Unknown here: queue.declare's counts come from the holding node."""
        return 0

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
        raise NotImplementedError("basic.get of a RemoteQueue goes through the forwarder")

    def purge(self) -> int:
        raise NotImplementedError("queue.purge of a RemoteQueue goes through the forwarder")

    # An entry is a QueuedMessage (basic.get) or, for a consumer's delivery, the pair
    # (holder's tag, what settles it).

    def ack(self, entry: Any, consumer: Consumer | None = None) -> None:
        if type(entry) is tuple:
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

    def reject(self, entry: Any, consumer: Consumer | None = None) -> None:
        if type(entry) is tuple:
            entry[1].settle(entry[0], False, False)
        else:
            entry.store_ref.settle(entry.seq, False, False)

    def requeue(self, entries: list[Any]) -> None:
        for entry in entries:
            if type(entry) is tuple:
                entry[1].settle(entry[0], False, True)
            else:
                entry.store_ref.settle(entry.seq, False, True)

    def on_delete(self) -> None:
        """The queue is gone from the cluster: its consumers here are cancelled."""
        for consumer in list(self.consumers):
            if consumer.state is not None:
                consumer.state.cancel()
        super().on_delete()
