"""typed_fields: a header's value with its wire type, as RabbitMQ's table parser names it, and
Message.typed_header over a message's content header."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from leveret.amqp import constants as c
from leveret.amqp import properties as props
from leveret.amqp.content import Message
from leveret.amqp.errors import AMQPError
from leveret.amqp.typed_fields import lookup


def entry(key: str, value: bytes) -> bytes:
    return bytes([len(key)]) + key.encode() + value


def sized(code: bytes, data: bytes) -> bytes:
    return code + struct.pack(">I", len(data)) + data


@pytest.mark.parametrize(
    ("value", "typed"),
    [
        (b"b\xfb", ("byte", -5)),
        (b"B\xfb", ("unsignedbyte", 251)),
        (b"s\xff\x00", ("short", -256)),
        (b"u\xff\x00", ("unsignedshort", 65280)),
        (b"I\xff\xff\xff\xfe", ("signedint", -2)),
        (b"i\xff\xff\xff\xfe", ("unsignedint", 2**32 - 2)),
        (b"l" + struct.pack(">q", -7), ("long", -7)),
        (b"L" + struct.pack(">q", -7), ("long", -7)),  # RabbitMQ reads L as a signed long
        (b"f" + struct.pack(">f", 1.5), ("float", 1.5)),
        (b"d" + struct.pack(">d", -0.25), ("double", -0.25)),
        (b"D\x02\xff\xff\xff\xff", ("decimal", (2, 2**32 - 1))),  # the value is unsigned
        (b"T" + struct.pack(">Q", 1_700_000_000), ("timestamp", 1_700_000_000)),
        (b"t\x00", ("bool", False)),
        (b"t\x07", ("bool", True)),
        (sized(b"S", b"\xff\xfe"), ("longstr", b"\xff\xfe")),
        (sized(b"x", b"ab"), ("binary", b"ab")),
        (b"V", ("void", None)),
        (sized(b"F", entry("a", b"b\x01") + entry("s", sized(b"S", b"v"))),
         ("table", [(b"a", "byte", 1), (b"s", "longstr", b"v")])),
        (sized(b"A", b"I\x00\x00\x00\x01" + sized(b"A", b"V")),
         ("array", [("signedint", 1), ("array", [("void", None)])])),
    ],
)
def test_each_wire_type(value: bytes, typed: tuple[str, object]) -> None:
    table = entry("before", b"l" + bytes(8)) + entry("k", value) + entry("after", b"V")
    assert lookup(table, "k") == typed


def test_first_entry_wins_and_missing_is_none() -> None:
    """rabbit_misc:table_lookup takes the first entry of a key."""
    table = entry("k", b"b\x01") + entry("k", b"b\x02")
    assert lookup(table, "k") == ("byte", 1)
    assert lookup(table, "other") is None
    assert lookup(b"", "k") is None


@pytest.mark.parametrize(
    "table",
    [
        entry("k", b"Z\x00"),  # no such type
        entry("k", b"l\x00\x00"),  # a fixed value cut short
        entry("k", b"S\x00\x00\x00\x09abc"),  # a sized value longer than the table
        b"\x09ab",  # a key longer than the table
        entry("k", sized(b"F", b"\x09ab")),  # the same inside a nested table
        entry("k", sized(b"A", b"Q")),  # an unknown type inside an array
    ],
)
def test_bytes_that_do_not_parse(table: bytes) -> None:
    with pytest.raises(ValueError):
        lookup(table, "k")


def _message(table: bytes) -> Message:
    header = (b"\x00\x3c\x00\x00" + (4).to_bytes(8, "big") + b"\x20\x00"
              + len(table).to_bytes(4, "big") + table)
    return Message("", "rk", header, b"body")


def test_message_typed_header() -> None:
    message = _message(entry("n", b"s\x00\x05"))
    assert message.typed_header("n") == ("short", 5)
    assert message.typed_header("m") is None
    plain = Message.build("", "rk", b"x", commands.Basic.Properties(content_type="a/b"))
    assert plain.typed_header("n") is None  # no headers at all


def test_message_typed_header_that_does_not_parse_is_a_frame_error() -> None:
    with pytest.raises(AMQPError) as info:
        _message(entry("n", b"Z")).typed_header("n")
    assert info.value.code == c.FRAME_ERROR


def test_unusual_header_reads_the_decoded_headers() -> None:
    """A content header with a property-flags continuation word cannot be walked cheaply:
    the table is what pamqp encodes of the decoded headers (its own choice of types)."""
    header = props.encode(4, commands.Basic.Properties(headers={"n": 5}))
    unusual = header[:13] + bytes([header[13] | 1]) + b"\x00\x00" + header[14:]
    message = Message("", "rk", unusual, b"body")
    assert props.table_bounds(unusual) is None
    assert message.typed_header("n") == ("byte", 5)
