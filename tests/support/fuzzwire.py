"""An AMQP 0-9-1 encoder that does what it is told, for fuzzers and argument tests.

pamqp validates what it encodes (name patterns and lengths, the Python types of table values),
so it cannot write the bytes a broken client sends: a shortstr of invalid UTF-8, a table value
of a type no client uses for that key, a table nested a thousand levels deep. This module
encodes methods from pamqp's argument lists without any validation, and field tables from plain
Python values (`Raw` gives a value of any type letter with any payload).
"""

from __future__ import annotations

import datetime
import decimal
import struct
from dataclasses import dataclass
from typing import Any

from pamqp import commands

FRAME_END = b"\xce"
_HEAD = struct.Struct(">BHI")


@dataclass(frozen=True)
class Raw:
    """A table value written as type letter `kind` followed by `payload`, as given."""

    kind: bytes
    payload: bytes


def short_str(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return bytes((len(raw) & 0xFF,)) + raw[:255]


def long_str(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


def field_value(value: Any) -> bytes:
    """One table or array value: its type letter and payload."""
    if isinstance(value, Raw):
        return value.kind + value.payload
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + struct.pack(">i", value)
        if -(2**63) <= value < 2**63:
            return b"l" + struct.pack(">q", value)
        return b"l" + struct.pack(">Q", value & (2**64 - 1))
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        number = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return b"D" + struct.pack(">Bi", scale & 0xFF, max(-(2**31), min(2**31 - 1, number)))
    if isinstance(value, datetime.datetime):
        return b"T" + struct.pack(">Q", int(value.timestamp()) & (2**64 - 1))
    if isinstance(value, str | bytes):
        return b"S" + long_str(value)
    if isinstance(value, bytearray):
        return b"x" + long_str(bytes(value))
    if value is None:
        return b"V"
    if isinstance(value, dict):
        return b"F" + table(value)
    if isinstance(value, list | tuple):
        items = b"".join(field_value(v) for v in value)
        return b"A" + struct.pack(">I", len(items)) + items
    raise TypeError(f"no AMQP field type for {type(value).__name__}")


def table(value: dict[Any, Any] | None) -> bytes:
    """A field table; keys may be str or bytes (invalid UTF-8 included)."""
    items = b"".join(short_str(k) + field_value(v) for k, v in (value or {}).items())
    return struct.pack(">I", len(items)) + items


def nested_table(depth: int, leaf: Any = 1) -> Raw:
    """{"n": {"n": ... leaf}} `depth` levels deep, encoded without recursion."""
    inner = field_value(leaf)
    for _ in range(depth):
        items = short_str("n") + inner
        inner = b"F" + struct.pack(">I", len(items)) + items
    return Raw(inner[:1], inner[1:])


def nested_array(depth: int) -> Raw:
    """[[[...]]] `depth` levels deep, encoded without recursion."""
    inner = b"A" + struct.pack(">I", 0)
    for _ in range(depth):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    return Raw(inner[:1], inner[1:])


_FIXED = {"octet": ">B", "short": ">H", "long": ">I", "longlong": ">Q", "timestamp": ">Q"}


def method_args(method: Any) -> bytes:
    """The arguments of a pamqp method object, encoded without validation (attributes may
    hold any value their wire type can carry: str or bytes for strings, any dict for tables)."""
    out: list[bytes] = []
    bits, nbits = 0, -1
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value = getattr(method, name, None)
        if kind == "bit":
            if nbits == -1 or nbits == 8:
                if nbits == 8:
                    out.append(bytes((bits,)))
                bits, nbits = 0, 0
            if value:
                bits |= 1 << nbits
            nbits += 1
            continue
        if nbits != -1:
            out.append(bytes((bits,)))
            bits, nbits = 0, -1
        if kind == "shortstr":
            out.append(short_str(value or ""))
        elif kind == "longstr":
            out.append(long_str(value or ""))
        elif kind == "table":
            out.append(table(value))
        else:
            fmt = _FIXED[kind]
            out.append(struct.pack(fmt, (value or 0) & ((1 << (8 * struct.calcsize(fmt))) - 1)))
    if nbits != -1:
        out.append(bytes((bits,)))
    return b"".join(out)


def frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return _HEAD.pack(frame_type, channel, len(payload)) + payload + end


def method_frame(channel: int, method: Any) -> bytes:
    return frame(1, channel, struct.pack(">I", method.index) + method_args(method))


def make(cls: type, **fields: Any) -> Any:
    """A pamqp method object with fields set directly (no validation)."""
    method = cls()
    for name, value in fields.items():
        setattr(method, name, value)
    return method


_PROPERTY_FLAGS = [
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("message_type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
]


def content_header(body_size: int, **properties: Any) -> bytes:
    """A basic content header payload with the given properties (unvalidated)."""
    flags = 0
    values: list[bytes] = []
    for bit, (name, kind) in zip(range(15, 1, -1), _PROPERTY_FLAGS, strict=True):
        if name not in properties or properties[name] is None:
            continue
        flags |= 1 << bit
        value = properties[name]
        if kind == "shortstr":
            values.append(short_str(value))
        elif kind == "table":
            values.append(table(value))
        elif kind == "octet":
            values.append(struct.pack(">B", value & 0xFF))
        else:
            values.append(struct.pack(">Q", value & (2**64 - 1)))
    return struct.pack(">HHQH", 60, 0, body_size, flags) + b"".join(values)


def publish(channel: int, exchange: str | bytes, routing_key: str | bytes, body: bytes,
            frame_max: int = 131072, mandatory: bool = False, **properties: Any) -> bytes:
    """basic.publish, its content header and body frames."""
    out = [method_frame(channel, make(commands.Basic.Publish, exchange=exchange,
                                      routing_key=routing_key, mandatory=mandatory))]
    out.append(frame(2, channel, content_header(len(body), **properties)))
    step = frame_max - 8
    for start in range(0, len(body), step):
        out.append(frame(3, channel, body[start : start + step]))
    return b"".join(out)
