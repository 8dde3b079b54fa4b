"""Durable classic queues: persistent messages in the log, acks recorded, a bounded memory.

A durable classic queue keeps its messages in its own log of the storage engine. Persistent
messages are appended before they are confirmed (one chunk per turn of the event loop); acks
and discards are appended as ranges of settled offsets, deliveries as ranges of delivered
offsets (so the redelivered flag survives a restart); the queue's writer (writer.py) owns that
turn's batch, its append, the commit point and the confirms. Whole segments below the lowest
unsettled offset are deleted, so disk use follows the backlog, not the history.

A FIFO queue keeps at most a page of ready messages in memory: once the page is full, new
messages (persistent or not) go to the log only, and are read back a page at a time as the
head drains. Transient messages written that way are dropped at a restart, as RabbitMQ drops
transient messages of durable queues. Priority queues keep their entries in memory.

Recovery reads the log once: settled and delivered ranges first, then the message records.

Single-threaded: runs on the event loop; storage calls are synchronous.
"""

from __future__ import annotations

import shutil
import struct
import sys
import uuid
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from leveret.broker.model.consumer import Consumer
from leveret.broker.model.intervals import IntervalSet
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import ClassicQueue, QueueOwner
from leveret.broker.model.replication import ONE_NODE, Appends
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.store import LeveledStore, MemoryStore, MessageStore
from leveret.broker.model.writer import Writer
from leveret.broker.process import logs
from leveret.storage import Log, LogConfig, OffsetSpec, StorageError

log = logs.get("leveret.durable")

ACKS = 16  # chunk type: ranges of settled offsets
DELIVERED = 17  # chunk type: ranges of delivered offsets
SEGMENT_BYTES = 16 * 1024 * 1024
PAGE_MESSAGES = 2048
PAGE_BYTES = 8 * 1024 * 1024
_HEAD = struct.Struct(">BQqBI")  # flags, seq, expires_at (-1: none), priority, body size
PRIORITY_AT = 17  # where the priority byte is in _HEAD
PERSISTENT = 1

PENDING = "pending"  # store_ref of an entry waiting for this turn's write
SETTLED_EARLY = "settled-early"  # settled before it was written: never written


@dataclass
class _Batch:
    entries: list[QueuedMessage] = field(default_factory=list)
    settled: IntervalSet = field(default_factory=IntervalSet)
    delivered: IntervalSet = field(default_factory=IntervalSet)
    tail: list[QueuedMessage] = field(default_factory=list)  # entries kept in the log only
    returned: list[QueuedMessage] = field(default_factory=list)  # counts to record (quorum)
    delivered_early: list[QueuedMessage] = field(default_factory=list)  # before their write
    dead_lettered: list[QueuedMessage] = field(default_factory=list)  # held (quorum)


def _ranges(intervals: IntervalSet) -> bytes:
    """A record of [start, end) pairs, as big-endian u64s."""
    flat = array("Q")
    for start, end in intervals.ranges():
        flat.append(start)
        flat.append(end)
    if sys.byteorder == "little":
        flat.byteswap()
    return flat.tobytes()


def _parse_ranges(record: bytes | memoryview) -> list[tuple[int, int]]:
    flat = array("Q")
    flat.frombytes(bytes(record))
    if sys.byteorder == "little":
        flat.byteswap()
    return list(zip(flat[0::2], flat[1::2], strict=True))


class PagedStore:
    """Ready messages of a durable FIFO queue: a page in memory, the rest in the log.

    `level`: the one priority whose messages it holds, when the queue keeps others elsewhere
    (a quorum queue's default priority): reading the tail back skips the others' records."""

    def __init__(self, queue: DurableClassicQueue, level: int | None = None) -> None:
        self.queue = queue
        self.level = level
        self.head = MemoryStore()
        self.tail_count = 0
        self.tail_bytes = 0
        self.tail_from = 0  # the offset the tail starts at (valid while tail_count)

    def __len__(self) -> int:
        return len(self.head) + self.tail_count

    def __iter__(self) -> Iterator[QueuedMessage]:
        return iter(self.head)

    @property
    def bytes(self) -> int:
        return self.head.bytes + self.tail_bytes

    def full(self) -> bool:
        return len(self.head) >= PAGE_MESSAGES or self.head.bytes >= PAGE_BYTES

    def push(self, entry: QueuedMessage) -> None:
        if (self.tail_count or self.full()) and isinstance(entry.store_ref, int):
            # written already (a quorum queue's, once committed): it joins the tail as it is
            if not self.tail_count:
                self.tail_from = entry.store_ref
            self.tail_count += 1
            self.tail_bytes += len(entry.message.body)
            return
        if self.tail_count or self.full():
            if not self.tail_count:
                # Head entries of this turn are still waiting to be written: write them now,
                # or they would take the offsets the tail starts at, be read back into the
                # head a second time, and leave as many tail entries unread.
                self.queue.writer.flush()
                self.tail_from = self.queue.log.next_offset
            entry.store_ref = PENDING
            self.tail_count += 1
            self.tail_bytes += len(entry.message.body)
            self.queue.write_later(entry, tail=True)
        else:
            self.head.push(entry)

    def _page_in(self) -> None:
        if not self.tail_count or len(self.head) >= PAGE_MESSAGES // 2:
            return
        self.queue.writer.flush()
        self.tail_from = self.queue.page_in(self.tail_from, self)

    def adopt(self, entries: list[QueuedMessage], size: int) -> None:
        """Messages read back from the tail (`size` body bytes in all) join the head."""
        self.head.extend(entries, size)
        self.tail_count -= len(entries)
        self.tail_bytes -= size

    def peek(self) -> QueuedMessage | None:
        if not len(self.head):
            self._page_in()
        return self.head.peek()

    def pop(self) -> QueuedMessage | None:
        if not len(self.head):
            self._page_in()
        return self.head.pop()

    def requeue(self, entry: QueuedMessage) -> None:
        self.head.requeue(entry)

    def recovered(self, offset: int, size: int, entry: Callable[[], QueuedMessage]) -> None:
        """A ready message found by recovery: into the head while it has room, else the tail
        (read back when the head drains)."""
        if self.tail_count or self.full():
            if not self.tail_count:
                self.tail_from = offset
            self.tail_count += 1
            self.tail_bytes += size
        else:
            self.head.push(entry())

    def clear(self) -> list[QueuedMessage]:
        """Purge: the head's entries are returned; the tail is settled in the log."""
        entries = self.head.clear()
        if self.tail_count:
            self.queue.writer.flush()
            self.queue.settle_range(self.tail_from, self.queue.log.next_offset)
            self.tail_count = 0
            self.tail_bytes = 0
        return entries


class DurableClassicQueue(ClassicQueue):
    def __init__(self, vhost: QueueOwner, name: str, *, env: StorageEnv,
                 storage_id: str | None = None, replication: Appends = ONE_NODE,
                 **kwargs: Any) -> None:
        super().__init__(vhost, name, **kwargs)
        self.env = env
        self.storage_id = storage_id or uuid.uuid4().hex
        self.directory = env.directory(self.storage_id)
        try:
            self.log = Log.open(self.directory, LogConfig(  # fsynced by env.syncer
                max_segment_size_bytes=SEGMENT_BYTES, fsync=env.fsync_policy,
                fsync_on_write=False, folder_lock=env.folder_locks))
        except StorageError:
            if storage_id is None:  # a new queue (a full disk): leave no empty folder behind
                shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self.settled_offsets = IntervalSet()
        self.delivered_offsets = IntervalSet()  # delivered before the last restart
        # neither ready nor settled (a quorum queue's dead letters waiting for their targets):
        # recovery and reading the tail back pass them by
        self.held_offsets = IntervalSet()
        self.floor = self.log.first_offset
        self.writer = Writer(vhost.scheduler, env.fsync_policy, lambda: self.log, batch=_Batch,
                             append=self._write, failed=self._write_failed, name=name,
                             replication=replication, on_commit=self.committed_moved,
                             syncer=env.syncer)
        self.messages = self.make_store()
        self._recover()

    def make_store(self) -> MessageStore:
        """Where the ready messages wait: a page in memory for a FIFO queue, all in memory
        for a priority queue."""
        return PagedStore(self) if not self.max_priority else self.messages

    def readable_up_to(self) -> int:
        """How far the tail may be read back: the commit point (a quorum queue's may be a
        majority's, behind what this node wrote)."""
        return self.writer.committer.committed

    def committed_moved(self) -> None:
        """The commit point moved (a quorum queue releases what it covers to consumers)."""

    def persists(self, message: InboundMessage) -> bool:
        """Whether a message is written to the log: persistent ones (RabbitMQ keeps transient
        messages of a durable classic queue in memory)."""
        return message.persistent

    # -- writing ------------------------------------------------------------------------------

    def write_later(self, entry: QueuedMessage, tail: bool = False) -> None:
        entry.store_ref = PENDING
        batch = self.writer.batch
        batch.entries.append(entry)
        if tail:
            batch.tail.append(entry)
        self.writer.schedule()

    def accept(self, entry: QueuedMessage, confirm: Confirm | None) -> None:
        persists = self.persists(entry.message)
        if entry.store_ref is None and persists:
            self.write_later(entry)
        if confirm is not None and entry.store_ref is PENDING and persists:
            self.writer.confirm_later(confirm)

    def settled(self, entry: QueuedMessage) -> None:
        ref = entry.store_ref
        if isinstance(ref, int):
            self.writer.batch.settled.add(ref)
            self.writer.schedule()
        elif ref is PENDING:
            entry.store_ref = SETTLED_EARLY

    def settle_range(self, start: int, end: int) -> None:
        self.writer.batch.settled.add_range(start, end)
        self.writer.schedule()

    def deliver_to(self, consumer: Consumer, entry: QueuedMessage) -> None:
        self._mark_delivered(entry)
        super().deliver_to(consumer, entry)

    def get(self, no_ack: bool) -> QueuedMessage | None:
        entry = super().get(no_ack)
        if entry is not None:
            self._mark_delivered(entry)
        return entry

    def _mark_delivered(self, entry: QueuedMessage) -> None:
        if isinstance(entry.store_ref, int) and not entry.redelivered:
            self.writer.batch.delivered.add(entry.store_ref)
            self.writer.schedule()

    def _write_failed(self, batch: _Batch, error: StorageError) -> bool:
        """A write failed (a full disk): the log was cut back to before it. If the messages
        were not written, their publishes are nacked (False); those that were to live in the
        log only (the paged-out tail) are gone, and the others stay in memory only, as
        transient messages do. The settled and delivered ranges go with the next write."""
        log.error("durable queue write failed", queue=self.name, vhost=self.vhost.name,
                  error=str(error))
        written = not any(entry.store_ref is PENDING for entry in batch.entries)
        for entry in batch.entries:
            if entry.store_ref is PENDING or entry.store_ref is SETTLED_EARLY:
                entry.store_ref = None
        store = self.messages
        if isinstance(store, LeveledStore):
            store = store.default
        if not written and isinstance(store, PagedStore):
            for entry in batch.tail:
                store.tail_count -= 1
                store.tail_bytes -= len(entry.message.body)
        following = self.writer.batch
        for start, end in batch.settled.ranges():
            following.settled.add_range(start, end)
        for start, end in batch.delivered.ranges():
            following.delivered.add_range(start, end)
        following.returned += batch.returned
        following.delivered_early += batch.delivered_early
        following.dead_lettered += batch.dead_lettered
        return written

    def _write(self, batch: _Batch) -> None:
        """The writer's append: this turn's messages, then its settled and delivered ranges."""
        entries = [e for e in batch.entries if e.store_ref is PENDING]
        if entries:
            first = self.log.append([self._pack(e) for e in entries])
            for offset, entry in enumerate(entries, first):
                entry.store_ref = offset
        for entry in batch.entries:
            if entry.store_ref is SETTLED_EARLY:
                entry.store_ref = None
        for chunk_type, ranges in ((ACKS, batch.settled), (DELIVERED, batch.delivered)):
            if ranges.range_count:
                offset = self.log.append([_ranges(ranges)], chunk_type=chunk_type)
                self.settled_offsets.add(offset)
        for start, end in batch.settled.ranges():
            self.settled_offsets.add_range(start, end)
        self._truncate()

    def _pack(self, entry: QueuedMessage) -> bytes:
        message = entry.message
        head = _HEAD.pack(PERSISTENT if self.persists(message) else 0, entry.seq,
                          -1 if entry.expires_at is None else entry.expires_at, entry.priority,
                          len(message.body))
        return head + self.env.encode_record(message)

    def _truncate(self) -> None:
        floor = self.settled_offsets.first_gap(self.floor)
        if floor == self.floor:
            return
        self.floor = floor
        if self.log.truncate_before(floor):
            self.settled_offsets.discard_below(self.log.first_offset)
            self.delivered_offsets.discard_below(self.log.first_offset)
            self.held_offsets.discard_below(self.log.first_offset)

    # -- reading back -------------------------------------------------------------------------

    def _unpack(self, offset: int, record: bytes, redelivered: bool) -> QueuedMessage:
        _flags, seq, expires_at, priority, _size = _HEAD.unpack_from(record, 0)
        entry = QueuedMessage(self.env.decode_record(record, _HEAD.size), seq,
                              None if expires_at < 0 else expires_at, priority)
        entry.store_ref = offset
        entry.redelivered = redelivered
        return entry

    def page_in(self, start: int, store: PagedStore) -> int:
        """Read tail messages from `start` into the head; returns where the tail now starts.

        The hot path of consuming a long queue: the settled and delivered ranges are looked
        up once per chunk (they rarely touch the tail), not once per record."""
        self.writer.commit()  # readers stop at the committed offset (fsync every N ms)
        reader = self.log.reader(OffsetSpec.offset(start), limit=self.readable_up_to)
        settled, delivered = self.settled_offsets, self.delivered_offsets
        held = self.held_offsets
        unpack = self._unpack
        level = store.level
        try:
            while store.tail_count and len(store.head) < PAGE_MESSAGES:
                chunk = reader.read()
                if chunk is None:
                    break
                low, high = chunk.first_offset, chunk.next_offset
                any_settled = settled.count_in(low, high) > 0 or held.count_in(low, high) > 0
                any_delivered = delivered.count_in(low, high) > 0
                entries: list[QueuedMessage] = []
                size = 0
                for offset, record in chunk.items():
                    if offset < start or (any_settled and (offset in settled or offset in held)
                                          ) or (level is not None
                                                and record[PRIORITY_AT] != level):
                        continue
                    entry = unpack(offset, record, any_delivered and offset in delivered)
                    entries.append(entry)
                    size += len(entry.message.body)
                store.adopt(entries, size)
                start = max(start, high)
            return start
        finally:
            reader.close()

    def tail_of(self, store: PagedStore) -> Iterator[QueuedMessage]:
        """The ready messages of `store`'s tail in order, read from the log without taking
        them (a peek): nothing changes, and a quorum queue's recovered counts stay unread."""
        if not store.tail_count:
            return
        self.writer.flush()
        self.writer.commit()
        reader = self.log.reader(OffsetSpec.offset(store.tail_from))
        settled, delivered, level = self.settled_offsets, self.delivered_offsets, store.level
        held = self.held_offsets
        left = store.tail_count
        try:
            while left > 0:
                chunk = reader.read()
                if chunk is None:
                    return
                for offset, record in chunk.items():
                    if left <= 0:
                        return
                    if offset < store.tail_from or offset in settled or offset in held or (
                            level is not None and record[PRIORITY_AT] != level):
                        continue
                    left -= 1
                    yield DurableClassicQueue._unpack(self, offset, record, offset in delivered)
        finally:
            reader.close()

    def _recover(self) -> None:
        """Rebuild the queue from its log: which messages are still ready, in order."""
        if self.log.next_offset == self.log.first_offset:
            return
        reader = self.log.reader(OffsetSpec.first(), chunk_types=(ACKS, DELIVERED))
        for chunk in reader:
            target = self.settled_offsets if chunk.chunk_type == ACKS else self.delivered_offsets
            self.settled_offsets.add(chunk.first_offset)
            for record in chunk.records:
                for start, end in _parse_ranges(record):
                    target.add_range(start, end)
        reader.close()
        transient = IntervalSet()
        highest_seq = 0
        store = self.messages
        reader = self.log.reader(OffsetSpec.first())
        for chunk in reader:
            for offset, record in chunk.items():
                if offset in self.settled_offsets:
                    continue
                if offset in self.held_offsets:
                    self.recovered_held(self._unpack(offset, record, True))
                    continue
                flags, seq, _expires, priority, size = _HEAD.unpack_from(record, 0)
                highest_seq = max(highest_seq, seq)
                if not flags & PERSISTENT:
                    transient.add(offset)
                    continue
                entry = partial(self._unpack, offset, record, offset in self.delivered_offsets)
                paged = store.paged(priority) if isinstance(store, LeveledStore) else store
                if isinstance(paged, PagedStore):
                    paged.recovered(offset, size, entry)
                else:
                    store.push(entry())
        reader.close()
        self._seq = highest_seq
        if transient.range_count:
            for start, end in transient.ranges():
                self.settle_range(start, end)
        self.floor = self.log.first_offset
        self._truncate()
        log.info("durable queue recovered", queue=self.name, vhost=self.vhost.name,
                 messages=len(store))

    def recovered_held(self, entry: QueuedMessage) -> None:
        """A held message found by recovery (see `held_offsets`): its queue type's."""

    # -- lifecycle ----------------------------------------------------------------------------

    def purge(self) -> int:
        self.writer.flush()
        return super().purge()

    def commit_pending(self) -> None:
        self.writer.commit_pending()

    def on_delete(self) -> None:
        self.writer.delete()  # first: what the purge of the tail would write is dropped
        super().on_delete()
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        if not self.deleted:
            self.writer.close()
            self.log.close()
