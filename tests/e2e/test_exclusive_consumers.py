"""Exclusive consumers (basic.consume exclusive=true), against Leveret and the reference RabbitMQ.

RabbitMQ's classic queue applies one rule whoever asks, on any channel of any connection: an
exclusive consumer needs a queue without consumers, and while it holds the queue no other
consume succeeds (403 `in exclusive use`, channel.close, and no consume-ok before it). With
single active consumer on, an exclusive consume is always refused. An exclusive queue is first
locked to its connection (405). Streams record the flag and enforce nothing. Every case below
expects one outcome, and runs on both brokers; the raw client shows the frames themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pika
import pytest
from pamqp import commands
from support.rawamqp import PeerClosed, RawClient

if TYPE_CHECKING:
    from e2e.conftest import Amqp

STREAM: dict[str, Any] = {"x-queue-type": "stream"}


def in_use(name: str) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use"


def locked(name: str) -> tuple[int, str]:
    return 405, (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
        "'/'. It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration."
    )


@pytest.fixture
def raws(mq: Amqp) -> Iterator[list[RawClient]]:
    """Raw clients of the test (past the handshake), closed after it. A clean close: RabbitMQ
    deletes a connection's exclusive queues before its close-ok, so none is left locked for
    the cleanup that follows."""
    clients: list[RawClient] = []
    yield clients
    for client in clients:
        try:
            client.close_connection()
        except (AssertionError, OSError, PeerClosed, TimeoutError):
            pass
        client.close()


def connect(mq: Amqp, raws: list[RawClient]) -> RawClient:
    client = RawClient(mq.port).handshake()
    client.open_channel(1)
    raws.append(client)
    return client


def second_consumer_place(mq: Amqp, raws: list[RawClient], owner: RawClient,
                          where: str) -> tuple[RawClient, int]:
    """Where the second consumer comes from: the owner's channel 1, its channel 2, or a new
    connection."""
    if where == "same-channel":
        return owner, 1
    if where == "other-channel":
        owner.open_channel(2)
        return owner, 2
    return connect(mq, raws), 1


def consume(client: RawClient, channel: int, queue: str, tag: str, exclusive: bool) -> object:
    """basic.consume; the broker's next method on the connection (consume-ok or a close)."""
    client.send_method(channel, commands.Basic.Consume(
        queue=queue, consumer_tag=tag, exclusive=exclusive))
    got_channel, method = client.next_method()
    assert got_channel == channel, (got_channel, method)
    return method


def outcome(method: object) -> tuple[int, str] | str:
    if isinstance(method, commands.Channel.Close):
        return method.reply_code or 0, method.reply_text
    assert isinstance(method, commands.Basic.ConsumeOk), method
    return "consume-ok"


# -- classic queues: every combination --------------------------------------------------------


@pytest.mark.parametrize("queue_kind", ["shared", "exclusive-queue"])
@pytest.mark.parametrize("where", ["same-channel", "other-channel", "other-connection"])
@pytest.mark.parametrize(
    ("first", "second"), [(False, False), (False, True), (True, False), (True, True)],
    ids=["shared-then-shared", "shared-then-exclusive", "exclusive-then-shared",
         "exclusive-then-exclusive"],
)
def test_second_consumer(mq: Amqp, raws: list[RawClient], queue_kind: str, where: str,
                         first: bool, second: bool) -> None:
    name = mq.uid("xc")
    owner = connect(mq, raws)
    owner.send_method(1, commands.Queue.Declare(queue=name,
                                                exclusive=queue_kind == "exclusive-queue"))
    owner.expect(commands.Queue.DeclareOk, 1)
    assert outcome(consume(owner, 1, name, "first", first)) == "consume-ok"

    client, channel = second_consumer_place(mq, raws, owner, where)

    got = outcome(consume(client, channel, name, "second", second))

    if queue_kind == "exclusive-queue" and where == "other-connection":
        assert got == locked(name)  # the queue's owner check comes before the consumers'
    elif first or second:
        assert got == in_use(name)  # no consume-ok went before the channel.close
    else:
        assert got == "consume-ok"
        return
    # The refused consume left the other consumer in place, unless its channel closed.
    owner.open_channel(3)
    expected = 0 if where == "same-channel" else 1

    def consumers() -> bool:
        owner.send_method(3, commands.Queue.Declare(queue=name, passive=True))
        return bool(owner.expect(commands.Queue.DeclareOk, 3).consumer_count == expected)

    mq.wait(consumers)


def test_exclusive_consumer_on_another_channel_of_the_same_connection(mq: Amqp) -> None:
    """The case of issue 13, as pika sees it: basic_consume raises, with no consume-ok first."""
    name = mq.uid("xc")
    conn = mq.connection()
    first = conn.channel()
    first.queue_declare(name)
    got: list[bytes] = []

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        ch.basic_ack(method.delivery_tag)

    first.basic_consume(name, on_message, exclusive=True)
    second = conn.channel()
    assert mq.soft_error(
        lambda: second.basic_consume(name, on_message, exclusive=True)) == in_use(name)
    assert conn.is_open and first.is_open
    first.basic_publish("", name, b"still mine")  # the holder keeps the queue
    mq.wait(lambda: conn.process_data_events(0.05) or got)
    assert got == [b"still mine"]


def test_exclusive_holder_cancelled_frees_the_queue(mq: Amqp, raws: list[RawClient]) -> None:
    name = mq.uid("xc")
    client = connect(mq, raws)
    client.send_method(1, commands.Queue.Declare(queue=name))
    client.expect(commands.Queue.DeclareOk, 1)
    assert outcome(consume(client, 1, name, "holder", True)) == "consume-ok"
    client.send_method(1, commands.Basic.Cancel(consumer_tag="holder"))
    client.expect(commands.Basic.CancelOk, 1)
    other = connect(mq, raws)
    assert outcome(consume(other, 1, name, "next", True)) == "consume-ok"
    assert outcome(consume(client, 1, name, "late", False)) == in_use(name)


@pytest.mark.parametrize("first", [True, False], ids=["exclusive-first", "shared-first"])
def test_single_active_consumer_queue_refuses_exclusive(mq: Amqp, raws: list[RawClient],
                                                        first: bool) -> None:
    """With x-single-active-consumer, RabbitMQ refuses every exclusive consume, even the first
    on an unused queue."""
    name = mq.uid("xc")
    client = connect(mq, raws)
    client.send_method(1, commands.Queue.Declare(
        queue=name, arguments={"x-single-active-consumer": True}))
    client.expect(commands.Queue.DeclareOk, 1)
    if not first:
        assert outcome(consume(client, 1, name, "shared", False)) == "consume-ok"
    assert outcome(consume(client, 1, name, "exclusive", True)) == in_use(name)


# -- streams: the flag is recorded, not enforced ----------------------------------------------


@pytest.mark.parametrize("where", ["same-channel", "other-channel", "other-connection"])
def test_stream_does_not_enforce_exclusive_consumers(mq: Amqp, raws: list[RawClient],
                                                     where: str) -> None:
    name = mq.uid("xs")
    owner = connect(mq, raws)
    owner.send_method(1, commands.Queue.Declare(queue=name, durable=True, arguments=STREAM))
    owner.expect(commands.Queue.DeclareOk, 1)
    client, channel = second_consumer_place(mq, raws, owner, where)
    for raw, number in {(owner, 1), (client, channel)}:
        raw.send_method(number, commands.Basic.Qos(prefetch_count=10))
        raw.expect(commands.Basic.QosOk, number)
    assert outcome(consume(owner, 1, name, "first", True)) == "consume-ok"
    assert outcome(consume(client, channel, name, "second", True)) == "consume-ok"
    assert outcome(consume(client, channel, name, "third", False)) == "consume-ok"


def test_pika_sees_no_consume_ok_before_the_refusal(mq: Amqp) -> None:
    """A shared consumer, then an exclusive one from another connection: 403 at once."""
    name = mq.uid("xc")
    ch = mq.channel()
    ch.queue_declare(name)
    ch.basic_consume(name, lambda *_: None)
    other = mq.connection().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.basic_consume(name, lambda *_: None, exclusive=True)
    assert (info.value.reply_code, info.value.reply_text) == in_use(name)
