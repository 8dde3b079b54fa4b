"""basic.*: consume, cancel, get, ack / nack / reject, recover and QoS, against Leveret and
RabbitMQ alike (`mq`, through pika and a raw frame client); then the same ground through
aio-pika and kombu."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

import aio_pika
import kombu
import pika
import pytest
from pamqp import commands

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from pika.adapters.blocking_connection import BlockingChannel


def _publish(ch: BlockingChannel, queue: str, count: int) -> None:
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode())


def _collect(mq: Amqp, ch: BlockingChannel, wanted: int, into: list[Any]) -> list[Any]:
    """Let pika dispatch deliveries until `into` has `wanted` items (and a little more)."""
    mq.wait(lambda: ch.connection.process_data_events(0.02) or len(into) >= wanted)
    ch.connection.process_data_events(0.1)  # anything beyond what is wanted shows up too
    return into


def test_round_robin_and_fifo(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    got: list[tuple[str, str]] = []
    consumers = mq.channel()
    for tag in ("a", "b", "c"):
        consumers.basic_consume(
            queue, lambda _c, m, _p, b: got.append((m.consumer_tag, b.decode())), auto_ack=True,
            consumer_tag=tag,
        )  # fmt: skip
    _publish(ch, queue, 9)
    assert _collect(mq, consumers, 9, got) == [
        ("a", "0"), ("b", "1"), ("c", "2"), ("a", "3"), ("b", "4"), ("c", "5"),
        ("a", "6"), ("b", "7"), ("c", "8"),
    ]  # fmt: skip


def test_prefetch_per_consumer(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 10)
    got: list[tuple[str, str]] = []
    consumers = mq.channel()
    # global=false: the limit of each consumer created afterwards.
    for tag, prefetch in (("a", 2), ("b", 3)):
        consumers.basic_qos(prefetch_count=prefetch)
        consumers.basic_consume(
            queue, lambda _c, m, _p, b: got.append((m.consumer_tag, b.decode())), consumer_tag=tag
        )
    assert _collect(mq, consumers, 5, got) == [
        ("a", "0"), ("a", "1"), ("b", "2"), ("b", "3"), ("b", "4"),
    ]  # fmt: skip
    assert mq.ready(queue) == 5


def test_global_prefetch_is_shared_by_the_channel(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 10)
    got: list[str] = []
    consumers = mq.channel()
    consumers.basic_qos(prefetch_count=3, global_qos=True)
    for tag in ("a", "b"):
        consumers.basic_consume(
            queue, lambda _c, m, _p, b: got.append(b.decode()), consumer_tag=tag
        )
    assert _collect(mq, consumers, 3, got) == ["0", "1", "2"]
    assert mq.ready(queue) == 7


def test_global_and_per_consumer_prefetch_together(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 10)
    got: list[tuple[str, str]] = []
    consumers = mq.channel()
    consumers.basic_qos(prefetch_count=4, global_qos=True)
    consumers.basic_qos(prefetch_count=1, global_qos=False)
    tags = []
    for tag in ("a", "b"):
        consumers.basic_consume(
            queue, lambda _c, m, _p, b: (got.append((m.consumer_tag, b.decode())),
                                         tags.append(m.delivery_tag)),
            consumer_tag=tag,
        )  # fmt: skip
    assert _collect(mq, consumers, 2, got) == [("a", "0"), ("b", "1")]
    consumers.basic_ack(tags[0])
    assert _collect(mq, consumers, 3, got)[2] == ("a", "2")


def test_basic_get_does_not_count_against_global_prefetch(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 10)
    consumers = mq.channel()
    consumers.basic_qos(prefetch_count=2, global_qos=True)
    consumers.basic_get(queue)
    consumers.basic_get(queue)
    got: list[str] = []
    consumers.basic_consume(queue, lambda _c, _m, _p, b: got.append(b.decode()))
    assert _collect(mq, consumers, 2, got) == ["2", "3"]


def test_acks_release_prefetch(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 6)
    got: list[str] = []
    tags: list[int] = []
    consumer = mq.channel()
    consumer.basic_qos(prefetch_count=2)
    consumer.basic_consume(
        queue, lambda _c, m, _p, b: (got.append(b.decode()), tags.append(m.delivery_tag))
    )
    assert _collect(mq, consumer, 2, got) == ["0", "1"]
    consumer.basic_ack(tags[-1], multiple=True)
    assert _collect(mq, consumer, 4, got) == ["0", "1", "2", "3"]
    consumer.basic_nack(tags[-1], multiple=True, requeue=True)
    assert _collect(mq, consumer, 6, got) == ["0", "1", "2", "3", "2", "3"]


def test_no_ack_consumer(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=1)  # does not limit a no-ack consumer
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    _publish(ch, queue, 5)
    assert len(_collect(mq, ch, 5, got)) == 5
    assert ch.queue_declare(queue, passive=True).method.message_count == 0


def test_server_generated_consumer_tag_and_tag_reuse(mq: Amqp) -> None:
    queue = mq.uid("q")
    mq.channel().queue_declare(queue, auto_delete=False)
    raw = mq.raw()
    raw.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag=""))
    tag = raw.expect(commands.Basic.ConsumeOk).consumer_tag
    assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag)
    raw.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag=tag))
    close = raw.expect(commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (
        530,
        f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'",
    )
    assert (close.class_id, close.method_id) == (60, 20)


def test_cancel(mq: Amqp) -> None:
    queue = mq.uid("q")
    mq.channel().queue_declare(queue)
    raw = mq.raw()
    raw.send_method(1, commands.Basic.Cancel(consumer_tag="never-consumed"))
    assert raw.expect(commands.Basic.CancelOk).consumer_tag == "never-consumed"
    raw.send_method(1, commands.Basic.Consume(queue=queue, consumer_tag="mine"))
    raw.expect(commands.Basic.ConsumeOk)
    raw.send_method(1, commands.Basic.Cancel(consumer_tag="mine"))
    assert raw.expect(commands.Basic.CancelOk).consumer_tag == "mine"
    ch = mq.channel()
    assert ch.queue_declare(queue, passive=True).method.consumer_count == 0


def test_cancelled_consumers_unacked_messages_stay_until_the_channel_closes(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 3)
    consumer = mq.channel()
    got: list[bytes] = []
    consumer.basic_consume(queue, lambda _c, _m, _p, b: got.append(b), consumer_tag="c")
    _collect(mq, consumer, 3, got)
    consumer.basic_cancel("c")
    assert mq.ready(queue) == 0
    consumer.close()
    mq.wait(lambda: mq.ready(queue) == 3)
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)


def test_exclusive_consumer(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(queue, lambda *_: None)
    in_use = (403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")
    assert mq.soft_error(lambda: ch.basic_consume(queue, lambda *_: None, exclusive=True)) == in_use
    ch = mq.channel()
    other = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(other, lambda *_: None, exclusive=True)
    assert mq.soft_error(lambda: ch.basic_consume(other, lambda *_: None)) == (
        403,
        f"ACCESS_REFUSED - queue '{other}' in vhost '/' in exclusive use",
    )


def test_consume_and_get_on_a_missing_queue(mq: Amqp) -> None:
    missing = mq.uid("missing")
    not_found = (404, f"NOT_FOUND - no queue '{missing}' in vhost '/'")
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.basic_consume(missing, lambda *_: None)) == not_found
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.basic_get(missing)) == not_found


def test_get_and_get_empty(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    assert ch.basic_get(queue) == (None, None, None)
    ch.basic_publish("amq.direct", "nobody", b"x")
    props = pika.BasicProperties(content_type="text/plain", headers={"k": "v"}, priority=3)
    ch.basic_publish("", queue, b"first", props)
    ch.basic_publish("", queue, b"second")
    method, got_props, body = ch.basic_get(queue)
    seen = (body, method.message_count, method.redelivered, method.exchange, method.routing_key)
    assert seen == (b"first", 1, False, "", queue)
    assert (got_props.content_type, got_props.headers, got_props.priority) == (
        "text/plain", {"k": "v"}, 3,
    )  # fmt: skip
    assert method.delivery_tag == 1
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert (body, method.message_count, method.delivery_tag) == (b"second", 0, 2)


def test_ack_nack_reject_requeue_and_redelivered(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 6)
    tags = [ch.basic_get(queue)[0].delivery_tag for _ in range(6)]
    assert tags == [1, 2, 3, 4, 5, 6]
    ch.basic_ack(1)
    ch.basic_nack(2, requeue=True)
    ch.basic_reject(4, requeue=True)
    ch.basic_nack(3, multiple=True, requeue=False)  # 3 only: 1 and 2 are settled
    ch.basic_ack(6, multiple=True)  # 5 and 6
    got = []
    while (result := ch.basic_get(queue, auto_ack=True))[0] is not None:
        method, _props, body = result
        got.append((body, method.redelivered, method.message_count))
    # Requeued messages go back to their place in the queue, marked redelivered.
    assert got == [(b"1", True, 1), (b"3", True, 0)]


@pytest.mark.parametrize(
    ("settle", "tag", "back"),
    [
        pytest.param(lambda ch: ch.basic_ack(99), 99, 2, id="ack"),
        pytest.param(lambda ch: ch.basic_nack(99), 99, 2, id="nack"),
        pytest.param(lambda ch: ch.basic_reject(99), 99, 2, id="reject"),
        pytest.param(lambda ch: (ch.basic_ack(1), ch.basic_ack(1)), 1, 1, id="twice"),
        pytest.param(
            lambda ch: (ch.basic_ack(1), ch.basic_ack(1, multiple=True)), 1, 1, id="acked-multiple"
        ),
        pytest.param(lambda ch: ch.basic_ack(0), 0, 2, id="zero-single"),
        pytest.param(lambda ch: ch.basic_ack(5, multiple=True), 5, 2, id="multiple-unknown"),
    ],
)
def test_unknown_delivery_tag(mq: Amqp, settle: Any, tag: int, back: int) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare(mq.uid("q"), exclusive=True).method.queue
    _publish(ch, queue, 2)
    ch.basic_get(queue)
    ch.basic_get(queue)
    settle(ch)
    assert mq.soft_error(lambda: ch.queue_declare(queue, passive=True)) == (
        406,
        f"PRECONDITION_FAILED - unknown delivery tag {tag}",
    )
    # Only the channel closed: its unacked messages went back, the connection lives on.
    assert mq.wait(lambda: mq.ready(queue) == back)


def test_multiple_with_tag_zero_settles_everything(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 3)
    for _ in range(3):
        ch.basic_get(queue)
    ch.basic_nack(0, multiple=True, requeue=True)
    mq.wait(lambda: mq.ready(queue) == 3)  # (RabbitMQ requeues asynchronously)
    for _ in range(3):
        ch.basic_get(queue)
    ch.basic_ack(0, multiple=True)
    ch.basic_ack(0, multiple=True)  # nothing left: still fine
    assert ch.queue_declare(queue, passive=True).method.message_count == 0


def test_recover(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    _publish(ch, queue, 2)
    ch.basic_get(queue)
    ch.basic_get(queue)
    ch.basic_recover(requeue=True)
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)
    raw = mq.raw()
    raw.send_method(1, commands.Basic.Recover(requeue=False))
    close = raw.expect(commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")


@pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")
def test_recover_async(mq: Amqp) -> None:
    queue = mq.uid("q")
    ch = mq.channel(confirm=True)
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"m")
    raw = mq.raw()
    raw.send_method(1, commands.Basic.Get(queue=queue))
    assert raw.expect(commands.Basic.GetOk).redelivered is False
    raw.send_method(1, commands.Basic.RecoverAsync(requeue=True))  # no reply
    raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
    get_ok = raw.methods(1)[0]
    assert isinstance(get_ok, commands.Basic.GetOk)
    assert get_ok.redelivered is True


def test_qos_prefetch_size_is_not_implemented(mq: Amqp) -> None:
    ch = mq.channel()
    assert mq.hard_error(lambda: ch.basic_qos(prefetch_size=10)) == (
        540,
        "NOT_IMPLEMENTED - prefetch_size!=0 (10)",
    )


def test_immediate_is_not_implemented(mq: Amqp) -> None:
    raw = mq.raw()
    raw.publish(1, b"m", "", "nowhere", immediate=True)
    close = raw.expect(commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")
    assert (close.class_id, close.method_id) == (60, 40)


def test_unacked_messages_are_redelivered_when_the_connection_closes(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = mq.uid("q")
    ch.queue_declare(queue)
    _publish(ch, queue, 2)
    conn = mq.connection()
    other = conn.channel()
    other.basic_get(queue)
    conn.close()
    mq.wait(lambda: mq.ready(queue) == 2)
    bodies = []
    while (result := ch.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append((result[2], result[0].redelivered))
    assert bodies == [(b"0", True), (b"1", False)]


async def test_aio_pika_consume_prefetch_and_requeue(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=2)
        queue = await channel.declare_queue("", exclusive=True)
        for i in range(4):
            await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
        seen: list[tuple[bytes, bool]] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            seen.append((message.body, message.redelivered))
            if message.body == b"1" and not message.redelivered:
                await message.nack(requeue=True)
            else:
                await message.ack()
            if len(seen) == 5:
                done.set()

        tag = await queue.consume(on_message)
        assert tag.startswith("ctag")
        await asyncio.wait_for(done.wait(), 5)
        assert sorted(seen) == [
            (b"0", False), (b"1", False), (b"1", True), (b"2", False), (b"3", False),
        ]  # fmt: skip
        await queue.cancel(tag)
        assert (
            await channel.declare_queue(queue.name, passive=True)
        ).declaration_result.message_count == 0


async def test_aio_pika_queue_iterator_and_get(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("", exclusive=True)
        for i in range(3):
            await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
        first = await queue.get(timeout=5)
        assert first.body == b"0"
        await first.reject(requeue=True)
        bodies = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    bodies.append((message.body, message.redelivered))
                if len(bodies) == 3:
                    break
        assert bodies == [(b"0", True), (b"1", False), (b"2", False)]
        assert await queue.get(fail=False) is None


def test_kombu_consumer_prefetch_and_requeue(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        queue = kombu.Queue("k-basic", kombu.Exchange("k-basic-x", "direct"), "k")
        with conn.Producer() as producer:
            for i in range(3):
                producer.publish(
                    {"n": i}, exchange=queue.exchange, routing_key="k", declare=[queue]
                )
        seen: list[tuple[int, bool]] = []

        def on_message(body: dict[str, int], message: kombu.Message) -> None:
            seen.append((body["n"], message.delivery_info["redelivered"]))
            if body["n"] == 0 and not message.delivery_info["redelivered"]:
                message.requeue()
            else:
                message.ack()

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=1, accept=["json"]):
            while len(seen) < 4:
                conn.drain_events(timeout=5)
        assert seen == [(0, False), (0, True), (1, False), (2, False)]


def test_kombu_server_generated_consumer_tag(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.default_channel
        name = channel.queue_declare("", exclusive=True).queue
        tag = channel.basic_consume(name, callback=lambda message: None)
        assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag)
        channel.basic_cancel(tag)
