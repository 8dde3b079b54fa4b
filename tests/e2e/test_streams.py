"""Streams over AMQP 0.9.1 against Leveret: declaring, offsets, credit, filters, tracking."""

from __future__ import annotations

import datetime
import json
import time
import urllib.parse
from pathlib import Path

import aio_pika
import pika
import pytest
from support.amqp import channel_error, connect, connection_error, consume, drain, offsets
from support.brokers import InProcessBroker

STREAM = {"x-queue-type": "stream"}


def declare_stream(ch, name: str, **arguments) -> None:  # type: ignore[no-untyped-def]
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})


def publish(ch, name: str, bodies: list[bytes], headers=None) -> None:  # type: ignore[no-untyped-def]
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(headers=headers))


@pytest.fixture
def conn(broker: InProcessBroker):  # type: ignore[no-untyped-def]
    connection = connect(broker.port)
    yield connection
    if connection.is_open:
        connection.close()


def test_publish_with_confirms_and_consume_from_first(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "s")
    publish(ch, "s", [b"m%d" % i for i in range(20)])
    assert ch.queue_declare("s", passive=True).method.message_count == 20
    got = consume(conn.channel(), "s", 20, arguments={"x-stream-offset": "first"})
    assert [body for _m, _p, body in got] == [b"m%d" % i for i in range(20)]
    assert offsets(got) == list(range(20))
    assert all(not method.redelivered for method, _p, _b in got)


def test_offset_header_is_a_long(broker: InProcessBroker) -> None:
    """RabbitMQ sends x-stream-offset as AMQP type long ('l'); check the raw type octet."""
    import struct

    from pamqp import commands
    from support.rawamqp import FRAME_HEADER, open_client

    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "typed")
    publish(ch, "typed", [b"x"])
    conn.close()
    with open_client(broker.port) as raw:
        raw.send_method(1, commands.Basic.Qos(prefetch_count=1))
        raw.expect(commands.Basic.QosOk)
        raw.send_method(1, commands.Basic.Consume(
            queue="typed", consumer_tag="c", arguments={"x-stream-offset": "first"}))
        raw.expect(commands.Basic.ConsumeOk)
        raw.expect(commands.Basic.Deliver)
        header = raw.next_frame()
    assert header.type == FRAME_HEADER
    key = b"\x0fx-stream-offset"
    at = header.payload.index(key) + len(key)
    assert header.payload[at : at + 1] == b"l"
    assert struct.unpack(">q", header.payload[at + 1 : at + 9])[0] == 0


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("first", list(range(10))),
        ("next", []),
        (3, list(range(3, 10))),
        (-5, list(range(10))),
        (10, []),
        (1000, []),
    ],
)
def test_offset_specs(conn, spec, expected) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "o")
    publish(ch, "o", [b"%d" % i for i in range(10)])
    got = consume(conn.channel(), "o", len(expected) or 1, arguments={"x-stream-offset": spec},
                  timeout=0.5 if not expected else 5)
    assert offsets(got) == expected


def test_last_starts_at_the_last_chunk_and_next_only_gets_new(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "l")
    publish(ch, "l", [b"a", b"b"])  # one publish per confirm: one chunk each
    consumer_ch = conn.channel()
    consumer_ch.basic_qos(prefetch_count=10)
    last: list[int] = []
    nxt: list[int] = []
    consumer_ch.basic_consume("l", lambda c, m, p, b: last.append(p.headers["x-stream-offset"]),
                              arguments={"x-stream-offset": "last"})
    consumer_ch.basic_consume("l", lambda c, m, p, b: nxt.append(p.headers["x-stream-offset"]),
                              arguments={"x-stream-offset": "next"})
    drain(conn, lambda: bool(last), 2)
    publish(ch, "l", [b"c"])
    drain(conn, lambda: len(nxt) >= 1 and len(last) >= 2, 3)
    assert last == [1, 2]
    assert nxt == [2]


def test_timestamp_and_interval_offsets(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "ts")
    publish(ch, "ts", [b"old"])
    time.sleep(1.1)
    now = datetime.datetime.now(tz=datetime.UTC)
    publish(ch, "ts", [b"new"])
    got = consume(conn.channel(), "ts", 1, arguments={"x-stream-offset": now})
    assert [b for _m, _p, b in got] == [b"new"]
    got = consume(conn.channel(), "ts", 2, arguments={"x-stream-offset": "1h"})
    assert [b for _m, _p, b in got] == [b"old", b"new"]
    future = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(hours=1)
    got = consume(conn.channel(), "ts", 1, arguments={"x-stream-offset": future}, timeout=0.5)
    assert got == []


def test_credit_never_exceeds_prefetch_and_acks_free_it(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "c")
    publish(ch, "c", [b"%d" % i for i in range(10)])
    cch = conn.channel()
    cch.basic_qos(prefetch_count=3)
    got: list[pika.spec.Basic.Deliver] = []
    cch.basic_consume("c", lambda c, m, p, b: got.append(m), arguments={"x-stream-offset": "first"})
    drain(conn, lambda: False, 0.5)
    assert len(got) == 3
    cch.basic_ack(got[0].delivery_tag)
    drain(conn, lambda: False, 0.3)
    assert len(got) == 4
    cch.basic_ack(got[-1].delivery_tag, multiple=True)
    drain(conn, lambda: False, 0.3)
    assert len(got) == 7


def test_nack_and_reject_neither_requeue_nor_delete(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "n")
    publish(ch, "n", [b"a", b"b", b"c"])
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    got: list[bytes] = []

    def on_message(c, m, p, b) -> None:  # type: ignore[no-untyped-def]
        got.append(b)
        if b == b"a":
            c.basic_nack(m.delivery_tag, requeue=True)
        elif b == b"b":
            c.basic_reject(m.delivery_tag, requeue=False)
        else:
            c.basic_ack(m.delivery_tag)

    cch.basic_consume("n", on_message, arguments={"x-stream-offset": "first"})
    drain(conn, lambda: len(got) >= 3, 2)
    drain(conn, lambda: False, 0.3)
    assert got == [b"a", b"b", b"c"]
    assert cch.is_open
    assert ch.queue_declare("n", passive=True).method.message_count == 3


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"x-stream-filter": "apple"}, [b"apple-0", b"apple-1"]),
        ({"x-stream-filter": ["apple", "banana"]}, [b"apple-0", b"banana-0", b"apple-1"]),
        ({"x-stream-filter": "apple", "x-stream-match-unfiltered": True},
         [b"apple-0", b"plain-0", b"apple-1"]),
        ({}, [b"apple-0", b"banana-0", b"plain-0", b"apple-1"]),
    ],
)
def test_filters_deliver_exactly_the_wanted_messages(conn, arguments, expected) -> None:  # type: ignore[no-untyped-def]
    """Leveret drops bloom false positives on the server: a filtering consumer gets exactly
    its messages (RabbitMQ would also deliver the other messages of a matching chunk)."""
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "f")
    # All in one chunk: without exact filtering, a chunk match would deliver them all.
    ch2 = conn.channel()
    for body, value in [(b"apple-0", "apple"), (b"banana-0", "banana"), (b"plain-0", None),
                        (b"apple-1", "apple")]:
        headers = {"x-stream-filter-value": value} if value else None
        ch2.basic_publish("", "f", body, pika.BasicProperties(headers=headers))
    ch.basic_publish("", "f", b"sync", pika.BasicProperties(headers={"x-stream-filter-value": "z"}))
    got = consume(conn.channel(), "f", len(expected) + 1,
                  arguments={"x-stream-offset": "first", **arguments}, timeout=1)
    bodies = [b for _m, _p, b in got if b != b"sync"]
    assert bodies == expected


def test_many_consumers_read_at_their_own_pace(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "many")
    publish(ch, "many", [b"%d" % i for i in range(50)])
    slow = conn.channel()
    slow.basic_qos(prefetch_count=1)
    slow_got: list[int] = []
    slow.basic_consume("many", lambda c, m, p, b: slow_got.append(1),
                       arguments={"x-stream-offset": "first"})
    results = [consume(conn.channel(), "many", 50, arguments={"x-stream-offset": "first"})
               for _ in range(5)]
    for got in results:
        assert offsets(got) == list(range(50))
    assert len(slow_got) == 1  # never acked: holds nobody else back


def test_cancel_and_channel_close_release_the_reader(broker: InProcessBroker, conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    declare_stream(ch, "r")
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    tag = cch.basic_consume("r", lambda *a: None)
    assert broker.call(lambda: len(broker.broker.vhosts["/"].queues["r"].consumers)) == 1
    cch.basic_cancel(tag)
    assert broker.call(lambda: len(broker.broker.vhosts["/"].queues["r"].consumers)) == 0
    cch.basic_consume("r", lambda *a: None)
    cch.close()
    drain(conn, lambda: False, 0.2)
    assert broker.call(lambda: len(broker.broker.vhosts["/"].queues["r"].consumers)) == 0


def test_delete_removes_the_files(broker: InProcessBroker, conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "gone")
    publish(ch, "gone", [b"x"])
    directory = broker.call(lambda: broker.broker.vhosts["/"].queues["gone"].directory)
    assert Path(directory).exists()
    assert ch.queue_delete("gone").method.message_count == 0
    assert not Path(directory).exists()


def test_queue_deleted_while_consuming_sends_basic_cancel(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    declare_stream(ch, "cancelled")
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    cancelled: list[object] = []
    cch.basic_consume("cancelled", lambda *a: None)
    cch.add_on_cancel_callback(cancelled.append)
    ch.queue_delete("cancelled")
    drain(conn, lambda: bool(cancelled), 2)
    assert cancelled


def test_purge_and_get_are_refused(conn) -> None:  # type: ignore[no-untyped-def]
    declare_stream(conn.channel(), "p")
    code, text = connection_error(lambda: conn.channel().queue_purge("p"))
    assert (code, text) == (540, "NOT_IMPLEMENTED - queue.purge not supported by stream queues "
                                 "queue 'p' in vhost '/'")


def test_automatic_offset_tracking_resumes_after_the_stored_offset(broker, conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "t")
    publish(ch, "t", [b"%d" % i for i in range(10)])
    # A client-chosen tag with no x-stream-offset tracks; with no stored offset it starts at
    # next, as RabbitMQ's default: so the first run uses the explicit switch to start at first.
    got = consume(conn.channel(), "t", 4, prefetch=1, tag="reader-1",
                  arguments={"x-stream-offset": "first",
                             "x-stream-automatic-offset-tracking": True})
    assert offsets(got) == [0, 1, 2, 3]
    got = consume(conn.channel(), "t", 6, tag="reader-1")
    assert offsets(got) == [4, 5, 6, 7, 8, 9]
    # A server-generated tag does not track.
    got = consume(conn.channel(), "t", 10, arguments={"x-stream-offset": "first"})
    assert offsets(got) == list(range(10))


def test_untracked_client_tag_without_stored_offset_starts_at_next(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "nx")
    publish(ch, "nx", [b"old"])
    cch = conn.channel()
    cch.basic_qos(prefetch_count=5)
    got: list[bytes] = []
    cch.basic_consume("nx", lambda c, m, p, b: got.append(b), consumer_tag="fresh")
    drain(conn, lambda: False, 0.3)
    publish(ch, "nx", [b"new"])
    drain(conn, lambda: bool(got), 2)
    assert got == [b"new"]


def test_single_active_consumer_takes_over_from_the_stored_offset(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "sac")
    publish(ch, "sac", [b"%d" % i for i in range(10)])
    args = {"x-single-active-consumer": True, "x-stream-offset": "first"}
    first_ch, second_ch = conn.channel(), conn.channel()
    first_ch.basic_qos(prefetch_count=1)
    second_ch.basic_qos(prefetch_count=1)
    first: list[int] = []
    second: list[int] = []

    def take(into: list[int], limit: int):  # type: ignore[no-untyped-def]
        def on_message(c, m, p, b) -> None:  # type: ignore[no-untyped-def]
            if len(into) < limit:
                into.append(p.headers["x-stream-offset"])
                c.basic_ack(m.delivery_tag)
        return on_message

    first_ch.basic_consume("sac", take(first, 4), consumer_tag="group", arguments=args)
    second_ch.basic_consume("sac", take(second, 100), consumer_tag="group", arguments=args)
    drain(conn, lambda: len(first) >= 4, 3)
    drain(conn, lambda: False, 0.3)
    assert first == [0, 1, 2, 3]
    assert second == []  # not active while the first member is there
    first_ch.close()  # the active member goes away (its 5th message was delivered, not acked)
    drain(conn, lambda: len(second) >= 6, 3)
    assert second == [4, 5, 6, 7, 8, 9]


def test_publisher_deduplication_drops_but_confirms(broker, conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "d")

    def send(pid: int, body: bytes) -> None:
        ch.basic_publish("", "d", body, pika.BasicProperties(headers={
            "x-stream-publisher-name": "p1", "x-stream-publishing-id": pid}))

    for pid in (1, 2, 3):
        send(pid, b"m%d" % pid)
    for pid in (2, 3):  # duplicates: confirmed (basic_publish would raise on a nack)
        send(pid, b"dup")
    send(4, b"m4")
    got = consume(conn.channel(), "d", 10, arguments={"x-stream-offset": "first"}, timeout=1)
    assert [b for _m, _p, b in got] == [b"m1", b"m2", b"m3", b"m4"]
    name = "amq.leveret.publisher-id?" + urllib.parse.urlencode({"stream": "d", "publisher": "p1"})
    _method, props, body = ch.basic_get(name, auto_ack=True)
    assert props.headers["x-stream-publishing-id"] == 4
    assert json.loads(body) == {"stream": "d", "publisher": "p1", "publishing_id": 4}
    unknown = "amq.leveret.publisher-id?stream=d&publisher=nobody"
    assert ch.basic_get(unknown, auto_ack=True)[1].headers["x-stream-publishing-id"] == 0


def test_publisher_name_without_an_integer_id_is_refused(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    declare_stream(ch, "bad-id")
    ch.basic_publish("", "bad-id", b"x", pika.BasicProperties(headers={
        "x-stream-publisher-name": "p1", "x-stream-publishing-id": "seven"}))
    code, text = channel_error(lambda: ch.queue_declare("bad-id", passive=True))
    assert code == 406
    assert "x-stream-publishing-id must be an integer" in text


def test_stored_offset_query(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "q")
    publish(ch, "q", [b"a", b"b", b"c"])
    consume(conn.channel(), "q", 2, prefetch=1, tag="named",
            arguments={"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
    _method, props, _body = ch.basic_get("amq.leveret.consumer-offset?stream=q&consumer=named",
                                       auto_ack=True)
    assert props.headers["x-stream-offset"] == 1
    assert ch.basic_get("amq.leveret.consumer-offset?stream=q&consumer=never")[0] is None
    code, _text = channel_error(lambda: ch.basic_get("amq.leveret.consumer-offset?stream=nope"))
    assert code == 404


async def test_aio_pika_consumes_a_stream(broker: InProcessBroker) -> None:
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue("aio", durable=True, arguments=STREAM)
        for i in range(5):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), "aio")
        seen: list[int] = []
        async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
            async for message in it:
                seen.append(message.headers["x-stream-offset"])
                await message.ack()
                if len(seen) == 5:
                    break
        assert seen == [0, 1, 2, 3, 4]


def test_stream_offsets_and_partitions_queries(broker, conn) -> None:  # type: ignore[no-untyped-def]
    from leveret.broker.model import superstream

    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "so")
    publish(ch, "so", [b"a", b"b", b"c"])
    _m, _p, body = ch.basic_get("amq.leveret.stream-offsets?stream=so", auto_ack=True)
    assert json.loads(body) == {"stream": "so", "first": 0, "last": 2, "committed": 2, "next": 3}
    vhost = broker.broker.vhosts["/"]
    broker.call(lambda: superstream.add(vhost, "orders", binding_keys=["eu", "us"]))
    _m, _p, body = ch.basic_get("amq.leveret.partitions?superstream=orders", auto_ack=True)
    assert json.loads(body) == {"superstream": "orders", "partitions": [
        {"stream": "orders-eu", "binding_key": "eu"}, {"stream": "orders-us", "binding_key": "us"}]}
    query = "amq.leveret.partitions?superstream=amq.direct"
    code, text = channel_error(lambda: ch.basic_get(query))
    assert code == 406 and "is not a super stream" in text
    code, _text = channel_error(lambda: conn.channel().basic_get("amq.leveret.nothing"))
    assert code == 404


def _read_to_the_end(conn, queue: str, arguments: dict, prefetch: int = 100,  # type: ignore[no-untyped-def]
                     timeout: float = 3, ack: bool = True) -> tuple[list[int], list[object]]:
    """Consume with x-leveret-end-offset until the broker cancels: the offsets received and
    the cancels, as lists that go on filling while the connection is drained."""
    cch = conn.channel()
    cch.basic_qos(prefetch_count=prefetch)
    got: list[int] = []
    cancelled: list[object] = []

    def on_message(ch, method, props, _body) -> None:  # type: ignore[no-untyped-def]
        got.append(props.headers["x-stream-offset"])
        if ack:
            ch.basic_ack(method.delivery_tag)

    cch.add_on_cancel_callback(cancelled.append)
    cch.basic_consume(queue, on_message, arguments=arguments)
    drain(conn, lambda: bool(cancelled), timeout)
    return got, cancelled


def test_end_offset_delivers_the_range_then_cancels(conn) -> None:  # type: ignore[no-untyped-def]
    """x-leveret-end-offset: offsets from x-stream-offset up to the end (not included), and
    then basic.cancel, across chunk edges and with a prefetch smaller than the range."""
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "range")
    for _ in range(4):  # four chunks of five
        publish(ch, "range", [b"x"] * 5)
    got, cancelled = _read_to_the_end(
        conn, "range", {"x-stream-offset": 3, "x-leveret-end-offset": 13}, prefetch=4)
    assert got == list(range(3, 13))
    assert len(cancelled) == 1
    got, cancelled = _read_to_the_end(conn, "range",
                                      {"x-stream-offset": 7, "x-leveret-end-offset": 7})
    assert (got, len(cancelled)) == ([], 1)
    assert ch.is_open


@pytest.mark.parametrize("ack", [True, False])
def test_end_offset_ends_a_filtered_range_whose_tail_is_filtered_out(conn, ack) -> None:  # type: ignore[no-untyped-def]
    """A filter that leaves nothing at the end of the range still ends it: the consumer is
    cancelled once the broker has looked past the end offset, whether or not the client
    acks (an ack lets the broker look again; without one it must see the end at once)."""
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "colours")
    for i in range(30):
        colour = "red" if i < 10 else "blue"
        publish(ch, "colours", [b"%d" % i], headers={"x-stream-filter-value": colour})
    got, cancelled = _read_to_the_end(conn, "colours", {
        "x-stream-offset": 0, "x-stream-filter": "red", "x-leveret-end-offset": 25}, ack=ack)
    assert (got, len(cancelled)) == (list(range(10)), 1)


def test_end_offset_beyond_the_log_waits_for_the_messages(conn) -> None:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    ch.confirm_delivery()
    declare_stream(ch, "later")
    publish(ch, "later", [b"x"] * 3)
    got, cancelled = _read_to_the_end(
        conn, "later", {"x-stream-offset": 0, "x-leveret-end-offset": 6}, timeout=0.5)
    assert (got, cancelled) == ([0, 1, 2], [])
    publish(ch, "later", [b"x"] * 5)
    drain(conn, lambda: bool(cancelled), 3)
    assert (got, len(cancelled)) == ([0, 1, 2, 3, 4, 5], 1)


@pytest.mark.parametrize(("value", "reason"), [
    (-1, "{value_negative,-1}"),
    ("10", "{unacceptable_type,longstr}"),
    (True, "{unacceptable_type,bool}"),
])
def test_a_bad_end_offset_is_refused(conn, value, reason) -> None:  # type: ignore[no-untyped-def]
    declare_stream(conn.channel(), "bad-end")
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    code, text = channel_error(lambda: ch.basic_consume(
        "bad-end", lambda *a: None, arguments={"x-leveret-end-offset": value}))
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid arg 'x-leveret-end-offset' for "
                                 f"queue 'bad-end' in vhost '/': {reason}")
    assert conn.channel().is_open
