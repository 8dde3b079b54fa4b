"""rstream, as its own tests use it, against Leveret and against the reference RabbitMQ 3.10.8
(`rabbitmq_stream`; skipped where no local rabbitmq-server can start): a Deliver's whole chunk
header (rstream's test_deliver: epoch 1 on a fresh stream, the trailer length of its publisher
tracking), and `last` after one send_batch of thousands of messages (rstream's
test_offset_type_last: the writer cut the batch into chunks of growing size, as osiris's does)."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from unittest.mock import ANY

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer, schema
from rstream.client import Client
from support.reference import Reference

from .conftest import LOOPBACK_NAME, start_stream_broker
from .raw import RawStream, s, strmap

pytestmark = pytest.mark.asyncio


@pytest.fixture
def reference_port(stream_reference: Reference) -> int:
    return stream_reference.stream_port


@pytest.fixture(scope="module")
def leveret_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    broker = start_stream_broker(tmp_path_factory.mktemp("chunks") / "data")
    yield broker.stream_port
    broker.process.kill()


@pytest.fixture(params=["leveret", pytest.param("rabbitmq", marks=pytest.mark.reference)])
def port(request: pytest.FixtureRequest) -> int:
    name = "reference_port" if request.param == "rabbitmq" else "leveret_port"
    return int(request.getfixturevalue(name))


@pytest.fixture
def stream() -> str:
    return f"chunks-{uuid.uuid4().hex[:10]}"


async def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


def client(port: int) -> Client:
    return Client("127.0.0.1", port, frame_max=1024 * 1024, heartbeat=60)


async def test_deliver_header(port: int, stream: str) -> None:
    """rstream's test_deliver, unchanged but for the stream's name: the whole Deliver."""
    c = client(port)
    await c.start()
    try:
        await c.authenticate(vhost="/", username="guest", password="guest")
        await c.create_stream(stream)
        await c.declare_publisher(stream, "test-reference", 1)
        await c.subscribe(stream, 1)
        waiter = c.wait_frame(schema.Deliver)
        await c.publish([schema.Message(publishing_id=1, filter_value=None,
                                        data=b"test message")], 1)
        assert await waiter == schema.Deliver(
            subscription_id=1, magic_version=80, chunk_type=0, num_entries=1, num_records=1,
            timestamp=ANY, epoch=1, chunk_first_offset=0, chunk_crc=307778378, data_length=16,
            trailer_length=24, _reserved=0, data=b"\x00\x00\x00\x0ctest message")
        await c.credit(1, 1)
        await c.unsubscribe(1)
        await c.delete_publisher(1)
        await c.delete_stream(stream)
    finally:
        await c.close()


async def test_deliver_header_without_a_reference(port: int, stream: str) -> None:
    """A publisher without a reference tracks nothing: no trailer."""
    c = client(port)
    await c.start()
    try:
        await c.authenticate(vhost="/", username="guest", password="guest")
        await c.create_stream(stream)
        await c.declare_publisher(stream, None, 1)
        await c.subscribe(stream, 1)
        waiter = c.wait_frame(schema.Deliver)
        await c.publish([schema.Message(publishing_id=1, filter_value=None, data=b"a"),
                         schema.Message(publishing_id=2, filter_value=None, data=b"bc")], 1)
        frame = await waiter
        assert (frame.epoch, frame.trailer_length, frame.num_entries) == (1, 0, 2)
        await c.delete_publisher(1)
        await c.delete_stream(stream)
    finally:
        await c.close()


async def test_offset_type_last_after_one_batch(port: int, stream: str) -> None:
    """rstream's test_offset_type_last: `last` after one send_batch of 4,999 messages is the
    last chunk the writer made of them, not the whole batch."""
    messages = [str(i).encode() for i in range(1, 5_000)]
    async with Producer(LOOPBACK_NAME, port=port, username="guest", password="guest") as p:
        await p.create_stream(stream)
        await p.send_batch(stream, messages)  # type: ignore[arg-type]
    captured: list[bytes] = []
    async with Consumer(LOOPBACK_NAME, port=port, username="guest", password="guest") as c:
        await c.subscribe(
            stream, callback=lambda message, context: captured.append(bytes(message)),
            offset_specification=ConsumerOffsetSpecification(OffsetType.LAST, None),
            subscriber_name="test-subscriber")
        await wait_for(lambda: len(captured) > 0 and captured[-1] == b"4999")
        assert len(captured) < len(messages)
        await c.delete_stream(stream)


def chunk_sizes(port: int, stream: str, count: int) -> list[int]:
    """The records of each chunk of the stream, read from the first (a raw subscription)."""
    raw = RawStream(port, timeout=20)
    raw.handshake()
    raw.request(0x07, struct.pack(">B", 1) + s(stream) + struct.pack(">HH", 1, 1000)
                + strmap({}))
    assert raw.response(0x07)[1] == 1
    sizes: list[int] = []
    while sum(sizes) < count:
        frame = raw.next(0x08)
        entries = struct.unpack_from(">H", frame, 7)[0]
        crc, length = struct.unpack_from(">II", frame, 5 + 32)
        assert zlib.crc32(frame[53 : 53 + length]) == crc
        sizes.append(entries)
    raw.request(0x0E, s(stream))
    raw.close()
    return sizes


async def test_a_batch_makes_chunks_of_growing_size(port: int, stream: str,
                                                    request: pytest.FixtureRequest) -> None:
    """One send_batch of 5,000: chunks that start at 32 records and double, up to a last part
    (RabbitMQ's first chunk may be cut shorter, when its writer ran dry before the rest came)."""
    async with Producer(LOOPBACK_NAME, port=port, username="guest", password="guest") as p:
        await p.create_stream(stream)
        await p.send_batch(stream, [str(i).encode() for i in range(5_000)])  # type: ignore[arg-type]
    sizes = chunk_sizes(port, stream, 5_000)
    assert sum(sizes) == 5_000 and len(sizes) > 1 and max(sizes) <= 8192
    assert sizes[-1] < 2048
    if request.node.callspec.params["port"] == "leveret":
        assert sizes == [32, 64, 128, 256, 512, 1024, 2048, 936]
