"""AMQP 1.0's type system, encoded and decoded as tagged values, the way RabbitMQ's
amqp10_binary_parser and generator see them.

A value is a (type, value) pair: ("null", None), ("boolean", True), ("ubyte" | "ushort" |
"uint" | "ulong" | "byte" | "short" | "int" | "long", n), ("float" | "double", x),
("timestamp", ms), ("uuid", 16 bytes), ("binary", bytes), ("utf8", str), ("symbol", str),
("char", str), ("decimal32" | "decimal64" | "decimal128", raw bytes), ("list", [values]),
("map", [(key, value)]), ("array", element type, [values]) and ("described", descriptor,
value). Keeping the tags keeps a message's exact types across a conversion.

Pure: no I/O, nothing of the broker. Malformed input raises ValueError.
"""

from __future__ import annotations

import struct
from typing import Any

Value = tuple[Any, ...]
NULL: Value = ("null", None)

_FIXED: dict[int, tuple[str, struct.Struct]] = {
    0x50: ("ubyte", struct.Struct(">B")), 0x51: ("byte", struct.Struct(">b")),
    0x52: ("uint", struct.Struct(">B")), 0x53: ("ulong", struct.Struct(">B")),
    0x54: ("int", struct.Struct(">b")), 0x55: ("long", struct.Struct(">b")),
    0x60: ("ushort", struct.Struct(">H")), 0x61: ("short", struct.Struct(">h")),
    0x70: ("uint", struct.Struct(">I")), 0x71: ("int", struct.Struct(">i")),
    0x72: ("float", struct.Struct(">f")), 0x80: ("ulong", struct.Struct(">Q")),
    0x81: ("long", struct.Struct(">q")), 0x82: ("double", struct.Struct(">d")),
    0x83: ("timestamp", struct.Struct(">q")),
}
_RAW = {0x74: ("decimal32", 4), 0x84: ("decimal64", 8), 0x94: ("decimal128", 16),
        0x98: ("uuid", 16)}
_VAR = {0xA0: ("binary", 1), 0xA1: ("utf8", 1), 0xA3: ("symbol", 1),
        0xB0: ("binary", 4), 0xB1: ("utf8", 4), 0xB3: ("symbol", 4)}
_EMPTY: dict[int, Value] = {0x40: NULL, 0x41: ("boolean", True), 0x42: ("boolean", False),
                            0x43: ("uint", 0), 0x44: ("ulong", 0), 0x45: ("list", [])}
_U32 = struct.Struct(">I")


def decode(data: bytes, pos: int = 0) -> tuple[Value, int]:
    """One value at `pos`; returns it and the position after it."""
    try:
        code = data[pos]
    except IndexError:
        raise ValueError("truncated AMQP 1.0 value") from None
    return _decode_body(data, code, pos + 1)


def _decode_body(data: bytes, code: int, pos: int) -> tuple[Value, int]:
    if code == 0x00:
        descriptor, pos = decode(data, pos)
        value, pos = decode(data, pos)
        return ("described", descriptor, value), pos
    empty = _EMPTY.get(code)
    if empty is not None:
        return empty, pos
    if code == 0x56:
        return ("boolean", _byte(data, pos) == 1), pos + 1
    fixed = _FIXED.get(code)
    if fixed is not None:
        name, st = fixed
        if pos + st.size > len(data):
            raise ValueError("truncated AMQP 1.0 value")
        return (name, st.unpack_from(data, pos)[0]), pos + st.size
    raw = _RAW.get(code)
    if raw is not None:
        return (raw[0], _take(data, pos, raw[1])), pos + raw[1]
    if code == 0x73:
        return ("char", chr(_U32.unpack(_take(data, pos, 4))[0])), pos + 4
    var = _VAR.get(code)
    if var is not None:
        name, width = var
        size, pos = _size(data, pos, width)
        chunk = _take(data, pos, size)
        if name == "binary":
            return ("binary", chunk), pos + size
        try:
            return (name, chunk.decode("utf-8")), pos + size
        except UnicodeDecodeError:
            raise ValueError("an AMQP 1.0 string is not UTF-8") from None
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        return _decode_compound(data, code, pos)
    if code in (0xE0, 0xF0):
        return _decode_array(data, code, pos)
    raise ValueError(f"unknown AMQP 1.0 constructor 0x{code:02x}")


def _decode_compound(data: bytes, code: int, pos: int) -> tuple[Value, int]:
    width = 1 if code < 0xD0 else 4
    size, pos = _size(data, pos, width)
    end = pos + size
    count, pos = _size(data, pos, width)
    items = []
    for _ in range(count):
        item, pos = decode(data, pos)
        items.append(item)
    if pos != end:
        raise ValueError("AMQP 1.0 compound size mismatch")
    if code in (0xC0, 0xD0):
        return ("list", items), pos
    if count % 2:
        raise ValueError("AMQP 1.0 map with an odd count")
    return ("map", list(zip(items[::2], items[1::2], strict=True))), pos


def _decode_array(data: bytes, code: int, pos: int) -> tuple[Value, int]:
    width = 1 if code == 0xE0 else 4
    size, pos = _size(data, pos, width)
    end = pos + size
    count, pos = _size(data, pos, width)
    element = _byte(data, pos)
    pos += 1
    descriptor = None
    if element == 0x00:
        descriptor, pos = decode(data, pos)
        element = _byte(data, pos)
        pos += 1
    items = []
    for _ in range(count):
        item, pos = _decode_body(data, element, pos)
        items.append(item if descriptor is None else ("described", descriptor, item))
    if pos != end:
        raise ValueError("AMQP 1.0 array size mismatch")
    kind = items[0][0] if items else "null"
    return ("array", kind, items), pos


def _byte(data: bytes, pos: int) -> int:
    if pos >= len(data):
        raise ValueError("truncated AMQP 1.0 value")
    return data[pos]


def _take(data: bytes, pos: int, size: int) -> bytes:
    if pos + size > len(data):
        raise ValueError("truncated AMQP 1.0 value")
    return bytes(data[pos : pos + size])


def _size(data: bytes, pos: int, width: int) -> tuple[int, int]:
    if width == 1:
        return _byte(data, pos), pos + 1
    return _U32.unpack(_take(data, pos, 4))[0], pos + 4


def encode(value: Value) -> bytes:
    """The encoding of one tagged value (the smallest constructor that holds it)."""
    kind = value[0]
    v: Any = value[1] if len(value) > 1 else None
    if kind == "null":
        return b"\x40"
    if kind == "boolean":
        return b"\x41" if v else b"\x42"
    if kind in ("uint", "ulong", "int", "long"):
        return _encode_integer(kind, v)
    simple = {"ubyte": (0x50, ">B"), "byte": (0x51, ">b"), "ushort": (0x60, ">H"),
              "short": (0x61, ">h"), "float": (0x72, ">f"), "double": (0x82, ">d"),
              "timestamp": (0x83, ">q")}
    if kind in simple:
        code, fmt = simple[kind]
        return bytes((code,)) + struct.pack(fmt, v)
    if kind in ("uuid", "decimal32", "decimal64", "decimal128"):
        code = {"uuid": 0x98, "decimal32": 0x74, "decimal64": 0x84, "decimal128": 0x94}[kind]
        return bytes((code,)) + bytes(v)
    if kind == "char":
        return b"\x73" + _U32.pack(ord(v))
    if kind in ("binary", "utf8", "symbol"):
        raw: bytes = bytes(v) if kind == "binary" else v.encode("utf-8")
        small, large = {"binary": (0xA0, 0xB0), "utf8": (0xA1, 0xB1),
                        "symbol": (0xA3, 0xB3)}[kind]
        if len(raw) < 256:
            return bytes((small, len(raw))) + raw
        return bytes((large,)) + _U32.pack(len(raw)) + raw
    if kind == "described":
        return b"\x00" + encode(value[1]) + encode(value[2])
    if kind == "list":
        if not v:
            return b"\x45"
        return _compound(0xC0, 0xD0, len(v), b"".join(encode(i) for i in v))
    if kind == "map":
        body = b"".join(encode(key) + encode(val) for key, val in v)
        return _compound(0xC1, 0xD1, 2 * len(v), body)
    if kind == "array":
        return _array(value[2])
    raise ValueError(f"cannot encode AMQP 1.0 type {kind}")


def _encode_integer(kind: str, v: int) -> bytes:
    if kind in ("uint", "ulong"):
        if v == 0:
            return b"\x43" if kind == "uint" else b"\x44"
        if v < 256:
            return (b"\x52" if kind == "uint" else b"\x53") + bytes((v,))
        return (b"\x70" + struct.pack(">I", v)) if kind == "uint" else (
            b"\x80" + struct.pack(">Q", v))
    if -128 <= v <= 127:
        return (b"\x54" if kind == "int" else b"\x55") + struct.pack(">b", v)
    return (b"\x71" + struct.pack(">i", v)) if kind == "int" else (
        b"\x81" + struct.pack(">q", v))


def _compound(small: int, large: int, count: int, body: bytes) -> bytes:
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + _U32.pack(len(body) + 4) + _U32.pack(count) + body


def _array(items: list[Value]) -> bytes:
    """An array: every element with one wide constructor (as 0xf0 arrays carry)."""
    if not items:
        return b"\xe0\x02\x00\x40"
    encoded = [_wide(i) for i in items]
    constructor = encoded[0][:1]
    body = constructor + b"".join(e[1:] for e in encoded)
    return b"\xf0" + _U32.pack(len(body) + 4) + _U32.pack(len(items)) + body


def _wide(value: Value) -> bytes:
    """A value with its widest fixed constructor, so all elements of an array share one."""
    kind = value[0]
    v: Any = value[1] if len(value) > 1 else None
    wide = {"uint": (0x70, ">I"), "ulong": (0x80, ">Q"), "int": (0x71, ">i"),
            "long": (0x81, ">q")}
    if kind in wide:
        code, fmt = wide[kind]
        return bytes((code,)) + struct.pack(fmt, v)
    if kind == "boolean":
        return b"\x56" + (b"\x01" if v else b"\x00")
    if kind in ("binary", "utf8", "symbol"):
        raw: bytes = bytes(v) if kind == "binary" else v.encode("utf-8")
        code = {"binary": 0xB0, "utf8": 0xB1, "symbol": 0xB3}[kind]
        return bytes((code,)) + _U32.pack(len(raw)) + raw
    if kind in ("list", "map"):
        items = v if kind == "list" else [x for pair in v for x in pair]
        body = b"".join(encode(i) for i in items)
        return (bytes((0xD0 if kind == "list" else 0xD1,)) + _U32.pack(len(body) + 4)
                + _U32.pack(len(items)) + body)
    return encode(value)
