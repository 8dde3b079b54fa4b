"""Field tables edited in place: entries left alone keep their exact bytes and types.

pamqp decodes a table into Python values and encodes them back with the smallest integer
type, so a decode-encode round trip turns a publisher's `long` into a `byte`, and a Java client
that reads it as a Long breaks. When the broker changes a message's headers (dead-lettering
adds x-death, BCC is removed), only the entries it changes are encoded again, with the types
RabbitMQ gives broker-made values (an integer is a long, a string a longstr); every other entry
is copied as it came. The walk over a table only measures entries; decoding stays pamqp's,
except for tables of only the four plainest types (long strings, longs, ints and booleans),
which `decode_plain` reads in one pass: that is what nearly every publish carries.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Mapping
from typing import Any

from pamqp import encode

_U32 = struct.Struct(">I")
_FIXED = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"l": 8, b"L": 8,
          b"f": 4, b"d": 8, b"D": 5, b"T": 8, b"V": 0, b"\x00": 0}
_SIZED = frozenset({b"S", b"x", b"A", b"F"})
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def raw_entries(table: bytes) -> dict[str, bytes]:
    """The encoded entries of a table's content (without its length), by key."""
    entries: dict[str, bytes] = {}
    pos = 0
    while pos < len(table):
        key_end = pos + 1 + table[pos]
        key = table[pos + 1 : key_end].decode("utf-8")
        kind = table[key_end : key_end + 1]
        if kind in _FIXED:
            end = key_end + 1 + _FIXED[kind]
        elif kind in _SIZED:
            end = key_end + 5 + _U32.unpack_from(table, key_end + 1)[0]
        else:
            raise ValueError(f"unknown field type {kind!r}")
        entries[key] = table[pos:end]
        pos = end
    return entries


def decode_plain(buf: bytes, pos: int, end: int) -> dict[str, Any] | None:
    """The table content in buf[pos:end], decoded as pamqp would, when every entry is a long
    string (str, or bytes when not UTF-8), a long, an int or a boolean; None when an entry is
    of another type or the bytes do not add up, for the caller to decode the general way."""
    values: dict[str, Any] = {}
    try:
        while pos < end:
            key_end = pos + 1 + buf[pos]
            key = buf[pos + 1 : key_end].decode("utf-8")
            kind = buf[key_end]
            if kind == 0x53:  # S
                pos = key_end + 5 + _U32.unpack_from(buf, key_end + 1)[0]
                raw = buf[key_end + 5 : pos]
                try:
                    value: Any = raw.decode("utf-8")
                except UnicodeDecodeError:
                    value = raw
            elif kind == 0x6C:  # l
                value = _I64.unpack_from(buf, key_end + 1)[0]
                pos = key_end + 9
            elif kind == 0x49:  # I
                value = _I32.unpack_from(buf, key_end + 1)[0]
                pos = key_end + 5
            elif kind == 0x74:  # t
                value = buf[key_end + 1] != 0
                pos = key_end + 2
            else:
                return None
            values[key] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return values if pos == end else None


def encode_value(value: Any) -> bytes:
    """A value the broker made, with the type RabbitMQ would give it."""
    if isinstance(value, bool):
        return b"t" + encode.boolean(value)
    if isinstance(value, int):
        return b"l" + encode.long_long_int(value)
    if isinstance(value, float):
        return b"d" + encode.double(value)
    if isinstance(value, decimal.Decimal):
        return b"D" + encode.decimal(value)
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return b"S" + _U32.pack(len(raw)) + raw
    if isinstance(value, bytes):
        return b"S" + _U32.pack(len(value)) + value
    if isinstance(value, bytearray):
        return b"x" + _U32.pack(len(value)) + bytes(value)
    if isinstance(value, datetime.datetime):
        return b"T" + encode.timestamp(value)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list):
        items = b"".join(encode_value(v) for v in value)
        return b"A" + _U32.pack(len(items)) + items
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode a header value of type {type(value).__name__}")


def encode_table(values: dict[str, Any], previous: dict[str, bytes] | None = None,
                 previous_values: Mapping[str, Any] | None = None) -> bytes:
    """A table (with its length) of `values`; an entry whose value is unchanged from
    `previous_values` is copied from `previous` as it was encoded."""
    previous = previous or {}
    previous_values = previous_values or {}
    parts = []
    for key, value in values.items():
        raw = previous.get(key)
        if raw is not None and key in previous_values and _same(previous_values[key], value):
            parts.append(raw)
            continue
        parts.append(encode_entry(key, value))
    content = b"".join(parts)
    return _U32.pack(len(content)) + content


def encode_entry(key: str, value: Any) -> bytes:
    """One table entry (key shortstr, type octet, value), typed as encode_value types it.
    ValueError for a key longer than 255 bytes."""
    name = key.encode("utf-8")
    if len(name) > 255:
        raise ValueError(f"table key {key[:40]!r}... is longer than 255 bytes")
    return bytes((len(name),)) + name + encode_value(value)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b
