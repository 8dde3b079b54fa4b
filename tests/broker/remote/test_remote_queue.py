"""A queue held by another node (broker/remote/remote_queue.py), without a link: a delivery's
settlement goes back to the channel it came on with the holder's own tag, publishes take the
queue's open publisher, and consumers here are ended when the queue is. How consume and get are
handed to the forwarder is in tests/broker/queues/test_queue_type.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp.content import Message
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import ResourceLocked
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue_client import QueueClient
from leveret.broker.model.vhost import VHost
from leveret.broker.remote.remote_queue import RemoteQueue


class Holder:
    """A channel on the holding node (`Settling`, and a QueuedMessage's store_ref): it writes
    down how each of its deliveries was settled, by the holder's tag."""

    def __init__(self, name: str, said: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.said = said

    def settle(self, tag: int, ok: bool, requeue: bool = False, failed: bool = False) -> None:
        self.said.append((self.name, "ack" if ok else "requeue" if requeue else "reject", tag,
                          failed) if failed else (
            self.name, "ack" if ok else "requeue" if requeue else "reject", tag))

    def ack(self, tag: int) -> None:
        self.said.append((self.name, "ack", tag))

    def ack_many(self, tags: list[int]) -> None:
        self.said.append((self.name, "ack-many", tags))


class Publisher:
    def __init__(self) -> None:
        self.closed = False
        self.sent: list[bytes] = []

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> None:
        self.sent.append(message.body)


class Forwarder:
    def __init__(self) -> None:
        self.published: list[bytes] = []

    def publish(self, queue: RemoteQueue, message: InboundMessage,
                confirm: Confirm | None) -> bool:
        self.published.append(message.body)
        return True

    def consume(self, queue: RemoteQueue, consumer: Consumer, client: QueueClient,
                nowait: bool) -> None:
        raise AssertionError("not used here")

    def get(self, queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None:
        raise AssertionError("not used here")


class Forwarding:
    """A remote consumer's forwarding (its `consumer.state`)."""

    def __init__(self, said: list[str]) -> None:
        self.said = said

    def cancel(self) -> None:
        self.said.append("cancel")

    def drain(self) -> None:
        self.said.append("drain")


class Sink:
    """A client channel (`ConsumerSink`) that writes down the consumers the server cancels."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def server_cancel(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)

    def can_send(self, consumer: Consumer) -> bool:
        return True

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None:
        raise AssertionError("a remote queue's deliveries come from its forwarding")

    def credit(self, consumer: Consumer) -> int:
        return 1 << 30

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        raise AssertionError("a remote queue's deliveries come from its forwarding")


@pytest.fixture
def vhost() -> VHost:
    return VHost("/", ManualScheduler(inline_soon=True))


def remote(vhost: VHost, forwarder: Forwarder | None = None, **flags: Any) -> RemoteQueue:
    options: dict[str, Any] = {"queue_type": "classic", "node": "b", "durable": True,
                               "auto_delete": False, "arguments": {},
                               "exclusive_elsewhere": False, **flags}
    queue = RemoteQueue(vhost, "q", forwarder=forwarder, **options)
    vhost.queues["q"] = queue
    return queue


def got(tag: int, holder: Holder) -> QueuedMessage:
    """A basic.get's entry as the forwarder makes it: the holder's tag, what settles it."""
    entry = QueuedMessage(Message.build("", "q", b"x"), tag)
    entry.store_ref = holder
    return entry


def test_a_deliverys_settlement_goes_back_by_the_holders_tag(vhost: VHost) -> None:
    said: list[tuple[Any, ...]] = []
    one, two = Holder("one", said), Holder("two", said)
    queue = remote(vhost, Forwarder())
    queue.ack((7, one))
    queue.reject((8, two))
    queue.ack(got(3, two))
    queue.reject(got(4, one))
    queue.requeue([(9, one), got(5, two)], delivery_failed=False)  # a nack or a recover
    queue.requeue([(10, one)])  # a reject or a closed channel: a failed delivery
    assert said == [("one", "ack", 7), ("two", "reject", 8), ("two", "ack", 3),
                    ("one", "reject", 4), ("one", "requeue", 9), ("two", "requeue", 5),
                    ("one", "requeue", 10, True)]


def test_a_multiple_ack_goes_to_each_holder_channel_as_runs_in_order(vhost: VHost) -> None:
    said: list[tuple[Any, ...]] = []
    one, two = Holder("one", said), Holder("two", said)
    remote(vhost, Forwarder()).ack_many([(1, one), (2, one), (1, two), got(6, one), (3, one),
                                         (4, one)])
    assert said == [("one", "ack-many", [1, 2]), ("one", "ack", 6), ("two", "ack-many", [1]),
                    ("one", "ack-many", [3, 4])]


def test_publishes_take_the_open_publisher_and_else_the_forwarder(vhost: VHost) -> None:
    forwarder = Forwarder()
    queue = remote(vhost, forwarder)
    queue.publish(Message.build("", "q", b"first"), None)
    publisher = queue.publisher = Publisher()
    queue.publish(Message.build("", "q", b"second"), None)
    publisher.closed = True  # its tunnel channel went: the forwarder makes another
    queue.publish(Message.build("", "q", b"third"), None)
    assert (forwarder.published, publisher.sent) == ([b"first", b"third"], [b"second"])
    assert queue.stats_published == 3


def test_a_consumer_removed_here_is_cancelled_on_the_holder(vhost: VHost) -> None:
    said: list[str] = []
    queue = remote(vhost, Forwarder())
    consumer = Consumer("ctag", queue, Sink())
    consumer.state = Forwarding(said)
    queue.add_consumer(consumer)
    queue.dispatch()
    queue.remove_consumer(consumer)
    queue.remove_consumer(consumer)  # again, as a channel closing after a cancel may
    assert said == ["drain", "cancel", "cancel"]
    assert queue.consumers == [] and queue.had_consumers


def test_a_deleted_remote_queue_ends_its_consumers_here(vhost: VHost) -> None:
    said: list[str] = []
    queue = remote(vhost, Forwarder())
    sink = Sink()
    consumer = Consumer("ctag", queue, sink)
    consumer.state = Forwarding(said)
    queue.add_consumer(consumer)
    vhost.delete_queue(queue)
    assert "q" not in vhost.queues
    assert said == ["cancel"] and sink.cancelled == ["ctag"]
    assert queue.deleted and queue.consumers == []


def test_a_queue_exclusive_to_a_connection_elsewhere_is_locked_here(vhost: VHost) -> None:
    queue = remote(vhost, Forwarder(), exclusive_elsewhere=True)
    assert queue.exclusive
    with pytest.raises(ResourceLocked) as raised:
        vhost.declare_queue("q", owner=object(), passive=True)
    assert raised.value.text.startswith(
        "cannot obtain exclusive access to locked queue 'q' in vhost '/'")
    open_queue = remote(VHost("/", ManualScheduler(inline_soon=True)), Forwarder())
    assert not open_queue.exclusive


def test_its_counts_are_the_holders_not_this_nodes(vhost: VHost) -> None:
    queue = remote(vhost, Forwarder())
    queue.publish(Message.build("", "q", b"x"), None)
    assert (queue.message_count, queue.holder) == (0, "b")
