"""AMQP 0.9.1 field tables with their exact field types, as RabbitMQ reads and writes them.

pamqp decodes a table into plain Python values, which loses the field types that a conversion
to AMQP 1.0 must keep (a signed 32-bit int stays an `int`, an unsigned one a `uint`). Here an
entry is (name, type, value) with RabbitMQ's type names: longstr, long, signedint, unsignedint,
short, unsignedshort, byte, unsignedbyte, bool, float, double, decimal, timestamp (seconds),
void, binary, array ([(type, value)]) and table ([(name, type, value)]).

Pure: no I/O. Malformed input raises ValueError.
"""

from __future__ import annotations

import struct
from typing import Any

Entry = tuple[str, str, Any]

_FIXED = {
    "b": ("byte", struct.Struct(">b")), "B": ("unsignedbyte", struct.Struct(">B")),
    "s": ("short", struct.Struct(">h")), "u": ("unsignedshort", struct.Struct(">H")),
    "I": ("signedint", struct.Struct(">i")), "i": ("unsignedint", struct.Struct(">I")),
    "l": ("long", struct.Struct(">q")), "f": ("float", struct.Struct(">f")),
    "d": ("double", struct.Struct(">d")), "T": ("timestamp", struct.Struct(">Q")),
}
_CODES = {name: (code, st) for code, (name, st) in _FIXED.items()}
_U32 = struct.Struct(">I")


def decode_table(data: bytes, pos: int, end: int) -> list[Entry]:
    out: list[Entry] = []
    while pos < end:
        size = data[pos]
        name = bytes(data[pos + 1 : pos + 1 + size]).decode("utf-8", "replace")
        pos += 1 + size
        kind, value, pos = _value(data, pos)
        out.append((name, kind, value))
    if pos != end:
        raise ValueError("field table overruns its length")
    return out


def _value(data: bytes, pos: int) -> tuple[str, Any, int]:
    if pos >= len(data):
        raise ValueError("truncated field table")
    code = chr(data[pos])
    pos += 1
    fixed = _FIXED.get(code)
    if fixed is not None:
        name, st = fixed
        if pos + st.size > len(data):
            raise ValueError("truncated field table")
        return name, st.unpack_from(data, pos)[0], pos + st.size
    if code == "t":
        return "bool", data[pos] != 0, pos + 1
    if code in ("S", "x"):
        size = _U32.unpack_from(data, pos)[0]
        raw = bytes(data[pos + 4 : pos + 4 + size])
        if len(raw) != size:
            raise ValueError("truncated field table")
        return ("longstr" if code == "S" else "binary"), raw, pos + 4 + size
    if code == "V":
        return "void", None, pos
    if code == "D":
        return "decimal", bytes(data[pos : pos + 5]), pos + 5
    if code == "F":
        size = _U32.unpack_from(data, pos)[0]
        return "table", decode_table(data, pos + 4, pos + 4 + size), pos + 4 + size
    if code == "A":
        size = _U32.unpack_from(data, pos)[0]
        end = pos + 4 + size
        pos += 4
        items = []
        while pos < end:
            kind, value, pos = _value(data, pos)
            items.append((kind, value))
        return "array", items, pos
    raise ValueError(f"unknown field type {code!r}")


def encode_table(entries: list[Entry]) -> bytes:
    """The entries of a table (without its u32 length)."""
    parts = []
    for name, kind, value in entries:
        raw = name.encode("utf-8")[:255]
        parts.append(bytes((len(raw),)) + raw + _encode_value(kind, value))
    return b"".join(parts)


def _encode_value(kind: str, value: Any) -> bytes:
    fixed = _CODES.get(kind)
    if fixed is not None:
        code, st = fixed
        return code.encode() + st.pack(value)
    if kind == "bool":
        return b"t\x01" if value else b"t\x00"
    if kind in ("longstr", "binary"):
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        return (b"S" if kind == "longstr" else b"x") + _U32.pack(len(raw)) + raw
    if kind == "void":
        return b"V"
    if kind == "decimal":
        return b"D" + bytes(value)
    if kind == "table":
        body = encode_table(value)
        return b"F" + _U32.pack(len(body)) + body
    if kind == "array":
        body = b"".join(_encode_value(k, v) for k, v in value)
        return b"A" + _U32.pack(len(body)) + body
    raise ValueError(f"cannot encode field type {kind}")
