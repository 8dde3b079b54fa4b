"""One log, two protocols: what AMQP 0.9.1 (pika) writes, rstream reads as RabbitMQ converts it,
and the reverse; stored offsets and publisher sequences are shared across the protocols."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import time
import uuid
from typing import Any

import pika
import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)
from rstream._pyamqp.message import Header, Properties

from .conftest import LOOPBACK_NAME, StreamBroker

pytestmark = pytest.mark.asyncio
STREAM = {"x-queue-type": "stream"}


def channel(lev: StreamBroker) -> pika.adapters.blocking_connection.BlockingChannel:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lev.amqp_port))
    return connection.channel()


async def stream_read(lev: StreamBroker, stream: str, count: int,
                      spec: ConsumerOffsetSpecification | None = None) -> list[Any]:
    got: list[tuple[int, AMQPMessage]] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append((context.offset, message))

    async with Consumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as c:
        await c.subscribe(stream, on, decoder=amqp_decoder, offset_specification=spec)
        deadline = time.monotonic() + 10
        while len(got) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert len(got) >= count
    return got


def amqp_read(ch: Any, stream: str, count: int, **arguments: Any) -> list[Any]:
    ch.basic_qos(prefetch_count=100)
    out = []
    for method, properties, body in ch.consume(stream, arguments=arguments,
                                               inactivity_timeout=3):
        if method is None:
            break
        out.append((method, properties, body))
        ch.basic_ack(method.delivery_tag)
        if len(out) == count:
            break
    ch.cancel()
    return out


async def test_091_in_stream_out(lev: StreamBroker, name: str) -> None:
    ch = channel(lev)
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_publish("", name, b"body", pika.BasicProperties(
        content_type="text/plain", content_encoding="utf-8", delivery_mode=2, priority=3,
        correlation_id="urn:uuid:" + str(uuid.UUID(int=1)), reply_to="rq", expiration="60000",
        message_id="mid", timestamp=1704153600, type="tp", user_id="guest", app_id="app",
        headers={"s": "str", "i": 5, "big": 2**40, "neg": -70000, "b": True, "x-custom": "xc",
                 "arr": [1, "a"], "t": {"k": 1}, "ts": datetime.datetime(2024, 1, 1),
                 "dec": decimal.Decimal("1.5")}))
    ch.connection.close()
    [(offset, message)] = await stream_read(lev, name, 1)
    assert offset == 0
    assert message.header == Header(durable=True, priority=3, ttl=60000)
    assert message.message_annotations == {
        b"x-exchange": b"", b"x-routing-key": name.encode(), b"x-custom": b"xc",
        b"x-basic-type": b"tp"}
    p = message.properties
    assert (p.message_id, p.user_id, p.reply_to, p.correlation_id, p.content_type,
            p.content_encoding, p.creation_time, p.group_id) == (
        b"mid", b"guest", b"/queues/rq", uuid.UUID(int=1), b"text/plain", b"utf-8",
        1704153600000, b"app")
    # arrays and tables are not application properties (AMQP 1.0 allows only scalars there)
    assert message.application_properties == {
        b"s": b"str", b"i": 5, b"big": 2**40, b"neg": -70000, b"b": True,
        b"ts": 1704067200000, b"dec": None}
    assert bytes(message.body) == b"body"


async def test_stream_in_091_out(lev: StreamBroker, name: str) -> None:
    async with Producer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as p:
        await p.create_stream(name)
        await p.send_wait(name, AMQPMessage(
            body=b"from-stream",
            properties=Properties(message_id=uuid.UUID(int=7), content_type="application/json",
                                  correlation_id="c1", reply_to="/queues/q%201",
                                  creation_time=1700000000123, group_id="grp",
                                  user_id=b"guest"),
            application_properties={"k": "v", "n": 5},
            header=Header(durable=True, priority=4),
            message_annotations={"x-ann": "a"}))
        await p.send_wait(name, AMQPMessage(body=b"bare"))
    ch = channel(lev)
    [(m1, p1, b1), (_m2, p2, b2)] = amqp_read(ch, name, 2, **{"x-stream-offset": "first"})
    assert (m1.exchange, m1.routing_key, b1) == ("", name, b"from-stream")
    assert (p1.message_id, p1.content_type, p1.correlation_id, p1.reply_to, p1.timestamp,
            p1.app_id, p1.user_id, p1.delivery_mode, p1.priority) == (
        "urn:uuid:00000000-0000-0000-0000-000000000007", "application/json", "c1", "q 1",
        1700000000, "grp", "guest", 2, 4)
    assert p1.headers == {"x-stream-offset": 0, "x-ann": "a", "k": "v", "n": 5}
    assert b2 == b"bare" and p2.headers == {"x-stream-offset": 1}
    assert p2.delivery_mode is None
    ch.connection.close()


async def test_offsets_are_shared(lev: StreamBroker, name: str) -> None:
    ch = channel(lev)
    ch.queue_declare(name, durable=True, arguments=STREAM)
    for i in range(6):
        ch.basic_publish("", name, b"%d" % i)
    # stored over the stream protocol, resumed over 0.9.1 (a named consumer tracks its offset)
    async with Consumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as c:
        await c.store_offset(name, "reader-a", 2)
        await asyncio.sleep(0.2)
    # a consumer tag without x-stream-offset tracks its offset (docs/STREAMS.md): it resumes
    # after the offset stored over the stream protocol
    ch.basic_qos(prefetch_count=100)
    bodies = []

    def on(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(name, on, consumer_tag="reader-a")
    deadline = time.monotonic() + 5
    while len(bodies) < 3 and time.monotonic() < deadline:
        ch.connection.process_data_events(0.1)
    assert bodies == [b"3", b"4", b"5"]
    ch.basic_cancel(tag)  # stores 5 as reader-a's offset
    ch.connection.process_data_events(0.3)
    async with Consumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as c:
        assert await c.query_offset(name, "reader-a") == 5
    ch.connection.close()


async def test_publisher_sequence_is_shared(lev: StreamBroker, name: str) -> None:
    ch = channel(lev)
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"a", pika.BasicProperties(
        headers={"x-stream-publisher-name": "pub-x", "x-stream-publishing-id": 41}))
    async with Producer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as p:
        client = await p.default_client
        assert await client.query_publisher_sequence(name, "pub-x") == 41
        await p.send_wait(name, AMQPMessage(body=b"b"), publisher_name="pub-x")  # id 42
    ch.basic_publish("", name, b"dup", pika.BasicProperties(
        headers={"x-stream-publisher-name": "pub-x", "x-stream-publishing-id": 42}))
    ch.connection.close()
    got = await stream_read(lev, name, 2, ConsumerOffsetSpecification(OffsetType.FIRST))
    await asyncio.sleep(0.3)
    assert [bytes(m.body) for _, m in got] == [b"a", b"b"]


async def test_single_active_consumer_spans_the_protocols(lev: StreamBroker, name: str) -> None:
    """An AMQP 0.9.1 consumer (tag = group name, x-single-active-consumer) and a stream
    subscriber (name, single-active-consumer) are one group: the stream member takes over,
    told by ConsumerUpdate, when the 0.9.1 member leaves."""
    from rstream import OffsetSpecification

    ch = channel(lev)
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    first: list[bytes] = []

    def on(channel_: Any, method: Any, properties: Any, body: bytes) -> None:
        first.append(body)
        channel_.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(name, on, consumer_tag="group-x",
                           arguments={"x-single-active-consumer": True,
                                      "x-stream-offset": "first"})
    ch.basic_publish("", name, b"one")
    deadline = time.monotonic() + 5
    while not first and time.monotonic() < deadline:
        ch.connection.process_data_events(0.05)
    assert first == [b"one"]
    got: list[bytes] = []
    updates: list[bool] = []

    async def on_update(active: bool, context: Any) -> OffsetSpecification:
        updates.append(active)
        return OffsetSpecification(OffsetType.NEXT, 0)

    async def handle(message: AMQPMessage, context: MessageContext) -> None:
        got.append(bytes(message.body))

    async with Consumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                        password="guest") as c:
        await c.subscribe(name, handle, decoder=amqp_decoder, subscriber_name="group-x",
                          properties={"single-active-consumer": "true", "name": "group-x"},
                          consumer_update_listener=on_update)
        await asyncio.sleep(0.3)
        assert updates == []  # the 0.9.1 member is still the active one
        ch.basic_cancel(tag)
        ch.connection.process_data_events(0.2)
        for _ in range(50):
            if updates:
                break
            await asyncio.sleep(0.05)
        assert updates == [True]
        ch.basic_publish("", name, b"two")
        ch.connection.process_data_events(0.1)
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
    assert got == [b"two"]
    ch.connection.close()


async def test_delayed_copies_ids_stay_out_of_what_stream_consumers_read(
        lev: StreamBroker, name: str) -> None:
    """A delayed exchange's copies (published here with the id header a client may set, as
    the exchange routes them) keep their ids in the tracking trailer of their chunk
    (docs/FORMAT.md 3.6): a stream-protocol subscriber reads the kept messages at dense
    offsets, without the header, and a copy with an id taken before is not stored."""
    ch = channel(lev)
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    for body, ident in ((b"first", "log1:7"), (b"again", "log1:7"), (b"other", "log1:8"),
                        (b"plain", None)):
        headers = {"h": 1} if ident is None else {"x-leveret-delayed-id": ident, "h": 1}
        ch.basic_publish("", name, body, pika.BasicProperties(headers=headers))
    ch.connection.close()
    got = await stream_read(lev, name, 3)
    await asyncio.sleep(0.3)
    assert [(offset, bytes(message.body)) for offset, message in got] == [
        (0, b"first"), (1, b"other"), (2, b"plain")]
    for _offset, message in got:
        assert message.application_properties == {b"h": 1}
