"""The stream protocol's pure codecs: framing, AMQP 1.0 types, 0.9.1 typed tables, chunks,
compression, and the stored record's AMQP 1.0 kind."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leveret.amqp import stored
from leveret.amqp.content import Message
from leveret.amqp.properties import encode_values
from leveret.broker.streamproto import amqp10, chunk, compression, table091
from leveret.broker.streamproto import amqp10types as t
from leveret.broker.streamproto import frames as f


def test_frame_buffer_splits_and_joins() -> None:
    buffer = f.FrameBuffer(100)
    data = f.frame(0x17, 1, b"") + f.frame(0x0F, 1, b"abc")
    assert buffer.feed(data[:3]) == []
    assert buffer.feed(data[3:9]) == [b"\x00\x17\x00\x01"]
    assert buffer.feed(data[9:]) == [b"\x00\x0f\x00\x01abc"]


def test_frame_buffer_checks_the_size_before_the_bytes() -> None:
    buffer = f.FrameBuffer(8192)
    with pytest.raises(f.FrameTooLarge) as info:
        buffer.feed(struct.pack(">I", 8193))
    assert (info.value.size, info.value.frame_max) == (8193, 8192)
    assert buffer.feed(b"more") == []  # the connection is closing: nothing more is read


def test_decoder_rejects_truncated_and_trailing_fields() -> None:
    with pytest.raises(f.FrameError):
        f.Decoder(b"\x00\x05ab").string()
    d = f.Decoder(b"\x00\x01\x00")
    d.u16()
    with pytest.raises(f.FrameError):
        d.done()
    assert f.Decoder(f.enc_map({"a": "b"})).map() == {"a": "b"}
    assert f.Decoder(b"\xff\xff").string() == ""


def test_response_layout() -> None:
    assert f.response(0x0D, 7, 1) == struct.pack(">IHHIH", 10, 0x800D, 1, 7, 1)


def test_deliver_chunk_header_and_crc() -> None:
    frame = chunk.deliver(3, 10, 1234, [b"a", b"bc"])
    size, key, version, sid = struct.unpack_from(">IHHB", frame)
    assert (size, key, version, sid) == (len(frame) - 4, 8, 1, 3)
    head = struct.unpack_from(">BBHIqQQIIIB3x", frame, 9)
    data = frame[9 + 48 :]
    assert head == (0x50, 0, 2, 2, 1234, 0, 10, zlib.crc32(data), len(data), 0, 0)
    assert data == b"\x00\x00\x00\x01a\x00\x00\x00\x02bc"
    v2 = chunk.deliver(3, 10, 1234, [b"a"], version=2, committed=99)
    assert struct.unpack_from(">HHBQ", v2, 4) == (8, 2, 3, 99)


def test_runs_of_consecutive_offsets() -> None:
    assert chunk.runs(5, None, 3) == [(5, 0, 3)]
    assert chunk.runs(5, [5, 6, 8, 9, 11], 5) == [(5, 0, 2), (8, 2, 4), (11, 4, 5)]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_compression_round_trip(codec: int) -> None:
    messages = [b"one", b"", b"three" * 100]
    raw = compression.pack(messages)
    data = compression.compress(codec, raw)
    assert compression.unpack(codec, 3, len(raw), data) == messages


def test_bad_sub_entry_batches() -> None:
    raw = compression.pack([b"x"])
    with pytest.raises(ValueError):
        compression.unpack(1, 1, len(raw), b"not gzip")
    with pytest.raises(ValueError):
        compression.unpack(0, 1, len(raw) + 1, raw)
    with pytest.raises(ValueError):
        compression.unpack(0, 2, len(raw), raw)
    with pytest.raises(ValueError):
        compression.unpack(7, 1, len(raw), raw)


scalars = st.one_of(
    st.just(t.NULL), st.booleans().map(lambda b: ("boolean", b)),
    st.integers(0, 255).map(lambda n: ("ubyte", n)),
    st.integers(-(2**31), 2**31 - 1).map(lambda n: ("int", n)),
    st.integers(0, 2**32 - 1).map(lambda n: ("uint", n)),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: ("long", n)),
    st.integers(0, 2**64 - 1).map(lambda n: ("ulong", n)),
    st.floats(allow_nan=False).map(lambda x: ("double", x)),
    st.text(max_size=300).map(lambda s: ("utf8", s)),
    st.text(max_size=20).map(lambda s: ("symbol", s)),
    st.binary(max_size=300).map(lambda b: ("binary", b)),
    st.binary(min_size=16, max_size=16).map(lambda b: ("uuid", b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: ("timestamp", n)),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5).map(lambda items: ("list", items)),
    st.lists(st.tuples(st.text(max_size=10).map(lambda s: ("symbol", s)), inner),
             max_size=5).map(lambda pairs: ("map", pairs)),
), max_leaves=20)


@given(values)
def test_amqp10_types_round_trip(value: t.Value) -> None:
    encoded = t.encode(value)
    assert t.decode(encoded) == (value, len(encoded))


def test_amqp10_arrays_and_described() -> None:
    array = ("array", "int", [("int", 1), ("int", -2)])
    assert t.decode(t.encode(array))[0] == array
    described = ("described", ("ulong", 0x75), ("binary", b"x"))
    assert t.decode(t.encode(described))[0] == described
    with pytest.raises(ValueError):
        t.decode(b"\xa1\x05ab")
    with pytest.raises(ValueError):
        t.decode(b"\x99")


def test_table091_round_trip() -> None:
    entries = [("s", "longstr", b"x"), ("l", "long", -5), ("I", "signedint", 7),
               ("B", "unsignedbyte", 200), ("t", "bool", True), ("d", "double", 1.5),
               ("T", "timestamp", 17), ("V", "void", None), ("x", "binary", b"\x00"),
               ("A", "array", [("long", 1), ("longstr", b"a")]),
               ("F", "table", [("k", "signedint", 1)])]
    raw = table091.encode_table(entries)
    assert table091.decode_table(raw, 0, len(raw)) == entries


def test_stored_amqp10_records() -> None:
    message = amqp10.from_091(Message.build("ex", "rk", b"hello"), [])
    record = stored.encode_amqp10_record("", "stream-a", message)
    assert stored.is_amqp10(record) and not stored.is_amqp10(b"\x00")
    assert stored.amqp10_parts(record) == ("", "stream-a", message)
    assert amqp10.to_amqp10(record) == message
    back = stored.decode_record(record)  # through the registered converter
    assert (back.exchange, back.routing_key, back.body) == ("", "stream-a", b"hello")
    out: list[bytes | memoryview] = []
    stored.deliver_batch(1, b"\x03tag", 1, [0], [record], 131072, out)
    assert b"hello" in b"".join(bytes(part) for part in out)


def test_a_record_that_is_not_amqp10_is_delivered_as_its_bytes() -> None:
    record = stored.encode_amqp10_record("", "s", b"\x99 not AMQP 1.0")
    assert stored.decode_record(record).body == b"\x99 not AMQP 1.0"


def test_091_record_converts_to_amqp10_with_its_types() -> None:
    header = encode_values(2, {"content_type": "a/b"},
                           headers=table091.encode_table([("n", "signedint", -3)]))
    record = stored.encode_record(Message("ex", "rk", header, b"hi"))
    sections, body = amqp10.sections(amqp10.to_amqp10(record))
    assert sections[amqp10.APPLICATION_PROPERTIES] == ("map", [(("utf8", "n"), ("int", -3))])
    assert body[0][1] == ("binary", b"hi")


def test_a_091_record_whose_headers_do_not_decode_goes_out_as_its_body() -> None:
    header = encode_values(1, None, headers=b"\x01aZ")  # field type Z does not exist
    record = stored.encode_record(Message("e", "k", header, b"B"))
    assert amqp10.to_amqp10(record) == b"\x00\x53\x75\xa0\x01B"


@pytest.mark.parametrize("size", [0, 100, 300, 70000])
def test_a_message_without_properties_converts_from_its_template(size: int) -> None:
    for exchange, key in (("", "s"), ("ex", "rk")):
        record = stored.encode_record(Message(exchange, key, encode_values(size, None),
                                              b"x" * size))
        assert amqp10.to_amqp10(record) == amqp10.from_091(stored.decode_record(record), [])


@pytest.mark.parametrize("size", [0, 100, 300])
def test_a_lone_data_section_converts_directly(size: int) -> None:
    message = t.encode(("described", ("ulong", 0x75), ("binary", b"y" * size)))
    record = stored.encode_amqp10_record("", "s", b"\x00\x53\x75" + message[3:])
    header, body = amqp10.to_091(stored.amqp10_parts(record)[2])
    fast = stored.decode_record(record)
    assert (fast.header, fast.body, fast.routing_key) == (header, body, "s")
