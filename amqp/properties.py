"""Encoded content headers: read and change them without decoding every property.

A content header payload is class id, weight, body size, property flags and the properties
in flag order. Messages keep that payload as the bytes the publisher sent; this module reads
the body size, decodes the properties with pamqp when a field is needed, and inserts a header
table entry (such as x-stream-offset) into the encoded bytes without decoding the rest. For
clients (the Spark data source, the load-test client), encode_values and decode_values build and
read a whole property list with struct, by the properties' AMQP names.

Pure functions on bytes; no I/O and no broker knowledge.
"""

from __future__ import annotations

import copy
import datetime
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp.header import ContentHeader

from leveret.amqp import constants as c
from leveret.amqp import tables
from leveret.amqp.errors import DECODE_ERRORS, AMQPError, erlang_bytes

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_DOUBLE = struct.Struct(">d")
_PREFIX = struct.Struct(">HHQH")  # class id, weight, body size, first flag word

FLAG_CONTENT_TYPE = 1 << 15
FLAG_CONTENT_ENCODING = 1 << 14
FLAG_HEADERS = 1 << 13

Properties = commands.Basic.Properties


def body_size(payload: bytes) -> int:
    return int(_U64.unpack_from(payload, 4)[0])


def check_header(payload: bytes) -> int:
    """Validate a content header's fixed part; return its body size.

    The errors are RabbitMQ's (rabbit_command_assembler), stamped with basic.publish: a weight
    other than 0 is not a content header at all, a header of another class is 505, and a body
    size over 512 MiB is 501. The caller has checked that the fixed part (14 bytes) is there.
    """
    class_id, weight, size, _flags = _PREFIX.unpack_from(payload, 0)
    if weight != 0:
        raise AMQPError(
            c.UNEXPECTED_FRAME,
            f"expected content header for class {c.CLASS_BASIC}, "
            "got non content header frame instead",
            60,
            40,
        )
    if class_id != c.CLASS_BASIC:
        raise AMQPError(
            c.UNEXPECTED_FRAME,
            f"expected content header for class {c.CLASS_BASIC}, "
            f"got one for class {class_id} instead",
            60,
            40,
        )
    if size > c.MAX_CONTENT_SIZE:
        raise AMQPError(
            c.FRAME_ERROR,
            f"content body size {size} exceeds maximum allowed size {c.MAX_CONTENT_SIZE}",
            60,
            40,
        )
    return int(size)


def decode(payload: bytes) -> Any:
    """Decode every property with pamqp; returns a pamqp Basic.Properties.

    Properties that stop short of what their flags and lengths announce are 501 FRAME_ERROR
    "cannot decode <<...>>" (pamqp alone would quietly return cut strings).
    """
    header = ContentHeader()
    try:
        _check_length(payload)
        header.unmarshal(payload)
    except DECODE_ERRORS:
        raise _cannot_decode(payload) from None
    return header.properties


def _cannot_decode(payload: bytes) -> AMQPError:
    return AMQPError(c.FRAME_ERROR, f"cannot decode {erlang_bytes(payload[12:])}", 60, 40)


_FIXED_SIZES = {"octet": 1, "timestamp": 8}
# The basic properties in flag order: (name, flag, wire type), named as in the AMQP spec
# ("type" where pamqp says message_type).
PROPERTY_FIELDS = tuple(
    ("type" if name == "message_type" else name, Properties.flags[name],
     getattr(Properties, "_" + name))
    for name in Properties.__slots__
)


def _present(payload: bytes) -> Iterator[tuple[str, str, int, int]]:
    """(name, wire type, start, end) of each property the flags say is there, in order;
    IndexError (or struct.error) if one runs past the end of the payload."""
    flags = _U16.unpack_from(payload, 12)[0]
    pos = 14
    while _U16.unpack_from(payload, pos - 2)[0] & 1:  # continuation flag words
        pos += 2
    for name, flag, kind in PROPERTY_FIELDS:
        if not flags & flag:
            continue
        if kind == "shortstr":
            end = pos + 1 + payload[pos]
        elif kind == "table":
            end = pos + 4 + _U32.unpack_from(payload, pos)[0]
        else:
            end = pos + _FIXED_SIZES[kind]
        if end > len(payload):
            raise IndexError("property past the end of the content header")
        yield name, kind, pos, end
        pos = end


def _check_length(payload: bytes) -> None:
    """Raise IndexError if a present property runs past the end of the payload."""
    for _property in _present(payload):
        pass


def encode_values(size: int, values: Mapping[str, Any] | None = None,
                  headers: bytes | None = None) -> bytes:
    """A content header payload built with struct, for a client's publishes: the properties
    in `values` by their PROPERTY_FIELDS names (str for the shortstrs, int for the octets, int
    seconds or a datetime for the timestamp; None or "" is absent, as pamqp leaves them out),
    and `headers`, the encoded entries of the headers table (None: no table). The bytes are
    pamqp's for the same properties. ValueError for a shortstr longer than 255 bytes."""
    if not values:
        if headers is None:
            return _PREFIX.pack(c.CLASS_BASIC, 0, size, 0)
        head = _PREFIX.pack(c.CLASS_BASIC, 0, size, FLAG_HEADERS)
        return head + _U32.pack(len(headers)) + headers
    flags = 0
    parts: list[bytes] = []
    for name, flag, kind in PROPERTY_FIELDS:
        if kind == "table":
            if headers is not None:
                flags |= flag
                parts += (_U32.pack(len(headers)), headers)
            continue
        value = values.get(name)
        if value is None or value == "":
            continue
        flags |= flag
        if kind == "shortstr":
            raw = str(value).encode("utf-8")
            if len(raw) > 255:
                raise ValueError(f"property {name} is longer than 255 bytes")
            parts += (bytes((len(raw),)), raw)
        elif kind == "octet":
            parts.append(bytes((int(value),)))
        elif isinstance(value, datetime.datetime):
            parts.append(pamqp_encode.timestamp(value))
        else:
            parts.append(_U64.pack(int(value)))
    return _PREFIX.pack(c.CLASS_BASIC, 0, size, flags) + b"".join(parts)


def decode_values(payload: bytes) -> dict[str, Any]:
    """Every property of a content header payload, by its PROPERTY_FIELDS name, read with
    struct for a client's deliveries: shortstrs as str (invalid UTF-8 replaced: a reader should
    not fail on a message someone else wrote), octets as int, the timestamp as int seconds,
    and the headers table as pamqp decodes it. 501 if a property runs past the end."""
    values: dict[str, Any] = {}
    try:
        for name, kind, pos, end in _present(payload):
            if kind == "shortstr":
                values[name] = payload[pos + 1 : end].decode("utf-8", "replace")
            elif kind == "octet":
                values[name] = payload[pos]
            elif kind == "timestamp":
                values[name] = _U64.unpack_from(payload, pos)[0]
            else:
                table = tables.decode_plain(payload, pos + 4, end)
                if table is None:
                    table = pamqp_decode.field_table(payload[pos:end])[1]
                values[name] = table
    except DECODE_ERRORS:
        raise _cannot_decode(payload) from None
    return values


def encode(size: int, properties: Any) -> bytes:
    """Encode a content header payload: pamqp for the properties, encode_table for headers.

    pamqp cannot encode everything it decodes: a longstr that is not UTF-8 comes out of its
    decoder as bytes, which its encoder refuses, and it writes floats as 32-bit ('f'), so a
    double such as 1e300 overflows. The headers table goes through encode_table instead.
    """
    headers = properties.headers
    if not headers:
        return ContentHeader(0, size, properties).marshal()
    rest = copy.copy(properties)
    rest.headers = None
    try:
        table = encode_table(headers)
    except RecursionError:  # nested deeper than the decoder could have read it
        raise AMQPError(c.FRAME_ERROR, "cannot encode the headers table", 60, 40) from None
    return add_header_entry(ContentHeader(0, size, rest).marshal(), table[4:])


def encode_table(table: dict[str, Any]) -> bytes:
    """A field table as pamqp encodes it (keys sorted), except that bytes are a longstr ('S'),
    floats are doubles ('d') and long keys are kept whole, so that every table pamqp decodes
    encodes back to the same values."""
    items = b"".join(
        pamqp_encode.short_string(key) + _field_value(v) for key, v in sorted(table.items())
    )
    return _U32.pack(len(items)) + items


def _field_value(value: Any) -> bytes:
    if isinstance(value, bytes):
        return b"S" + _U32.pack(len(value)) + value
    if isinstance(value, float):
        return b"d" + _DOUBLE.pack(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list):
        items = b"".join(_field_value(v) for v in value)
        return b"A" + _U32.pack(len(items)) + items
    return pamqp_encode.encode_table_value(value)


def _skip_short_str(payload: bytes, pos: int) -> int:
    return pos + 1 + payload[pos]


def _headers_position(payload: bytes) -> tuple[int, int]:
    """(flags, position of the headers table or of where it would go)."""
    flags = _U16.unpack_from(payload, 12)[0]
    pos = 14
    if flags & 1:  # continuation flag words; basic has none, but skip them correctly
        while _U16.unpack_from(payload, pos - 2)[0] & 1:
            pos += 2
    if flags & FLAG_CONTENT_TYPE:
        pos = _skip_short_str(payload, pos)
    if flags & FLAG_CONTENT_ENCODING:
        pos = _skip_short_str(payload, pos)
    return flags, pos


def add_header_entry(payload: bytes, entry: bytes) -> bytes:
    """Insert one encoded table entry (key shortstr, type octet, value) into the headers table.

    The entry goes first in the table; if the message had no headers, a table is added. The
    rest of the payload is copied unchanged.
    """
    flags, pos = _headers_position(payload)
    if flags & FLAG_HEADERS:
        length = _U32.unpack_from(payload, pos)[0]
        return b"".join((payload[:pos], _U32.pack(length + len(entry)), entry, payload[pos + 4 :]))
    return b"".join(
        (
            payload[:12],
            _U16.pack(flags | FLAG_HEADERS),
            payload[14:pos],
            _U32.pack(len(entry)),
            entry,
            payload[pos:],
        )
    )


def long_entry(key: bytes, value: int) -> bytes:
    """An encoded table entry of type long ('l', signed 64-bit)."""
    return b"".join((bytes((len(key),)), key, b"l", _I64.pack(value)))


def set_headers(payload: bytes, headers: dict[str, Any], previous: bytes,
                previous_values: Mapping[str, Any]) -> bytes:
    """`payload` with its headers table replaced by `headers`; entries unchanged from the
    `previous` header payload keep their bytes (see tables.py)."""
    flags, pos = _headers_position(payload)
    old_flags, old_pos = _headers_position(previous)
    old_entries: dict[str, bytes] = {}
    if old_flags & FLAG_HEADERS:
        length = _U32.unpack_from(previous, old_pos)[0]
        try:
            old_entries = tables.raw_entries(previous[old_pos + 4 : old_pos + 4 + length])
        except (ValueError, IndexError, UnicodeDecodeError):
            old_entries = {}
    table = tables.encode_table(headers, old_entries, previous_values)
    if flags & FLAG_HEADERS:
        length = _U32.unpack_from(payload, pos)[0]
        return payload[:pos] + table + payload[pos + 4 + length :]
    return b"".join(
        (payload[:12], _U16.pack(flags | FLAG_HEADERS), payload[14:pos], table, payload[pos:])
    )


_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_PRIORITY = 1 << 11
_FLAG_CORRELATION_ID = 1 << 10
_FLAG_REPLY_TO = 1 << 9
_FLAG_EXPIRATION = 1 << 8


def table_bounds(payload: bytes) -> tuple[int, int, int] | None:
    """Where the headers table's content starts and ends ((0, 0) without a table) and where
    the property after it starts, read without decoding anything. None if the header is
    unusual (flag continuation words, or bytes that do not add up)."""
    try:
        high = payload[12]
        if payload[13] & 1:
            return None
        pos = 14
        if high & 0x80:  # content-type
            pos += 1 + payload[pos]
        if high & 0x40:  # content-encoding
            pos += 1 + payload[pos]
        if not high & 0x20:  # no headers
            return (0, 0, pos) if pos <= len(payload) else None
        end = pos + 4 + _U32.unpack_from(payload, pos)[0]
        return (pos + 4, end, end) if end <= len(payload) else None
    except (IndexError, struct.error):
        return None


def quick_fields(payload: bytes) -> tuple[int, int, int, int, str | None] | None:
    """What routing and queues need, read without decoding the rest: (headers table content
    start, end, delivery_mode, priority, expiration). The properties come in flag order, so
    the walk stops after expiration. None if the header is unusual (flag continuation words,
    or bytes that do not add up): the caller then decodes everything with pamqp."""
    bounds = table_bounds(payload)
    if bounds is None:
        return None
    start, end, pos = bounds
    flags = (payload[12] << 8) | payload[13]
    try:
        delivery_mode = priority = 0
        if flags & _FLAG_DELIVERY_MODE:
            delivery_mode = payload[pos]
            pos += 1
        if flags & _FLAG_PRIORITY:
            priority = payload[pos]
            pos += 1
        expiration = None
        if flags & _FLAG_EXPIRATION:
            if flags & _FLAG_CORRELATION_ID:
                pos += 1 + payload[pos]
            if flags & _FLAG_REPLY_TO:
                pos += 1 + payload[pos]
            expiration = payload[pos + 1 : pos + 1 + payload[pos]].decode("utf-8")
        if pos > len(payload):
            return None
        return start, end, delivery_mode, priority, expiration
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
