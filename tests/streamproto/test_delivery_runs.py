"""Deliver frames built once per run: records published over the stream protocol are cut, not
converted; any other run is converted record by record; a second subscriber of the same
chunks, and one that starts inside a chunk, get the same messages."""

from __future__ import annotations

import struct

import pika

from leveret.amqp import stored
from leveret.amqp.content import Message
from leveret.amqp.properties import encode_values
from leveret.broker.streamproto import amqp10, chunk, subscription

from .conftest import StreamBroker
from .raw import s, strmap
from .test_raw_protocol import confirms, create_and_declare, deliveries


def test_stream_records_are_cut_and_mixed_runs_converted() -> None:
    sent = [b"\x00\x53\x75\xa0\x02hi", b"\x00\x53\x77\xa1\x03abc"]
    records = [stored.encode_amqp10_record("", "events", m) for m in sent]
    assert subscription._entries(records).data == chunk.entries(sent).data
    plain = stored.encode_record(Message("", "events", encode_values(3, None), b"091"))
    mixed = [records[0], plain, records[1]]
    expected = chunk.entries([amqp10.to_amqp10(r) for r in mixed])
    run = subscription._entries(mixed)
    assert (run.data, run.count, run.crc) == (expected.data, 3, expected.crc)
    other = stored.encode_amqp10_record("", "other", sent[0])  # another prefix: converted
    assert subscription._entries([records[0], other]).data == chunk.entries(
        [sent[0], sent[0]]).data


def test_two_subscribers_and_one_inside_a_chunk(lev: StreamBroker, name: str) -> None:
    publisher = lev.raw()
    create_and_declare(publisher, name)
    sent = [b"\x00\x53\x75\xa0\x02m" + bytes([48 + i]) for i in range(6)]
    entries = b"".join(struct.pack(">QI", i, len(m)) + m for i, m in enumerate(sent))
    publisher.send(0x02, 1, struct.pack(">Bi", 1, len(sent)) + entries)
    assert confirms(publisher) == list(range(6))
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lev.amqp_port))
    ch = connection.channel()
    ch.confirm_delivery()
    ch.basic_publish("", name, b"from 0.9.1")
    connection.close()
    expected = [(i, m) for i, m in enumerate(sent)] + [
        (6, amqp10.to_amqp10(stored.encode_record(
            Message("", name, encode_values(10, None), b"from 0.9.1"))))]

    def read(spec: bytes) -> list[tuple[int, bytes]]:
        client = lev.raw()
        client.request(0x07, struct.pack(">B", 1) + s(name) + spec + struct.pack(">H", 10)
                       + strmap({}))
        assert client.response(0x07)[1] == 1
        got = deliveries(client, 7 - struct.unpack(">Q", spec[2:])[0] if len(spec) > 2 else 7)
        client.close()
        return got

    first = read(struct.pack(">H", 1))
    assert first == expected
    assert read(struct.pack(">H", 1)) == expected
    assert read(struct.pack(">HQ", 4, 3)) == expected[3:]
    publisher.close()
