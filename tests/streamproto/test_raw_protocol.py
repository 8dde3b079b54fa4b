"""What rstream does not exercise, over a raw socket: sub-entry batches with every compression
(snappy, lz4 and zstd too), publish v2 with a filter value, Deliver v2 after
ExchangeCommandVersions, heartbeats and the client's Close."""

from __future__ import annotations

import struct
import zlib

import pytest

from leveret.broker.streamproto import compression

from .conftest import StreamBroker
from .raw import RawStream, s, strmap


def create_and_declare(client: RawStream, name: str, pid: int = 1) -> None:
    client.request(0x0D, s(name) + struct.pack(">i", 0))
    assert client.response(0x0D)[1] == 1
    declare_publisher(client, name, pid)


def declare_publisher(client: RawStream, name: str, pid: int = 1) -> None:
    client.request(0x01, struct.pack(">B", pid) + s("") + s(name))
    assert client.response(0x01)[1] == 1


def confirms(client: RawStream) -> list[int]:
    frame = client.next(0x03)
    count = struct.unpack(">i", frame[5:9])[0]
    return [struct.unpack(">Q", frame[9 + 8 * i : 17 + 8 * i])[0] for i in range(count)]


def deliveries(client: RawStream, count: int) -> list[tuple[int, bytes]]:
    """(offset, message) of Deliver v1 or v2 frames until `count` messages arrived."""
    out: list[tuple[int, bytes]] = []
    while len(out) < count:
        frame = client.next(0x08)
        version = struct.unpack(">H", frame[2:4])[0]
        pos = 5 + (8 if version == 2 else 0)
        head = struct.unpack_from(">BBHIqQQIIIB3x", frame, pos)
        entries, first, crc, length = head[2], head[6], head[7], head[8]
        data = frame[pos + 48 : pos + 48 + length]
        assert zlib.crc32(data) == crc
        at = 0
        for i in range(entries):
            size = struct.unpack(">I", data[at : at + 4])[0]
            out.append((first + i, data[at + 4 : at + 4 + size]))
            at += 4 + size
    return out


def subscribe(client: RawStream, name: str, properties: dict[str, str] | None = None) -> None:
    client.request(0x07, struct.pack(">B", 1) + s(name) + struct.pack(">HH", 1, 100)
                   + strmap(properties or {}))
    assert client.response(0x07)[1] == 1


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_sub_entry_batch_compression(lev: StreamBroker, name: str, codec: int) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    messages = [b"m%d" % i * 20 for i in range(5)]
    raw = compression.pack(messages)
    data = compression.compress(codec, raw)
    entry = (struct.pack(">QB", 1, 0x80 | (codec << 4)) + struct.pack(">HII", 5, len(raw),
                                                                     len(data)) + data)
    client.send(0x02, 1, struct.pack(">Bi", 1, 1) + entry)
    assert confirms(client) == [1]
    subscribe(client, name)
    assert deliveries(client, 5) == list(enumerate(messages))


def test_a_bad_sub_entry_batch_is_a_malformed_frame(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    entry = struct.pack(">QB", 1, 0x80 | (1 << 4)) + struct.pack(">HII", 1, 10, 4) + b"nope"
    client.send(0x02, 1, struct.pack(">Bi", 1, 1) + entry)
    frame = client.next(0x16)
    assert struct.unpack(">H", frame[8:10])[0] == 13


def test_publish_v2_filter_values_and_deliver_v2(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    client.request(0x1B, struct.pack(">i", 1) + struct.pack(">HHH", 0x08, 1, 2))
    _, code, body = client.response(0x1B)
    versions = {struct.unpack(">H", body[4 + 6 * i : 6 + 6 * i])[0]:
                struct.unpack(">HH", body[6 + 6 * i : 10 + 6 * i])
                for i in range(struct.unpack(">i", body[:4])[0])}
    assert code == 1 and versions[0x02] == (1, 2)
    create_and_declare(client, name)
    entries = b"".join(struct.pack(">Q", i) + s(value) + struct.pack(">I", 1) + body
                       for i, (value, body) in enumerate([("a", b"1"), ("b", b"2"),
                                                          ("a", b"3")], 1))
    client.send(0x02, 2, struct.pack(">Bi", 1, 3) + entries)
    assert confirms(client) == [1, 2, 3]
    subscribe(client, name, {"filter.0": "a"})
    frame = client.next(0x08)
    assert struct.unpack(">H", frame[2:4])[0] == 2
    client.buf = struct.pack(">I", len(frame)) + frame + client.buf
    assert [m for _, m in deliveries(client, 2)] == [b"1", b"3"]


def test_heartbeat_and_client_close(lev: StreamBroker) -> None:
    client = lev.raw()
    client.send(0x17, 1, b"")
    corr = client.request(0x16, struct.pack(">H", 1) + s("bye"))
    assert client.response(0x16)[:2] == (corr, 1)
    assert client.closed_by_server()


def test_deleting_a_stream_tells_its_publishers_and_subscribers(lev: StreamBroker,
                                                                name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    subscribe(client, name)
    other = lev.raw()
    other.request(0x0E, s(name))
    assert other.response(0x0E)[1] == 1
    frame = client.next(0x10)
    assert struct.unpack(">H", frame[4:6])[0] == 6 and frame[8:] == name.encode()
    client.request(0x0F, struct.pack(">i", 1) + s(name))  # only one update came
    frame = client.read_frame()
    assert struct.unpack(">H", frame[:2])[0] == 0x800F
    message = b"late"  # the publisher went with its stream
    client.send(0x02, 1, struct.pack(">BiQI", 1, 1, 5, len(message)) + message)
    frame = client.next(0x04)
    assert struct.unpack(">BiQH", frame[4:19]) == (1, 1, 5, 18)


def test_stream_stats(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)

    def stats() -> dict[str, int]:
        client.request(0x1C, s(name))
        _, code, body = client.response(0x1C)
        assert code == 1
        out, pos = {}, 4
        for _ in range(struct.unpack(">i", body[:4])[0]):
            size = struct.unpack(">h", body[pos : pos + 2])[0]
            key = body[pos + 2 : pos + 2 + size].decode()
            out[key] = struct.unpack(">q", body[pos + 2 + size : pos + 10 + size])[0]
            pos += 10 + size
        return out

    # osiris:get_stats's three keys, which every RabbitMQ with StreamStats (3.11+) answers and
    # the Node client's own test reads (test/unit/stream_stats.test.ts: lastChunkId)
    assert stats() == {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}
    client.send(0x02, 1, struct.pack(">Bi", 1, 3) + b"".join(
        struct.pack(">QI", i, 1) + b"x" for i in (1, 2, 3)))
    assert confirms(client) == [1, 2, 3]
    client.send(0x02, 1, struct.pack(">BiQI", 1, 1, 4, 1) + b"y")
    assert confirms(client) == [4]
    assert stats() == {"first_chunk_id": 0, "committed_chunk_id": 3, "last_chunk_id": 3}


def test_match_unfiltered(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)
    client.send(0x02, 2, struct.pack(">Bi", 1, 2) + b"".join(
        struct.pack(">Q", i) + s(v) + struct.pack(">I", 1) + b for i, (v, b) in
        enumerate([("a", b"1"), ("b", b"2")], 1)))
    assert confirms(client) == [1, 2]
    client.send(0x02, 1, struct.pack(">BiQI", 1, 1, 3, 1) + b"3")  # v1: no filter value
    assert confirms(client) == [3]
    subscribe(client, name, {"filter.0": "a", "match-unfiltered": "true"})
    assert [m for _, m in deliveries(client, 2)] == [b"1", b"3"]


def test_resolve_offset_spec(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    create_and_declare(client, name)

    def resolve(kind: int, value: bytes = b"") -> tuple[int, int]:
        client.request(0x1F, s(name) + struct.pack(">h", kind) + value + strmap({}))
        _, code, body = client.response(0x1F)
        offset_type, offset = struct.unpack(">HQ", body)
        assert offset_type == 4
        return code, offset

    assert resolve(1) == (19, 0)  # first, on an empty stream: no offset
    client.send(0x02, 1, struct.pack(">Bi", 1, 3) + b"".join(
        struct.pack(">QI", i, 1) + b"x" for i in (1, 2, 3)))
    assert confirms(client) == [1, 2, 3]
    client.send(0x02, 1, struct.pack(">BiQI", 1, 1, 4, 1) + b"y")
    assert confirms(client) == [4]
    assert resolve(1) == (1, 0)
    assert resolve(2) == (1, 3)  # last: the last chunk
    assert resolve(3) == (1, 4)  # next
    client.request(0x1F, s("missing-" + name) + struct.pack(">h", 1) + strmap({}))
    assert client.response(0x1F)[1] == 2
