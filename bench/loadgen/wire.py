"""AMQP 0-9-1 bytes for the hot paths, written with struct, and the benchmark's body layout.

Role: build every frame the load generator sends per message (basic.publish with its content
header and body, basic.ack) once, as templates; give the offsets at which a burst stamps its
sequence numbers and timestamps; and decode the two hot inbound methods (basic.ack/nack as
confirms, basic.deliver) with struct alone. pamqp encodes the content header once (properties
are not on the hot path) and handles every other method, in client.py.

It must not know sockets, scenarios or any broker. Pure functions and immutable templates:
safe to share between processes after fork, no threading contract needed.
Not leveret.amqp's codecs, on purpose: bench/ measures RabbitMQ alike, never importing leveret.*.

Body layout (big-endian, BODY_PREFIX bytes, then filler up to the body size):
    publisher id u32 | sequence number u64 | send time u64 (time.monotonic_ns) | kind u8
`kind` is KIND_WANTED for the 1% of scenario (g) that carry x-stream-filter-value "wanted".
time.monotonic_ns is CLOCK_MONOTONIC, one clock for every process of the machine.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import commands
from pamqp import frame as pframe
from pamqp.header import ContentHeader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
FRAME_OVERHEAD = 8  # 7 head bytes and the end octet

CLASS_BASIC = 60
# class id << 16 | method id, as the first 4 payload bytes of a method frame read as ">I"
BASIC_PUBLISH = (60 << 16) | 40
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120
BASIC_CANCEL = (60 << 16) | 30

BODY = struct.Struct(">IQQB")
BODY_PREFIX = BODY.size  # 21
SEQ_TS = struct.Struct(">QQ")  # stamped into a body at offset 4
KIND_OTHER, KIND_WANTED = 0, 1

U64 = struct.Struct(">Q")
U32 = struct.Struct(">I")
_CONFIRM = struct.Struct(">QB")  # delivery tag, bits; after the 4 class/method bytes
_ACK_FRAME = struct.Struct(">BHIHHQBB")


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {value!r}")
    return bytes([len(raw)]) + raw


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool = False) -> bytes:
    """A basic.publish method frame (reserved-1 ticket 0, immediate never set)."""
    payload = (
        struct.pack(">HHH", 60, 40, 0)
        + shortstr(exchange)
        + shortstr(routing_key)
        + bytes([1 if mandatory else 0])
    )
    return frame(FRAME_METHOD, channel, payload)


def ack_frame(channel: int, delivery_tag: int, multiple: bool = True) -> bytes:
    """A basic.ack method frame, client to broker."""
    return _ACK_FRAME.pack(
        FRAME_METHOD, channel, 13, 60, 80, delivery_tag, int(multiple), FRAME_END
    )


def content_header(channel: int, body_size: int, properties: commands.Basic.Properties) -> bytes:
    """The content header frame, encoded once by pamqp (properties are not a hot path)."""
    return pframe.marshal(ContentHeader(0, body_size, properties), channel)


def properties(persistent: bool = False, filter_value: str | None = None) -> Any:
    headers = {"x-stream-filter-value": filter_value} if filter_value is not None else None
    return commands.Basic.Properties(delivery_mode=2 if persistent else None, headers=headers)


@dataclass(frozen=True)
class PublishTemplate:
    """One message's frames with blank sequence and time; a burst is this repeated."""

    data: bytes
    seq_offset: int  # where SEQ_TS goes in the first copy
    body_size: int

    @property
    def size(self) -> int:
        return len(self.data)

    def burst(self, first_seq: int, count: int, ts_ns: int) -> bytearray:
        """`count` messages numbered from first_seq, all stamped with one send time."""
        buf = bytearray(self.data * count)
        pack_into = SEQ_TS.pack_into
        size = len(self.data)
        offset = self.seq_offset
        for seq in range(first_seq, first_seq + count):
            pack_into(buf, offset, seq, ts_ns)
            offset += size
        return buf


def publish_template(
    channel: int,
    routing_key: str,
    body_size: int,
    publisher_id: int = 0,
    kind: int = KIND_OTHER,
    persistent: bool = False,
    filter_value: str | None = None,
    exchange: str = "",
    frame_max: int = 131072,
) -> PublishTemplate:
    """basic.publish + content header + body frame(s) for one message of body_size bytes."""
    if body_size < BODY_PREFIX:
        raise ValueError(f"bodies need at least {BODY_PREFIX} bytes, got {body_size}")
    body = BODY.pack(publisher_id, 0, 0, kind) + b"x" * (body_size - BODY_PREFIX)
    head = publish_method(channel, exchange, routing_key) + content_header(
        channel, body_size, properties(persistent, filter_value)
    )
    chunk = frame_max - FRAME_OVERHEAD
    frames = [frame(FRAME_BODY, channel, body[i : i + chunk]) for i in range(0, body_size, chunk)]
    return PublishTemplate(head + b"".join(frames), len(head) + 7 + 4, body_size)


def parse_confirm(payload_start: int, buf: bytes | bytearray) -> tuple[int, bool]:
    """(delivery tag, multiple) of a basic.ack/nack method frame whose payload starts there."""
    tag, bits = _CONFIRM.unpack_from(buf, payload_start + 4)
    return tag, bool(bits & 1)


def deliver_tag(payload_start: int, buf: bytes | bytearray) -> int:
    """The delivery tag of a basic.deliver method frame whose payload starts there."""
    ctag_len = buf[payload_start + 4]
    return int(U64.unpack_from(buf, payload_start + 5 + ctag_len)[0])


def deliver_frame_prefix(channel: int, consumer_tag: str) -> bytes:
    """Everything of a basic.deliver payload before the delivery tag (for the discard server)."""
    return struct.pack(">HH", 60, 60) + shortstr(consumer_tag)


def deliver_frame(
    channel: int, consumer_tag: str, delivery_tag: int, exchange: str, routing_key: str
) -> bytes:
    payload = (
        deliver_frame_prefix(channel, consumer_tag)
        + U64.pack(delivery_tag)
        + b"\x00"
        + shortstr(exchange)
        + shortstr(routing_key)
    )
    return frame(FRAME_METHOD, channel, payload)
