"""One log, two protocols: a stored message as an AMQP 1.0 message, and back.

A stream keeps each message in the form it arrived in (amqp.stored): a 0.9.1 record keeps its
exact bytes for 0.9.1 consumers, an AMQP 1.0 record (a stream-protocol publish) keeps its
sections. The other protocol's consumers get a conversion, as RabbitMQ makes it (mc_amqpl.erl):

- 0.9.1 -> 1.0 (`to_amqp10`): header (durable from delivery mode 2, priority, ttl from
  expiration), message annotations (x-exchange, x-routing-key, every x-* header, CC as x-cc,
  the type as x-basic-type), properties (message and correlation ids as uuid when they are
  `urn:uuid:`, user id as binary, reply-to as /queues/<name>, content type and encoding as
  symbols, creation time = timestamp x 1000, group-id = app-id), application properties (the
  other headers of scalar types) and the body as one data section.
- 1.0 -> 0.9.1 (`to_091_record`): the reverse, as RabbitMQ 3.13 delivers a stream-protocol
  message to an AMQP 0.9.1 consumer (exchange "" and the stream's name as routing key).

Pure: no I/O. Registers `to_091_record` with amqp.stored at import.
"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

from leveret.amqp import stored
from leveret.amqp.content import Message
from leveret.amqp.properties import encode_values
from leveret.broker.streamproto import amqp10types as t
from leveret.broker.streamproto import table091

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
AMQP10_TYPE = "amqp-1.0"
_INTERNAL = ("x-routing-key", "x-exchange", "x-death")


def _section(code: int, value: t.Value) -> bytes:
    return b"\x00\x53" + bytes((code,)) + t.encode(value)


def _trim(fields: list[t.Value]) -> list[t.Value]:
    while fields and fields[-1] == t.NULL:
        fields.pop()
    return fields


# -- 0.9.1 -> 1.0 ------------------------------------------------------------------------------

def to_amqp10(record: bytes) -> bytes:
    """A stored record as the AMQP 1.0 message a stream-protocol consumer receives."""
    if record[0] == stored.AMQP10:
        pos = 2 + record[1]
        return bytes(record[pos + 1 + record[pos] :])
    header_len = int.from_bytes(record[3:7], "big")
    names_end = 8 + record[7]
    names_end += 1 + record[names_end]
    if header_len == 14 and not record[names_end + 12] and not record[names_end + 13]:
        return _bare(record, names_end)  # no properties: the common case, from a template
    message = stored.decode_record(record)
    try:
        return from_091(message, _headers_of(record))
    except Exception:  # noqa: BLE001 - properties that do not decode: the body alone
        return _section(DATA, ("binary", message.body))


_TEMPLATES: dict[bytes, bytes] = {}
_TEMPLATES_MAX = 4096


def _bare(record: bytes, names_end: int) -> bytes:
    """A 0.9.1 message without properties: the sections before the body depend only on its
    exchange and routing key, and are built once per pair."""
    names = bytes(record[7:names_end])
    head = _TEMPLATES.get(names)
    if head is None:
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        empty = stored.decode_record(bytes(record[: names_end + 14]))
        full = from_091(empty, [])
        head = _TEMPLATES[names] = full[: len(full) - len(_section(DATA, ("binary", b"")))]
    body = bytes(record[names_end + 14 :])
    return head + _section(DATA, ("binary", body))


def _headers_of(record: bytes) -> list[table091.Entry]:
    """The typed headers table of a 0.9.1 record (empty when it has none)."""
    if not record[0] & 1:
        return []
    insert_at = (record[1] << 8) | record[2]
    names_end = 8 + record[7]
    names_end += 1 + record[names_end]
    at = names_end + insert_at
    size = int.from_bytes(record[at : at + 4], "big")
    return table091.decode_table(record, at + 4, at + 4 + size)


def _value_from_091(kind: str, value: Any) -> t.Value:
    if kind == "longstr":
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return ("binary", value)
        return ("binary", value) if "\x00" in text else ("utf8", text)
    simple = {"long": "long", "unsignedbyte": "ubyte", "short": "short",
              "unsignedshort": "ushort", "unsignedint": "uint", "signedint": "int",
              "double": "double", "float": "float", "bool": "boolean", "binary": "binary",
              "byte": "byte"}
    if kind in simple:
        return (simple[kind], value)
    if kind == "timestamp":
        return ("timestamp", value * 1000)
    if kind == "array":
        return ("list", [_value_from_091(k, v) for k, v in value])
    if kind == "table":
        return ("map", [(("symbol", n), _value_from_091(k, v)) for n, k, v in value])
    return t.NULL  # void, decimal


def _id(value: str | None) -> t.Value:
    if value is None or value == "":
        return t.NULL
    if value.startswith("urn:uuid:"):
        try:
            return ("uuid", uuid.UUID(value[9:]).bytes)
        except ValueError:
            pass
    return ("utf8", value)


def from_091(message: Message, headers: list[table091.Entry]) -> bytes:
    p = message.properties
    ttl: t.Value = t.NULL
    if p.expiration:
        try:
            ttl = ("uint", int(p.expiration))
        except ValueError:
            ttl = t.NULL
    header = [("boolean", p.delivery_mode == 2),
              ("ubyte", p.priority) if p.priority is not None else t.NULL, ttl]
    annotations: list[tuple[t.Value, t.Value]] = [
        (("symbol", "x-exchange"), ("utf8", message.exchange)),
        (("symbol", "x-routing-key"), ("utf8", message.routing_key)),
    ]
    application: list[tuple[t.Value, t.Value]] = []
    for name, kind, value in headers:
        if name.startswith("x-"):
            annotations.append((("symbol", name), _value_from_091(kind, value)))
        elif name == "CC" and kind == "array":
            annotations.append((("symbol", "x-cc"), _value_from_091(kind, value)))
        elif kind not in ("array", "table"):
            application.append((("utf8", name), _value_from_091(kind, value)))
    if p.message_type:
        annotations.append((("symbol", "x-basic-type"), ("utf8", p.message_type)))
    timestamp = p.timestamp
    properties = [
        _id(p.message_id),
        ("binary", p.user_id.encode("utf-8")) if p.user_id else t.NULL,
        t.NULL, t.NULL,
        ("utf8", "/queues/" + urllib.parse.quote(p.reply_to, safe="")) if p.reply_to
        else t.NULL,
        _id(p.correlation_id),
        ("symbol", p.content_type) if p.content_type else t.NULL,
        ("symbol", p.content_encoding) if p.content_encoding else t.NULL,
        t.NULL,
        ("timestamp", int(timestamp.timestamp()) * 1000) if timestamp is not None else t.NULL,
        ("utf8", p.app_id) if p.app_id else t.NULL,
    ]
    return b"".join((
        _section(HEADER, ("list", _trim(header))),
        _section(MESSAGE_ANNOTATIONS, ("map", annotations)),
        _section(PROPERTIES, ("list", _trim(properties))),
        _section(APPLICATION_PROPERTIES, ("map", application)),
        _section(DATA, ("binary", message.body)),
    ))


# -- 1.0 -> 0.9.1 ------------------------------------------------------------------------------

def sections(message: bytes) -> tuple[dict[int, Any], list[tuple[int, Any, bytes]]]:
    """The sections of an AMQP 1.0 message by descriptor code, and its body sections as
    (code, value, raw bytes)."""
    out: dict[int, Any] = {}
    body: list[tuple[int, Any, bytes]] = []
    pos = 0
    while pos < len(message):
        start = pos
        value, pos = t.decode(message, pos)
        if value[0] != "described":
            raise ValueError("an AMQP 1.0 section is not a described type")
        descriptor = value[1]
        code = descriptor[1] & 0xFF if descriptor[0] == "ulong" else _symbolic(descriptor[1])
        if code in (DATA, AMQP_SEQUENCE, AMQP_VALUE):
            body.append((code, value[2], message[start:pos]))
        else:
            out[code] = value[2]
    return out, body


_SYMBOLS = {"amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
            "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
            "amqp:properties:list": PROPERTIES,
            "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
            "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE,
            "amqp:footer:map": FOOTER}


def _symbolic(name: Any) -> int:
    return _SYMBOLS.get(str(name), -1)


def _value_to_091(value: t.Value) -> tuple[str, Any] | None:
    kind = value[0]
    v: Any = value[1] if len(value) > 1 else None
    simple = {"long": "long", "ulong": "long", "byte": "byte", "ubyte": "unsignedbyte",
              "short": "short", "ushort": "unsignedshort", "uint": "unsignedint",
              "int": "signedint", "double": "double", "float": "float", "boolean": "bool"}
    if kind in simple:
        return simple[kind], v
    if kind in ("utf8", "symbol"):
        return "longstr", v.encode("utf-8")
    if kind == "binary":
        return "longstr", v
    if kind == "timestamp":
        return "timestamp", v // 1000
    if kind == "null":
        return "void", None
    if kind in ("list", "array"):
        items = value[2] if kind == "array" else v
        converted = [_value_to_091(i) for i in items]
        return "array", [c for c in converted if c is not None]
    if kind == "map":
        entries = []
        for key, item in v:
            c = _value_to_091(item)
            if c is not None and key[0] in ("utf8", "symbol"):
                entries.append((key[1], c[0], c[1]))
        return "table", entries
    return None


def _get(pairs: Any, key: str) -> Any:
    for k, v in pairs or []:
        if k == ("symbol", key):
            return v[1] if len(v) > 1 else None
    return None


def _field(fields: list[t.Value], index: int) -> Any:
    if index < len(fields) and fields[index] != t.NULL:
        return fields[index]
    return None


def _shortstr(value: Any) -> str | None:
    if value is None or value[0] != "utf8" or len(value[1].encode("utf-8")) > 255:
        return None
    text: str = value[1]
    return text


def _message_id(value: Any, header: str,
                headers: list[table091.Entry]) -> tuple[list[table091.Entry], str | None]:
    if value is None:
        return headers, None
    kind, v = value[0], value[1]
    if kind == "uuid":
        return headers, f"urn:uuid:{uuid.UUID(bytes=v)}"
    if kind == "ulong":
        return headers, str(v)
    if kind == "binary":
        return [(header, "binary", v), *headers], None
    if kind == "utf8":
        if len(v.encode("utf-8")) <= 255:
            return headers, v
        return [(header, "longstr", v.encode("utf-8")), *headers], None
    return headers, None


def to_091(message: bytes) -> tuple[bytes, bytes]:
    """An AMQP 1.0 message as a 0.9.1 content header payload and body."""
    parts, body_sections = sections(message)
    header = parts.get(HEADER)
    header_fields = header[1] if header else []
    annotations = parts.get(MESSAGE_ANNOTATIONS)
    annotations = annotations[1] if annotations else []
    props = parts.get(PROPERTIES)
    props = props[1] if props else []
    app = parts.get(APPLICATION_PROPERTIES)
    app = app[1] if app else []
    if body_sections and all(code == DATA for code, _, _ in body_sections):
        body = b"".join(value[1] for _, value, _ in body_sections)
        type_ = _get(annotations, "x-basic-type")
    else:
        body = b"".join(raw for _, _, raw in body_sections)
        type_ = AMQP10_TYPE
    durable = _field(header_fields, 0)
    delivery_mode = (2 if durable[1] else 1) if durable is not None else _get(
        annotations, "x-basic-delivery-mode")
    priority = _field(header_fields, 1)
    priority = priority[1] if priority is not None else _get(annotations, "x-basic-priority")
    ttl = _field(header_fields, 2)
    expiration = str(ttl[1]) if ttl is not None else _get(annotations, "x-basic-expiration")
    headers: list[table091.Entry] = []
    for key, value in app:
        if key[0] == "utf8" and len(key[1].encode("utf-8")) <= 255:
            c = _value_to_091(value)
            if c is not None:
                headers.append((key[1], c[0], c[1]))
    x_headers: list[table091.Entry] = []
    for key, value in annotations:
        name = key[1] if key[0] == "symbol" else None
        if name is None:
            continue
        if name == "x-cc":
            c = _value_to_091(value)
            if c is not None:
                x_headers.append(("CC", c[0], c[1]))
        elif name == "x-opt-rabbitmq-received-time" and value[0] == "timestamp":
            x_headers.append(("timestamp_in_ms", "long", value[1]))
        elif (name.startswith("x-") and not name.startswith("x-basic-")
              and name not in _INTERNAL and name != "x-opt-deaths"
              and len(name.encode("utf-8")) <= 255):
            c = _value_to_091(value)
            if c is not None:
                x_headers.append((name, c[0], c[1]))
    headers, message_id = _message_id(_field(props, 0), "x-message-id", headers)
    headers, correlation_id = _message_id(_field(props, 5), "x-correlation-id", headers)
    all_headers = x_headers + headers
    user = _field(props, 1)
    user_id = None
    if user is not None and user[0] == "binary" and len(user[1]) <= 255:
        try:
            user_id = user[1].decode("utf-8")
        except UnicodeDecodeError:
            user_id = None
    reply_to = _shortstr(_field(props, 4))
    if reply_to is not None and reply_to.startswith("/queues/"):
        reply_to = urllib.parse.unquote(reply_to[8:])
    created = _field(props, 9)
    content_type = _field(props, 6)
    content_encoding = _field(props, 7)
    values = {
        "content_type": content_type[1] if content_type else None,
        "content_encoding": content_encoding[1] if content_encoding else None,
        "delivery_mode": delivery_mode, "priority": priority,
        "correlation_id": correlation_id, "reply_to": reply_to, "expiration": expiration,
        "message_id": message_id,
        "timestamp": created[1] // 1000 if created is not None else None,
        "type": type_, "user_id": user_id, "app_id": _shortstr(_field(props, 10)),
    }
    table = table091.encode_table(all_headers) if all_headers else None
    return encode_values(len(body), values, headers=table), body


def _only_data(message: bytes) -> bytes | None:
    """The body of a message that is a single data section, else None."""
    if message[:3] != b"\x00\x53\x75" or len(message) < 5:
        return None
    if message[3] == 0xA0 and len(message) == 5 + message[4]:
        return message[5:]
    if message[3] == 0xB0 and len(message) >= 8 and len(message) == 8 + int.from_bytes(
            message[4:8], "big"):
        return message[8:]
    return None


def to_091_record(record: bytes | memoryview) -> bytes:
    """An AMQP 1.0 record as a 0.9.1 record (the converter amqp.stored calls)."""
    exchange, routing_key, message = stored.amqp10_parts(record)
    body = _only_data(message)
    if body is not None:  # one data section and nothing else: no properties to convert
        return stored.encode_record(Message(exchange, routing_key,
                                            encode_values(len(body), None), body))
    try:
        header, body = to_091(message)
    except (ValueError, IndexError, TypeError):  # not a valid AMQP 1.0 message: the bytes as-is
        header, body = encode_values(len(message), None), message
    return stored.encode_record(Message(exchange, routing_key, header, body))


stored.set_amqp10_converter(to_091_record)
