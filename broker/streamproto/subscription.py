"""One Subscribe of a stream connection: the model consumer's sink and its Deliver pump.

Credit counts chunks, not messages: the subscription turns the queue's "deliver now"
(`credit()`) into its own pump that reads whole chunks from the cursor's reader, one credit
each, and writes each run of consecutive offsets as one Deliver (chunk.py). A whole
STREAM_ENTRIES chunk (what stream-protocol publishers wrote, amqp/stored.py) is sent as its
record bytes lie on disk; other records become AMQP 1.0 messages on the way out
(amqp10.to_amqp10), once per run: a stream's RunCache keeps the entries its subscriptions were
sent lately for the next one.

It reaches its connection through the `Connection` Protocol below, so that the session (which
holds its subscriptions) and this module do not import each other.
Must not know: the stream protocol's commands (consuming.py handles them), the server.
Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Protocol

from leveret.amqp import stored
from leveret.broker.model import stream_args as sargs
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.message import QueuedMessage
from leveret.broker.model.storage_env import STREAM_ENTRIES, USER
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import listen, logs
from leveret.broker.streamproto import amqp10, chunk
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.storage import ChunkView, StorageError

log = logs.get("leveret.stream_connection")
MAX_CHUNKS_PER_TURN = 64
# Deliver bytes a pump writes before it looks at `writable` again: big chunks are written one
# by one (and none is read while the socket is full), small ones together
FLUSH_BYTES = 64 * 1024
RUN_CACHE_BYTES = 8 * 1024 * 1024  # per stream
# chunks whose record bytes are sent as they lie in the file: big ones are not copied out of
# the mapped segment (Reader.read's `mapped`)
_MAPPED = frozenset({STREAM_ENTRIES})


class Connection(Protocol):
    """What a subscription needs of its stream connection (`session.StreamSession`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def name(self) -> str: ...

    @property
    def peer(self) -> tuple[str, int]: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def writable(self) -> bool: ...

    @property
    def deliver_version(self) -> int: ...

    @property
    def subscriptions(self) -> dict[int, Subscription]: ...

    @property
    def consumer_updates(self) -> dict[int, int]: ...  # ConsumerUpdate correlation id -> sub id

    @property
    def correlation(self) -> Iterator[int]: ...

    def send(self, data: bytes | memoryview) -> None: ...

    def flush(self) -> None: ...

    def stream_unavailable(self, stream: str) -> None: ...

    def fail_or_close(self, code: int, text: str) -> None: ...


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


def _builder(view: ChunkView, start: int, end: int) -> Callable[[], chunk.Entries]:
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

    def __init__(self, session: Connection, sid: int, queue: StreamQueue, credit: int,
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

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: object) -> None:
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
