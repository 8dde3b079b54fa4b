"""The stored form of a message, and deliveries built from it without decoding.

Streams (and durable queues) keep a message as the bytes it was published as, plus what a
delivery needs: the exchange and routing key, already encoded as the two shortstrs that
basic.deliver carries, and where in the content header an `x-stream-offset` entry goes. A
delivery is then a small basic.deliver frame, the stored header with one table entry spliced
in, and the stored body: no property is decoded and nothing is re-encoded.

Record layout (all integers big-endian):

    u8   flags        bit 0: the header already has a headers table
    u16  insert_at    position in the header of the table's u32 length, or where a new
                      table goes (after content-type and content-encoding)
    u32  header_len
    ...  exchange shortstr, routing-key shortstr (length octet + bytes each)
    ...  content header payload (header_len bytes)
    ...  body (the rest)

A second record kind holds a message that arrived as AMQP 1.0 (over the stream protocol):

    u8   0x80         the kind (a 0.9.1 record's first octet is 0 or 1)
    ...  exchange shortstr, routing-key shortstr (what a 0.9.1 delivery names: "" and the
         stream's name, as RabbitMQ delivers a stream-protocol message)
    ...  the AMQP 1.0 message's sections, as they were sent

Its 0.9.1 form for 0.9.1 consumers comes from the converter that the broker registers
(`set_amqp10_converter`): this layer knows no AMQP 1.0.

Messages published over the stream protocol are stored in chunks of their own type,
STREAM_ENTRIES (broker/model/storage_env.py, docs/FORMAT.md 3.2), whose records are each an
osiris simple entry (a third record kind, told apart by its chunk's type, not its bytes):

    u32  size         the message's length (top bit 0)
    ...  the AMQP 1.0 message's sections, as they were sent

so that such a chunk's record bytes are, as they lie on disk, the data of a stream-protocol
Deliver. Everything else reads such a record as the 0x80 record above with exchange "" and
the stream's name as routing key (`stream_entries_as_records`). Logs written before this
type existed hold 0x80 records in USER chunks; both are read everywhere.

Pure functions; no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from leveret.amqp import constants as c
from leveret.amqp.codec import encode_deliver, short_str
from leveret.amqp.content import Message
from leveret.amqp.properties import FLAG_CONTENT_ENCODING, FLAG_CONTENT_TYPE, FLAG_HEADERS

_PREFIX = struct.Struct(">BHI")
_FRAME_HEAD = struct.Struct(">BHI")
_DELIVER_HEAD = struct.Struct(">BHIHH")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_TAG_BIT = struct.Struct(">QB")
_END = c.FRAME_END_BYTE
_OFFSET_KEY = b"\x0fx-stream-offset"


AMQP10 = 0x80  # the first octet of a record that holds an AMQP 1.0 message


def _no_converter(record: bytes | memoryview) -> bytes:
    raise ValueError("no AMQP 1.0 converter is registered")


_to_091: Callable[[bytes | memoryview], bytes] = _no_converter


def set_amqp10_converter(convert: Callable[[bytes | memoryview], bytes]) -> None:
    """Register how an AMQP 1.0 record becomes a 0.9.1 record (the broker's stream protocol
    package does, at start-up)."""
    global _to_091
    _to_091 = convert


def encode_amqp10_record(exchange: str, routing_key: str, message: bytes) -> bytes:
    """The stored form of an AMQP 1.0 message (its sections, as sent)."""
    return b"".join((b"\x80", deliver_names(exchange, routing_key), message))


def stream_entry(message: bytes | memoryview) -> bytes:
    """A STREAM_ENTRIES record: the message's size (u32) and the message."""
    return _U32.pack(len(message)) + message


def stream_entries_as_records(records: Sequence[bytes], stream: str) -> list[bytes]:
    """STREAM_ENTRIES records as 0x80 records: exchange "" and the stream's name as the
    routing key, as RabbitMQ 3.13 delivers a stream-protocol message over 0.9.1."""
    prefix = b"\x80" + deliver_names("", stream)
    return [prefix + r[4:] for r in records]


def amqp10_parts(record: bytes | memoryview) -> tuple[str, str, bytes]:
    """An AMQP 1.0 record's exchange, routing key and message."""
    pos = 1
    ex_len = record[pos]
    exchange = bytes(record[pos + 1 : pos + 1 + ex_len]).decode("utf-8")
    pos += 1 + ex_len
    rk_len = record[pos]
    routing_key = bytes(record[pos + 1 : pos + 1 + rk_len]).decode("utf-8")
    pos += 1 + rk_len
    return exchange, routing_key, bytes(record[pos:])


def is_amqp10(record: bytes | memoryview) -> bool:
    return record[0] == AMQP10


def _insertion_point(header: bytes) -> tuple[bool, int]:
    flags = (header[12] << 8) | header[13]
    pos = 14
    if flags & FLAG_CONTENT_TYPE:
        pos += 1 + header[pos]
    if flags & FLAG_CONTENT_ENCODING:
        pos += 1 + header[pos]
    return bool(flags & FLAG_HEADERS), pos


_NAMES: dict[tuple[str, str], bytes] = {}
_NAMES_MAX = 4096  # distinct (exchange, routing key) pairs remembered, then forgotten


def deliver_names(exchange: str, routing_key: str) -> bytes:
    """The two shortstrs of basic.deliver, encoded once per distinct pair (a name over 255
    bytes, such as a long x-dead-letter-routing-key, is cut as codec.short_str cuts it)."""
    key = (exchange, routing_key)
    names = _NAMES.get(key)
    if names is None:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        names = _NAMES[key] = short_str(exchange) + short_str(routing_key)
    return names


def encode_record(message: Message) -> bytes:
    """The stored form of a published message. An `x-stream-offset` header that came with
    the message is dropped: the offset is the broker's to set."""
    header = message.header
    if _OFFSET_KEY in header and "x-stream-offset" in message.headers:
        headers = dict(message.headers)
        del headers["x-stream-offset"]
        message = message.replace(headers=headers or None)
        header = message.header
    high = header[12]
    if high & 0xC0:  # content-type or content-encoding: the table goes after them
        has_table, insert_at = _insertion_point(header)
        prefix = _PREFIX.pack(1 if has_table else 0, insert_at, len(header))
    else:  # the table, if any, is the first property: right after the flags
        prefix = _PREFIX.pack(1 if high & 0x20 else 0, 14, len(header))
    return b"".join(
        (prefix, deliver_names(message.exchange, message.routing_key), header, message.body)
    )


_PAIRS: dict[bytes, tuple[str, str]] = {}  # deliver_names backwards, as bounded


def _pair(names: bytes) -> tuple[str, str]:
    """The exchange and routing key of basic.deliver's two shortstrs, decoded once per pair."""
    pair = _PAIRS.get(names)
    if pair is None:
        if len(_PAIRS) >= _NAMES_MAX:
            _PAIRS.clear()
        ex_end = 1 + names[0]
        pair = _PAIRS[names] = (names[1:ex_end].decode("utf-8"),
                                names[ex_end + 1 :].decode("utf-8"))
    return pair


def decode_record(record: bytes | memoryview, at: int = 0) -> Message:
    """Back to a Message (for basic.get-style reads, dead-lettering, inspection); the record
    starts `at` that position of `record` (a durable queue's entry has its own head first)."""
    if type(record) is not bytes:
        record = bytes(record)
    if record[at] == AMQP10:
        record = _to_091(record[at:])
        at = 0
    header_len = _U32.unpack_from(record, at + 3)[0]
    names_at = at + 7
    names_end = names_at + 1 + record[names_at]
    names_end += 1 + record[names_end]
    exchange, routing_key = _pair(record[names_at:names_end])
    header_end = names_end + header_len
    return Message(exchange, routing_key, record[names_end:header_end], record[header_end:])


def deliver_frames(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    offset: int,
    record: bytes | memoryview,
    frame_max: int,
    out: list[bytes | memoryview],
) -> None:
    """Append to `out` the frames of one basic.deliver of a stored message, with the
    `x-stream-offset` header (a long) set to `offset`."""
    if record[0] == AMQP10:
        record = _to_091(record)
    flags, insert_at, header_len = _PREFIX.unpack_from(record, 0)
    names_end = 8 + record[7]
    names_end += 1 + record[names_end]
    names = record[7:names_end]
    header_end = names_end + header_len
    entry = _OFFSET_KEY + b"l" + offset.to_bytes(8, "big", signed=True)
    header_start = names_end
    at = header_start + insert_at
    if flags & 1:
        table_len = _U32.unpack_from(record, at)[0]
        new_header_len = header_len + 25
        header_parts: tuple[bytes | memoryview, ...] = (
            record[header_start:at],
            _U32.pack(table_len + 25),
            entry,
            record[at + 4 : header_end],
        )
    else:
        prop_flags = (record[header_start + 12] << 8) | record[header_start + 13]
        new_header_len = header_len + 29
        header_parts = (
            record[header_start : header_start + 12],
            _U16.pack(prop_flags | FLAG_HEADERS),
            record[header_start + 14 : at],
            b"\x00\x00\x00\x19",
            entry,
            record[at:header_end],
        )
    body_len = len(record) - header_end
    out += (
        encode_deliver(channel, consumer_tag, delivery_tag, False, names),
        _FRAME_HEAD.pack(c.FRAME_HEADER, channel, new_header_len),
        *header_parts,
        _END,
    )
    if not body_len:
        return
    max_body = frame_max - c.FRAME_OVERHEAD
    if body_len <= max_body:
        out += (_FRAME_HEAD.pack(c.FRAME_BODY, channel, body_len), record[header_end:], _END)
        return
    view = memoryview(record)
    for start in range(header_end, len(record), max_body):
        piece = view[start : start + max_body]
        out += (_FRAME_HEAD.pack(c.FRAME_BODY, channel, len(piece)), piece, _END)


_NO_PROPERTIES_TAIL = b"\x20\x00\x00\x00\x00\x19" + _OFFSET_KEY + b"l"  # flags, table length
# after a bare header's first 12 octets: the flags and the one-entry table, the offset, the
# frame end, and the body frame's head (type, channel, size)
_BARE_TAIL = struct.Struct(f">{len(_NO_PROPERTIES_TAIL)}sqBBHI")


def deliver_batch(
    channel: int,
    consumer_tag: bytes,
    first_tag: int,
    offsets: Sequence[int],
    records: Sequence[bytes],
    frame_max: int,
    out: list[bytes | memoryview],
) -> None:
    """deliver_frames for a run of records with consecutive delivery tags.

    The same frames, built with the per-message work cut down. A message without properties
    (the common case for streams fed by load generators and many producers) has frames that
    differ from the last such message's only in the delivery tag, the offset and the body
    when its record is as long and starts with the same bytes up to the body: then everything
    before the body is one struct pack of the tag and the offset between constant bytes."""
    max_body = frame_max - c.FRAME_OVERHEAD
    end_and_header_head = _END + _FRAME_HEAD.pack(c.FRAME_HEADER, channel, 14 + 29)
    end = _END
    prefixes: dict[int, bytes] = {}
    same_len = -1  # the last bare record's length,
    last = same_head = b""  # the record, and its bytes up to the body once a second matches,
    body_at = 0  # where its body starts,
    head: struct.Struct | None = None  # and its frames up to the body, tag and offset apart
    before = middle = after = b""
    extend = out.extend
    unpack_header_len, pack_tag, pack_tail = _U32.unpack_from, _TAG_BIT.pack, _BARE_TAIL.pack
    frame_end, frame_body = end[0], c.FRAME_BODY
    tag = first_tag
    for offset, record in zip(offsets, records, strict=True):
        size = len(record)
        if size == same_len and record.startswith(same_head or last[:body_at]):
            if not same_head:  # a layout seen twice in a row: worth a struct of its own
                same_head = last[:body_at]
                names_end = 9 + record[7] + record[8 + record[7]]
                middle = (b"\x00" + record[7:names_end] + end_and_header_head
                          + record[names_end : names_end + 12] + _NO_PROPERTIES_TAIL)
                after = end + _FRAME_HEAD.pack(c.FRAME_BODY, channel, size - body_at)
                head = struct.Struct(f">{len(before)}sQ{len(middle)}sq{len(after)}s")
            assert head is not None
            extend((head.pack(before, tag, middle, offset, after), record[body_at:], end))
            tag += 1
            continue
        if record[0] == AMQP10:
            record = _to_091(record)
            size = len(record)
        header_len = unpack_header_len(record, 3)[0]
        names_end = 8 + record[7]
        names_end += 1 + record[names_end]
        header_end = names_end + header_len
        body_len = size - header_end
        if header_len != 14 or record[names_end + 12] or record[names_end + 13] or not (
            0 < body_len <= max_body
        ):
            deliver_frames(channel, consumer_tag, tag, offset, record, frame_max, out)
            tag += 1
            continue
        args_len = len(consumer_tag) + 9 + names_end - 7
        before = prefixes.get(args_len, b"")
        if not before:
            before = prefixes[args_len] = (
                _DELIVER_HEAD.pack(c.FRAME_METHOD, channel, args_len + 4, 60, 60) + consumer_tag
            )
        extend((
            before, pack_tag(tag, 0), record[7:names_end], end_and_header_head,
            record[names_end : names_end + 12],
            pack_tail(_NO_PROPERTIES_TAIL, offset, frame_end, frame_body, channel, body_len),
            record[header_end:], end,
        ))
        same_len = size  # (after a 1.0 record, `last` is its 0.9.1 form: no 1.0 record matches)
        last = record
        body_at = header_end
        same_head = b""
        tag += 1
