"""rstream (the asyncio stream client from PyPI), unchanged, against `leveret serve`'s stream
listener: streams, publishing with confirms and deduplication, every offset specification,
credit, stored offsets, filtering, sub-entry batches, super streams, and stats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    MessageContext,
    OffsetType,
    Producer,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
    amqp_decoder,
)
from rstream.exceptions import OffsetNotFound, StreamAlreadyExists, StreamDoesNotExist

from .conftest import LOOPBACK_NAME, StreamBroker

pytestmark = pytest.mark.asyncio


def producer(lev: StreamBroker, **kwargs: Any) -> Producer:
    return Producer(LOOPBACK_NAME, port=lev.stream_port, username="guest", password="guest",
                    **kwargs)


def consumer(lev: StreamBroker) -> Consumer:
    return Consumer(LOOPBACK_NAME, port=lev.stream_port, username="guest", password="guest")


async def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


async def read(lev: StreamBroker, stream: str, spec: ConsumerOffsetSpecification, count: int,
               **kwargs: Any) -> list[tuple[int, AMQPMessage]]:
    got: list[tuple[int, AMQPMessage]] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append((context.offset, message))

    async with consumer(lev) as c:
        await c.subscribe(stream, on, decoder=amqp_decoder, offset_specification=spec,
                          **kwargs)
        await wait_for(lambda: len(got) >= count)
        await asyncio.sleep(0.2)  # nothing more arrives
    return got


async def publish(lev: StreamBroker, stream: str, bodies: list[bytes], **kwargs: Any) -> None:
    async with producer(lev) as p:
        for body in bodies:
            await p.send_wait(stream, AMQPMessage(body=body), **kwargs)


async def test_create_publish_and_consume_from_first(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        with pytest.raises(StreamAlreadyExists):
            await p.create_stream(name)
        await p.create_stream(name, exists_ok=True)
    await publish(lev, name, [f"m{i}".encode() for i in range(5)])
    got = await read(lev, name, ConsumerOffsetSpecification(OffsetType.FIRST), 5)
    assert [(o, bytes(m.body)) for o, m in got] == [(i, f"m{i}".encode()) for i in range(5)]


async def test_delete_stream(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        assert await p.stream_exists(name)
        await p.delete_stream(name)
        assert not await p.stream_exists(name)
        with pytest.raises(StreamDoesNotExist):
            await p.delete_stream(name)
        await p.delete_stream(name, missing_ok=True)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (ConsumerOffsetSpecification(OffsetType.FIRST), list(range(6))),
        (ConsumerOffsetSpecification(OffsetType.OFFSET, 3), [3, 4, 5]),
        (ConsumerOffsetSpecification(OffsetType.LAST), [5]),
    ],
)
async def test_offset_specifications(lev: StreamBroker, name: str,
                                     spec: ConsumerOffsetSpecification,
                                     expected: list[int]) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        await p.send_batch(name, [AMQPMessage(body=b"a%d" % i) for i in range(3)])
        await asyncio.sleep(0.3)  # a second chunk
        await p.send_batch(name, [AMQPMessage(body=b"a%d" % i) for i in range(3, 6)])
        await asyncio.sleep(0.3)
    got = await read(lev, name, spec, len(expected))
    # the client drops what lies below an offset spec in the first chunk, as with RabbitMQ
    offsets = [o for o, _ in got]
    if spec.offset_type is OffsetType.LAST:
        assert offsets[-1] == 5 and offsets == sorted(offsets) and set(offsets) <= {3, 4, 5}
    else:
        assert offsets == expected


async def test_next_and_timestamp(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        await p.send_wait(name, AMQPMessage(body=b"old"))
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    got: list[bytes] = []
    by_time: list[bytes] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append(bytes(message.body))

    async def on_time(message: AMQPMessage, context: MessageContext) -> None:
        by_time.append(bytes(message.body))

    async with consumer(lev) as c:
        await c.subscribe(name, on, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))
        await asyncio.sleep(0.2)
        await publish(lev, name, [b"new"])
        await wait_for(lambda: got == [b"new"])
    async with consumer(lev) as c:
        await c.subscribe(name, on_time, decoder=amqp_decoder,
                          offset_specification=ConsumerOffsetSpecification(
                              OffsetType.TIMESTAMP, middle))
        await wait_for(lambda: by_time == [b"new"])


async def test_credit_is_per_chunk(lev: StreamBroker, name: str) -> None:
    """With one credit at a time the client still receives every chunk (it grants one more
    per Deliver): delivery never stalls."""
    async with producer(lev) as p:
        await p.create_stream(name)
        for i in range(20):
            await p.send_wait(name, AMQPMessage(body=b"%d" % i))  # one chunk each
    got = await read(lev, name, ConsumerOffsetSpecification(OffsetType.FIRST), 20,
                     initial_credit=1)
    assert [o for o, _ in got] == list(range(20))


async def test_deduplication_and_publisher_sequence(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        client = await p.default_client
        for _ in range(2):
            await p.send_wait(name, AMQPMessage(body=b"x"), publisher_name="pub-1")
        sequence = await client.query_publisher_sequence(name, "pub-1")
        assert sequence == 2
        assert await client.query_publisher_sequence(name, "unknown") == 0
    # a new producer with the same name starts after the stored sequence; a resent id is
    # dropped and still confirmed
    async with producer(lev) as p:
        await p.send_wait(name, AMQPMessage(body=b"y"), publisher_name="pub-1")
    got = await read(lev, name, ConsumerOffsetSpecification(OffsetType.FIRST), 3)
    assert [bytes(m.body) for _, m in got] == [b"x", b"x", b"y"]


async def test_store_and_query_offset(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
    await publish(lev, name, [b"a", b"b", b"c"])
    async with consumer(lev) as c:
        with pytest.raises(OffsetNotFound):
            await c.query_offset(name, "reader-1")
        await c.store_offset(name, "reader-1", 1)
        await wait_for_offset(c, name, "reader-1", 1)


async def wait_for_offset(c: Consumer, stream: str, reference: str, offset: int) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            if await c.query_offset(stream, reference) == offset:
                return
        except Exception:  # noqa: BLE001 - not stored yet
            pass
        if time.monotonic() > deadline:
            raise AssertionError("offset not stored")
        await asyncio.sleep(0.05)


async def test_filtering(lev: StreamBroker, name: str) -> None:
    async def colour_of(message: AMQPMessage) -> str:
        return str(message.application_properties["c"])

    async with producer(lev, filter_value_extractor=colour_of) as p:
        await p.create_stream(name)
        for colour in ["red", "blue", "red", "green"]:
            await p.send_wait(name, AMQPMessage(body=colour.encode(),
                                                application_properties={"c": colour}))
    got: list[bytes] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append(bytes(message.body))

    async with consumer(lev) as c:
        await c.subscribe(name, on, decoder=amqp_decoder,
                          filter_input=FilterConfiguration(["red"]))
        await wait_for(lambda: len(got) >= 2)
        await asyncio.sleep(0.2)
    assert got == [b"red", b"red"]


@pytest.mark.parametrize("compression", [CompressionType.No, CompressionType.Gzip])
async def test_sub_entry_batches(lev: StreamBroker, name: str,
                                 compression: CompressionType) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        confirmed: list[Any] = []

        async def on_confirm(confirmation: Any) -> None:
            confirmed.append(confirmation)

        await p.send_sub_entry(name, [AMQPMessage(body=b"s%d" % i) for i in range(10)],
                               compression_type=compression, on_publish_confirm=on_confirm)
        await wait_for(lambda: bool(confirmed))
    got = await read(lev, name, ConsumerOffsetSpecification(OffsetType.FIRST), 10)
    assert [bytes(m.body) for _, m in got] == [b"s%d" % i for i in range(10)]


async def test_super_stream_routing_and_partitions(lev: StreamBroker, name: str) -> None:
    async def key_of(message: AMQPMessage) -> str:
        return str(message.application_properties["id"])

    async with SuperStreamProducer(
        LOOPBACK_NAME, port=lev.stream_port, username="guest", password="guest",
        super_stream=name, routing=RouteType.Hash,
        routing_extractor=key_of, super_stream_creation_option=SuperStreamCreationOption(3),
    ) as p:
        for i in range(30):
            await p.send(AMQPMessage(body=b"%d" % i, application_properties={"id": str(i)}))
        await asyncio.sleep(0.5)
    got: list[tuple[str, bytes]] = []

    async def on(message: AMQPMessage, context: MessageContext) -> None:
        got.append((context.stream, bytes(message.body)))

    async with SuperStreamConsumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                                   password="guest", super_stream=name) as c:
        await c.subscribe(on, decoder=amqp_decoder)
        await wait_for(lambda: len(got) >= 30)
    assert sorted(int(b) for _, b in got) == list(range(30))
    assert {s for s, _ in got} == {f"{name}-0", f"{name}-1", f"{name}-2"}


async def test_metadata_and_stats(lev: StreamBroker, name: str) -> None:
    async with producer(lev) as p:
        await p.create_stream(name)
        await p.send_wait(name, AMQPMessage(body=b"z"))
        client = await p.default_client
        metadata = await client.query_leader_and_replicas(name)
        leader = metadata[0]
        # a client over loopback is told `localhost` (test_advertised_host.py)
        assert (leader.host, leader.port) == (LOOPBACK_NAME, lev.stream_port)
        stats = await client.stream_stats(name) if hasattr(client, "stream_stats") else None
        if stats is not None:
            assert stats["first_chunk_id"] == 0


async def run(coroutine: Awaitable[Any]) -> Any:
    return await coroutine


async def test_single_active_consumer_with_consumer_update(lev: StreamBroker, name: str) -> None:
    """One member of a group receives; the next one takes over when it leaves, told by
    ConsumerUpdate, and starts where its listener says (here: after the stored offset)."""
    from rstream import OffsetSpecification

    async with producer(lev) as p:
        await p.create_stream(name)
        await p.send_batch(name, [AMQPMessage(body=b"%d" % i) for i in range(4)])
        await asyncio.sleep(0.3)
    received: dict[str, list[int]] = {"a": [], "b": []}
    updates: list[tuple[str, bool]] = []

    def listener(member: str) -> Any:
        async def on_update(active: bool, context: Any) -> OffsetSpecification:
            updates.append((member, active))
            try:
                stored = await context.consumer.query_offset(name, "group-1")
            except OffsetNotFound:
                return OffsetSpecification(OffsetType.FIRST, 0)
            return OffsetSpecification(OffsetType.OFFSET, stored + 1)
        return on_update

    def on(member: str) -> Any:
        async def handle(message: AMQPMessage, context: MessageContext) -> None:
            received[member].append(context.offset)
        return handle

    properties = {"single-active-consumer": "true", "name": "group-1"}
    first, second = consumer(lev), consumer(lev)
    await first.start()
    await second.start()
    await first.subscribe(name, on("a"), decoder=amqp_decoder, properties=properties,
                          subscriber_name="group-1", consumer_update_listener=listener("a"))
    await second.subscribe(name, on("b"), decoder=amqp_decoder, properties=properties,
                           subscriber_name="group-1", consumer_update_listener=listener("b"))
    await wait_for(lambda: len(received["a"]) >= 4)
    await asyncio.sleep(0.3)
    assert received == {"a": [0, 1, 2, 3], "b": []}
    await first.store_offset(name, "group-1", 1)
    await asyncio.sleep(0.2)
    await first.close()
    await wait_for(lambda: len(received["b"]) >= 2)
    assert received["b"] == [2, 3]
    assert updates == [("a", True), ("b", True)]
    await second.close()


async def test_super_stream_consumer_group(lev: StreamBroker, name: str) -> None:
    """Two members of a single-active-consumer group on a super stream of two partitions
    share it: one partition each, as RabbitMQ spreads them (by partition index). Each newly
    active member starts where rstream's default ConsumerUpdate answer says: next."""
    async def key_of(message: AMQPMessage) -> str:
        return str(message.application_properties["id"])

    producer_ = SuperStreamProducer(
        LOOPBACK_NAME, port=lev.stream_port, username="guest", password="guest",
        super_stream=name, routing=RouteType.Hash, routing_extractor=key_of,
        super_stream_creation_option=SuperStreamCreationOption(2))
    await producer_.start()
    got: dict[str, set[str]] = {"a": set(), "b": set()}
    count = {"a": 0, "b": 0}

    def on(member: str) -> Any:
        async def handle(message: AMQPMessage, context: MessageContext) -> None:
            got[member].add(context.stream)
            count[member] += 1
        return handle

    properties = {"single-active-consumer": "true", "name": "group-g", "super-stream": name}
    members = []
    for member in ("a", "b"):
        c = SuperStreamConsumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                                password="guest", super_stream=name)
        await c.start()
        await c.subscribe(on(member), decoder=amqp_decoder, properties=properties,
                          subscriber_name="group-g")
        members.append(c)
    await asyncio.sleep(0.5)
    for i in range(20):
        await producer_.send(AMQPMessage(body=b"%d" % i, application_properties={"id": str(i)}))
    await wait_for(lambda: count["a"] + count["b"] >= 20)
    await asyncio.sleep(0.3)
    assert count["a"] + count["b"] == 20
    assert got == {"a": {f"{name}-0"}, "b": {f"{name}-1"}}
    await producer_.close()
    for c in members:
        await c.close()


async def test_a_stepping_down_member_answers_before_the_next_one_starts(
        lev: StreamBroker, name: str) -> None:
    """A super-stream group rebalances when a member joins: partition 1 moves from a to b.
    As RabbitMQ's coordinator does, b is made active only once a has answered the
    ConsumerUpdate that made it inactive (here a's listener holds its answer back)."""
    from rstream import OffsetSpecification

    producer_ = SuperStreamProducer(
        LOOPBACK_NAME, port=lev.stream_port, username="guest", password="guest",
        super_stream=name, routing=RouteType.Hash,
        routing_extractor=lambda m: str(m.application_properties["id"]),
        super_stream_creation_option=SuperStreamCreationOption(2))
    await producer_.start()
    updates: list[tuple[str, str, bool]] = []
    release = asyncio.Event()

    def listener(member: str) -> Any:
        async def on_update(active: bool, context: Any) -> OffsetSpecification:
            updates.append((member, context.stream, active))
            if not active:
                await release.wait()
            return OffsetSpecification(OffsetType.NEXT, 0)
        return on_update

    async def ignore(message: AMQPMessage, context: MessageContext) -> None:
        pass

    properties = {"single-active-consumer": "true", "name": "group-s", "super-stream": name}
    members = []
    for member in ("a", "b"):
        c = SuperStreamConsumer(LOOPBACK_NAME, port=lev.stream_port, username="guest",
                                password="guest", super_stream=name)
        await c.start()
        await c.subscribe(ignore, decoder=amqp_decoder, properties=properties,
                          subscriber_name="group-s", consumer_update_listener=listener(member))
        members.append(c)
        if member == "a":
            await wait_for(lambda: len(updates) == 2)  # a is active on both partitions
    partition = f"{name}-1"
    try:
        await wait_for(lambda: ("a", partition, False) in updates)
        await asyncio.sleep(0.5)  # time enough for b's activation, if it did not wait
        assert ("b", partition, True) not in updates
    finally:
        release.set()
    await wait_for(lambda: ("b", partition, True) in updates)
    assert updates.index(("a", partition, False)) < updates.index(("b", partition, True))
    assert sorted(updates) == sorted([("a", f"{name}-0", True), ("a", partition, True),
                                      ("a", partition, False), ("b", partition, True)])
    await producer_.close()
    for c in members:
        await c.close()
