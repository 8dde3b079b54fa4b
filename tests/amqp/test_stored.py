"""The stored form of a message, and deliveries built from it, checked against pamqp."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.header import ContentHeader

from leveret.amqp.content import Message, deliver_parts
from leveret.amqp.frames import FrameBuffer
from leveret.amqp.stored import (
    decode_record,
    deliver_batch,
    deliver_frames,
    deliver_names,
    encode_record,
)

names = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
headers = st.dictionaries(st.text(min_size=1, max_size=8), st.integers(-1000, 1000), max_size=3)
properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | st.text(min_size=1, max_size=10),
    content_encoding=st.none() | st.text(min_size=1, max_size=10),
    headers=st.none() | headers,
    message_id=st.none() | st.text(min_size=1, max_size=10),
)
messages = st.builds(
    lambda exchange, key, body, props: Message.build(exchange, key, body, props),
    names, names, st.binary(max_size=300), properties,
)


def decode_all(data: bytes) -> list[object]:
    buffer = FrameBuffer(131072)
    out = []
    for frame_type, channel, payload in buffer.feed(data):
        raw = frame_type.to_bytes(1, "big") + channel.to_bytes(2, "big")
        raw += len(payload).to_bytes(4, "big") + payload + b"\xce"
        out.append(frame.unmarshal(raw)[2])
    return out


@settings(max_examples=200, deadline=None)
@given(messages)
def test_record_round_trip(message: Message) -> None:
    back = decode_record(encode_record(message))
    assert (back.exchange, back.routing_key, back.header, back.body) == (
        message.exchange, message.routing_key, message.header, message.body)


@settings(max_examples=100, deadline=None)
@given(messages, st.binary(max_size=30))
def test_a_record_read_where_it_starts_in_a_longer_buffer(message: Message, head: bytes) -> None:
    """A durable queue's entry is its own head, then the record: read in place."""
    back = decode_record(head + encode_record(message), len(head))
    assert (back.exchange, back.routing_key, back.header, back.body) == (
        message.exchange, message.routing_key, message.header, message.body)


@settings(max_examples=200, deadline=None)
@given(messages, st.integers(1, 2**40), st.booleans(), st.sampled_from([0, 4096, 131072]),
       st.sampled_from([0, 1, 4088, 4089, 10000]))
def test_a_classic_delivery_is_the_message_as_published(
        message: Message, tag: int, redelivered: bool, frame_max: int, size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    message = Message.build(message.exchange, message.routing_key, body, message.properties)
    parts = deliver_parts(5, b"\x03abc", tag, redelivered,
                          deliver_names(message.exchange, message.routing_key), message.header,
                          body, frame_max)
    deliver, content_header, *bodies = decode_all(b"".join(bytes(p) for p in parts))
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == (
        "abc", tag, redelivered)
    assert (deliver.exchange, deliver.routing_key) == (message.exchange, message.routing_key)
    assert isinstance(content_header, ContentHeader)
    assert content_header.body_size == size
    assert content_header.properties == message.properties
    assert b"".join(b.value for b in bodies) == body
    limit = frame_max - 8 if frame_max else size
    assert all(len(b.value) <= limit for b in bodies)
    assert len(bodies) == (-(-size // limit) if size else 0)


def test_names_over_255_bytes_are_cut_as_shortstrs_are() -> None:
    """A dead-letter routing key is a queue argument (a longstr), so it can be longer than
    basic.deliver can carry: cut at 255 bytes on a character boundary, never an error."""
    names = deliver_names("dlx", "é" * 200)
    assert names[:4] == b"\x03dlx"
    assert names[4] == 254 and names[5:].decode("utf-8") == "é" * 127


@settings(max_examples=200, deadline=None)
@given(messages, st.integers(0, 2**62), st.integers(1, 2**40), st.sampled_from([4096, 131072]))
def test_a_delivery_is_the_message_with_its_offset(
        message: Message, offset: int, tag: int, frame_max: int) -> None:
    out: list[bytes | memoryview] = []
    deliver_frames(3, b"\x03abc", tag, offset, encode_record(message), frame_max, out)
    deliver, content_header, *bodies = decode_all(b"".join(bytes(p) for p in out))
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("abc", tag, False)
    assert (deliver.exchange, deliver.routing_key) == (message.exchange, message.routing_key)
    assert isinstance(content_header, ContentHeader)
    expected = message.properties
    got = content_header.properties
    assert got.headers == {**(expected.headers or {}), "x-stream-offset": offset}
    for name in ("content_type", "content_encoding", "message_id"):
        assert getattr(got, name) == getattr(expected, name)
    assert b"".join(b.value for b in bodies) == message.body
    assert all(len(b.value) <= frame_max - 8 for b in bodies)


def assert_batch_is_one_by_one(channel: int, consumer_tag: bytes, first_tag: int,
                               offsets: range, batch: list[Message], frame_max: int) -> None:
    """deliver_batch writes the same bytes as deliver_frames for each record in turn."""
    records = [encode_record(m) for m in batch]
    one_by_one: list[bytes | memoryview] = []
    for i, (offset, record) in enumerate(zip(offsets, records, strict=True)):
        deliver_frames(channel, consumer_tag, first_tag + i, offset, record, frame_max,
                       one_by_one)
    batched: list[bytes | memoryview] = []
    deliver_batch(channel, consumer_tag, first_tag, list(offsets), records, frame_max, batched)
    assert b"".join(bytes(p) for p in batched) == b"".join(bytes(p) for p in one_by_one)


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, min_size=1, max_size=20), st.integers(1, 2**40),
       st.sampled_from([4096, 131072]))
def test_a_batch_is_the_same_bytes_as_one_by_one(
        batch: list[Message], first_tag: int, frame_max: int) -> None:
    assert_batch_is_one_by_one(7, b"\x01c", first_tag, range(100, 100 + len(batch)), batch,
                               frame_max)


bare = st.builds(  # messages without properties, of few layouts: runs of one layout are likely
    lambda exchange, key, size, fill: Message.build(exchange, key, bytes([fill]) * size),
    st.sampled_from(["", "x", "y"]), st.sampled_from(["k", "q", "kk"]),
    st.sampled_from([0, 1, 5, 5000]), st.integers(0, 255),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(bare | messages, min_size=1, max_size=30), st.integers(1, 2**40),
       st.sampled_from([4096, 131072]))
def test_runs_of_one_layout_are_the_same_bytes_as_one_by_one(
        batch: list[Message], first_tag: int, frame_max: int) -> None:
    """deliver_batch's shortcut for a record laid out as the one before it (same length, same
    bytes up to the body) changes no byte."""
    assert_batch_is_one_by_one(2, b"\x02ct", first_tag, range(7, 7 + 3 * len(batch), 3), batch,
                               frame_max)


def test_a_published_offset_header_is_replaced_not_duplicated() -> None:
    message = Message.build("", "s", b"x", commands.Basic.Properties(
        headers={"x-stream-offset": 999, "app": "kept"}))
    out: list[bytes | memoryview] = []
    deliver_frames(1, b"\x01c", 1, 5, encode_record(message), 131072, out)
    raw = b"".join(bytes(p) for p in out)
    assert raw.count(b"\x0fx-stream-offset") == 1
    _deliver, content_header, _body = decode_all(raw)
    assert content_header.properties.headers == {"x-stream-offset": 5, "app": "kept"}
