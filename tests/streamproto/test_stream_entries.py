"""Stream-protocol messages stored as STREAM_ENTRIES chunks (docs/FORMAT.md 3.2): a subscriber
gets them back byte for byte, one Deliver per chunk built from the chunk's record bytes as
stored; a turn that mixes AMQP 0.9.1 and stream-protocol publishes becomes one chunk per run;
AMQP 0.9.1 consumers, the management API's read, filters, a restart and the CLI read them; and
a log written before the type existed (0x80 records in USER chunks) is still served."""

from __future__ import annotations

import datetime
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from rstream import AMQPMessage, amqp_decoder
from support.brokers import InProcessBroker
from support.ports import free_port
from typer.testing import CliRunner

from leveret.amqp.stored import encode_amqp10_record
from leveret.broker.streamproto import amqp10types as t
from leveret.cli.streams import app
from leveret.storage import Log, OffsetSpec, Reader

from .conftest import StreamBroker, start_stream_broker
from .raw import RawStream
from .test_raw_protocol import (
    confirms,
    create_and_declare,
    declare_publisher,
    deliveries,
    subscribe,
)

STREAM_ENTRIES = 32


def amqp10(body: bytes, **application: Any) -> bytes:
    return bytes(AMQPMessage(body=body, application_properties=application or None))


def publish_frame(client: RawStream, first_id: int, messages: list[bytes],
                  values: list[str] | None = None) -> None:
    """One Publish (v1, or v2 with filter values) of simple entries."""
    if values is None:
        entries = b"".join(struct.pack(">QI", first_id + i, len(m)) + m
                           for i, m in enumerate(messages))
        client.send(0x02, 1, struct.pack(">Bi", 1, len(messages)) + entries)
        return
    entries = b"".join(struct.pack(">Q", first_id + i) + struct.pack(">h", len(v)) + v.encode()
                       + struct.pack(">I", len(m)) + m
                       for i, (m, v) in enumerate(zip(messages, values, strict=True)))
    client.send(0x02, 2, struct.pack(">Bi", 1, len(messages)) + entries)


def confirmed(client: RawStream, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        ids += confirms(client)
    return ids


def deliver_frames(client: RawStream, count: int) -> list[tuple[int, int, bytes]]:
    """(first offset, entry count, data) of Deliver frames until `count` messages came."""
    out: list[tuple[int, int, bytes]] = []
    while sum(n for _, n, _ in out) < count:
        frame = client.next(0x08)
        head = struct.unpack_from(">BBHIqQQIIIB3x", frame, 5)
        data = frame[5 + 48 : 5 + 48 + head[8]]
        assert zlib.crc32(data) == head[7]
        out.append((head[6], head[2], data))
    return out


def chunk_types(log_dir: Path) -> list[tuple[int, int, int]]:
    """(type, first offset, records) of every chunk with records, in file order."""
    with Reader.open(log_dir, OffsetSpec.first(), chunk_types=(0, STREAM_ENTRIES)) as reader:
        return [(v.chunk_type, v.first_offset, v.num_records) for v in reader]


def amqp_read(port: int, stream: str, count: int) -> list[tuple[Any, Any, bytes]]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1000)
    out = []
    for method, properties, body in ch.consume(stream, arguments={"x-stream-offset": "first"},
                                               inactivity_timeout=5):
        if method is None:
            break
        out.append((method, properties, body))
        ch.basic_ack(method.delivery_tag)
        if len(out) == count:
            break
    connection.close()
    return out


# -- one broker process for the module (conftest's `lev`) ------------------------------------


def test_stream_messages_come_back_byte_for_byte_one_deliver_per_chunk(
        lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    sent: list[bytes] = []
    for batch in range(12):  # confirmed batch by batch: several chunks
        messages = [amqp10(b"m%d.%d" % (batch, i) * (i % 7)) for i in range(40)]
        messages[3] = b""  # any bytes, even none, go through as they were sent
        publish_frame(client, len(sent) + 1, messages)
        assert confirmed(client, 40) == list(range(len(sent) + 1, len(sent) + 41))
        sent += messages
    subscribe(client, name)
    assert deliveries(client, len(sent)) == list(enumerate(sent))
    reader = lev.raw()
    subscribe(reader, name)
    frames = deliver_frames(reader, len(sent))
    # each Deliver is one whole chunk: its data is the chunk's entries, as published
    assert [first for first, _, _ in frames] == sorted({first for first, _, _ in frames})
    assert b"".join(data for _, _, data in frames) == b"".join(
        struct.pack(">I", len(m)) + m for m in sent)


def test_stream_in_091_out_keeps_every_property_type(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    application = [
        ("utf8", "s", ("utf8", "text")), ("b", ("boolean", True)), ("ub", ("ubyte", 200)),
        ("by", ("byte", -5)), ("us", ("ushort", 60000)), ("sh", ("short", -300)),
        ("ui", ("uint", 4000000000)), ("in", ("int", -70000)), ("l", ("long", -(2**40))),
        ("ul", ("ulong", 2**40)), ("d", ("double", 3.0)), ("f", ("float", 2.0)),
        ("ts", ("timestamp", 1700000000123)), ("bin", ("binary", b"\x00\xff")),
        ("sym", ("symbol", "sy")), ("nul", ("null",)),
    ]
    pairs = [(("utf8", key), value) for key, value in
             [(a[1], a[2]) if a[0] == "utf8" else a for a in application]]
    message = b"".join((
        t.encode(("described", ("ulong", 0x70), ("list", [("boolean", True), ("ubyte", 6)]))),
        t.encode(("described", ("ulong", 0x73), ("list", [
            ("utf8", "mid"), ("binary", b"guest"), ("null",), ("null",), ("utf8", "/queues/rq"),
            ("utf8", "corr"), ("symbol", "text/plain"), ("symbol", "gzip"), ("null",),
            ("timestamp", 1700000000000), ("utf8", "app")]))),
        t.encode(("described", ("ulong", 0x74), ("map", pairs))),
        t.encode(("described", ("ulong", 0x75), ("binary", b"payload"))),
    ))
    publish_frame(client, 1, [message, amqp10(b"plain")])
    assert confirmed(client, 2) == [1, 2]
    [(m1, p1, b1), (m2, p2, b2)] = amqp_read(lev.amqp_port, name, 2)
    assert (m1.exchange, m1.routing_key, b1) == ("", name, b"payload")
    assert (p1.message_id, p1.user_id, p1.reply_to, p1.correlation_id, p1.content_type,
            p1.content_encoding, p1.timestamp, p1.app_id, p1.delivery_mode, p1.priority) == (
        "mid", "guest", "rq", "corr", "text/plain", "gzip", 1700000000, "app", 2, 6)
    # (pika reads a double or a float as an int: whole numbers are sent)
    assert p1.headers == {
        "x-stream-offset": 0, "s": "text", "b": True, "ub": 200, "by": -5, "us": 60000,
        "sh": -300, "ui": 4000000000, "in": -70000, "l": -(2**40), "ul": 2**40, "d": 3,
        "f": 2, "ts": datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
        "bin": b"\x00\xff", "sym": "sy", "nul": None}
    assert (m2.routing_key, b2, p2.headers) == (name, b"plain", {"x-stream-offset": 1})


def test_server_side_filtering_of_stream_entries(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    publish_frame(client, 1, [b"a1", b"b1", b"a2"], ["a", "b", "a"])  # a mixed chunk
    assert confirmed(client, 3) == [1, 2, 3]
    publish_frame(client, 4, [b"a3", b"a4"], ["a", "a"])  # a chunk the filter keeps whole
    assert confirmed(client, 2) == [4, 5]
    publish_frame(client, 6, [b"b2"], ["b"])  # a chunk the bloom filter skips
    assert confirmed(client, 1) == [6]
    subscribe(client, name, {"filter.0": "a"})
    assert deliveries(client, 4) == [(0, b"a1"), (2, b"a2"), (3, b"a3"), (4, b"a4")]
    other = lev.raw()
    subscribe(other, name, {"filter.0": "b"})
    assert deliveries(other, 2) == [(1, b"b1"), (5, b"b2")]


# -- brokers of their own ---------------------------------------------------------------------


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[tuple[InProcessBroker, int]]:
    port = free_port()
    broker = InProcessBroker(tmp_path / "data", stream_port=port,
                             management_port=free_port()).start()
    yield broker, port
    broker.stop()


def test_a_turn_with_both_protocols_is_one_chunk_per_run(
        inproc: tuple[InProcessBroker, int], name: str) -> None:
    broker, stream_port = inproc
    client = RawStream(stream_port)
    client.handshake()
    create_and_declare(client, name)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    ch = connection.channel()
    blocked, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:  # the broker reads both sockets in its next turn
        blocked.set()
        release.wait(20)

    holder = threading.Thread(target=broker.call, args=(hold_the_loop,))
    holder.start()
    try:
        assert blocked.wait(20)
        for i in range(3):
            ch.basic_publish("", name, b"amqp-%d" % i)
        publish_frame(client, 1, [amqp10(b"stream-%d" % i) for i in range(4)])
        # A wire worker (LEVERET_WORKERS=2) reads the AMQP socket, not the held loop: let it
        # pass the publishes on, so that both kinds wait for the same turn of the main process.
        time.sleep(0.3)
    finally:
        release.set()
        holder.join()
    assert confirmed(client, 4) == [1, 2, 3, 4]
    confirming = connection.channel()  # stored before the count below, even through a worker
    confirming.confirm_delivery()
    for i in range(3, 5):  # later turns
        confirming.basic_publish("", name, b"amqp-%d" % i)
    publish_frame(client, 5, [amqp10(b"stream-%d" % i) for i in range(4, 6)])
    assert confirmed(client, 2) == [5, 6]
    queue = broker.broker.vhosts["/"].queues[name]
    chunks = chunk_types(queue.directory)
    # one chunk per run: the turn held both kinds, each of its chunks holds one kind
    assert {kind for kind, _, _ in chunks} == {0, STREAM_ENTRIES}
    assert [first for _, first, _ in chunks] == [0, *[
        first + n for _, first, n in chunks][:-1]]  # offsets contiguous
    assert sum(n for _, _, n in chunks) == 11
    subscribe(client, name)
    got = deliveries(client, 11)
    assert [o for o, _ in got] == list(range(11))
    bodies = [bytes(amqp_decoder(m).body) for _, m in got]
    assert [b for b in bodies if b.startswith(b"amqp")] == [b"amqp-%d" % i for i in range(5)]
    assert [b for b in bodies if b.startswith(b"stream")] == [b"stream-%d" % i for i in range(6)]
    # the one turn's publishes are two chunks next to each other, whichever came first
    first_turn = [kind for kind, first, _ in chunks if first < 7]
    assert sorted(first_turn) == [0, STREAM_ENTRIES]
    out = amqp_read(broker.port, name, 11)
    assert [m.routing_key for m, _, _ in out] == [name] * 11
    assert sorted(bodies) == sorted(body for _, _, body in out)
    connection.close()
    client.close()


def test_the_management_api_reads_stream_entries(
        inproc: tuple[InProcessBroker, int], name: str) -> None:
    broker, stream_port = inproc
    client = RawStream(stream_port)
    client.handshake()
    create_and_declare(client, name)
    publish_frame(client, 1, [amqp10(b"one", k="v"), amqp10(b"two")])
    assert confirmed(client, 2) == [1, 2]
    url = (f"http://127.0.0.1:{broker.config.management_port}/api/leveret/streams/%2F/"
           f"{name}/messages")
    answer = requests.get(url, params={"offset": 1, "count": 5}, auth=("guest", "guest"),
                          timeout=10).json()
    messages = answer["messages"] if isinstance(answer, dict) else answer
    assert [(m["offset"], m["payload"], m["routing_key"], m["exchange"]) for m in messages] == [
        (1, "two", name, "")]
    answer = requests.get(url, params={"offset": 0, "count": 1}, auth=("guest", "guest"),
                          timeout=10).json()
    messages = answer["messages"] if isinstance(answer, dict) else answer
    assert messages[0]["payload"] == "one"
    assert messages[0]["properties"]["headers"] == {"k": "v"}
    client.close()


def test_a_restart_reopens_the_log_and_serves_stream_entries(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    lev = start_stream_broker(data)
    sent = [amqp10(b"before-%d" % i) for i in range(30)]
    try:
        client = lev.raw()
        create_and_declare(client, name)
        publish_frame(client, 1, sent)
        assert confirmed(client, 30) == list(range(1, 31))
        client.close()
    finally:
        lev.process.stop()
    [folder] = [p for p in (data / "queues").iterdir() if p.is_dir()]
    assert [kind for kind, _, _ in chunk_types(folder)] == [STREAM_ENTRIES]
    result = CliRunner().invoke(app, ["dump_chunk", "--log-dir", str(folder), "--offset", "3",
                                      "--records", "--formatter", "json"])
    assert result.exit_code == 0, result.output
    assert '"offset": 3' in result.stdout
    lev = start_stream_broker(data)
    try:
        client = lev.raw()
        subscribe(client, name)
        assert deliveries(client, 30) == list(enumerate(sent))
        assert [body for _, _, body in amqp_read(lev.amqp_port, name, 30)] == [
            b"before-%d" % i for i in range(30)]
    finally:
        lev.process.stop()


def new_stream_folder(data: Path, name: str) -> Path:
    """The log folder of stream `name`, created by a broker on `data` that is then stopped (a
    test writes into it as an older writer would have)."""
    lev = start_stream_broker(data)
    try:
        client = lev.raw()
        create_and_declare(client, name)
        client.close()
    finally:
        lev.process.stop()
    [folder] = [p for p in (data / "queues").iterdir() if p.is_dir()]
    return folder


def test_a_log_written_before_stream_entries_is_still_served(tmp_path: Path, name: str) -> None:
    """0x80 records (the exchange and routing key, then the message) in USER chunks, as the
    broker wrote stream-protocol publishes before STREAM_ENTRIES existed."""
    data = tmp_path / "data"
    folder = new_stream_folder(data, name)
    old = [amqp10(b"old-%d" % i) for i in range(5)]
    with Log.open(folder) as log:
        log.append([encode_amqp10_record("", name, m) for m in old[:3]])
        log.append([encode_amqp10_record("", name, m) for m in old[3:]])
    lev = start_stream_broker(data)
    try:
        client = lev.raw()
        declare_publisher(client, name)
        new = [amqp10(b"new-%d" % i) for i in range(2)]
        publish_frame(client, 1, new)
        assert confirmed(client, 2) == [1, 2]
        assert [kind for kind, _, _ in chunk_types(folder)] == [0, 0, STREAM_ENTRIES]
        subscribe(client, name)
        assert deliveries(client, 7) == list(enumerate(old + new))
        out = amqp_read(lev.amqp_port, name, 7)
        assert [(m.routing_key, body) for m, _, body in out] == [
            (name, b"old-%d" % i) for i in range(5)] + [(name, b"new-0"), (name, b"new-1")]
    finally:
        lev.process.stop()


def test_the_deliver_crc_is_the_one_kept_with_the_chunk(
        inproc: tuple[InProcessBroker, int], name: str) -> None:
    """The writer keeps each STREAM_ENTRIES chunk's CRC-32 (docs/FORMAT.md 3.1, version 3); the
    Deliver carries it, and it is the CRC-32 of the Deliver's data as clients compute it."""
    broker, stream_port = inproc
    client = RawStream(stream_port)
    client.handshake()
    create_and_declare(client, name)
    sent: list[bytes] = []
    for batch in range(5):
        messages = [amqp10(b"crc-%d-%d" % (batch, i) * i) for i in range(25)]
        publish_frame(client, len(sent) + 1, messages)
        assert confirmed(client, 25) == list(range(len(sent) + 1, len(sent) + 26))
        sent += messages
    queue = broker.broker.vhosts["/"].queues[name]
    with Reader.open(queue.directory, OffsetSpec.first(),
                     chunk_types=(0, STREAM_ENTRIES)) as reader:
        kept = {v.first_offset: v.records_crc for v in reader}
    subscribe(client, name)
    frames = deliver_frames(client, len(sent))  # each checked: zlib.crc32(data) == its CRC
    for first, _count, data in frames:
        assert kept[first] == zlib.crc32(data)
    assert b"".join(data for _, _, data in frames) == b"".join(
        struct.pack(">I", len(m)) + m for m in sent)
    client.close()


def test_stream_entries_chunks_without_a_kept_crc_are_still_served(tmp_path: Path,
                                                                   name: str) -> None:
    """STREAM_ENTRIES chunks written before the writer kept their CRC (format version 2): the
    Deliver's CRC is computed as they are sent."""
    data = tmp_path / "data"
    folder = new_stream_folder(data, name)
    old = [amqp10(b"old-%d" % i) for i in range(5)]
    with Log.open(folder) as log:
        log.append([struct.pack(">I", len(m)) + m for m in old[:2]], chunk_type=STREAM_ENTRIES)
        log.append([struct.pack(">I", len(m)) + m for m in old[2:]], chunk_type=STREAM_ENTRIES)
    with Reader.open(folder, OffsetSpec.first(), chunk_types=(STREAM_ENTRIES,)) as reader:
        assert [v.records_crc for v in reader] == [None, None]
    lev = start_stream_broker(data)
    try:
        client = lev.raw()
        declare_publisher(client, name)
        new = [amqp10(b"new-%d" % i) for i in range(3)]
        publish_frame(client, 1, new)
        assert confirmed(client, 3) == [1, 2, 3]
        reader = lev.raw()
        subscribe(reader, name)
        frames = deliver_frames(reader, 8)  # every CRC checked, old chunks and the new one
        assert [(first, count) for first, count, _ in frames] == [(0, 2), (2, 3), (5, 3)]
        subscribe(client, name)
        assert deliveries(client, 8) == list(enumerate(old + new))
    finally:
        lev.process.stop()
