"""The stream protocol's consuming: Subscribe, Credit, Deliver, Unsubscribe, StoreOffset and
QueryOffset.

A subscription is a model Consumer of the stream queue, so it shares the queue's readers,
filters and single-active-consumer groups with AMQP 0.9.1 consumers. Credit counts chunks, not
messages: the subscription is the consumer's sink, and it turns the queue's "deliver now"
(`credit()`) into its own pump that reads whole chunks from the cursor's reader, one credit
each, and writes each run of consecutive offsets as one Deliver (chunk.py). A whole
STREAM_ENTRIES chunk (what stream-protocol publishers wrote, amqp/stored.py) is sent as its
record bytes lie on disk: they are the Deliver's simple entries, with no work per record.
Other records become AMQP 1.0 messages on the way out (amqp10.to_amqp10; 0x80 records of
older logs are only cut), once per run: a stream's RunCache keeps the entries (and CRC) its
subscriptions were sent lately for the next one. Stored offsets are the log's tracking
records, the same ones 0.9.1 offset tracking writes.
Single-threaded, on the event loop.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from leveret.amqp import stored
from leveret.broker.model import stream_args as sargs
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import BrokerError
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES, STREAM_ENTRIES, USER
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import listen, logs
from leveret.broker.streamproto import amqp10, chunk
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.broker.streamproto.streams import stream_of
from leveret.storage import OffsetSpec, StorageError

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

log = logs.get("leveret.stream_connection")
_KINDS = {k.OFFSET_FIRST: "first", k.OFFSET_LAST: "last", k.OFFSET_NEXT: "next"}
MAX_CHUNKS_PER_TURN = 64
# Deliver bytes a pump writes before it looks at `writable` again: big chunks are written one
# by one (and none is read while the socket is full), small ones together
FLUSH_BYTES = 64 * 1024
RUN_CACHE_BYTES = 8 * 1024 * 1024  # per stream
# chunks whose record bytes are sent as they lie in the file: big ones are not copied out of
# the mapped segment (Reader.read's `mapped`)
_MAPPED = frozenset({STREAM_ENTRIES})


class RunCache:
    """The entries of the runs a stream's subscriptions were sent lately, by (first offset,
    count): the next subscription to reach a run frames it without converting it again. A
    run of consecutive offsets has the same records whichever reader (filtered or not)
    returned it, and a stream's offsets are never reused."""

    __slots__ = ("bytes", "entries")

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[int, int], chunk.Entries] = OrderedDict()
        self.bytes = 0

    def get(self, first: int, count: int, build: Callable[[], chunk.Entries]) -> chunk.Entries:
        """The run of `count` offsets from `first`: cached, or `build()` (then cached)."""
        key = (first, count)
        run = self.entries.get(key)
        if run is not None:
            self.entries.move_to_end(key)
            return run
        run = build()
        self.entries[key] = run
        self.bytes += len(run.data)
        while self.bytes > RUN_CACHE_BYTES and len(self.entries) > 1:
            _key, old = self.entries.popitem(last=False)
            self.bytes -= len(old.data)
        return run


_RUN_CACHES: weakref.WeakKeyDictionary[StreamQueue, RunCache] = weakref.WeakKeyDictionary()


def _runs_of(queue: StreamQueue) -> RunCache:
    runs = _RUN_CACHES.get(queue)
    if runs is None:
        runs = _RUN_CACHES[queue] = RunCache()
    return runs


def _entries(records: Sequence[bytes], chunk_type: int = USER) -> chunk.Entries:
    """A run's records as simple entries of AMQP 1.0 messages. STREAM_ENTRIES records are simple
    entries already: they are only joined. Records published over the stream protocol to one stream
    before that chunk type existed all start with the same bytes (amqp.stored's AMQP 1.0 kind:
    0x80, the exchange and the routing key as short strings), followed by the message as it was
    sent: those are only cut (chunk.cut_entries); any other run is converted record by record
    (amqp10.to_amqp10)."""
    if chunk_type == STREAM_ENTRIES:
        return chunk.Entries(b"".join(records), len(records))
    head = records[0]
    if head[0] == stored.AMQP10:
        cut = 2 + head[1]
        cut += 1 + head[cut]
        if len(set(map(itemgetter(slice(0, cut)), records))) == 1:
            return chunk.cut_entries(records, cut)
    convert = amqp10.to_amqp10
    return chunk.entries([convert(r) for r in records])


def _builder(view: Any, start: int, end: int) -> Callable[[], chunk.Entries]:
    """How to build the entries of records start..end of a chunk view: a whole
    STREAM_ENTRIES chunk is its record bytes as read, with the CRC-32 the writer kept (or
    one CRC, for chunks written before it kept one): nothing per record. Each run carries the
    trailer length of its chunk (the publishers it tracks, as osiris's trailer would)."""

    def build() -> chunk.Entries:
        if view.chunk_type == STREAM_ENTRIES and view.offsets is None:
            run = chunk.Entries(view.record_bytes(), view.num_records, view.records_crc)
        else:
            records = view.records
            part = records[start:end] if start or end != len(records) else records
            run = _entries(part, view.chunk_type)
        run.trailer_length = chunk.trailer_length(view.publishers)
        return run

    return build


class Subscription:
    """One Subscribe of a connection: the model consumer's sink."""

    # it reads from this node's member of the stream, wherever its single-active-consumer
    # group lives (a replicated stream's is on the leader: broker/cluster/stream_sac.py)
    reads_locally = True

    def __init__(self, session: StreamSession, sid: int, queue: StreamQueue, credit: int,
                 properties: dict[str, str]) -> None:
        self.session = session
        self.id = sid
        self.queue = queue
        self.stream = queue.name
        self.credit_left = credit
        self.properties = properties
        self.consumer: Consumer | None = None
        self.scheduled = False
        self.closed = False
        self.delivered = 0
        # single active consumer: the member told it is active, and the ConsumerUpdate it has
        # not answered yet (no delivery until it chooses its offset)
        self.sac = properties.get("single-active-consumer") == "true"
        self.told_active = False
        self.awaiting: int | None = None
        self.stepping_down: int | None = None  # the inactive ConsumerUpdate not answered yet

    @property
    def connection_name(self) -> str:
        """Its connection's name as the management API shows it (for a group elsewhere)."""
        return listen.connection_name(self.session.peer, self.session.transport)

    # -- the ConsumerSink interface -----------------------------------------------------------

    def can_send(self, consumer: Consumer) -> bool:
        return False

    def send(self, consumer: Consumer, entry: Any, queue: Any) -> None:
        raise AssertionError("stream subscriptions take records only")

    def credit(self, consumer: Consumer) -> int:
        """The queue has something for this consumer: deliver it on this subscription's own
        terms (whole chunks) at the end of the turn."""
        self.resume()
        return 0

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        raise AssertionError("stream subscriptions read their chunks themselves")

    def server_cancel(self, consumer: Consumer) -> None:
        """The stream went away (deleted, or its reader failed)."""
        self.session.subscriptions.pop(self.id, None)
        self.closed = True
        self.session.stream_unavailable(self.stream)

    def deactivated(self, consumer: Consumer) -> bool:
        """The group made another member active: this one is told (ConsumerUpdate, inactive).
        True when the group must wait for the client's answer before the next member starts
        (RabbitMQ's step-down)."""
        if self.sac and self.told_active and not self.closed:
            self.told_active = False
            self.awaiting = None
            self.stepping_down = self._consumer_update(False)
            return True
        return False

    # -- single active consumer ---------------------------------------------------------------

    def _consumer_update(self, active: bool) -> int:
        s = self.session
        corr = next(s.correlation)
        s.consumer_updates[corr] = self.id
        s.send(f.request(k.CONSUMER_UPDATE, corr, f.u8(self.id) + f.u8(1 if active else 0)))
        s.flush()
        return corr

    def update_answered(self, corr: int, spec: sargs.StartSpec | None) -> None:
        """The client chose where the newly active member starts (or kept its subscription's
        offset, when it sent none)."""
        if corr == self.stepping_down and self.consumer is not None:
            self.stepping_down = None
            self.queue.handed_over(self.consumer)
            return
        if corr != self.awaiting or self.consumer is None or self.closed:
            return
        self.awaiting = None
        if spec is not None and self.consumer.state.active:
            self.queue.reposition(self.consumer, spec)
        self.resume()

    # -- delivery -----------------------------------------------------------------------------

    def resume(self) -> None:
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.session.loop.call_soon(self.pump)

    def pump(self) -> None:
        """Deliver what the credit allows; an unexpected error closes this connection only."""
        self.scheduled = False
        try:
            self._pump()
        except Exception:
            log.exception("stream delivery failed", connection=self.session.name,
                          stream=self.stream)
            self.session.fail_or_close(k.INTERNAL_ERROR, "internal error")

    def _pump(self) -> None:
        consumer = self.consumer
        if self.closed or consumer is None:
            return
        cursor = consumer.state
        s = self.session
        if self.sac:
            if cursor is None or not cursor.active:
                return
            if not self.told_active:  # newly active: the client chooses its offset first
                self.told_active = True
                self.awaiting = self._consumer_update(True)
                return
            if self.awaiting is not None:
                return
        sent = pending = 0
        while (self.credit_left > 0 and s.writable and cursor is not None and cursor.active
               and cursor.reader is not None):
            if sent >= MAX_CHUNKS_PER_TURN:  # let other connections have the loop too
                self.resume()
                break
            try:
                view = cursor.reader.read(mapped=_MAPPED)
            except StorageError:
                self.queue.remove_consumer(consumer)
                self.server_cancel(consumer)
                break
            if view is None:
                break
            count = view.count
            if not count:
                continue
            self.credit_left -= 1
            sent += 1
            runs = _runs_of(self.queue)
            for first, start, end in chunk.runs(view.first_offset, view.offsets, count):
                head, data = chunk.deliver_parts(
                    self.id, first, view.timestamp_ms,
                    runs.get(first, end - start, _builder(view, start, end)),
                    epoch=view.epoch, version=s.deliver_version,
                    committed=self.queue.log.committed_offset)
                s.send(head)
                s.send(data)
                pending += len(data)
                cursor.delivered = first + (end - start) - 1
                self.delivered += end - start
            if pending >= FLUSH_BYTES:  # then `writable` tells whether the socket took it
                s.flush()
                pending = 0
        s.flush()

    def cancel(self) -> None:
        self.closed = True
        if self.consumer is not None and not self.queue.deleted:
            self.queue.remove_consumer(self.consumer)


def consumer_update_response(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """The client's answer to ConsumerUpdate: the offset where the active member starts."""
    corr = d.u32()
    d.u16()  # response code; RabbitMQ only logs one that is not OK
    spec = None
    if d.remaining() >= 2:
        kind = d.i16()
        value = d.i64() if d.remaining() >= 8 else 0
        if kind in _KINDS:
            spec = sargs.StartSpec(_KINDS[kind])
        elif kind == k.OFFSET_OFFSET:
            spec = sargs.StartSpec("offset", max(0, value))
        elif kind == k.OFFSET_TIMESTAMP:
            spec = sargs.StartSpec("timestamp", value)
    sid = s.consumer_updates.pop(corr, None)
    sub = s.subscriptions.get(sid) if sid is not None else None
    if sub is not None:
        sub.update_answered(corr, spec)


def subscribe(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    sid = d.u8()
    name = d.string()
    kind = d.u16()
    value = 0
    if kind == k.OFFSET_OFFSET:
        value = d.u64()
    elif kind == k.OFFSET_TIMESTAMP:
        value = d.i64()
    credit = d.u16()
    properties = d.map() if d.remaining() else {}
    d.done()
    s.send(f.response(k.SUBSCRIBE, corr, _subscribe(s, sid, name, kind, value, credit,
                                                    properties)))
    sub = s.subscriptions.get(sid)
    if sub is not None and sub.consumer is not None and sub.consumer.state.active:
        sub.resume()


def consumer_arguments(kind: int, value: int, properties: dict[str, str]) -> dict[str, Any]:
    if kind in _KINDS:
        spec = sargs.StartSpec(_KINDS[kind])
    elif kind == k.OFFSET_OFFSET:
        spec = sargs.StartSpec("offset", value)
    else:
        spec = sargs.StartSpec("timestamp", value)
    arguments: dict[str, Any] = {"x-stream-offset": spec,
                                 "x-stream-automatic-offset-tracking": False}
    filters = [v for key, v in sorted(properties.items()) if key.startswith("filter.")]
    if filters:
        arguments["x-stream-filter"] = filters
        arguments["x-stream-match-unfiltered"] = properties.get("match-unfiltered") == "true"
    if properties.get("single-active-consumer") == "true":
        arguments["x-single-active-consumer"] = True
    return arguments


def _subscribe(s: StreamSession, sid: int, name: str, kind: int, value: int, credit: int,
               properties: dict[str, str]) -> int:
    if sid in s.subscriptions:
        return k.SUBSCRIPTION_ID_ALREADY_EXISTS
    if not s.allowed("read", name):
        return k.ACCESS_REFUSED
    queue = stream_of(s, name)
    if queue is None:
        return k.STREAM_DOES_NOT_EXIST
    if kind not in (*_KINDS, k.OFFSET_OFFSET, k.OFFSET_TIMESTAMP):
        return k.PRECONDITION_FAILED
    sac = properties.get("single-active-consumer") == "true"
    reference = properties.get("name")
    if sac and not reference:
        return k.PRECONDITION_FAILED
    sub = Subscription(s, sid, queue, credit, properties)
    tag = reference if sac and reference else f"stream.{s.id}.{sid}"
    consumer = Consumer(tag, queue, sub, prefetch=0,
                        arguments=consumer_arguments(kind, value, properties))
    sub.consumer = consumer
    s.subscriptions[sid] = sub
    try:
        queue.add_consumer(consumer)
    except (BrokerError, StorageError):
        s.subscriptions.pop(sid, None)
        return k.INTERNAL_ERROR
    return k.OK


def credit(s: StreamSession, d: f.Decoder, _version: int) -> None:
    sid = d.u8()
    amount = d.u16()
    d.done()
    sub = s.subscriptions.get(sid)
    if sub is None:  # only this error is answered (Credit has no correlation id)
        s.send(f.frame(k.CREDIT | k.RESPONSE, 1,
                       f.u16(k.SUBSCRIPTION_ID_DOES_NOT_EXIST) + f.u8(sid)))
        return
    sub.credit_left += amount
    sub.resume()


def unsubscribe(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    sid = d.u8()
    d.done()
    sub = s.subscriptions.pop(sid, None)
    if sub is None:
        s.send(f.response(k.UNSUBSCRIBE, corr, k.SUBSCRIPTION_ID_DOES_NOT_EXIST))
        return
    sub.cancel()
    s.send(f.response(k.UNSUBSCRIBE, corr, k.OK))


def query_offset(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    reference = d.string()
    name = d.string()
    d.done()
    queue = stream_of(s, name)
    if queue is None:
        s.send(f.response(k.QUERY_OFFSET, corr, k.STREAM_DOES_NOT_EXIST, f.u64(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.QUERY_OFFSET, corr, k.ACCESS_REFUSED, f.u64(0)))
        return
    stored = queue.stored_offset(reference.encode("utf-8")) if reference else None
    if stored is None or stored < 0:
        s.send(f.response(k.QUERY_OFFSET, corr, k.NO_OFFSET, f.u64(0)))
        return
    s.send(f.response(k.QUERY_OFFSET, corr, k.OK, f.u64(stored)))


def resolve_offset_spec(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """The offset where a subscriber with this offset spec would start (RabbitMQ answers
    with osiris's resolution: type OFFSET and the offset; NO_OFFSET when there is none)."""
    corr = d.u32()
    name = d.string()
    kind = d.i16()
    value = 0
    if kind == k.OFFSET_OFFSET:
        value = d.u64()
    elif kind == k.OFFSET_TIMESTAMP:
        value = d.i64()
    if d.remaining():
        d.map()  # properties (chunk_selector): every chunk Leveret delivers is user data
    d.done()
    code, offset = _resolve(s, name, kind, value)
    s.send(f.response(k.RESOLVE_OFFSET_SPEC, corr, code, f.u16(k.OFFSET_OFFSET) + f.u64(offset)))


def _resolve(s: StreamSession, name: str, kind: int, value: int) -> tuple[int, int]:
    if not s.allowed("read", name):
        return k.ACCESS_REFUSED, 0
    queue = stream_of(s, name)
    if queue is None:
        return k.STREAM_DOES_NOT_EXIST, 0
    log_ = queue.log
    if kind in (k.OFFSET_FIRST, k.OFFSET_LAST) and log_.committed_offset < log_.first_offset:
        return k.NO_OFFSET, 0
    if kind == k.OFFSET_FIRST:
        start = OffsetSpec.first()
    elif kind == k.OFFSET_LAST:
        start = OffsetSpec.last()
    elif kind == k.OFFSET_NEXT:
        start = OffsetSpec.next()
    elif kind == k.OFFSET_OFFSET:
        start = OffsetSpec.offset(value)
    elif kind == k.OFFSET_TIMESTAMP:
        start = OffsetSpec.timestamp(value)
    else:
        return k.PRECONDITION_FAILED, 0
    try:
        reader = log_.reader(start, chunk_types=STREAM_CHUNK_TYPES)
    except StorageError:
        return k.NO_OFFSET, 0
    position = reader.position
    reader.close()
    return k.OK, position
