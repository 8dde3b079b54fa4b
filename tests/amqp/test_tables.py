"""Editing headers keeps the bytes and types of the entries left alone."""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, decode, encode

from leveret.amqp import tables
from leveret.amqp.content import Message
from leveret.amqp.properties import FLAG_HEADERS
from leveret.amqp.properties import decode as decode_properties

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
    | st.floats(allow_nan=False, width=32),  # pamqp encodes floats as single precision
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=6))
def test_encoded_tables_decode_to_the_same_values(table: dict[str, object]) -> None:
    raw = tables.encode_table(table)
    _size, decoded = decode.field_table(raw)
    assert decoded == table


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=6))
def test_raw_entries_split_what_pamqp_encodes(table: dict[str, object]) -> None:
    raw = encode.field_table(table)[4:]
    entries = tables.raw_entries(raw)
    assert list(entries) == sorted(table)  # pamqp sorts keys
    assert b"".join(entries.values()) == raw


def test_unchanged_entries_keep_their_wire_types() -> None:
    # A publisher's header as pika sends an int: type 'I' (signed 32-bit), not pamqp's 'b'.
    content = b"\x01nI" + struct.pack(">i", 5) + b"\x03app" + b"S" + struct.pack(">I", 2) + b"js"
    props = encode.short_string("text/plain")
    flags = (1 << 15) | FLAG_HEADERS
    header = struct.pack(">HHQH", 60, 0, 3, flags) + props + struct.pack(">I", len(content))
    header += content
    message = Message("x", "k", header, b"abc")
    assert message.headers == {"n": 5, "app": "js"}
    copy = message.replace(headers={**message.headers, "x-death": [{"count": 1, "reason": "expired",
                           "time": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}]},
                           expiration=None)
    assert b"\x01nI" + struct.pack(">i", 5) in copy.header  # kept as the publisher sent it
    assert b"\x05countl" + struct.pack(">q", 1) in copy.header  # a broker-made int is a long
    assert decode_properties(copy.header).content_type == "text/plain"
    assert copy.headers["x-death"][0]["reason"] == "expired"


def test_removing_headers_and_an_expiration() -> None:
    message = Message.build("", "q", b"x", commands.Basic.Properties(
        expiration="100", headers={"BCC": ["a"], "keep": "me"}))
    copy = message.replace(headers={"keep": "me"})
    assert copy.headers == {"keep": "me"} and copy.expiration == "100"
    gone = message.replace(headers=None, expiration=None)
    assert gone.headers == {} and gone.expiration is None


def test_encode_entry_reads_back_through_pamqp() -> None:
    entry = tables.encode_entry("x-stream-filter-value", "eu")
    assert decode.field_table(len(entry).to_bytes(4, "big") + entry)[1] == {
        "x-stream-filter-value": "eu"
    }
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        tables.encode_entry("k" * 256, 1)
