"""The hot frames, encoded and decoded with struct: publish, ack, deliver, and properties.

pamqp builds and parses one publish at about 100k msgs/s here (see DESIGN.md), which would be
the sink's ceiling; these functions build the same bytes for a fraction of the cost.
`tests/spark/test_frames.py` checks them against pamqp both ways.

Layouts (AMQP 0.9.1, big-endian): a frame is type u8, channel u16, size u32, payload, 0xCE.
A content header payload is class u16 (60), weight u16 (0), body size u64, property flags u16,
then the present properties in flag order. Field tables use RabbitMQ's type letters ('l' is
a signed 64-bit integer, 'S' a long string, 'T' a timestamp).

Pure functions; no I/O.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import decode as pamqp_decode

FRAME_HEAD = struct.Struct(">BHI")
CLASS_METHOD = struct.Struct(">I")
TAG_BITS = struct.Struct(">QB")
BODY_SIZE = struct.Struct(">Q")
_HEADER_HEAD = struct.Struct(">BHIHHQ")
_ACK = struct.Struct(">BHIIQBB")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
END = b"\xce"

BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120
BASIC_DELIVER = (60 << 16) | 60

# Property flags, in wire order (bit 15 first).
PROPERTY_FLAGS = {
    "content_type": 1 << 15,
    "content_encoding": 1 << 14,
    "headers": 1 << 13,
    "delivery_mode": 1 << 12,
    "priority": 1 << 11,
    "correlation_id": 1 << 10,
    "reply_to": 1 << 9,
    "expiration": 1 << 8,
    "message_id": 1 << 7,
    "timestamp": 1 << 6,
    "type": 1 << 5,
    "user_id": 1 << 4,
    "app_id": 1 << 3,
    "cluster_id": 1 << 2,
}
SHORTSTR_PROPERTIES = frozenset(PROPERTY_FLAGS) - {"headers", "delivery_mode", "priority",
                                                   "timestamp"}
OCTET_PROPERTIES = frozenset({"delivery_mode", "priority"})


def shortstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError(f"{raw[:40]!r}... is longer than 255 bytes")
    return _U8.pack(len(raw)) + raw


def method_frame_publish(channel: int, exchange: bytes, routing_key: bytes,
                         mandatory: bool = True) -> bytes:
    """A basic.publish method frame; exchange and routing_key are encoded shortstrs."""
    payload = b"".join((b"\x00\x3c\x00\x28\x00\x00", exchange, routing_key,
                        b"\x01" if mandatory else b"\x00"))
    return FRAME_HEAD.pack(1, channel, len(payload)) + payload + END


def content_frames(channel: int, properties: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """The content header frame and body frame(s) of one message, as parts to join."""
    parts = [_HEADER_HEAD.pack(2, channel, 12 + len(properties), 60, 0, len(body)),
             properties, END]
    limit = frame_max - 8
    if len(body) <= limit:
        if body:
            parts += (FRAME_HEAD.pack(3, channel, len(body)), body, END)
        return parts
    for start in range(0, len(body), limit):
        piece = body[start : start + limit]
        parts += (FRAME_HEAD.pack(3, channel, len(piece)), piece, END)
    return parts


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(1, channel, 13, BASIC_ACK, delivery_tag, 1 if multiple else 0, 0xCE)


class Delivery:
    """One basic.deliver, basic.return or basic.get-ok with its content; the properties
    stay encoded (decode_properties decodes them when a caller wants them)."""

    __slots__ = ("body", "delivery_tag", "exchange", "properties", "routing_key")

    def __init__(self, delivery_tag: int, exchange: str, routing_key: str,
                 properties: bytes, body: bytes) -> None:
        self.delivery_tag = delivery_tag
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body


# -- field tables -------------------------------------------------------------------------


def table_entry_str(key: str, value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return shortstr(key) + b"S" + _U32.pack(len(raw)) + raw


def table_entry_long(key: str, value: int) -> bytes:
    return shortstr(key) + b"l" + _I64.pack(value)


def table(entries: list[bytes] | tuple[bytes, ...]) -> bytes:
    data = b"".join(entries)
    return _U32.pack(len(data)) + data


# -- properties ---------------------------------------------------------------------------


def encode_properties(values: dict[str, Any], headers_table: bytes | None) -> bytes:
    """Property flags and list. `values` maps property names to Python values (None: absent);
    `headers_table` is an already encoded field table, or None."""
    flags = 0
    parts: list[bytes] = []
    for name, bit in PROPERTY_FLAGS.items():
        if name == "headers":
            if headers_table is not None:
                flags |= bit
                parts.append(headers_table)
            continue
        value = values.get(name)
        if value is None:
            continue
        flags |= bit
        if name in OCTET_PROPERTIES:
            parts.append(_U8.pack(int(value)))
        elif name == "timestamp":
            parts.append(_U64.pack(timestamp_seconds(value)))
        else:
            parts.append(shortstr(str(value)))
    return _U16.pack(flags) + b"".join(parts)


def timestamp_seconds(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp())
    return int(value)


def decode_properties(data: bytes) -> dict[str, Any]:
    """Property flags and list (a content header payload from offset 12) to a dict."""
    flags = _U16.unpack_from(data, 0)[0]
    pos = 2
    out: dict[str, Any] = {}
    for name, bit in PROPERTY_FLAGS.items():
        if not flags & bit:
            continue
        value: Any
        if name == "headers":
            used, value = pamqp_decode.field_table(data[pos:])
            pos += used
        elif name in OCTET_PROPERTIES:
            value = data[pos]
            pos += 1
        elif name == "timestamp":
            value = _U64.unpack_from(data, pos)[0]
            pos += 8
        else:
            length = data[pos]
            value = bytes(data[pos + 1 : pos + 1 + length]).decode("utf-8", "replace")
            pos += 1 + length
        out[name] = value
    return out


def parse_deliver(payload: memoryview) -> Delivery:
    """basic.deliver's arguments (after class and method ids) into a Delivery."""
    pos = 4
    pos += 1 + payload[pos]  # consumer tag
    tag = BODY_SIZE.unpack_from(payload, pos)[0]
    pos += 9  # delivery tag, redelivered
    length = payload[pos]
    exchange = bytes(payload[pos + 1 : pos + 1 + length]).decode("utf-8")
    pos += 1 + length
    length = payload[pos]
    routing_key = bytes(payload[pos + 1 : pos + 1 + length]).decode("utf-8")
    return Delivery(tag, exchange, routing_key, b"", b"")
