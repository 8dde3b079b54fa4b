"""Encoded content headers: a header entry spliced into pamqp's bytes reads back through pamqp."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from leveret.amqp import properties as props
from leveret.amqp.errors import AMQPError

Properties = commands.Basic.Properties

shortstrs = st.text(max_size=40)
keys = st.text(min_size=1, max_size=20).filter(lambda k: k != "x-stream-offset")
scalars = st.one_of(
    st.text(max_size=30),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=6,
)
headers = st.one_of(st.none(), st.dictionaries(keys, values, max_size=5))
timestamps = st.integers(0, 2**31).map(
    lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)
)


@st.composite
def properties(draw: st.DrawFn) -> Any:
    def maybe(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.none(), strategy))

    return Properties(
        content_type=maybe(shortstrs),
        content_encoding=maybe(shortstrs),
        headers=draw(headers),
        delivery_mode=maybe(st.sampled_from([1, 2])),
        priority=maybe(st.integers(0, 255)),
        correlation_id=maybe(shortstrs),
        reply_to=maybe(shortstrs),
        expiration=maybe(st.integers(0, 10**9).map(str)),
        message_id=maybe(shortstrs),
        timestamp=maybe(timestamps),
        message_type=maybe(shortstrs),
        user_id=maybe(shortstrs),
        app_id=maybe(shortstrs),
    )


def encoded(size: int, properties: Any) -> bytes:
    return ContentHeader(0, size, properties).marshal()


def decoded(payload: bytes) -> ContentHeader:
    header = ContentHeader()
    header.unmarshal(payload)
    return header


def others(properties: Any) -> dict[str, Any]:
    """Every property but headers, with pamqp's "absent" spelled one way."""
    return {
        name: (getattr(properties, name) or None)
        for name in properties.__slots__
        if name != "headers"
    }


@given(properties(), st.integers(0, 2**62), st.integers(-(2**63), 2**63 - 1))
def test_add_header_entry_round_trips_through_pamqp(
    properties: Any, size: int, offset: int
) -> None:
    before = encoded(size, properties)
    after = props.add_header_entry(before, props.long_entry(b"x-stream-offset", offset))
    header = decoded(after)
    assert header.body_size == size
    assert next(iter(header.properties.headers or {})) == "x-stream-offset"
    assert header.properties.headers == {"x-stream-offset": offset, **(properties.headers or {})}
    assert others(header.properties) == others(decoded(before).properties)


@pytest.mark.parametrize(
    "existing",
    [None, {}, {"a": "b"}, {"n": 1, "nested": {"deep": [1, "two", True]}}],
    ids=["no-table", "empty-table", "one-entry", "nested"],
)
@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [(None, None), ("application/json", None), (None, "gzip"), ("text/plain", "utf-8")],
)
def test_add_header_entry_with_and_without_headers(
    existing: dict[str, Any] | None, content_type: str | None, content_encoding: str | None
) -> None:
    properties = Properties(
        content_type=content_type,
        content_encoding=content_encoding,
        headers=existing,
        delivery_mode=2,
        message_id="m-1",
    )
    before = encoded(5, properties)
    after = props.add_header_entry(before, props.long_entry(b"x-stream-offset", 42))
    got = decoded(after).properties
    assert got.headers == {"x-stream-offset": 42, **(existing or {})}
    assert (got.content_type, got.content_encoding) == (content_type, content_encoding)
    assert (got.delivery_mode, got.message_id) == (2, "m-1")
    # Only the table changed: the bytes before it and after it are the same.
    assert len(after) - len(before) == len(props.long_entry(b"x-stream-offset", 42)) + (
        4 if existing is None else 0
    )


def test_two_entries_stack_newest_first() -> None:
    payload = encoded(0, Properties(headers={"k": "v"}))
    payload = props.add_header_entry(payload, props.long_entry(b"a", 1))
    payload = props.add_header_entry(payload, props.long_entry(b"b", -2))
    got = decoded(payload).properties.headers or {}
    assert list(got.items()) == [("b", -2), ("a", 1), ("k", "v")]


def test_long_entry_bytes() -> None:
    assert props.long_entry(b"x", -1) == b"\x01xl" + b"\xff" * 8


@given(properties(), st.integers(0, 2**62))
def test_decode_and_encode_are_pamqp(properties: Any, size: int) -> None:
    payload = encoded(size, properties)
    assert props.encode(size, properties) == payload
    assert props.body_size(payload) == size
    assert props.decode(payload) == decoded(payload).properties
    if size <= 2**29:
        assert props.check_header(payload) == size


def spec_values(properties: Any) -> dict[str, Any]:
    """pamqp's properties (but headers) by their AMQP names, timestamps in int seconds."""
    values = {}
    for name, _flag, _kind in props.PROPERTY_FIELDS:
        value = getattr(properties, "message_type" if name == "type" else name)
        if name != "headers" and value is not None:
            values[name] = int(value.timestamp()) if name == "timestamp" else value
    return values


@given(properties(), st.integers(0, 2**62), st.booleans())
def test_encode_values_is_pamqps_bytes(properties: Any, size: int, seconds: bool) -> None:
    values = spec_values(properties)
    if not seconds and properties.timestamp is not None:
        values["timestamp"] = properties.timestamp
    table = None if properties.headers is None else props.encode_table(properties.headers)[4:]
    assert props.encode_values(size, values, table) == encoded(size, properties)


@given(properties(), st.integers(0, 2**62))
def test_decode_values_reads_pamqps_bytes(properties: Any, size: int) -> None:
    payload = encoded(size, properties)
    theirs = decoded(payload).properties
    expected = {k: v for k, v in spec_values(theirs).items() if v != ""}
    if theirs.headers is not None:
        expected["headers"] = theirs.headers
    assert props.decode_values(payload) == expected


def test_encode_values_without_properties() -> None:
    assert props.encode_values(3) == encoded(3, Properties())
    assert props.encode_values(3, {}, b"") == encoded(3, Properties(headers={}))
    entry = props.long_entry(b"x-stream-publishing-id", 7)
    payload = props.encode_values(3, None, entry)
    assert payload.endswith(entry)  # pamqp would make 7 a byte: the table is kept as given
    assert decoded(payload).properties == Properties(headers={"x-stream-publishing-id": 7})
    assert props.body_size(payload) == 3


def test_encode_values_refuses_a_long_shortstr() -> None:
    with pytest.raises(ValueError, match="message_id is longer than 255 bytes"):
        props.encode_values(0, {"message_id": "m" * 256})


def test_decode_values_replaces_invalid_utf8() -> None:
    payload = bytes.fromhex("003c 0000 0000000000000000 8000 02 ff41")
    assert props.decode_values(payload) == {"content_type": "\ufffdA"}


def test_decode_values_of_cut_properties_is_501() -> None:
    payload = bytes.fromhex("003c 0000 0000000000000000 2000 0000000a 01") + b"k"  # headers cut
    with pytest.raises(AMQPError) as info:
        props.decode_values(payload)
    assert (info.value.code, info.value.class_id, info.value.method_id) == (501, 60, 40)


@pytest.mark.parametrize(
    ("prefix", "code", "text"),
    [
        (
            bytes.fromhex("003c 0001 0000000000000003 0000"),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
        ),
        (
            bytes.fromhex("0032 0000 0000000000000003 0000"),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        ),
        (
            bytes.fromhex("003c 0000 0000000020000001 0000"),
            501,
            "FRAME_ERROR - content body size 536870913 exceeds maximum allowed size 536870912",
        ),
    ],
    ids=["weight", "class", "too-big"],
)
def test_check_header_errors(prefix: bytes, code: int, text: str) -> None:
    with pytest.raises(AMQPError) as info:
        props.check_header(prefix)
    error = info.value
    assert (error.code, error.reply_text, error.class_id, error.method_id) == (code, text, 60, 40)


def test_largest_allowed_body_size() -> None:
    assert props.check_header(bytes.fromhex("003c 0000 0000000020000000 0000")) == 2**29


def test_undecodable_properties_are_501() -> None:
    payload = bytes.fromhex("003c 0000 0000000000000000 8000 05") + b"ab"  # content_type cut
    with pytest.raises(AMQPError) as info:
        props.decode(payload)
    error = info.value
    assert (error.code, error.class_id, error.method_id) == (501, 60, 40)
    assert error.reply_text == "FRAME_ERROR - cannot decode <<128,0,5,97,98>>"
