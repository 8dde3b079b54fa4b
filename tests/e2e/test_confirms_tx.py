"""Publisher confirms, mandatory returns and transactions, against Leveret and RabbitMQ alike
(`mq`, through a raw frame client where the order of frames matters, and pika); then through
aio-pika and kombu."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aio_pika
import kombu
import pika
import pytest
from kombu.transport.pyamqp import amqp as py_amqp  # py-amqp, as kombu imports it
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from support.rawamqp import RawClient


def _acked(raw: RawClient, count: int) -> tuple[list[int], list[Any]]:
    """Read basic.ack frames until tags 1..count are confirmed; (tags covered, frames)."""
    covered: set[int] = set()
    frames = []
    while len(covered) < count:
        ack = raw.expect(commands.Basic.Ack)
        frames.append(ack)
        low = ack.delivery_tag if not ack.multiple else 1
        new = set(range(low, ack.delivery_tag + 1)) - covered
        assert ack.delivery_tag not in covered, f"tag {ack.delivery_tag} confirmed twice"
        covered |= new
    return sorted(covered), frames


def test_confirms_are_numbered_from_one(mq: Amqp) -> None:
    queue = mq.uid("q")
    mq.channel().queue_declare(queue, auto_delete=True)
    raw = mq.raw()
    raw.send_method(1, commands.Confirm.Select())
    raw.expect(commands.Confirm.SelectOk)
    for expected in (1, 2, 3):
        raw.publish(1, b"m", "", queue)
        ack = raw.expect(commands.Basic.Ack)
        assert (ack.delivery_tag, ack.multiple) == (expected, False)
    raw.publish(1, b"m", "amq.direct", "unroutable")  # routed nowhere: acked at once
    assert raw.expect(commands.Basic.Ack).delivery_tag == 4


def test_a_burst_is_confirmed_completely(mq: Amqp) -> None:
    queue = mq.uid("q")
    mq.channel().queue_declare(queue, auto_delete=True)
    raw = mq.raw()
    raw.send_method(1, commands.Confirm.Select())
    raw.expect(commands.Confirm.SelectOk)
    raw.send(b"".join(
        frame for i in range(50) for frame in raw.publish_frames(1, str(i).encode(), "", queue)
    ))
    covered, acks = _acked(raw, 50)
    assert covered == list(range(1, 51))
    if mq.is_leveret:
        # Leveret confirms what arrived in one read at once: ack(multiple) coalescing.
        assert len(acks) < 50
        assert any(ack.multiple for ack in acks)


def test_mandatory_return_comes_before_the_ack(mq: Amqp) -> None:
    raw = mq.raw()
    raw.send_method(1, commands.Confirm.Select())
    raw.expect(commands.Confirm.SelectOk)
    key = mq.uid("nowhere")
    raw.publish(1, b"payload", "amq.direct", key, mandatory=True)
    returned = raw.expect(commands.Basic.Return)
    assert (returned.reply_code, returned.reply_text, returned.exchange, returned.routing_key) == (
        312, "NO_ROUTE", "amq.direct", key,
    )  # fmt: skip
    raw.expect(ContentHeader)
    assert raw.expect(ContentBody).value == b"payload"
    ack = raw.expect(commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_nack_when_a_queue_rejects(mq: Amqp) -> None:
    queue = mq.uid("q")
    args = {"x-max-length": 1, "x-overflow": "reject-publish"}
    mq.channel().queue_declare(queue, auto_delete=True, arguments=args)
    other = mq.uid("q")
    mq.channel().queue_declare(other, auto_delete=True)
    raw = mq.raw()
    raw.send_method(1, commands.Confirm.Select())
    raw.expect(commands.Confirm.SelectOk)
    raw.publish(1, b"fits", "", queue)
    assert raw.expect(commands.Basic.Ack).delivery_tag == 1
    raw.publish(1, b"refused", "", queue, mandatory=True)
    nack = raw.expect(commands.Basic.Nack)  # no basic.return: the message was routed
    # Nacks are always coalesced (a lone ack is not): nothing below 2 is unconfirmed.
    assert (nack.delivery_tag, nack.multiple) == (2, True)
    raw.publish(1, b"fine", "", other)
    assert raw.expect(commands.Basic.Ack).delivery_tag == 3


def test_confirms_with_pika(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", queue, str(i).encode())
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("amq.direct", mq.uid("nowhere"), b"x", mandatory=True)
    [returned] = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text, returned.body) == (
        312, "NO_ROUTE", b"x",
    )  # fmt: skip
    assert ch.queue_declare(queue, passive=True).method.message_count == 20


def test_mode_clashes(mq: Amqp) -> None:
    ch = mq.channel()
    ch.confirm_delivery()
    assert mq.soft_error(ch.tx_select) == (
        406,
        "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
    )
    ch = mq.channel()
    ch.tx_select()
    ch.tx_select()  # again: fine
    assert mq.soft_error(ch.confirm_delivery) == (
        406,
        "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
    )
    for call in ("tx_commit", "tx_rollback"):
        ch = mq.channel()
        assert mq.soft_error(getattr(ch, call)) == (
            406,
            "PRECONDITION_FAILED - channel is not transactional",
        )


def test_transactional_publishes(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", queue, b"a")
    ch.basic_publish("", queue, b"b")
    assert mq.ready(queue) == 0  # nothing until commit
    ch.tx_commit()
    assert mq.ready(queue) == 2
    ch.basic_publish("", queue, b"dropped")
    ch.tx_rollback()
    ch.tx_commit()  # an empty transaction
    assert mq.drain(ch, queue) == [b"a", b"b"]


def test_transactional_acks(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    for body in (b"0", b"1", b"2"):
        ch.basic_publish("", queue, body)
    tags = [ch.basic_get(queue)[0].delivery_tag for _ in range(3)]
    ch.tx_select()
    ch.basic_ack(tags[0])
    ch.basic_nack(tags[1], requeue=True)
    ch.tx_rollback()  # both deliveries are unacked again
    ch.basic_ack(tags[0])  # so this is no unknown tag
    ch.basic_reject(tags[2], requeue=True)
    ch.basic_publish("", queue, b"3")
    assert mq.ready(queue) == 0
    ch.tx_commit()
    ch.basic_recover(requeue=True)  # what is still unacked (tags[1]) comes back too
    bodies = []
    while (result := ch.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append((result[2], result[0].redelivered))
    assert bodies == [(b"1", True), (b"2", True), (b"3", False)]


def test_an_ack_inside_a_transaction_is_taken_at_once(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"m")
    tag = ch.basic_get(queue)[0].delivery_tag
    ch.tx_select()
    ch.basic_ack(tag)
    ch.basic_ack(tag)
    assert mq.soft_error(ch.tx_commit) == (406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
    assert mq.wait(lambda: mq.ready(queue) == 1)  # never committed: back in the queue


def test_transactional_ack_releases_prefetch_at_commit(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    for body in (b"0", b"1"):
        ch.basic_publish("", queue, body)
    consumer = mq.channel()
    consumer.basic_qos(prefetch_count=1)
    got: list[tuple[bytes, int]] = []
    consumer.basic_consume(queue, lambda _c, m, _p, b: got.append((b, m.delivery_tag)))
    mq.wait(lambda: consumer.connection.process_data_events(0.02) or got)
    consumer.tx_select()
    consumer.basic_ack(got[0][1])
    consumer.connection.process_data_events(0.2)
    assert [body for body, _tag in got] == [b"0"]
    consumer.tx_commit()
    mq.wait(lambda: consumer.connection.process_data_events(0.02) or len(got) == 2)
    assert [body for body, _tag in got] == [b"0", b"1"]


def test_mandatory_return_in_a_transaction(mq: Amqp) -> None:
    ch = mq.channel()
    returned: list[tuple[int, str, bytes]] = []
    ch.add_on_return_callback(
        lambda _c, m, _p, body: returned.append((m.reply_code, m.reply_text, body))
    )
    ch.tx_select()
    ch.basic_publish("amq.direct", mq.uid("nowhere"), b"m", mandatory=True)
    ch.connection.process_data_events(0.1)
    assert returned == []  # the publish happens at commit
    ch.tx_commit()
    mq.wait(lambda: ch.connection.process_data_events(0.02) or returned)
    assert returned == [(312, "NO_ROUTE", b"m")]


async def test_aio_pika_publisher_confirms(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        confirmations = await asyncio.gather(
            *(
                channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
                for i in range(100)
            )
        )
        assert all(isinstance(c, commands.Basic.Ack) for c in confirmations)
        full = await channel.declare_queue(
            "", exclusive=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
        )
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(aio_pika.Message(b"no room"), full.name)
        returning = await connection.channel(publisher_confirms=True, on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.PublishError) as info:
            await returning.default_exchange.publish(
                aio_pika.Message(b"lost", message_id="m-1"), "no-such-queue", mandatory=True
            )
        assert info.value.message.body == b"lost"
        assert (info.value.frame.reply_code, info.value.frame.reply_text) == (312, "NO_ROUTE")
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.declaration_result.message_count == 100


async def test_aio_pika_transaction(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue("", exclusive=True)
        async with channel.transaction():
            await channel.default_exchange.publish(aio_pika.Message(b"committed"), queue.name)
        tx = channel.transaction()
        await tx.select()
        await channel.default_exchange.publish(aio_pika.Message(b"rolled back"), queue.name)
        await tx.rollback()
        message = await queue.get(no_ack=True)
        assert message.body == b"committed"
        assert await queue.get(fail=False) is None


def test_kombu_confirm_publish(lev: Amqp) -> None:
    with kombu.Connection(lev.url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        queue = kombu.Queue(
            "k-confirm",
            kombu.Exchange("k-confirm-x", "direct"),
            "k",
            channel=channel,
            queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
        )
        queue.declare()
        producer = kombu.Producer(channel)
        producer.publish({"n": 1}, exchange="k-confirm-x", routing_key="k")
        with pytest.raises(py_amqp.exceptions.MessageNacked):
            producer.publish({"n": 2}, exchange="k-confirm-x", routing_key="k")
        message = queue.get(no_ack=True)
        assert message is not None and message.payload == {"n": 1}
        queue.delete()
