"""LavinMQ-style message deduplication on exchanges and queues."""

from __future__ import annotations

import time

import pika
import pytest
from support.amqp import channel_error, connect, consume
from support.brokers import InProcessBroker

DEDUP = {"x-message-deduplication": True}


def send(ch, exchange: str, key: str, body: bytes, dedup: object = None, **headers) -> None:  # type: ignore[no-untyped-def]
    if dedup is not None:
        headers["x-deduplication-header"] = dedup
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers or None))


def count(ch, queue: str) -> int:  # type: ignore[no-untyped-def]
    return ch.queue_declare(queue, passive=True).method.message_count


@pytest.fixture
def ch(broker: InProcessBroker):  # type: ignore[no-untyped-def]
    conn = connect(broker.port)
    channel = conn.channel()
    channel.confirm_delivery()
    yield channel
    conn.close()


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic", "headers"])
def test_exchange_drops_duplicates_before_routing(ch, exchange_type: str) -> None:  # type: ignore[no-untyped-def]
    ch.exchange_declare("x", exchange_type, arguments=DEDUP)
    for queue in ("q1", "q2"):
        ch.queue_declare(queue)
        ch.queue_bind(queue, "x", "k" if exchange_type != "fanout" else "")
    send(ch, "x", "k", b"a", dedup="id-1")
    send(ch, "x", "k", b"a again", dedup="id-1")  # confirmed (ack), never routed
    send(ch, "x", "k", b"b", dedup="id-2")
    send(ch, "x", "k", b"no header")
    send(ch, "x", "k", b"no header")
    assert count(ch, "q1") == 4 and count(ch, "q2") == 4


def test_mandatory_duplicate_is_returned_and_still_acked(ch) -> None:  # type: ignore[no-untyped-def]
    ch.exchange_declare("xm", "direct", arguments=DEDUP)
    ch.queue_declare("qm")
    ch.queue_bind("qm", "xm", "k")
    send(ch, "xm", "k", b"first", dedup=1)
    # pika raises UnroutableError for a message that came back with basic.return and was then
    # acked; a nack would raise NackError instead.
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish("xm", "k", b"dup", pika.BasicProperties(
            headers={"x-deduplication-header": 1}), mandatory=True)
    (returned,) = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text, returned.body) == (
        312, "NO_ROUTE", b"dup")
    assert count(ch, "qm") == 1


def test_queue_level_dedup_only_affects_that_queue(ch) -> None:  # type: ignore[no-untyped-def]
    ch.exchange_declare("fan", "fanout")
    ch.queue_declare("dedup-q", arguments=DEDUP)
    ch.queue_declare("plain-q")
    ch.queue_bind("dedup-q", "fan")
    ch.queue_bind("plain-q", "fan")
    for _ in range(3):
        send(ch, "fan", "", b"x", dedup="same")
    assert count(ch, "dedup-q") == 1
    assert count(ch, "plain-q") == 3


def test_values_are_compared_with_their_types(ch) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare("typed", arguments=DEDUP)
    send(ch, "", "typed", b"a", dedup="1")
    send(ch, "", "typed", b"b", dedup=1)
    send(ch, "", "typed", b"c", dedup=1)
    assert count(ch, "typed") == 2


def test_custom_header_name(ch) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare("custom", arguments={**DEDUP, "x-deduplication-header": "msg-id"})
    for _ in range(2):
        ch.basic_publish("", "custom", b"x", pika.BasicProperties(headers={"msg-id": "m1"}))
    send(ch, "", "custom", b"y", dedup="m1")  # the default header means nothing here
    assert count(ch, "custom") == 2


def test_cache_ttl_and_per_message_ttl(ch) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare("ttl", arguments={**DEDUP, "x-cache-ttl": 300})
    send(ch, "", "ttl", b"1", dedup="k")
    send(ch, "", "ttl", b"2", dedup="k")  # duplicate within the TTL
    send(ch, "", "ttl", b"3", dedup="short", **{"x-cache-ttl": 50})
    time.sleep(0.1)
    send(ch, "", "ttl", b"4", dedup="short")  # the per-message TTL (50 ms) has passed
    send(ch, "", "ttl", b"5", dedup="k")  # the default TTL (300 ms) has not
    time.sleep(0.35)
    send(ch, "", "ttl", b"6", dedup="k")  # now it has
    got = consume(ch.connection.channel(), "ttl", 10, timeout=0.5)
    assert [b for _m, _p, b in got] == [b"1", b"3", b"4", b"6"]


def test_cache_size_evicts_least_recently_used(ch) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare("lru", arguments={**DEDUP, "x-cache-size": 2})
    send(ch, "", "lru", b"a", dedup="a")
    send(ch, "", "lru", b"b", dedup="b")
    send(ch, "", "lru", b"a2", dedup="a")  # a duplicate: refreshes "a"
    send(ch, "", "lru", b"c", dedup="c")  # evicts "b", the least recently used
    send(ch, "", "lru", b"b2", dedup="b")  # new again; evicts "a"
    send(ch, "", "lru", b"a3", dedup="a")  # so "a" is new again too
    got = consume(ch.connection.channel(), "lru", 10, timeout=0.5)
    assert [b for _m, _p, b in got] == [b"a", b"b", b"c", b"b2", b"a3"]


def test_dedup_in_front_of_a_stream(ch) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare("ds", durable=True, arguments={"x-queue-type": "stream", **DEDUP})
    for body in (b"a", b"a", b"b"):
        send(ch, "", "ds", body, dedup=body.decode())
    got = consume(ch.connection.channel(), "ds", 5, arguments={"x-stream-offset": "first"},
                  timeout=0.5)
    assert [b for _m, _p, b in got] == [b"a", b"b"]


@pytest.mark.parametrize(("arguments", "key"), [
    ({"x-message-deduplication": "yes"}, "x-message-deduplication"),
    ({**DEDUP, "x-cache-size": -1}, "x-cache-size"),
    ({**DEDUP, "x-cache-size": "big"}, "x-cache-size"),
    ({**DEDUP, "x-cache-ttl": -5}, "x-cache-ttl"),
    ({**DEDUP, "x-deduplication-header": 7}, "x-deduplication-header"),
])
@pytest.mark.parametrize("kind", ["queue", "exchange"])
def test_invalid_arguments_are_406(broker: InProcessBroker, arguments, key: str, kind: str) -> None:  # type: ignore[no-untyped-def]
    conn = connect(broker.port)
    ch = conn.channel()
    if kind == "queue":
        code, text = channel_error(lambda: ch.queue_declare("bad", arguments=arguments))
    else:
        code, text = channel_error(lambda: ch.exchange_declare("bad", "direct",
                                                               arguments=arguments))
    assert code == 406
    assert f"invalid arg '{key}' for {kind} 'bad' in vhost '/'" in text
    conn.close()
