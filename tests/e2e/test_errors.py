"""Error paths as clients see them: which errors close the channel and which the connection,
with RabbitMQ's reply code, text and failing method ids, against Leveret and RabbitMQ alike
(`mq`, through a raw frame client); then what pika, aio-pika and kombu make of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq
import kombu
import pika
import pytest
from pamqp import commands

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from support.rawamqp import RawClient

M = commands

# (name, frames to send on channel 1, close kind, code, text, class id, method id).
# `{x}` in a text is a unique missing name; `{q}` an existing queue of the same client.
CASES: list[tuple[str, Callable[[RawClient, str, str], None], str, int, str, int, int]] = [
    ("passive queue.declare",
     lambda r, x, q: r.send_method(1, M.Queue.Declare(queue=x, passive=True)),
     "channel", 404, "NOT_FOUND - no queue '{x}' in vhost '/'", 50, 10),
    ("passive exchange.declare",
     lambda r, x, q: r.send_method(1, M.Exchange.Declare(exchange=x, passive=True)),
     "channel", 404, "NOT_FOUND - no exchange '{x}' in vhost '/'", 40, 10),
    ("queue.bind to a missing exchange",
     lambda r, x, q: r.send_method(1, M.Queue.Bind(queue=q, exchange=x, routing_key="k")),
     "channel", 404, "NOT_FOUND - no exchange '{x}' in vhost '/'", 50, 20),
    ("queue.purge", lambda r, x, q: r.send_method(1, M.Queue.Purge(queue=x)),
     "channel", 404, "NOT_FOUND - no queue '{x}' in vhost '/'", 50, 30),
    ("basic.consume", lambda r, x, q: r.send_method(1, M.Basic.Consume(queue=x)),
     "channel", 404, "NOT_FOUND - no queue '{x}' in vhost '/'", 60, 20),
    ("basic.get", lambda r, x, q: r.send_method(1, M.Basic.Get(queue=x)),
     "channel", 404, "NOT_FOUND - no queue '{x}' in vhost '/'", 60, 70),
    ("basic.publish", lambda r, x, q: r.publish(1, b"m", x, "k"),
     "channel", 404, "NOT_FOUND - no exchange '{x}' in vhost '/'", 60, 40),
    ("basic.ack", lambda r, x, q: r.send_method(1, M.Basic.Ack(delivery_tag=7)),
     "channel", 406, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 80),
    ("basic.reject", lambda r, x, q: r.send_method(1, M.Basic.Reject(delivery_tag=7)),
     "channel", 406, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 90),
    ("basic.nack", lambda r, x, q: r.send_method(1, M.Basic.Nack(delivery_tag=7)),
     "channel", 406, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 120),
    ("exchange.delete amq.*",
     lambda r, x, q: r.send_method(1, M.Exchange.Delete(exchange="amq.topic")),
     "channel", 403,
     "ACCESS_REFUSED - deletion of system exchange 'amq.topic' in vhost '/' not allowed", 40, 20),
    ("queue.declare amq.*", lambda r, x, q: r.send_method(1, M.Queue.Declare(queue="amq.x")),
     "channel", 403, "ACCESS_REFUSED - queue name 'amq.x' contains reserved prefix 'amq.*'",
     50, 10),
    ("exchange.bind from the default exchange",
     lambda r, x, q: r.send_method(1, M.Exchange.Bind(destination="amq.direct", source="")),
     "channel", 403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 30),
    ("tx.commit", lambda r, x, q: r.send_method(1, M.Tx.Commit()),
     "channel", 406, "PRECONDITION_FAILED - channel is not transactional", 90, 20),
    ("tx.rollback", lambda r, x, q: r.send_method(1, M.Tx.Rollback()),
     "channel", 406, "PRECONDITION_FAILED - channel is not transactional", 90, 30),
    ("user_id",
     lambda r, x, q: r.publish(1, b"m", "", q, properties=M.Basic.Properties(user_id="mallory")),
     "channel", 406,
     "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'",
     60, 40),
    ("unknown exchange type",
     lambda r, x, q: r.send_method(1, M.Exchange.Declare(exchange=x, exchange_type="zzq-" + x)),
     "channel", 406, "PRECONDITION_FAILED - unknown exchange type 'zzq-{x}'", 40, 10),
    ("prefetch_size", lambda r, x, q: r.send_method(1, M.Basic.Qos(prefetch_size=1)),
     "connection", 540, "NOT_IMPLEMENTED - prefetch_size!=0 (1)", 60, 10),
    ("recover requeue=false", lambda r, x, q: r.send_method(1, M.Basic.Recover(requeue=False)),
     "connection", 540, "NOT_IMPLEMENTED - requeue=false", 60, 110),
    ("immediate", lambda r, x, q: r.publish(1, b"m", "", q, immediate=True),
     "connection", 540, "NOT_IMPLEMENTED - immediate=true", 60, 40),
]  # fmt: skip


# Where RabbitMQ changed after 3.10 and Leveret follows the later release (README, "Differences
# from RabbitMQ"): what the reference RabbitMQ 3.10 answers instead, checked on it.
RABBITMQ_3_10: dict[str, tuple[str, int, str]] = {
    # 3.13 made an unknown type a channel error (rabbit_exchange:check_type)
    "unknown exchange type": ("connection", 503,
                              "COMMAND_INVALID - unknown exchange type 'zzq-{x}'"),
}


@pytest.mark.parametrize(
    ("case", "send", "kind", "code", "text", "class_id", "method_id"),
    [pytest.param(*case, id=case[0]) for case in CASES],
)
def test_error_codes_texts_and_method_ids(
    mq: Amqp,
    case: str,
    send: Callable[[RawClient, str, str], None],
    kind: str,
    code: int,
    text: str,
    class_id: int,
    method_id: int,
) -> None:
    if not mq.is_leveret and case in RABBITMQ_3_10:
        kind, code, text = RABBITMQ_3_10[case]
    raw = mq.raw()
    missing = mq.uid("missing")
    queue = mq.uid("q")
    raw.send_method(1, M.Queue.Declare(queue=queue, exclusive=True))
    raw.expect(M.Queue.DeclareOk)
    send(raw, missing, queue)
    channel, close = raw.next_method()
    expected_type = M.Channel.Close if kind == "channel" else M.Connection.Close
    assert isinstance(close, expected_type), close
    assert channel == (1 if kind == "channel" else 0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        code,
        text.format(x=missing, q=queue),
        class_id,
        method_id,
    )
    if kind == "channel":
        # The channel is gone; after close-ok the same number opens again, on a live
        # connection.
        raw.send_method(1, M.Channel.CloseOk())
        raw.send_method(1, M.Channel.Open())
        raw.expect(M.Channel.OpenOk)
        raw.send_method(1, M.Queue.Declare(queue=queue, passive=True))
        assert raw.expect(M.Queue.DeclareOk).queue == queue
    else:
        raw.send_method(0, M.Connection.CloseOk())


def test_a_channel_error_leaves_other_channels_alone(mq: Amqp) -> None:
    conn = mq.connection()
    healthy = conn.channel()
    healthy.confirm_delivery()
    queue = healthy.queue_declare("", exclusive=True).method.queue
    failing = conn.channel()
    missing = mq.uid("missing")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        failing.queue_declare(missing, passive=True)
    assert conn.is_open and healthy.is_open and failing.is_closed
    healthy.basic_publish("", queue, b"still fine")
    assert mq.drain(healthy, queue) == [b"still fine"]
    # The exclusive queue belongs to the connection, not the channel: it survives.
    assert conn.channel().queue_declare(queue, passive=True).method.queue == queue


def test_a_connection_error_closes_every_channel(mq: Amqp) -> None:
    conn = mq.connection()
    first = conn.channel()
    queue = first.queue_declare(mq.uid("excl"), exclusive=True).method.queue
    second = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        second.basic_qos(prefetch_size=5)
    assert (info.value.reply_code, info.value.reply_text) == (
        540,
        "NOT_IMPLEMENTED - prefetch_size!=0 (5)",
    )
    assert conn.is_closed and first.is_closed
    # ... and its exclusive queues go with it.
    assert mq.wait(lambda: not mq.exists("queue", queue))


def test_errors_after_a_publish_are_reported_on_the_next_call(mq: Amqp) -> None:
    ch = mq.channel()
    missing = mq.uid("missing")
    ch.basic_publish(missing, "k", b"m")  # asynchronous: no error yet
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_get(mq.uid("whatever"))
    assert (info.value.reply_code, info.value.reply_text) == (
        404,
        f"NOT_FOUND - no exchange '{missing}' in vhost '/'",
    )


async def test_aio_pika_exception_types(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        expectations: list[tuple[Any, type[Exception], str]] = [
            (
                lambda ch: ch.declare_queue("nope", passive=True),
                aio_pika.exceptions.ChannelNotFoundEntity,
                "NOT_FOUND - no queue 'nope' in vhost '/'",
            ),
            (
                lambda ch: ch.declare_exchange("amq.new", aio_pika.ExchangeType.DIRECT),
                aiormq.exceptions.ChannelAccessRefused,
                "ACCESS_REFUSED - exchange name 'amq.new' contains reserved prefix 'amq.*'",
            ),
            (
                lambda ch: ch.declare_queue("q", arguments={"x-max-length": -1}),
                aio_pika.exceptions.ChannelPreconditionFailed,
                "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q' in vhost '/': "
                "{value_negative,-1}",
            ),
        ]
        for attempt, error, text in expectations:
            channel = await connection.channel()
            with pytest.raises(error) as info:
                await attempt(channel)
            assert info.value.args[0] == text
        owner = await aio_pika.connect(lev.url)
        async with owner:
            owner_channel = await owner.channel()
            await owner_channel.declare_queue("locked", exclusive=True)
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelLockedResource):
                await channel.declare_queue("locked", passive=True)
        channel = await connection.channel()
        await channel.declare_queue("after-errors", auto_delete=True)  # the connection lives


def test_kombu_channel_errors(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.channel()
        with pytest.raises(conn.channel_errors) as info:
            channel.queue_declare("missing", passive=True)
        assert info.value.code == 404
        assert "NOT_FOUND - no queue 'missing' in vhost '/'" in str(info.value)
        channel = conn.channel()
        with pytest.raises(conn.channel_errors) as info:
            channel.exchange_declare("", "direct")
        assert info.value.code == 403
        channel = conn.channel()
        channel.queue_declare("kombu-after", auto_delete=True)
        with pytest.raises(conn.connection_errors) as info:
            channel.basic_qos(prefetch_size=3, prefetch_count=0, a_global=False)
        assert info.value.code == 540
