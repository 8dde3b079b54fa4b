"""The session's queue.declare (passive), queue.purge and queue.delete (session/topology.py),
without sockets: a queue of this node serves them here, a queue held by another node hands
them to its holder through the queue-type interface, and one whose holder is down is deleted
from the metadata alone (refusing if_empty), with the same replies, texts and order as before
the handlers stopped asking which kind of queue they hold."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from pamqp import commands as m
from pamqp.base import Frame
from support.manual_scheduler import ManualScheduler

from leveret.amqp import codec
from leveret.amqp.content import Message
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import ClassicQueue, Queue
from leveret.broker.model.queue_client import Closeable, QueueClient, QueueMethod
from leveret.broker.model.vhost import VHost
from leveret.broker.remote.remote_queue import RemoteQueue
from leveret.broker.session import backlog, topology
from leveret.broker.topology.port import DeletedQueue


class Forwarder:
    """A Forwarding that keeps the queue methods handed to it, for the test to answer."""

    def __init__(self, reachable: bool = True) -> None:
        self.holder_reachable = reachable
        self.handed: list[tuple[QueueMethod, Callable[[QueueMethod], None]]] = []

    def publish(self, queue: RemoteQueue, message: InboundMessage,
                confirm: Confirm | None) -> bool:
        raise AssertionError("nothing is published here")

    def consume(self, queue: RemoteQueue, consumer: Consumer, client: QueueClient,
                nowait: bool) -> None:
        raise AssertionError("nothing is consumed here")

    def get(self, queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None:
        raise AssertionError("nothing is got here")

    def forward(self, queue: RemoteQueue, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> None:
        self.handed.append((method, answer))

    def reachable(self, queue: RemoteQueue) -> bool:
        return self.holder_reachable


class Port:
    """The topology port's delete, as one node's: it never waits."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete_queue(self, vhost: VHost, name: str) -> DeletedQueue:
        self.deleted.append(name)
        return DeletedQueue(None)


class Broker:
    def __init__(self) -> None:
        self.topology = Port()


class Session:
    cluster_key = "this-connection"

    def __init__(self) -> None:
        self.broker = Broker()
        self.written: list[bytes] = []
        self.channels: dict[int, Channel] = {}

    def write(self, data: bytes) -> None:
        self.written.append(data)


class Channel:
    """The channel as the handlers see it: what it replies and cancels, in order."""

    number = 1

    def __init__(self, vhost: VHost) -> None:
        self.vhost = vhost
        self.session = Session()
        self.session.channels[self.number] = self
        self.closed = False
        self.last_queue: str | None = None
        self.remote: Closeable | None = None
        self.backlog: backlog.Backlog | None = None
        self.consumers: dict[str, Consumer] = {}
        self.said: list[object] = []

    def check(self, kind: str, resource_kind: str, name: str) -> None:
        pass

    def reply(self, method: Frame) -> None:
        self.said.append((method.name, getattr(method, "message_count", None)))

    def notify_cancel(self, consumer: Consumer) -> None:
        self.said.append(("cancel", consumer.tag))

    # QueueClient and ConsumerSink: never asked here
    def consume_started(self, consumer: Consumer, nowait: bool) -> None:
        raise AssertionError("no consume here")

    def get_ok(self, entry: QueuedMessage, queue: Any, no_ack: bool, remaining: int) -> None:
        raise AssertionError("no get here")

    def get_empty(self) -> None:
        raise AssertionError("no get here")

    def wait_for(self, index: int, step: Coroutine[Any, Any, None]) -> None:
        raise AssertionError("the fake forwarder starts no step")

    def server_cancel(self, consumer: Consumer) -> None:
        self.said.append(("server-cancel", consumer.tag))


@pytest.fixture
def vhost() -> VHost:
    return VHost("/", ManualScheduler(inline_soon=True))


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Run each step the handlers start to its end at once (the fake port never waits)."""
    started: list[int] = []

    def start_step(channel: object, index: int, step: Coroutine[Any, Any, None]) -> None:
        started.append(index)
        with pytest.raises(StopIteration):
            step.send(None)
    monkeypatch.setattr(backlog, "start_step", start_step)
    return started


def held_elsewhere(vhost: VHost, forwarder: Forwarder | None) -> RemoteQueue:
    queue = RemoteQueue(vhost, "q", queue_type="classic", node="b", durable=True,
                        auto_delete=False, arguments={}, exclusive_elsewhere=False,
                        forwarder=forwarder)
    vhost.queues["q"] = queue
    return queue


def held_here(vhost: VHost) -> Queue:
    queue = ClassicQueue(vhost, "q")
    vhost.queues["q"] = queue
    queue.publish(Message.build("", "q", b"a"), None)
    return queue


def test_a_passive_declare_of_a_queue_held_elsewhere_answers_with_the_holders_counts(
        vhost: VHost) -> None:
    forwarder = Forwarder()
    held_elsewhere(vhost, forwarder)
    channel = Channel(vhost)
    method = m.Queue.Declare(queue="q", passive=True)
    topology.queue_declare(channel, method)
    assert channel.last_queue == "q"
    [(handed, answer)] = forwarder.handed
    assert handed is method  # the client's frame, as it came
    assert channel.session.written == []
    answer(m.Queue.DeclareOk(queue="q", message_count=2, consumer_count=1))
    assert channel.session.written == [codec.encode_declare_ok(1, "q", 2, 1)]


def test_a_passive_declare_of_a_queue_held_here_answers_at_once(vhost: VHost) -> None:
    held_here(vhost)
    channel = Channel(vhost)
    topology.queue_declare(channel, m.Queue.Declare(queue="q", passive=True))
    assert channel.session.written == [codec.encode_declare_ok(1, "q", 1, 0)]


def test_a_purge_of_a_queue_held_elsewhere_answers_the_holders_purge_ok(vhost: VHost) -> None:
    forwarder = Forwarder()
    held_elsewhere(vhost, forwarder)
    channel = Channel(vhost)
    channel.last_queue = "q"
    method = m.Queue.Purge(queue="")
    topology.queue_purge(channel, method)
    [(handed, answer)] = forwarder.handed
    assert handed is method
    answer(m.Queue.PurgeOk(message_count=3))
    assert channel.said == [("Queue.PurgeOk", 3)]


def test_a_purge_of_a_queue_held_here_purges_it_here(vhost: VHost) -> None:
    queue = held_here(vhost)
    channel = Channel(vhost)
    topology.queue_purge(channel, m.Queue.Purge(queue="q"))
    assert channel.said == [("Queue.PurgeOk", 1)]
    assert queue.message_count == 0


def test_a_delete_of_a_queue_whose_holder_is_reachable_is_the_holders(
        vhost: VHost, steps: list[int]) -> None:
    forwarder = Forwarder()
    held_elsewhere(vhost, forwarder)
    channel = Channel(vhost)
    method = m.Queue.Delete(queue="q", if_empty=True)
    topology.queue_delete(channel, method)
    [(handed, answer)] = forwarder.handed
    assert handed is method and steps == []
    answer(m.Queue.DeleteOk(message_count=4))
    assert channel.said == [("Queue.DeleteOk", 4)]
    assert channel.session.broker.topology.deleted == []


def test_a_delete_of_a_queue_whose_holder_is_down_refuses_if_empty(
        vhost: VHost, steps: list[int]) -> None:
    forwarder = Forwarder(reachable=False)
    held_elsewhere(vhost, forwarder)
    channel = Channel(vhost)
    with pytest.raises(PreconditionFailed) as raised:
        topology.queue_delete(channel, m.Queue.Delete(queue="q", if_empty=True))
    assert raised.value.text == "queue 'q' in vhost '/' not empty"
    assert forwarder.handed == [] and steps == []


@pytest.mark.parametrize("forwarder", [Forwarder(reachable=False), None])
def test_a_delete_of_a_queue_whose_holder_is_down_is_made_in_the_metadata_alone(
        vhost: VHost, steps: list[int], forwarder: Forwarder | None) -> None:
    queue = held_elsewhere(vhost, forwarder)
    channel = Channel(vhost)
    consumer = Consumer("ctag", queue, channel)
    channel.consumers["ctag"] = consumer  # cancelled when the sync drops the queue, not here
    topology.queue_delete(channel, m.Queue.Delete(queue="q", if_unused=True))
    assert steps == [m.Queue.Delete.index]
    assert channel.session.broker.topology.deleted == ["q"]
    assert channel.said == [("Queue.DeleteOk", 0)]
    assert channel.consumers == {"ctag": consumer}


def test_a_delete_of_a_queue_held_here_counts_and_cancels_after_delete_ok(
        vhost: VHost, steps: list[int]) -> None:
    queue = held_here(vhost)
    channel = Channel(vhost)
    channel.consumers["ctag"] = Consumer("ctag", queue, channel)
    topology.queue_delete(channel, m.Queue.Delete(queue="q"))
    assert channel.session.broker.topology.deleted == ["q"]
    assert channel.said == [("Queue.DeleteOk", 1), ("cancel", "ctag")]
    assert channel.consumers == {}


def test_a_delete_of_a_queue_held_here_keeps_its_own_conditions(vhost: VHost,
                                                                  steps: list[int]) -> None:
    queue = held_here(vhost)
    channel = Channel(vhost)
    queue.consumers.append(Consumer("ctag", queue, channel))
    with pytest.raises(PreconditionFailed) as raised:
        topology.queue_delete(channel, m.Queue.Delete(queue="q", if_unused=True))
    assert raised.value.text == "queue 'q' in vhost '/' in use"
    assert steps == []
