"""The stream protocol's publishing: DeclarePublisher, Publish (v1, and v2 with a filter
value), PublishConfirm and PublishError, QueryPublisherSequence and DeletePublisher.

Each published message is stored as a STREAM_ENTRIES record (amqp.stored: the simple entry `size
message`, cut as it is from the Publish frame) through the stream's writer, so it shares the turn's
batch, the commit point and the confirms of AMQP 0.9.1 publishes (a run of them is a chunk of its
own, whose record bytes a subscriber's Deliver carries as they are). A publisher with a reference
is deduplicated by its publishing ids through the same tracking records as 0.9.1's
x-stream-publisher-name. Confirms of one turn go out as one PublishConfirm per publisher (the
publisher itself, its confirms and counters: publisher.py). A publisher counts what it was
sent, confirmed and refused (RabbitMQ's published, confirmed and errored, shown by the
management API): plain integer additions per frame, never per message.
Must not know: AMQP 1.0's sections (records are stored as sent). Single-threaded.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from leveret.amqp.stored import stream_entry
from leveret.broker.model.message import Confirm
from leveret.broker.streamproto import compression
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.broker.streamproto.publisher import Publisher, publish_error
from leveret.broker.streamproto.streams import stream_of

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

_ID_SIZE = struct.Struct(">QI")  # a simple entry's publishing id and size (top bit clear)


def declare_publisher(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    pid = d.u8()
    reference = d.string()
    name = d.string()
    d.done()
    s.send(f.response(k.DECLARE_PUBLISHER, corr, _declare(s, pid, reference, name)))


def _declare(s: StreamSession, pid: int, reference: str, name: str) -> int:
    if len(reference.encode("utf-8")) > 255:
        return k.PRECONDITION_FAILED
    if not s.allowed("write", name):
        return k.ACCESS_REFUSED
    queue = stream_of(s, name)
    if queue is None:
        return k.STREAM_DOES_NOT_EXIST
    if pid in s.publishers:
        return k.PRECONDITION_FAILED
    if reference and any(p.reference == reference and p.stream == name
                         for p in s.publishers.values()):
        return k.PRECONDITION_FAILED
    s.publishers[pid] = Publisher(s, pid, reference or None, queue)
    return k.OK


def delete_publisher(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    pid = d.u8()
    d.done()
    if s.publishers.pop(pid, None) is None:
        s.send(f.response(k.DELETE_PUBLISHER, corr, k.PUBLISHER_DOES_NOT_EXIST))
    else:
        s.send(f.response(k.DELETE_PUBLISHER, corr, k.OK))


def query_publisher_sequence(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    reference = d.string()
    name = d.string()
    d.done()
    queue = stream_of(s, name)
    if queue is None:
        s.send(f.response(k.QUERY_PUBLISHER_SEQUENCE, corr, k.STREAM_DOES_NOT_EXIST, f.u64(0)))
        return
    if not s.allowed("read", name) and not s.allowed("write", name):
        s.send(f.response(k.QUERY_PUBLISHER_SEQUENCE, corr, k.ACCESS_REFUSED, f.u64(0)))
        return
    last = queue.last_publishing_id(reference.encode("utf-8")) if reference else 0
    s.send(f.response(k.QUERY_PUBLISHER_SEQUENCE, corr, k.OK, f.u64(max(0, last))))


Entry = tuple[int, bytes | None, list[bytes]]


def _entries(d: f.Decoder, version: int) -> tuple[list[tuple[int, bytes]], list[Entry]]:
    """The entries of a Publish, in order: first the leading simple entries of a v1 frame (what
    clients send without sub-entry batching) as (publishing id, stored record: the entry's size and
    message as they lie in the frame), read with one struct call each; then every other entry as
    (publishing id, filter value, messages). A sub-entry batch is decompressed here, so that a bad
    one fails the frame before anything is stored."""
    count = d.count()
    simple: list[tuple[int, bytes]] = []
    if version < 2:
        data, pos, end = d.data, d.pos, len(d.data)
        unpack = _ID_SIZE.unpack_from
        append = simple.append
        while len(simple) < count and end - pos >= 12:
            publishing_id, size = unpack(data, pos)
            if size & 0x80000000 or pos + 12 + size > end:
                break  # a sub-entry batch, or a truncated entry: the decoder says which
            append((publishing_id, data[pos + 8 : pos + 12 + size]))
            pos += 12 + size
        d.pos = pos
    return simple, _decoded(d, version, count - len(simple))


def _decoded(d: f.Decoder, version: int, count: int) -> list[Entry]:
    entries: list[Entry] = []
    for _ in range(count):
        publishing_id = d.u64()
        value = d.string().encode("utf-8") if version >= 2 else b""
        first = d.u8()
        if first & 0x80:  # a sub-entry batch: 1:1 compression:3 reserved:4 count uncompressed
            codec = (first >> 4) & 0x7
            n = d.u16()
            uncompressed = d.u32()
            try:
                messages = compression.unpack(codec, n, uncompressed, d.bytes_())
            except ValueError as exc:
                raise f.FrameError(str(exc)) from None
        else:
            d.pos -= 1
            messages = [d.raw(d.u32())]
        entries.append((publishing_id, value or None, messages))
    d.done()
    return entries


def publish(s: StreamSession, d: f.Decoder, version: int) -> None:
    pid = d.u8()
    simple, entries = _entries(d, version)
    publisher = s.publishers.get(pid)
    if publisher is None or publisher.queue.deleted:
        ids = [e[0] for e in simple] + [e[0] for e in entries]
        if publisher is not None:
            publisher.published += len(ids)
            publisher.errored += len(ids)
        s.send(publish_error(pid, ids, k.PUBLISHER_DOES_NOT_EXIST))
        return
    publisher.published += len(simple) + len(entries)
    queue = publisher.queue
    reference = publisher.reference
    settled = publisher.settled
    publish_record = queue.publish_record
    for publishing_id, record in simple:
        confirm = Confirm(publishing_id, settled)
        publish_record(record, None, reference, publishing_id, confirm)
        confirm.seal()
    for publishing_id, value, messages in entries:
        confirm = Confirm(publishing_id, settled)
        last = len(messages) - 1
        for i, message in enumerate(messages):
            # the batch's publishing id deduplicates it at its first message
            fresh = publish_record(
                stream_entry(message), value,
                reference if i == 0 else None, publishing_id, confirm if i == last else None)
            if not fresh:  # a duplicate: confirmed all the same, the rest of the batch too
                if i != last:
                    queue.writer.confirm_later(confirm)
                break
        confirm.seal()
    if s.broker.alarm is not None:
        s.block()
