"""Content: the inbound message, its assembly from frames, and its splitting into frames.

A Message holds what a basic.publish carried: the exchange and routing key, the content header
payload exactly as the publisher encoded it, and the body. Properties are decoded on first use
only. Outbound, a message becomes one header frame and as many body frames as frame_max allows,
built from those same bytes.

No I/O and no broker knowledge; a Message is immutable once built and can be shared freely.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from pamqp import decode, encode

from leveret.amqp import constants as c
from leveret.amqp import properties as props
from leveret.amqp import tables, typed_fields
from leveret.amqp.codec import encode_deliver
from leveret.amqp.errors import DECODE_ERRORS, AMQPError

_FRAME_HEAD = struct.Struct(">BHI")
_END = c.FRAME_END_BYTE
_KEEP: Any = object()


class LazyHeaders(Mapping[str, Any]):
    """A message's headers table, read entry by entry: finding a key measures the entries
    (tables.raw_entries); a value is decoded by pamqp only when it is asked for."""

    __slots__ = ("_decoded", "_raw")

    def __init__(self, content: bytes) -> None:
        try:
            self._raw = tables.raw_entries(content)
        except DECODE_ERRORS as exc:
            raise AMQPError(
                c.FRAME_ERROR, f"cannot decode content header: {type(exc).__name__}", 60, 0
            ) from None
        self._decoded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._decoded:
            return self._decoded[key]
        raw = self._raw[key]
        try:
            value = _decode_entry(raw)
        except DECODE_ERRORS as exc:
            raise AMQPError(
                c.FRAME_ERROR, f"cannot decode content header: {type(exc).__name__}", 60, 0
            ) from None
        self._decoded[key] = value
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """As Mapping.get, without raising and catching a KeyError for a missing key (the
        publish path asks for headers most messages do not have)."""
        if key in self._raw:
            return self[key]
        return default

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


_NO_HEADERS: Mapping[str, Any] = {}
_PUBLISHING_ID = b"\x16x-stream-publishing-idl"
_PUBLISHERS: dict[bytes, str] = {}  # header bytes from the flags up to the id: the name
_PUBLISHERS_MAX = 4096


def _remember_publisher(header: bytes, headers: dict[str, Any]) -> None:
    """A header whose properties are only a table of x-stream-publisher-name and, last,
    x-stream-publishing-id (a long): every deduplicated stream publish, the Spark sink's
    included. The same publisher's next headers differ from it in the id's 8 bytes only, so
    its bytes up to them give the name, and the next ones are read with one lookup."""
    name = headers.get("x-stream-publisher-name")
    if isinstance(name, str) and header.startswith(_PUBLISHING_ID, len(header) - 32):
        if len(_PUBLISHERS) >= _PUBLISHERS_MAX:
            _PUBLISHERS.clear()
        _PUBLISHERS[header[12:-8]] = name
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


def _decode_entry(raw: bytes) -> Any:
    """The value of one encoded table entry (key included), as pamqp decodes it. The two
    types the publish path reads most (a long string: stream publisher names and filter
    values; a signed 64-bit integer: publishing ids) are read here directly."""
    at = 1 + raw[0]
    kind = raw[at]
    if kind == 0x53 and len(raw) >= at + 5:  # "S": pamqp gives str, or bytes if not UTF-8
        size = _U32.unpack_from(raw, at + 1)[0]
        data = raw[at + 5 : at + 5 + size]
        if len(data) == size:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return data
    elif kind == 0x6C and len(raw) == at + 9:  # "l"
        return _I64.unpack_from(raw, at + 1)[0]
    return decode.embedded_value(raw[at:])[1]


class Message:
    """One published message, with lazily decoded properties."""

    __slots__ = ("_headers", "_props", "_quick", "body", "exchange", "header", "routing_key")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._props: Any = None
        self._quick: Any = None
        self._headers: Any = None

    @classmethod
    def build(cls, exchange: str, routing_key: str, body: bytes, properties: Any = None) -> Message:
        """A message created by the broker itself (tests, dead letters, the management API)."""
        properties = properties if properties is not None else props.Properties()
        return cls(exchange, routing_key, props.encode(len(body), properties), body)

    @property
    def properties(self) -> Any:
        if self._props is None:
            self._props = props.decode(self.header)
        return self._props

    def _fields(self) -> tuple[int, int, int, int, str | None]:
        quick = self._quick
        if quick is None:
            quick = props.quick_fields(self.header)
            if quick is None:  # unusual: let pamqp decode (and judge) everything
                p = self.properties
                quick = (0, 0, p.delivery_mode or 0, p.priority or 0, p.expiration)
            self._quick = quick
        fields: tuple[int, int, int, int, str | None] = quick
        return fields

    @property
    def headers(self) -> Mapping[str, Any]:
        if not self.header[12] & 0x20:  # FLAG_HEADERS is bit 13: high byte, bit 5
            return _NO_HEADERS
        headers = self._headers
        if headers is None:
            headers = self._headers = self._read_headers()
        found: Mapping[str, Any] = headers
        return found

    def _read_headers(self) -> Mapping[str, Any]:
        header = self.header
        if len(header) > 60 and header[-32] == 22:  # perhaps a stream publisher's two headers
            name = _PUBLISHERS.get(header[12:-8])
            if name is not None:
                return {
                    "x-stream-publisher-name": name,
                    "x-stream-publishing-id": _I64.unpack_from(header, len(header) - 8)[0],
                }
        bounds = props.table_bounds(header)
        if bounds is None:  # unusual: let pamqp decode (and judge) it all
            found: Mapping[str, Any] = self.properties.headers or {}
            return found
        start, end = bounds[:2]
        plain = tables.decode_plain(header, start, end)
        if plain is None:
            return LazyHeaders(header[start:end])
        if end == len(header) and len(plain) == 2:
            _remember_publisher(header, plain)
        return plain

    def typed_header(self, name: str) -> tuple[str, Any] | None:
        """The header `name` with its wire type, as RabbitMQ's parser names it (e.g.
        `("long", 5)`, `("longstr", b"v")`; typed_fields has the shapes); None without it."""
        if not self.header[12] & 0x20:
            return None
        bounds = props.table_bounds(self.header)
        if bounds is None:  # unusual: the table as pamqp re-encodes the decoded headers
            table = encode.field_table(self.properties.headers or {})[4:]
        else:
            table = self.header[bounds[0]:bounds[1]]
        try:
            return typed_fields.lookup(table, name)
        except ValueError as exc:
            raise AMQPError(c.FRAME_ERROR, f"cannot decode content header: {exc}", 60, 0) \
                from None

    @property
    def delivery_mode(self) -> int:
        return self._fields()[2] or 1

    @property
    def persistent(self) -> bool:
        return self._fields()[2] == 2

    @property
    def has_priority(self) -> bool:
        return bool(self.header[12] & 0x08)  # FLAG_PRIORITY is bit 11: high byte, bit 3

    @property
    def priority(self) -> int:
        return self._fields()[3]

    @property
    def expiration(self) -> str | None:
        return self._fields()[4] or None

    @property
    def size(self) -> int:
        return len(self.body)

    def replace(
        self, *, exchange: str | None = None, routing_key: str | None = None, **changes: Any
    ) -> Message:
        """A copy with some properties changed; a property given as None is removed. Header
        entries the change leaves alone keep their exact encoding and types."""
        header = self.header
        new_headers = changes.pop("headers", None) if "headers" in changes else _KEEP
        if changes or new_headers is None:
            new_props = copy.copy(self.properties)
            for name, value in changes.items():
                setattr(new_props, name, value)
            if new_headers is not _KEEP:
                new_props.headers = None  # set below, entry by entry
            header = props.encode(len(self.body), new_props)
        if new_headers is not _KEEP and new_headers is not None:
            header = props.set_headers(header, new_headers, self.header, self.headers)
        return Message(
            self.exchange if exchange is None else exchange,
            self.routing_key if routing_key is None else routing_key,
            header,
            self.body,
        )

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r}/{self.routing_key!r} {len(self.body)} bytes>"


def content_frames(
    channel: int, header: bytes, body: bytes, frame_max: int
) -> list[bytes | memoryview]:
    """The header frame and body frames of a message, as byte strings to write: each body
    frame carries at most frame_max - 8 bytes, and an empty body has no body frame."""
    parts: list[bytes | memoryview] = [
        _FRAME_HEAD.pack(c.FRAME_HEADER, channel, len(header)), header, _END]
    max_body = frame_max - c.FRAME_OVERHEAD if frame_max else len(body)  # 0: no limit
    size = len(body)
    if size <= max_body:
        if size:
            parts += (_FRAME_HEAD.pack(c.FRAME_BODY, channel, size), body, _END)
        return parts
    view = memoryview(body)
    for start in range(0, size, max_body):
        piece = view[start : start + max_body]
        parts += (_FRAME_HEAD.pack(c.FRAME_BODY, channel, len(piece)), piece, _END)
    return parts


def deliver_parts(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    names: bytes,
    header: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes | memoryview]:
    """A whole basic.deliver: its method frame, then the content frames, as byte strings to
    write. `consumer_tag` is the encoded shortstr, and `names` the exchange's and routing key's
    two encoded shortstrs, as basic.deliver carries them."""
    size = len(body)
    method = encode_deliver(channel, consumer_tag, delivery_tag, redelivered, names)
    if 0 < size <= (frame_max - c.FRAME_OVERHEAD if frame_max else size):  # one body frame
        return [
            method,
            _FRAME_HEAD.pack(c.FRAME_HEADER, channel, len(header)), header, _END,
            _FRAME_HEAD.pack(c.FRAME_BODY, channel, size), body, _END,
        ]
    return [method, *content_frames(channel, header, body, frame_max)]
