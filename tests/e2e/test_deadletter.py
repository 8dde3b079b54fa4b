"""Dead-lettering: reasons (rejected, expired, maxlen), the x-death header and the
x-first-death-* headers, dead-letter routing keys, repeated deaths and cycles, against
Leveret and RabbitMQ alike (`mq`).

RabbitMQ 3.10 has no x-last-death-* headers (they came in 3.13); Leveret targets 4.2 and
adds them, so they are checked on Leveret only.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import kombu
import pika
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from pika.adapters.blocking_connection import BlockingChannel


def _setup(mq: Amqp, ch: BlockingChannel, **queue_args: Any) -> tuple[str, str, str]:
    """A fanout DLX with a catch-all queue, and a source queue dead-lettering into it."""
    dlx, source, dead = mq.uid("dlx"), mq.uid("src"), mq.uid("dead")
    ch.exchange_declare(dlx, "fanout", auto_delete=True)
    ch.queue_declare(dead, exclusive=True)
    ch.queue_bind(dead, dlx)
    ch.queue_declare(
        source, exclusive=True, arguments={"x-dead-letter-exchange": dlx, **queue_args}
    )
    return dlx, source, dead


def _take(mq: Amqp, ch: BlockingChannel, queue: str) -> tuple[Any, Any, bytes]:
    """The next message of a queue, waiting for it (dead-lettering is asynchronous)."""
    got = mq.wait(lambda: (r := ch.basic_get(queue, auto_ack=True))[0] is not None and r)
    return got


def _deaths(props: Any) -> list[dict[str, Any]]:
    """x-death with each `time` checked (a recent timestamp) and removed."""
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    out = []
    for death in props.headers["x-death"]:
        death = dict(death)
        stamp = death.pop("time")
        assert isinstance(stamp, datetime.datetime)
        assert abs((stamp.replace(tzinfo=None) - now).total_seconds()) < 30
        out.append(death)
    return out


def _check_last_death(mq: Amqp, props: Any, reason: str, queue: str, exchange: str) -> None:
    headers = props.headers
    if mq.is_leveret:  # RabbitMQ >= 3.13 only
        assert (
            headers["x-last-death-reason"],
            headers["x-last-death-queue"],
            headers["x-last-death-exchange"],
        ) == (reason, queue, exchange)
    else:
        assert "x-last-death-reason" not in headers


def test_rejected_messages(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    dlx, source, dead = _setup(mq, ch)
    props = pika.BasicProperties(headers={"h": 1}, expiration="60000", message_id="m1")
    ch.basic_publish("", source, b"rejected", props)
    ch.basic_publish("", source, b"nacked")
    ch.basic_publish("", source, b"requeued")
    first = ch.basic_get(source)[0]
    second = ch.basic_get(source)[0]
    third = ch.basic_get(source)[0]
    ch.basic_reject(first.delivery_tag, requeue=False)
    ch.basic_nack(third.delivery_tag, requeue=True)  # requeue: not dead-lettered
    ch.basic_nack(second.delivery_tag, multiple=True, requeue=False)

    method, props, body = _take(mq, ch, dead)
    assert (body, method.exchange, method.routing_key) == (b"rejected", dlx, source)
    assert props.expiration is None  # moved to original-expiration
    assert props.message_id == "m1"
    assert _deaths(props) == [
        {
            "count": 1,
            "reason": "rejected",
            "queue": source,
            "exchange": "",
            "routing-keys": [source],
            "original-expiration": "60000",
        }
    ]
    assert props.headers["h"] == 1
    assert (
        props.headers["x-first-death-reason"],
        props.headers["x-first-death-queue"],
        props.headers["x-first-death-exchange"],
    ) == ("rejected", source, "")
    _check_last_death(mq, props, "rejected", source, "")

    method, props, body = _take(mq, ch, dead)
    assert body == b"nacked"
    assert _deaths(props) == [
        {"count": 1, "reason": "rejected", "queue": source, "exchange": "",
         "routing-keys": [source]}
    ]  # fmt: skip
    assert mq.drain(ch, dead) == []
    assert mq.drain(ch, source) == [b"requeued"]


def test_expired_messages(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    _dlx, source, dead = _setup(mq, ch, **{"x-message-ttl": 150})
    ch.basic_publish("amq.direct", "nobody", b"x")  # (unrelated traffic)
    ch.basic_publish("", source, b"queue-ttl")
    ch.basic_publish("", source, b"message-ttl", pika.BasicProperties(expiration="100"))
    _m, props, body = _take(mq, ch, dead)
    assert body == b"queue-ttl"
    assert _deaths(props) == [
        {"count": 1, "reason": "expired", "queue": source, "exchange": "",
         "routing-keys": [source]}
    ]  # fmt: skip
    _check_last_death(mq, props, "expired", source, "")
    _m, props, body = _take(mq, ch, dead)
    assert body == b"message-ttl"
    assert _deaths(props)[0]["original-expiration"] == "100"
    assert props.expiration is None


def test_maxlen_drop_head_and_reject_publish_dlx(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    dlx, source, dead = _setup(mq, ch, **{"x-max-length": 1})
    ch.basic_publish("", source, b"1")
    ch.basic_publish("", source, b"2")  # drops "1" from the head
    other = mq.uid("src2")
    args = {"x-dead-letter-exchange": dlx, "x-max-length": 1, "x-overflow": "reject-publish-dlx"}
    ch.queue_declare(other, exclusive=True, arguments=args)
    ch.basic_publish("", other, b"3")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", other, b"4")  # refused and dead-lettered
    _m, props, body = _take(mq, ch, dead)
    assert body == b"1"
    assert _deaths(props) == [
        {"count": 1, "reason": "maxlen", "queue": source, "exchange": "",
         "routing-keys": [source]}
    ]  # fmt: skip
    _m, props, body = _take(mq, ch, dead)
    assert body == b"4"
    assert _deaths(props) == [
        {"count": 1, "reason": "maxlen", "queue": other, "exchange": "",
         "routing-keys": [other]}
    ]  # fmt: skip
    assert mq.drain(ch, source) == [b"2"]
    assert mq.drain(ch, other) == [b"3"]


def test_dead_letter_routing_key(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    dlx = mq.uid("dlx")
    ch.exchange_declare(dlx, "direct", auto_delete=True)
    by_key, by_cc, with_dlrk, keep_keys = (mq.uid(n) for n in ("bykey", "bycc", "dlrk", "keep"))
    ch.queue_declare(by_key, exclusive=True)
    ch.queue_declare(by_cc, exclusive=True)
    ch.queue_bind(by_key, dlx, "dead")
    ch.queue_bind(by_cc, dlx, "cc1")
    args = {"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"}
    ch.queue_declare(with_dlrk, exclusive=True, arguments=args)
    ch.queue_declare(keep_keys, exclusive=True, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(keep_keys, "amq.direct", "orig")
    cc = pika.BasicProperties(headers={"CC": ["cc1"]})
    ch.basic_publish("", with_dlrk, b"with-dlrk", cc)
    ch.basic_publish("amq.direct", "orig", b"keep-keys", cc)
    for queue in (with_dlrk, keep_keys):
        ch.basic_reject(ch.basic_get(queue)[0].delivery_tag, requeue=False)

    # With a dead-letter routing key: only that key, and the CC header is removed.
    method, props, body = _take(mq, ch, by_key)
    assert (body, method.routing_key) == (b"with-dlrk", "dead")
    assert "CC" not in props.headers
    assert _deaths(props)[0]["routing-keys"] == [with_dlrk, "cc1"]
    # Without one: the original key and CC again (the original key reaches nothing here).
    method, props, body = _take(mq, ch, by_cc)
    assert (body, method.routing_key) == (b"keep-keys", "orig")
    assert props.headers["CC"] == ["cc1"]
    assert _deaths(props)[0]["routing-keys"] == ["orig", "cc1"]
    assert mq.drain(ch, by_key) == []
    assert mq.drain(ch, by_cc) == []


def test_repeated_deaths_count_and_order(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    dlx, first, second = mq.uid("dlx"), mq.uid("first"), mq.uid("second")
    ch.exchange_declare(dlx, "direct", auto_delete=True)
    ch.queue_declare(
        first,
        exclusive=True,
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "to-second"},
    )
    ch.queue_declare(
        second,
        exclusive=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": first},
    )
    ch.queue_bind(second, dlx, "to-second")
    ch.basic_publish("", first, b"ping-pong")
    for _round in range(2):
        method = mq.wait(lambda: ch.basic_get(first)[0])
        ch.basic_nack(method.delivery_tag, requeue=False)
        method = mq.wait(lambda: ch.basic_get(second)[0])
        ch.basic_nack(method.delivery_tag, requeue=False)
    _m, props, _body = _take(mq, ch, first)
    # Newest first; a repeated (queue, reason) pair counts up and moves to the front.
    assert _deaths(props) == [
        {"count": 2, "reason": "rejected", "queue": second, "exchange": dlx,
         "routing-keys": ["to-second"]},
        {"count": 2, "reason": "rejected", "queue": first, "exchange": "",
         "routing-keys": [first]},
    ]  # fmt: skip
    assert props.headers["x-first-death-queue"] == first
    _check_last_death(mq, props, "rejected", second, dlx)


def test_cycles(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    # Expiring back into the same queue, with no client in the loop: dropped.
    looping = mq.uid("loop")
    args = {"x-dead-letter-exchange": "", "x-message-ttl": 50}
    ch.queue_declare(looping, exclusive=True, arguments=args)
    ch.basic_publish("", looping, b"loop")
    time.sleep(0.3)
    assert mq.ready(looping) == 0
    # Rejections are a client's doing: the message comes back every time.
    rejected = mq.uid("rejected")
    ch.queue_declare(rejected, exclusive=True, arguments={"x-dead-letter-exchange": ""})
    ch.basic_publish("", rejected, b"again")
    for _round in range(3):
        method = mq.wait(lambda: ch.basic_get(rejected)[0])
        ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _body = _take(mq, ch, rejected)
    assert _deaths(props) == [
        {"count": 3, "reason": "rejected", "queue": rejected, "exchange": "",
         "routing-keys": [rejected]}
    ]  # fmt: skip


def test_missing_dead_letter_exchange_drops(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    source = mq.uid("src")
    args = {"x-dead-letter-exchange": mq.uid("missing")}
    ch.queue_declare(source, exclusive=True, arguments=args)
    ch.basic_publish("", source, b"m")
    ch.basic_reject(ch.basic_get(source)[0].delivery_tag, requeue=False)
    assert mq.drain(ch, source) == []


async def test_aio_pika_reject_to_dead_letter_exchange(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        dlx = await channel.declare_exchange("a-dlx", aio_pika.ExchangeType.FANOUT)
        dead = await channel.declare_queue("", exclusive=True)
        await dead.bind(dlx)
        source = await channel.declare_queue(
            "a-src", exclusive=True, arguments={"x-dead-letter-exchange": "a-dlx"}
        )
        await channel.default_exchange.publish(aio_pika.Message(b"bad"), "a-src")
        message = await source.get(timeout=5)
        await message.reject(requeue=False)
        dead_message = await dead.get(timeout=5)
        await dead_message.ack()
        assert dead_message.body == b"bad"
        [death] = dead_message.headers["x-death"]
        assert (death["reason"], death["queue"], death["count"]) == ("rejected", "a-src", 1)


def test_kombu_dead_letter_queue(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.channel()
        dead = kombu.Queue("k-dead", kombu.Exchange("k-dlx", "fanout"), channel=channel)
        dead.declare()
        work = kombu.Queue(
            "k-work",
            kombu.Exchange("k-work-x", "direct"),
            "w",
            channel=channel,
            queue_arguments={"x-dead-letter-exchange": "k-dlx"},
        )
        work.declare()
        kombu.Producer(channel).publish({"job": 1}, exchange="k-work-x", routing_key="w")
        message = work.get()
        assert message is not None
        message.reject(requeue=False)
        deadline = time.monotonic() + 3
        while (dead_message := dead.get(no_ack=True)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert dead_message.payload == {"job": 1}
        assert dead_message.headers["x-death"][0]["reason"] == "rejected"
