"""Classic queue arguments: validation texts, TTLs, x-expires, length limits and overflow,
priorities and single active consumer, against Leveret and RabbitMQ alike (`mq`).

Timing tests use TTLs of 100-300 ms and poll with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aio_pika
import kombu
import pika
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp

INVALID_ARGS = [
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-message-ttl": 315360000001}, "x-message-ttl", "{value_too_large,315360000001}"),
    ({"x-message-ttl": "x"}, "x-message-ttl", '"expected integer, got longstr"'),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -5}, "x-expires", "{value_negative,-5}"),
    ({"x-expires": True}, "x-expires", '"expected integer, got bool"'),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "a"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-overflow": "bogus"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 3}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-single-active-consumer": 1}, "x-single-active-consumer",
     "{unacceptable_type,signedint}"),
    ({"x-single-active-consumer": "true"}, "x-single-active-consumer",
     "{unacceptable_type,longstr}"),
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key",
     "routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": "x", "x-dead-letter-routing-key": 5},
     "x-dead-letter-routing-key", "{unacceptable_type,signedint}"),
    ({"x-queue-type": "bogus"}, "x-queue-type", "\"unsupported queue type 'bogus'\""),
]  # fmt: skip


@pytest.mark.parametrize(("arguments", "key", "error"), INVALID_ARGS)
def test_invalid_arguments(mq: Amqp, arguments: dict[str, object], key: str, error: str) -> None:
    ch = mq.channel()
    queue = mq.uid("q")
    assert mq.soft_error(lambda: ch.queue_declare(queue, arguments=arguments)) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/': {error}",
    )


def test_argument_of_another_queue_type(mq: Amqp) -> None:
    ch = mq.channel()
    queue = mq.uid("q")
    assert mq.soft_error(lambda: ch.queue_declare(queue, arguments={"x-max-age": "1D"})) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '{queue}' in vhost '/' of "
        "queue type rabbit_classic_queue",
    )


def test_dead_letter_exchange_must_be_a_string(mq: Amqp) -> None:
    ch = mq.channel()
    queue = mq.uid("q")
    # Checked before the other arguments, with its own text.
    arguments = {"x-dead-letter-exchange": 5, "x-max-length": -1}
    assert mq.soft_error(lambda: ch.queue_declare(queue, arguments=arguments)) == (
        406,
        f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in "
        f"queue '{queue}' in vhost '/'",
    )


@pytest.mark.parametrize(
    ("expiration", "error"),
    [
        ("abc", "no_integer"),
        ("", "no_integer"),
        (" 5", "no_integer"),
        ("10x", '{leftover_string,"x"}'),
        ("1.5", '{leftover_string,".5"}'),
        ("-5", "{value_negative,-5}"),
        ("315360000001", "{value_too_large,315360000001}"),
    ],
)
def test_invalid_per_message_expiration(mq: Amqp, expiration: str, error: str) -> None:
    ch = mq.channel()
    ch.basic_publish("", mq.uid("nowhere"), b"m", pika.BasicProperties(expiration=expiration))
    assert mq.soft_error(lambda: ch.queue_declare("", exclusive=True)) == (
        406,
        f"PRECONDITION_FAILED - invalid expiration '{expiration}': {error}",
    )


def test_valid_per_message_expirations(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    for expiration in ("+60000", "007000", "0", "60000"):
        ch.basic_publish(
            "", queue, expiration.encode(), pika.BasicProperties(expiration=expiration)
        )
    assert mq.drain(ch, queue) == [b"+60000", b"007000", b"60000"]  # "0" expired at once


def test_queue_ttl_and_message_ttl(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-message-ttl": 150}).method.queue
    ch.basic_publish("", queue, b"queue-ttl")
    ch.basic_publish("", queue, b"msg-ttl-longer", pika.BasicProperties(expiration="60000"))
    short = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", short, b"msg-ttl", pika.BasicProperties(expiration="150"))
    ch.basic_publish("", short, b"no-ttl")
    assert mq.ready(queue) == 2
    started = time.monotonic()
    mq.wait(lambda: mq.ready(queue) == 0)  # the smaller of the two TTLs applies
    assert mq.drain(ch, short) in ([b"no-ttl"], [b"msg-ttl", b"no-ttl"])
    assert time.monotonic() - started < 2.5


def test_expiry_only_at_the_head(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"long", pika.BasicProperties(expiration="5000"))
    ch.basic_publish("", queue, b"short", pika.BasicProperties(expiration="50"))
    time.sleep(0.2)
    # The expired message behind a live head is still counted, and dropped when it reaches
    # the head.
    assert mq.ready(queue) == 2
    assert mq.drain(ch, queue) == [b"long"]


def test_ttl_zero(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-message-ttl": 0}).method.queue
    ch.basic_publish("", queue, b"no-consumer: dropped")
    assert mq.ready(queue) == 0
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    ch.basic_publish("", queue, b"ready consumer: delivered")
    mq.wait(lambda: ch.connection.process_data_events(0.02) or got)
    assert got == [b"ready consumer: delivered"]


def test_requeued_expired_message_is_dropped(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-message-ttl": 100}).method.queue
    ch.basic_publish("", queue, b"m")
    method, _props, _body = ch.basic_get(queue)
    time.sleep(0.2)  # expires while unacked: nothing happens until it is back in the queue
    ch.basic_nack(method.delivery_tag, requeue=True)
    mq.wait(lambda: mq.ready(queue) == 0)
    assert mq.drain(ch, queue) == []


def _still_there(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> bool:
    """Probe a queue without using it: a passive declare or a get would restart x-expires,
    a mandatory publish in confirm mode does not."""
    try:
        ch.basic_publish("", queue, b"probe", mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


def test_x_expires(mq: Amqp) -> None:
    ch = mq.channel()
    probe = mq.channel(confirm=True)
    idle = mq.uid("idle")
    ch.queue_declare(idle, arguments={"x-expires": 300})
    started = time.monotonic()
    time.sleep(0.2)
    ch.queue_declare(idle, passive=True)  # a declare counts as use: the timer restarts
    time.sleep(0.2)
    assert _still_there(probe, idle)
    mq.wait(lambda: not _still_there(probe, idle))
    assert time.monotonic() - started >= 0.45

    used = mq.uid("used")
    ch.queue_declare(used, arguments={"x-expires": 200})
    tag = ch.basic_consume(used, lambda *_: None)
    time.sleep(0.35)
    assert _still_there(probe, used)  # never expires while it has a consumer
    ch.basic_cancel(tag)
    mq.wait(lambda: not _still_there(probe, used))


def test_max_length_drop_head(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-max-length": 2}).method.queue
    for i in range(5):
        ch.basic_publish("", queue, str(i).encode())
    assert mq.drain(ch, queue) == [b"3", b"4"]


def test_max_length_bytes_drop_head(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    results = []
    for sizes in ([11], [5, 5, 11], [5, 5, 6], [3, 3, 3, 3], [10, 1]):
        args = {"x-max-length-bytes": 10}
        queue = ch.queue_declare("", exclusive=True, arguments=args).method.queue
        for i, size in enumerate(sizes):
            ch.basic_publish("", queue, bytes([65 + i]) * size)
        results.append([f"{body[:1].decode()}{len(body)}" for body in mq.drain(ch, queue)])
    assert results == [[], [], ["C6"], ["B3", "C3", "D3"], ["B1"]]


def test_max_length_counts_ready_messages_only(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-max-length": 1}).method.queue
    ch.basic_publish("", queue, b"a")
    ch.basic_get(queue)  # unacked: not counted
    ch.basic_publish("", queue, b"b")
    ch.basic_publish("", queue, b"c")
    assert mq.ready(queue) == 1
    ch.basic_recover(requeue=True)  # "a" comes back at the head, over the limit: dropped
    assert mq.drain(ch, queue) == [b"c"]


def test_reject_publish(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    returned: list[int] = []
    ch.add_on_return_callback(lambda _c, method, _p, _b: returned.append(method.reply_code))
    args = {"x-max-length": 1, "x-overflow": "reject-publish"}
    queue = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    ch.basic_publish("", queue, b"1", mandatory=True)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", queue, b"2", mandatory=True)  # nacked, and not returned
    ch.connection.process_data_events(0.05)
    assert returned == []
    unconfirmed = mq.channel()
    unconfirmed.basic_publish("", queue, b"3")  # no confirms: silently dropped
    assert mq.drain(unconfirmed, queue) == [b"1"]  # (gets on that channel come after it)
    ch.basic_publish("", queue, b"4")  # room again
    assert mq.drain(ch, queue) == [b"4"]


def test_reject_publish_counts_bytes(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    args = {"x-max-length-bytes": 4, "x-overflow": "reject-publish"}
    queue = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    ch.basic_publish("", queue, b"abc")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", queue, b"de")
    ch.basic_publish("", queue, b"d")
    assert mq.drain(ch, queue) == [b"abc", b"d"]


def test_max_priority(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 5}).method.queue
    for i, priority in enumerate([None, 1, 5, 9, 3, 0, 5]):
        props = pika.BasicProperties(priority=priority)
        ch.basic_publish("", queue, f"{i}:{priority}".encode(), props)
    # Highest first, FIFO within a priority; 9 counts as 5 (the max), none as 0.
    assert [b.decode() for b in mq.drain(ch, queue)] == [
        "2:5", "3:9", "6:5", "4:3", "1:1", "0:None", "5:0",
    ]  # fmt: skip


def test_single_active_consumer(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    args = {"x-single-active-consumer": True}
    queue = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    got: list[tuple[str, bytes]] = []
    consumers = mq.channel()
    for tag in ("first", "second"):
        consumers.basic_consume(
            queue,
            lambda _c, m, _p, body: got.append((m.consumer_tag, body)),
            auto_ack=True,
            consumer_tag=tag,
        )
    for i in range(3):
        ch.basic_publish("", queue, str(i).encode())
    mq.wait(lambda: consumers.connection.process_data_events(0.02) or len(got) == 3)
    consumers.basic_cancel("first")
    for i in range(3, 5):
        ch.basic_publish("", queue, str(i).encode())
    mq.wait(lambda: consumers.connection.process_data_events(0.02) or len(got) == 5)
    assert got == [
        ("first", b"0"), ("first", b"1"), ("first", b"2"), ("second", b"3"), ("second", b"4"),
    ]  # fmt: skip
    assert ch.queue_declare(queue, passive=True).method.consumer_count == 1


async def test_aio_pika_message_ttl_and_max_length(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            "", exclusive=True, arguments={"x-max-length": 2, "x-message-ttl": 60000}
        )
        for i in range(3):
            await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), queue.name)
        short = await channel.declare_queue("", exclusive=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"gone", expiration=0.1), short.name
        )
        first = await queue.get(no_ack=True)
        second = await queue.get(no_ack=True)
        assert (first.body, second.body) == (b"1", b"2")
        deadline = time.monotonic() + 3
        while (
            await channel.declare_queue(short.name, passive=True)
        ).declaration_result.message_count:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)


def test_kombu_queue_arguments(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.channel()
        queue = kombu.Queue(
            "k-args",
            kombu.Exchange("k-args-x", "direct"),
            "k",
            channel=channel,
            queue_arguments={
                "x-max-priority": 3,
                "x-overflow": "reject-publish",
                "x-max-length": 2,
            },
        )
        queue.declare()
        producer = kombu.Producer(channel)
        for priority in (1, 3, 2):
            producer.publish(
                {"p": priority}, exchange="k-args-x", routing_key="k", priority=priority
            )
        payloads = []
        while (message := queue.get(no_ack=True)) is not None:
            payloads.append(message.payload["p"])
        assert payloads == [3, 1]  # the third publish was rejected (queue full)
        queue.delete()
