"""The sink's and source's hand-written frames match pamqp's, both ways."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands, frame, header

from leveret.spark import frames as f

pytestmark = pytest.mark.spark

short = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)


@given(exchange=short, routing_key=short, body=st.binary(max_size=3000),
       frame_max=st.sampled_from([4096, 131072]))
def test_publish_frames_decode_with_pamqp(exchange: str, routing_key: str, body: bytes,
                                          frame_max: int) -> None:
    props = f.encode_properties({"content_type": "text/plain", "delivery_mode": 2},
                                f.table([f.table_entry_long("x-stream-publishing-id", 7)]))
    data = f.method_frame_publish(3, f.shortstr(exchange), f.shortstr(routing_key)) + b"".join(
        f.content_frames(3, props, body, frame_max))
    used, channel, method = frame.unmarshal(data)
    assert channel == 3 and isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory) == (exchange, routing_key,
                                                                       True)
    data = data[used:]
    used, _ch, content = frame.unmarshal(data)
    assert isinstance(content, header.ContentHeader)
    assert content.body_size == len(body)
    assert content.properties.content_type == "text/plain"
    assert content.properties.headers == {"x-stream-publishing-id": 7}
    data = data[used:]
    got = b""
    while data:
        used, _ch, piece = frame.unmarshal(data)
        assert isinstance(piece, pamqp_body.ContentBody)
        assert len(piece.value) <= frame_max - 8
        got += piece.value
        data = data[used:]
    assert got == body


@given(  # (pamqp leaves out empty strings, which we send: not compared byte for byte here)
    content_type=st.none() | short.filter(bool),
    message_id=st.none() | short.filter(bool),
    priority=st.none() | st.integers(0, 255),
    timestamp=st.none() | st.integers(0, 2**32 - 1),
    headers=st.none() | st.dictionaries(short.filter(bool), st.text(max_size=20), max_size=4),
)
def test_properties_roundtrip_against_pamqp(content_type, message_id, priority, timestamp,
                                            headers) -> None:  # type: ignore[no-untyped-def]
    values = {"content_type": content_type, "message_id": message_id, "priority": priority,
              "timestamp": timestamp}
    table = (f.table([f.table_entry_str(k, v) for k, v in headers.items()])
             if headers is not None else None)
    ours = f.encode_properties(values, table)
    theirs = commands.Basic.Properties(
        content_type=content_type, message_id=message_id, priority=priority,
        timestamp=(datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
                   if timestamp is not None else None),
        headers=headers)
    content = header.ContentHeader(0, 0, theirs).marshal()
    parsed = header.ContentHeader()
    parsed.unmarshal(content[:12] + ours)  # pamqp reads ours ...
    assert parsed.properties == theirs
    decoded = f.decode_properties(content[12:])  # ... and we read pamqp's
    expected = {k: v for k, v in values.items() if v is not None}
    if headers is not None:
        expected["headers"] = headers
    assert decoded == expected


def test_deliver_and_ack() -> None:
    deliver = commands.Basic.Deliver(consumer_tag="ctag", delivery_tag=2**40 + 5,
                                     redelivered=True, exchange="ex", routing_key="rk")
    payload = frame.marshal(deliver, 1)[7:-1]
    got = f.parse_deliver(memoryview(payload))
    assert (got.delivery_tag, got.exchange, got.routing_key) == (2**40 + 5, "ex", "rk")
    assert f.encode_ack(9, 12345, True) == frame.marshal(
        commands.Basic.Ack(delivery_tag=12345, multiple=True), 9)
