"""The forwarder (broker/remote/forwarding.py, tunnel_client.py) over a stand-in for the
node-to-node link, without sockets: what the holding node is sent for a publish, a consume and
a basic.get; how its answers (confirms, get-ok, channel errors) reach this node's clients; and
RabbitMQ's answers when the holding node is down or goes down."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import pytest
from pamqp import commands as m
from pamqp import frame
from pamqp.base import Frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from support.manual_scheduler import ManualScheduler

from leveret.amqp.content import Message
from leveret.amqp.errors import AMQPError
from leveret.broker.cluster.link import LinkClosed
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import NotFound
from leveret.broker.model.message import Confirm, QueuedMessage
from leveret.broker.model.queue_client import Closeable
from leveret.broker.model.vhost import VHost
from leveret.broker.remote.forwarding import Forwarder, forward_queue_method
from leveret.broker.remote.remote_queue import RemoteQueue

DOWN = "home node 'b' of durable queue 'q' in vhost '/' is down or inaccessible"


class Link:
    """The link to node 'b', as a Tunnel uses it: what was sent on it, and its close."""

    def __init__(self, open_error: Exception | None = None) -> None:
        self.peer_node = "b"
        self.closed = False
        self.buffered_bytes = 0
        self.open_error = open_error
        self.sent = b""
        self._on_close: list[Callable[[Any], None]] = []

    async def call(self, kind: str, body: Any = None, timeout: float | None = None) -> Any:
        if self.open_error is not None:
            raise self.open_error
        return {"frame_max": 131072}

    def on_close(self, callback: Callable[[Any], None]) -> None:
        self._on_close.append(callback)

    def send_tunnel(self, tunnel_id: int, data: bytes | memoryview) -> None:
        self.sent += bytes(data)

    def close(self) -> None:
        self.closed = True
        for callback in self._on_close:
            callback(self)

    def frames(self) -> list[tuple[int, Any]]:
        """What the holder was sent since the last call: (channel, frame)."""
        data, self.sent, found = self.sent, b"", []
        while data:
            used, channel, decoded = frame.unmarshal(data)
            assert used > 0
            found.append((channel, decoded))
            data = data[used:]
        return found


class Cluster:
    def __init__(self) -> None:
        self.link: Link | None = Link()
        self.links = self

    def link_to(self, node: str) -> Link | None:
        return self.link if node == "b" and self.link is not None and not self.link.closed \
            else None


class Host:
    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster: Any = cluster
        self.connections: list[Any] = []


class Session:
    flush_early_bytes = 1 << 20
    frame_max = 131072
    writable = True

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write_many(self, parts: list[Any]) -> None:
        self.written += [bytes(p) for p in parts]


class Client:
    """A client's channel on this node: a QueueClient and ConsumerSink that keeps its answers
    and the steps it was asked to wait for."""

    def __init__(self) -> None:
        self.closed = False
        self.remote: Closeable | None = None
        self.number = 1
        self.session = Session()
        self.said: list[tuple[Any, ...]] = []
        self.steps: list[Coroutine[Any, Any, None]] = []

    def consume_started(self, consumer: Consumer, nowait: bool) -> None:
        self.said.append(("consume-ok", consumer.tag))

    def get_ok(self, entry: QueuedMessage, queue: Any, no_ack: bool, remaining: int) -> None:
        self.said.append(("get-ok", entry.message.body, entry.redelivered, remaining))
        self.entry = entry

    def get_empty(self) -> None:
        self.said.append(("get-empty",))

    def wait_for(self, index: int, step: Coroutine[Any, Any, None]) -> None:
        self.steps.append(step)

    async def step(self) -> None:
        """Run the first step the channel waits for (as its backlog would)."""
        await asyncio.wait_for(self.steps.pop(0), 2)

    def can_send(self, consumer: Consumer) -> bool:
        return True

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None:
        self.said.append(("deliver", entry.message.body))

    def server_cancel(self, consumer: Consumer) -> None:
        self.said.append(("cancel", consumer.tag))

    def credit(self, consumer: Consumer) -> int:
        return 1 << 30

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        raise AssertionError("not a stream consumer")


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def queue(cluster: Cluster) -> RemoteQueue:
    vhost = VHost("/", ManualScheduler(inline_soon=True))
    forwarder = Forwarder(Host(cluster), server=None)  # type: ignore[arg-type]
    return RemoteQueue(vhost, "q", queue_type="classic", node="b", durable=True,
                       auto_delete=False, arguments={}, exclusive_elsewhere=False,
                       forwarder=forwarder)


async def turn() -> None:
    """Let the tunnel open and this turn's output leave."""
    for _ in range(3):
        await asyncio.sleep(0)


def methods(frames: list[tuple[int, Any]]) -> list[str]:
    return [type(f).__name__ if not isinstance(f, Frame) else f.name for _, f in frames]


def reply(queue: RemoteQueue, channel: int, *frames: Any) -> None:
    """The holder's frames on `channel` of the tunnel."""
    forwarder = queue.forwarder
    assert isinstance(forwarder, Forwarder)
    (tunnel,) = forwarder.tunnels.values()
    tunnel.receive(b"".join(frame.marshal(f, channel) for f in frames))


def publish(queue: RemoteQueue, body: bytes, confirmed: list[tuple[bytes, bool]]) -> None:
    confirm = Confirm(len(confirmed), lambda c: confirmed.append((body, not c.rejected)))
    queue.publish(Message.build("x", "k", body), confirm)
    confirm.seal()


async def test_a_publish_is_confirmed_when_the_holder_confirms_it(queue: RemoteQueue,
                                                                  cluster: Cluster) -> None:
    confirmed: list[tuple[bytes, bool]] = []
    for body in (b"one", b"two", b"three"):
        publish(queue, body, confirmed)
    await turn()
    assert cluster.link is not None
    sent = cluster.link.frames()
    assert methods(sent) == ["Channel.Open", "Queue.Declare", "Confirm.Select"] + [
        "Basic.Publish", "ContentHeader", "ContentBody"] * 3
    declare, publish_ = sent[1][1], sent[3][1]
    assert (declare.queue, declare.passive) == ("q", True)
    assert (publish_.exchange, publish_.routing_key) == ("x", "k")
    assert [f.value for _, f in sent if isinstance(f, ContentBody)] == [b"one", b"two", b"three"]
    assert confirmed == []  # deferred until the holder confirms
    channel = sent[0][0]
    reply(queue, channel, m.Basic.Ack(delivery_tag=2, multiple=True))
    assert confirmed == [(b"one", True), (b"two", True)]
    reply(queue, channel, m.Basic.Nack(delivery_tag=3))
    assert confirmed[2] == (b"three", False)


async def test_publishes_waiting_for_a_node_that_goes_down_are_nacked(queue: RemoteQueue,
                                                                      cluster: Cluster) -> None:
    confirmed: list[tuple[bytes, bool]] = []
    publish(queue, b"one", confirmed)
    await turn()
    assert cluster.link is not None
    cluster.link.close()
    assert confirmed == [(b"one", False)]
    publish(queue, b"two", confirmed)  # no link: routed, and nacked at once
    assert confirmed[1] == (b"two", False)
    assert queue.forwarder is not None and not queue.forwarder.reachable(queue)


async def test_consume_and_get_on_a_node_without_a_link_are_rabbitmqs_node_down(
        queue: RemoteQueue, cluster: Cluster) -> None:
    cluster.link = None
    client = Client()
    calls: list[Callable[[], None]] = [
        lambda: queue.consume(Consumer("ctag", queue, client), client, False),
        lambda: queue.serve_get(client, False),
        lambda: forward_queue_method(client, queue, m.Queue.Purge(queue="q"),
                                     lambda answer: None)]
    for call in calls:
        with pytest.raises(NotFound) as raised:
            call()
        assert raised.value.text == DOWN
    assert client.said == [] and client.steps == []


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
async def test_a_tunnel_that_cannot_open_answers_node_down_and_nothing_else(
        queue: RemoteQueue, cluster: Cluster) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    cluster.link = Link(open_error=LinkClosed("link to 'b' closed"))
    client = Client()
    queue.serve_get(client, False)
    queue.consume(Consumer("ctag", queue, client), client, False)
    for _ in range(2):
        with pytest.raises(NotFound) as raised:
            await client.step()
        assert raised.value.text == DOWN
    gc.collect()
    # no "Future exception was never retrieved" (an error in the log) for what the
    # node-down answer stands for
    assert [context["message"] for context in unhandled] == []


async def test_a_get_is_the_holders_get_ok_and_its_ack_goes_back_by_the_holders_tag(
        queue: RemoteQueue, cluster: Cluster) -> None:
    client = Client()
    queue.serve_get(client, no_ack=False)
    await turn()
    assert cluster.link is not None
    sent = cluster.link.frames()
    assert methods(sent) == ["Channel.Open", "Basic.Get"]
    channel, get = sent[1]
    assert (get.queue, get.no_ack) == ("q", False)
    body = b"from b"
    reply(queue, channel, m.Channel.OpenOk(),
          m.Basic.GetOk(delivery_tag=42, redelivered=True, exchange="x", routing_key="k",
                        message_count=5),
          ContentHeader(body_size=len(body)), ContentBody(body))
    await client.step()
    assert client.said == [("get-ok", body, True, 5)]
    queue.ack(client.entry)
    await turn()
    (acked,) = [f for _, f in cluster.link.frames() if isinstance(f, m.Basic.Ack)]
    assert acked.delivery_tag == 42


async def test_a_get_the_holder_answers_empty_is_get_empty(queue: RemoteQueue,
                                                            cluster: Cluster) -> None:
    client = Client()
    queue.serve_get(client, no_ack=True)
    await turn()
    assert cluster.link is not None
    channel = cluster.link.frames()[-1][0]
    reply(queue, channel, m.Channel.OpenOk(), m.Basic.GetEmpty())
    await client.step()
    assert client.said == [("get-empty",)]


async def test_the_holders_channel_error_is_the_clients_with_its_code_and_text(
        queue: RemoteQueue, cluster: Cluster) -> None:
    client = Client()
    queue.serve_get(client, no_ack=False)
    await turn()
    assert cluster.link is not None
    channel = cluster.link.frames()[-1][0]
    reply(queue, channel, m.Channel.Close(reply_code=404, reply_text=(
        "NOT_FOUND - no queue 'q' in vhost '/'"), class_id=60, method_id=70))
    with pytest.raises(AMQPError) as raised:
        await client.step()
    assert (raised.value.code, raised.value.explanation) == (404, "no queue 'q' in vhost '/'")
    await turn()
    assert methods(cluster.link.frames()) == ["Channel.CloseOk"]


async def test_a_consumer_is_consumed_on_the_holder_then_answered_and_cancelled_if_it_goes(
        queue: RemoteQueue, cluster: Cluster) -> None:
    client = Client()
    consumer = Consumer("ctag", queue, client, prefetch=10)
    queue.consume(consumer, client, nowait=False)
    running = asyncio.create_task(client.step())  # the channel's backlog runs the step
    await turn()
    assert cluster.link is not None
    sent = cluster.link.frames()
    assert methods(sent) == ["Channel.Open", "Basic.Qos", "Basic.Consume"]
    channel, consume = sent[2]
    assert (consume.queue, consume.consumer_tag, sent[1][1].prefetch_count) == (
        "q", "ctag", 10)
    assert client.said == []  # consume-ok waits for the holder's
    reply(queue, channel, m.Channel.OpenOk(), m.Basic.QosOk(),
          m.Basic.ConsumeOk(consumer_tag="ctag"))
    await running
    assert client.said == [("consume-ok", "ctag")] and queue.consumers == [consumer]
    cluster.link.close()  # the holder's node goes down: its consumers here are cancelled
    assert client.said[-1] == ("cancel", "ctag") and queue.consumers == []
