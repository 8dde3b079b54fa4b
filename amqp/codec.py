"""Method codecs: pamqp for every method, and small struct codecs for the hot ones.

basic.publish and basic.ack coming in, and basic.deliver going out, run at every message, so
they have hand-written struct codecs (a property test proves them byte-identical to pamqp).
A client's side of the same three (encode_publish, decode_deliver, and decode_ack for the
confirms) is here too, for the Spark data source and the test clients. A few methods whose
names pamqp would validate against a stricter pattern than RabbitMQ allows (queue.declare-ok,
basic.get-ok, basic.return, and basic.get from a client) are encoded here as well. Everything
else is decoded and encoded by pamqp.

No I/O and no broker knowledge; pure functions, safe from any thread.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands, frame

from leveret.amqp import constants as c
from leveret.amqp.errors import DECODE_ERRORS, AMQPError, erlang_bytes

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_DELIVER_HEAD = struct.Struct(">BHIHH")  # frame type, channel, size, class, method
_ACK_FRAME = struct.Struct(">BHIHHQB")
_U64_BIT = struct.Struct(">QB")
_END = c.FRAME_END_BYTE

Method = Any  # a pamqp.base.Frame


def method_index(payload: bytes) -> int:
    """class_id << 16 | method_id of a method frame payload (at least 4 bytes long)."""
    return int(_U32.unpack_from(payload, 0)[0])


def cannot_decode(index: int, arguments: bytes) -> AMQPError:
    """501 for method arguments that do not decode, in RabbitMQ's words."""
    return AMQPError(
        c.FRAME_ERROR, f"cannot decode {erlang_bytes(arguments)}", index >> 16, index & 0xFFFF
    )


def decode_method(payload: bytes) -> Method:
    """Decode any method frame payload with pamqp.

    An unknown class or method is 540 NOT_IMPLEMENTED; arguments that cannot be decoded,
    including ones that stop short of what their types require, are 501 FRAME_ERROR
    "cannot decode <<...>>", stamped with the method's class and method ids.
    """
    index = method_index(payload)
    try:
        method = commands.INDEX_MAPPING[index]()
    except KeyError:
        class_id, method_id = index >> 16, index & 0xFFFF
        raise AMQPError(
            c.NOT_IMPLEMENTED, f"unknown method {class_id}/{method_id}", class_id, method_id
        ) from None
    arguments = payload[4:]
    try:
        _check_length(method, arguments)
        method.unmarshal(arguments)
    except DECODE_ERRORS:
        raise cannot_decode(index, arguments) from None
    return method


_FIXED_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


def _check_length(method: Method, data: bytes) -> None:
    """Raise IndexError if the arguments end before their types say they do.

    pamqp slices strings without checking that the bytes are there, so a truncated frame would
    decode to a shorter value instead of failing as it does in RabbitMQ.
    """
    pos = 0
    bits = 8  # bits used in the current octet; 8 means a new octet is needed
    for argument in method.__slots__:
        kind = method.amqp_type(argument)
        if kind == "bit":
            if bits == 8:
                pos += 1
                bits = 0
            bits += 1
            continue
        bits = 8
        if kind == "shortstr":
            pos += 1 + data[pos]
        elif kind in ("longstr", "table"):
            pos += 4 + _U32.unpack_from(data, pos)[0]
        else:
            pos += _FIXED_SIZES[kind]
        if pos > len(data):
            raise IndexError("argument past the end of the frame")
    if pos > len(data):
        raise IndexError("argument past the end of the frame")


def encode_method(channel: int, method: Method) -> bytes:
    """Encode a method frame with pamqp."""
    return frame.marshal(method, channel)


def _short_str(data: bytes, pos: int) -> tuple[str, int]:
    length = data[pos]
    end = pos + 1 + length
    if end > len(data):
        raise IndexError("short string past the end of the frame")
    return data[pos + 1 : end].decode("utf-8"), end


_PUBLISH_NAMES: dict[bytes, tuple[str, str]] = {}
_PUBLISH_NAMES_MAX = 4096  # distinct (exchange, routing key) pairs remembered, then forgotten


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """basic.publish arguments: (exchange, routing_key, mandatory, immediate).

    Publishers repeat the same few exchange and routing-key pairs, so their decoded names are
    remembered by their encoded bytes (a bounded cache, emptied when full)."""
    try:
        rk_at = 7 + payload[6]
        end = rk_at + 1 + payload[rk_at]
        bits = payload[end]
    except IndexError:
        raise cannot_decode(c.BASIC_PUBLISH, payload[4:]) from None
    names = _PUBLISH_NAMES.get(payload[6:end])
    if names is None:
        try:
            exchange, pos = _short_str(payload, 6)
            routing_key, pos = _short_str(payload, pos)
        except (IndexError, UnicodeDecodeError):
            raise cannot_decode(c.BASIC_PUBLISH, payload[4:]) from None
        if len(_PUBLISH_NAMES) >= _PUBLISH_NAMES_MAX:
            _PUBLISH_NAMES.clear()
        names = _PUBLISH_NAMES[payload[6:end]] = (exchange, routing_key)
    return names[0], names[1], bool(bits & 1), bool(bits & 2)


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack arguments: (delivery_tag, multiple). basic.nack starts with the same two, so
    a publisher reads its confirms, acks and nacks alike, with this."""
    try:
        tag, bits = _U64_BIT.unpack_from(payload, 4)
    except struct.error:
        raise cannot_decode(method_index(payload), payload[4:]) from None
    return tag, bool(bits & 1)


def decode_deliver(payload: bytes) -> tuple[str, int, bool, str, str]:
    """basic.deliver arguments (a client's hot path): (consumer_tag, delivery_tag, redelivered,
    exchange, routing_key)."""
    try:
        consumer_tag, pos = _short_str(payload, 4)
        tag, bits = _U64_BIT.unpack_from(payload, pos)
        exchange, pos = _short_str(payload, pos + 9)
        routing_key, _pos = _short_str(payload, pos)
    except (IndexError, UnicodeDecodeError, struct.error):
        raise cannot_decode(c.BASIC_DELIVER, payload[4:]) from None
    return consumer_tag, tag, bool(bits & 1), exchange, routing_key


def short_str(value: str | bytes, *, cut: bool = True) -> bytes:
    """Encode a shortstr (length octet + bytes). A longer value is cut to 255 bytes, and a str
    on a character boundary, so that the result stays valid UTF-8; with cut=False it is a
    ValueError instead (a client's names, which must reach the broker whole)."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > 255:
        if not cut:
            raise ValueError(f"{raw[:40]!r}... is longer than 255 bytes")
        raw = raw[:255]
        if isinstance(value, str):
            raw = raw.decode("utf-8", "ignore").encode("utf-8")
    return bytes((len(raw),)) + raw


def encode_publish(
    channel: int, exchange: bytes, routing_key: bytes, mandatory: bool = False,
    immediate: bool = False,
) -> bytes:
    """A whole basic.publish method frame (a client's hot path). The two names come
    pre-encoded as shortstrs."""
    bits = (1 if mandatory else 0) | (2 if immediate else 0)
    args = b"".join((b"\x00\x00", exchange, routing_key, bytes((bits,))))
    return _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(args) + 4, 60, 40) + args + _END


def encode_get(channel: int, queue: bytes, no_ack: bool = False) -> bytes:
    """A whole basic.get method frame; the queue name comes pre-encoded as a shortstr (pamqp
    refuses names such as Leveret's query queues, `amq.leveret.publisher-id?stream=...`)."""
    args = b"".join((b"\x00\x00", queue, b"\x01" if no_ack else b"\x00"))
    return _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(args) + 4, 60, 70) + args + _END


def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    names: bytes | memoryview,
) -> bytes:
    """A whole basic.deliver method frame. The names come pre-encoded: the consumer tag's
    shortstr, and `names`, the exchange's and routing key's two shortstrs as they follow each
    other in the method (stored.deliver_names, or a stored record's bytes)."""
    return b"".join((
        _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(consumer_tag) + len(names) + 13, 60, 60),
        consumer_tag,
        _U64_BIT.pack(delivery_tag, 1 if redelivered else 0),
        names,
        _END,
    ))


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
    message_count: int,
) -> bytes:
    args = b"".join(
        (
            _U64_BIT.pack(delivery_tag, 1 if redelivered else 0),
            exchange,
            routing_key,
            _U32.pack(message_count),
        )
    )
    return _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(args) + 4, 60, 71) + args + _END


def encode_return(
    channel: int, reply_code: int, reply_text: str, exchange: bytes, routing_key: bytes
) -> bytes:
    args = b"".join((_U16.pack(reply_code), short_str(reply_text), exchange, routing_key))
    return _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(args) + 4, 60, 50) + args + _END


def encode_declare_ok(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    args = short_str(queue) + struct.pack(">II", message_count, consumer_count)
    return _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, len(args) + 4, 50, 11) + args + _END


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A basic.ack frame: a publisher confirm from the server, or a consumer's ack from a
    client (the same bytes)."""
    return (
        _ACK_FRAME.pack(c.FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0)
        + _END
    )


def encode_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A basic.nack frame (publisher confirms). Its requeue bit is set, as RabbitMQ sends it
    (the field's default); clients ignore it in a confirm."""
    return (
        _ACK_FRAME.pack(c.FRAME_METHOD, channel, 13, 60, 120, delivery_tag, 3 if multiple else 2)
        + _END
    )
