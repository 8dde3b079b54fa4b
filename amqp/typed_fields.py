"""Field-table values with their wire types, as RabbitMQ's table parser names them.

pamqp decodes a table into bare Python values and loses each value's wire type: a `long` 5,
an `int` 5 and a `byte` 5 all become 5. A few broker features hash a header value together
with its type (RabbitMQ's `rabbit_misc:table_lookup` returns `{Type, Value}`), so this module
reads a table's bytes and returns, for one key, the pair RabbitMQ's parser would build:
`("long", 5)`, `("longstr", b"v")`, `("table", [(b"k", "bool", True)])`,
`("array", [("signedint", 1)])`, and so on. `L` reads as `long`, as RabbitMQ reads it; a
decimal is `(scale, unsigned 32-bit value)`; a float is the 32-bit value widened.

Wire knowledge only: no broker, no I/O; pure functions, any thread.
"""

from __future__ import annotations

import struct
from typing import Any

# type octet: (RabbitMQ's type name, struct format of the fixed-size value)
_FIXED: dict[int, tuple[str, struct.Struct]] = {
    ord(code): (name, struct.Struct(fmt)) for code, name, fmt in (
        ("b", "byte", ">b"), ("B", "unsignedbyte", ">B"),
        ("s", "short", ">h"), ("u", "unsignedshort", ">H"),
        ("I", "signedint", ">i"), ("i", "unsignedint", ">I"),
        ("l", "long", ">q"), ("L", "long", ">q"),
        ("d", "double", ">d"), ("f", "float", ">f"),
        ("T", "timestamp", ">Q"),
    )
}
_U32 = struct.Struct(">I")
_DECIMAL = struct.Struct(">BI")


def lookup(table: bytes, key: str) -> tuple[str, Any] | None:
    """The first entry named `key` in a table's content (without its length prefix), as
    `(type, value)`; None when there is none. ValueError for bytes that do not parse."""
    wanted = key.encode("utf-8")
    pos = 0
    try:
        while pos < len(table):
            name_end = pos + 1 + table[pos]
            name = table[pos + 1:name_end]
            if name_end > len(table):
                raise ValueError("a table key runs past the table")
            kind, value, pos = _value(table, name_end)
            if name == wanted:
                return kind, value
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a field table does not parse: {exc}") from None
    return None


def _value(buf: bytes, pos: int) -> tuple[str, Any, int]:
    """The value whose type octet is at `pos`: (type, value, the position after it)."""
    code = buf[pos]
    pos += 1
    fixed = _FIXED.get(code)
    if fixed is not None:
        name, shape = fixed
        return name, shape.unpack_from(buf, pos)[0], pos + shape.size
    if code == 0x74:  # t
        return "bool", buf[pos] != 0, pos + 1
    if code == 0x44:  # D
        return "decimal", _DECIMAL.unpack_from(buf, pos), pos + _DECIMAL.size
    if code == 0x56:  # V
        return "void", None, pos
    if code in (0x53, 0x78, 0x46, 0x41):  # S x F A: a 32-bit length, then the bytes
        size = _U32.unpack_from(buf, pos)[0]
        start, end = pos + 4, pos + 4 + size
        if end > len(buf):
            raise ValueError("a field value runs past its table")
        data = buf[start:end]
        if code == 0x53:
            return "longstr", data, end
        if code == 0x78:
            return "binary", data, end
        if code == 0x46:
            return "table", _table(data), end
        return "array", _array(data), end
    raise ValueError(f"unknown field type {chr(code)!r}")


def _table(data: bytes) -> list[tuple[bytes, str, Any]]:
    entries = []
    pos = 0
    while pos < len(data):
        name_end = pos + 1 + data[pos]
        if name_end > len(data):
            raise ValueError("a table key runs past the table")
        kind, value, after = _value(data, name_end)
        entries.append((data[pos + 1:name_end], kind, value))
        pos = after
    return entries


def _array(data: bytes) -> list[tuple[str, Any]]:
    items = []
    pos = 0
    while pos < len(data):
        kind, value, pos = _value(data, pos)
        items.append((kind, value))
    return items
