"""A queue deleted while consumers consume from it, against Leveret and the reference RabbitMQ.

What RabbitMQ 3.10 does, and these tests hold both brokers to:
- every consumer's channel whose client announced `consumer_cancel_notify` gets a basic.cancel
  (nowait=true) for it; a client without the capability gets nothing, and its channel stays
  usable;
- the deleting channel sends delete-ok first, then the cancels of its own consumers (RabbitMQ's
  channel hears that the queue went only once it has replied). For a classic queue the other
  channels' cancels race with that delete-ok in RabbitMQ, so only each channel's own order is
  checked; in Leveret a stream's deletion reaches every channel of the deleting connection
  after it (in RabbitMQ usually, but not always);
- delete-ok counts the ready messages only; the unacked deliveries are lost: acking them is
  harmless, and nacking them neither requeues nor dead-letters them (nor are the ready ones
  dead-lettered).

kombu (py-amqp) raises ConsumerCancelled for a basic.cancel its consumer did not ask for; with
the order above, a queue deleted on the consumer's own channel returns from delete() and the
cancel surfaces from the next drain_events, on both brokers.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import kombu
import pytest
from pamqp import commands
from support.rawamqp import CLIENT_CAPABILITIES, FRAME_METHOD, RawClient

if TYPE_CHECKING:
    from e2e.conftest import Amqp

STREAM: dict[str, Any] = {"x-queue-type": "stream"}
NO_CANCEL_NOTIFY = {k: v for k, v in CLIENT_CAPABILITIES.items() if k != "consumer_cancel_notify"}


@pytest.fixture
def raws(mq: Amqp) -> Iterator[list[RawClient]]:
    clients: list[RawClient] = []
    yield clients
    for client in clients:
        client.close()


def connect(mq: Amqp, raws: list[RawClient], notify: bool = True) -> RawClient:
    client = RawClient(mq.port).handshake(capabilities=None if notify else NO_CANCEL_NOTIFY)
    client.open_channel(1)
    raws.append(client)
    return client


def methods(client: RawClient, quiet: float = 0.5) -> list[tuple[int, Any]]:
    """(channel, method) of every method frame until the connection is quiet for `quiet`
    seconds; content headers and bodies are skipped."""
    out: list[tuple[int, Any]] = []
    while True:
        try:
            got = client.next_frame(quiet)
        except TimeoutError:
            return out
        if got.type == FRAME_METHOD:
            out.append((got.channel, got.method))


def named(frames: list[tuple[int, Any]]) -> list[tuple[int, str]]:
    """Frames as (channel, short name) pairs: `cancel <tag>`, `delete-ok <count>`."""
    out = []
    for channel, method in frames:
        if isinstance(method, commands.Basic.Cancel):
            assert method.nowait, "RabbitMQ's server-sent basic.cancel says nowait"
            out.append((channel, f"cancel {method.consumer_tag}"))
        elif isinstance(method, commands.Queue.DeleteOk):
            out.append((channel, f"delete-ok {method.message_count}"))
        else:
            out.append((channel, method.name))
    return out


def declare(client: RawClient, name: str, kind: str, arguments: dict[str, Any] | None = None
            ) -> None:
    args = dict(STREAM if kind == "stream" else {}, **(arguments or {}))
    client.send_method(1, commands.Queue.Declare(queue=name, durable=kind == "stream",
                                                 arguments=args))
    client.expect(commands.Queue.DeclareOk, 1)


def consume(client: RawClient, channel: int, queue: str, tag: str, kind: str,
            prefetch: int = 10) -> None:
    client.send_method(channel, commands.Basic.Qos(prefetch_count=prefetch))
    client.expect(commands.Basic.QosOk, channel)
    args: dict[str, Any] = {"x-stream-offset": "first"} if kind == "stream" else {}
    client.send_method(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag,
                                                       arguments=args))
    client.expect(commands.Basic.ConsumeOk, channel)


def delete(client: RawClient, channel: int, queue: str) -> None:
    client.send_method(channel, commands.Queue.Delete(queue=queue))


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_deleting_channel_gets_delete_ok_then_its_own_cancel(mq: Amqp, raws: list[RawClient],
                                                             kind: str) -> None:
    name = mq.uid("dq")
    client = connect(mq, raws)
    declare(client, name, kind)
    consume(client, 1, name, "mine", kind)
    delete(client, 1, name)
    assert named(methods(client)) == [(1, "delete-ok 0"), (1, "cancel mine")]
    # The consumer is gone from the channel: cancelling it again is a plain cancel-ok.
    client.send_method(1, commands.Basic.Cancel(consumer_tag="mine"))
    client.expect(commands.Basic.CancelOk, 1)


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_deleting_channel_without_cancel_notify_gets_only_delete_ok(
        mq: Amqp, raws: list[RawClient], kind: str) -> None:
    name = mq.uid("dq")
    client = connect(mq, raws, notify=False)
    declare(client, name, kind)
    consume(client, 1, name, "mine", kind)
    delete(client, 1, name)
    assert named(methods(client)) == [(1, "delete-ok 0")]
    client.send_method(1, commands.Basic.Cancel(consumer_tag="mine"))
    client.expect(commands.Basic.CancelOk, 1)


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_every_consumer_of_every_connection_is_cancelled(mq: Amqp, raws: list[RawClient],
                                                         kind: str) -> None:
    """Consumers on channels 1 and 2 of the deleting connection (which deletes on channel 3),
    on another connection, and on one that does not understand basic.cancel."""
    name = mq.uid("dq")
    deleter = connect(mq, raws)
    declare(deleter, name, kind)
    deleter.open_channel(2)
    deleter.open_channel(3)
    consume(deleter, 1, name, "one", kind)
    consume(deleter, 2, name, "two", kind)
    other = connect(mq, raws)
    consume(other, 1, name, "other", kind)
    deaf = connect(mq, raws, notify=False)
    consume(deaf, 1, name, "deaf", kind)

    delete(deleter, 3, name)
    seen = named(methods(deleter))
    assert sorted(seen) == [(1, "cancel one"), (2, "cancel two"), (3, "delete-ok 0")]
    if kind == "stream" and mq.is_leveret:
        # Leveret's stream deletion reaches the channels after delete-ok. RabbitMQ's channel
        # processes write to the socket each on its own, so its order across channels varies
        # from run to run (it once sent "cancel one" first, on a busy machine).
        assert seen[0] == (3, "delete-ok 0")
    assert named(methods(other)) == [(1, "cancel other")]
    assert named(methods(deaf)) == []
    deaf.send_method(1, commands.Basic.Cancel(consumer_tag="deaf"))
    deaf.expect(commands.Basic.CancelOk, 1)


def test_consumers_of_another_channel_when_the_deleting_channel_consumes_too(
        mq: Amqp, raws: list[RawClient]) -> None:
    """Channel 1 consumes and deletes; channel 2 of the same connection consumes: channel 1
    still sends delete-ok before its own cancel, and channel 2 is cancelled."""
    name = mq.uid("dq")
    client = connect(mq, raws)
    declare(client, name, "classic")
    client.open_channel(2)
    consume(client, 1, name, "one", "classic")
    consume(client, 2, name, "two", "classic")
    delete(client, 1, name)
    seen = named(methods(client))
    assert sorted(seen) == [(1, "cancel one"), (1, "delete-ok 0"), (2, "cancel two")]
    assert seen.index((1, "delete-ok 0")) < seen.index((1, "cancel one"))


def test_unacked_deliveries_are_lost_not_requeued_nor_dead_lettered(
        mq: Amqp, raws: list[RawClient]) -> None:
    name, dlq = mq.uid("dq"), mq.uid("dlq")
    client = connect(mq, raws)
    client.send_method(1, commands.Queue.Declare(queue=dlq))
    client.expect(commands.Queue.DeclareOk, 1)
    declare(client, name, "classic", {"x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": dlq})
    client.open_channel(2)
    client.open_channel(3)
    consume(client, 2, name, "two", "classic", prefetch=1)
    consume(client, 3, name, "three", "classic", prefetch=1)
    for number in range(5):
        client.publish(1, b"m%d" % number, routing_key=name)
    delivered = [m for _ch, m in methods(client) if isinstance(m, commands.Basic.Deliver)]
    # One each (prefetch 1); in RabbitMQ the two channels' deliveries reach the wire in
    # either order.
    assert sorted(m.consumer_tag for m in delivered) == ["three", "two"]

    delete(client, 1, name)
    seen = named(methods(client))
    assert sorted(seen) == [(1, "delete-ok 3"), (2, "cancel two"), (3, "cancel three")]

    # Settling deliveries of a queue that is gone is no error, and has no effect.
    client.send_method(2, commands.Basic.Nack(delivery_tag=1, requeue=False))
    client.send_method(3, commands.Basic.Nack(delivery_tag=1, requeue=True))
    client.send_method(1, commands.Queue.Declare(queue=dlq, passive=True))
    assert client.expect(commands.Queue.DeclareOk, 1).message_count == 0
    client.send_method(2, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, 2)
    client.send_method(3, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, 3)
    client.send_method(1, commands.Queue.Declare(queue=name, passive=True))
    close = client.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in "
                                                         "vhost '/'")


# -- kombu ------------------------------------------------------------------------------------


def test_kombu_consumer_whose_own_channel_deletes_the_queue(mq: Amqp) -> None:
    """delete() returns; the next drain_events raises ConsumerCancelled for that consumer."""
    name = mq.uid("kq")
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{mq.port}//") as conn:
        queue = kombu.Queue(name, kombu.Exchange("", type="direct"), routing_key=name,
                            durable=False)
        channel = conn.channel()
        got: list[dict[str, str]] = []

        def on_message(body: dict[str, str], message: kombu.Message) -> None:
            got.append(body)
            message.ack()

        consumer = kombu.Consumer(channel, queues=[queue], callbacks=[on_message],
                                  accept=["json"], tag_prefix="kombu-del-")
        consumer.consume()
        kombu.Producer(conn.channel()).publish(
            {"say": "hello"}, exchange="", routing_key=name, serializer="json")
        conn.drain_events(timeout=3)
        assert got == [{"say": "hello"}]

        assert queue.bind(channel).delete() == 0  # no cancel raised from inside the delete
        with pytest.raises(conn.connection_errors) as info:
            conn.drain_events(timeout=3)
        assert type(info.value).__name__ == "ConsumerCancelled"  # py-amqp's
        with pytest.raises(socket.timeout):  # nothing else is sent, the connection stays up
            conn.drain_events(timeout=0.3)
        assert not mq.exists("queue", name)
