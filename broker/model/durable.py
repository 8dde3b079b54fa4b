"""Durable classic queues: persistent messages in the log, acks recorded, a bounded memory.

A durable classic queue keeps its messages in its own log of the storage engine. Persistent
messages are appended before they are confirmed (one chunk per turn of the event loop); acks
and discards are appended as ranges of settled offsets, deliveries as ranges of delivered
offsets (so the redelivered flag survives a restart), the ids of delayed exchanges' copies it
took as TAKEN records (so that a copy routed again after a restart is dropped: delayed_ids.py;
like acks, their offsets are settled at once, and they go with their segment); the queue's
writer (writer.py) owns that turn's batch, its append, the commit point and the confirms.
Whole segments below the lowest unsettled offset are deleted, so disk use follows the
backlog, not the history.

A FIFO queue keeps at most a page of ready messages in memory: once the page is full, new
messages (persistent or not) go to the log only, and are read back a page at a time as the
head drains. Transient messages written that way are dropped at a restart, as RabbitMQ drops
transient messages of durable queues. Priority queues keep their entries in memory.

Recovery reads the settled and delivered ranges, then the message records after the queue's
last snapshot (snapshot.py: the counts of the ready messages below an offset S, written at a
clean close and every SNAPSHOT_EVERY records written or settled), or every message record when
there is no usable snapshot. A priority classic queue keeps every message in memory, and reads
them all: it writes no snapshot.

Single-threaded: runs on the event loop; storage calls are synchronous.
"""

from __future__ import annotations

import shutil
import struct
import sys
import uuid
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from leveret.broker.model import snapshot
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.delayed_ids import pack_taken, unpack_taken
from leveret.broker.model.intervals import IntervalSet, pack_ranges
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import ClassicQueue, QueueOwner
from leveret.broker.model.replication import ONE_NODE, Appends
from leveret.broker.model.snapshot import OTHER, PAGED, TRANSIENT, Ledger, SnapshotError, minus
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.store import LeveledStore, MemoryStore, MessageStore
from leveret.broker.model.writer import Writer
from leveret.broker.process import logs
from leveret.storage import Log, LogConfig, OffsetSpec, StorageError

log = logs.get("leveret.durable")

ACKS = 16  # chunk type: ranges of settled offsets
DELIVERED = 17  # chunk type: ranges of delivered offsets
TAKEN = 20  # chunk type: ids of delayed exchanges' copies taken (delayed_ids.py)
SEGMENT_BYTES = 16 * 1024 * 1024
PAGE_MESSAGES = 2048
PAGE_BYTES = 8 * 1024 * 1024
_HEAD = struct.Struct(">BQqBI")  # flags, seq, expires_at (-1: none), priority, body size
PRIORITY_AT = 17  # where the priority byte is in _HEAD
PERSISTENT = 1
USER = 0  # chunk type of the message records
SNAPSHOT_EVERY = 100_000  # records written or settled between two snapshots

PENDING = "pending"  # store_ref of an entry waiting for this turn's write
SETTLED_EARLY = "settled-early"  # settled before it was written: never written


@dataclass
class _Batch:
    entries: list[QueuedMessage] = field(default_factory=list)
    settled: IntervalSet = field(default_factory=IntervalSet)
    delivered: IntervalSet = field(default_factory=IntervalSet)
    tail: list[QueuedMessage] = field(default_factory=list)  # entries kept in the log only
    # (quorum) returned messages with their counts then and when a delayed retry makes them
    # ready (0: at once), in order; and those of them
    # delivered again in the same batch (recorded again after the counts)
    returned: list[tuple[QueuedMessage, int, int, int]] = field(default_factory=list)
    out_again: list[QueuedMessage] = field(default_factory=list)
    returned_ids: set[int] = field(default_factory=set)  # id() of the returned entries
    delivered_early: list[QueuedMessage] = field(default_factory=list)  # before their write
    dead_lettered: list[QueuedMessage] = field(default_factory=list)  # held (quorum)
    sends: list[tuple[Consumer, QueuedMessage]] = field(default_factory=list)  # (quorum)
    settled_entries: dict[int, QueuedMessage] = field(default_factory=dict)  # by offset
    taken: list[tuple[str, int]] = field(default_factory=list)  # delayed copies taken


_ranges = pack_ranges  # a record of [start, end) pairs


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
        # Readers stop at the committed offset: write and commit what is pending first. That
        # may deliver, and so read the tail back, itself (a quorum queue's committed_moved):
        # the tail is read as it is after that, from where that left it.
        writer = self.queue.writer
        writer.flush()
        writer.commit()
        if self.tail_count and len(self.head) < PAGE_MESSAGES // 2:
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
    CHUNK_TYPES: tuple[int, ...] = (USER, ACKS, DELIVERED, TAKEN)  # every chunk type of its log
    STATE_TYPES: tuple[int, ...] = (ACKS, DELIVERED, TAKEN)  # read by recovery before messages
    paged_level: int | None = None  # the priority the paged store holds (None: every one)

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
                fsync_on_write=False, folder_lock=env.folder_locks,
                open_logs=env.open_logs))
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
        # what a snapshot holds, kept up to date as the log is written (None: no snapshots)
        self.ledger: Ledger | None = None
        # S of the queue's last snapshot, loaded at recovery or written since (None: none):
        # the log below S is what a restart need not read (quorum_status's Snapshot Index)
        self.snapshot_covers: int | None = None
        self._snapshot_due = False
        self.writer = Writer(vhost.scheduler, env.fsync_policy, lambda: self.log, batch=_Batch,
                             append=self._write, failed=self._write_failed, name=name,
                             replication=replication, on_commit=self._commit_moved,
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

    def _commit_moved(self) -> None:
        self.committed_moved()
        if (self.ledger is not None and self.ledger.changes >= SNAPSHOT_EVERY
                and not self._snapshot_due):
            self._snapshot_due = True  # after this turn, outside the committer's callback
            self.vhost.scheduler.call_soon(self._periodic_snapshot)

    def _periodic_snapshot(self) -> None:
        """Every SNAPSHOT_EVERY records written or settled: what the fsync policy left
        pending is fsynced first (under a steady load the commit point is always a little
        behind the log's end), then the snapshot is written."""
        self._snapshot_due = False
        if self.deleted or self.ledger is None or not self.snapshots_allowed():
            return
        if self.writer.committer.committed < self.log.next_offset - 1:
            self.writer.commit()
        self.write_snapshot()

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
            batch = self.writer.batch
            batch.settled.add(ref)
            batch.settled_entries[ref] = entry
            self.writer.schedule()
        elif ref is PENDING:
            entry.store_ref = SETTLED_EARLY

    def ack_many(self, entries: list[QueuedMessage], consumer: Consumer | None = None) -> None:
        """Acks of one consumer's deliveries (a multiple ack), as `ack` one by one would
        settle them, with the writer scheduled once."""
        self.unacked -= len(entries)
        self.settled_many(entries)

    def settled_many(self, entries: list[QueuedMessage]) -> None:
        """`settled` for each of `entries`."""
        settled = self.writer.batch.settled
        written = False
        for entry in entries:
            ref = entry.store_ref
            if isinstance(ref, int):
                settled.add(ref)
                written = True
            elif ref is PENDING:
                entry.store_ref = SETTLED_EARLY
        if written:
            self.writer.schedule()

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

    def took_delayed(self, log_id: str, offset: int) -> None:
        """A delayed copy's id is written with it (a TAKEN record, read back by recovery), so
        that a copy routed again after a restart is dropped too (delayed_ids.py). Written for
        a transient copy as well: it was taken, once (a restart loses it, as any transient
        message)."""
        self.writer.batch.taken.append((log_id, offset))
        self.writer.schedule()

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
        if self.ledger is not None:  # what it counted may not be in the log: no more snapshots
            self.ledger = None       # until a restart (the last one written stays valid)
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
        following.out_again += batch.out_again
        following.returned_ids |= batch.returned_ids
        following.delivered_early += batch.delivered_early
        following.dead_lettered += batch.dead_lettered
        following.sends += batch.sends
        if written:
            following.taken += batch.taken
        else:  # those copies are not kept: a new leader of their exchange may route them
            for log_id, offset in batch.taken:
                self.taken_ids.forget(log_id, offset)
        return written

    def _write(self, batch: _Batch) -> None:
        """The writer's append: this turn's messages, then its settled and delivered ranges."""
        entries = [e for e in batch.entries if e.store_ref is PENDING]
        ledger = self.ledger
        if entries:
            first = self.log.append([self._pack(e) for e in entries])
            for offset, entry in enumerate(entries, first):
                entry.store_ref = offset
            if ledger is not None:
                kind_of = self._kind_of
                ledger.written_many(first, [kind_of(e) for e in entries],
                                    max(e.seq for e in entries))
        for entry in batch.entries:
            if entry.store_ref is SETTLED_EARLY:
                entry.store_ref = None
        for chunk_type, ranges in ((ACKS, batch.settled), (DELIVERED, batch.delivered)):
            if ranges.range_count:
                offset = self.log.append([_ranges(ranges)], chunk_type=chunk_type)
                self.settled_offsets.add(offset)
        if batch.taken:  # with the copies, under the same commit (and fsync)
            records = [pack_taken(*taken) for taken in batch.taken]
            first = self.log.append(records, chunk_type=TAKEN)
            self.settled_offsets.add_range(first, first + len(records))
        if ledger is not None and batch.settled.range_count:
            known = batch.settled_entries

            def what(offset: int) -> tuple[int, int] | None:
                entry = known.get(offset)
                return None if entry is None else self._kind_of(entry)

            out = (self.settled_offsets, self.held_offsets)
            for start, end in batch.settled.ranges():
                ledger.settle(start, end, out, what if known else None)
        for start, end in batch.settled.ranges():
            self.settled_offsets.add_range(start, end)
        self._truncate()

    def _kind_of(self, entry: QueuedMessage) -> tuple[int, int]:
        """What a message is for the snapshot's ledger, and its size."""
        return (self._kind(self.persists(entry.message), entry.priority),
                len(entry.message.body))

    def _kind(self, persistent: bool, priority: int) -> int:
        if not persistent:
            return TRANSIENT
        level = self.paged_level
        return PAGED if level is None or priority == level else OTHER

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
        up once per chunk (they rarely touch the tail), not once per record. What is written
        is committed first (PagedStore._page_in): this reads up to the commit point."""
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
        """Rebuild the queue from its log: which messages are still ready, in order. With a
        usable snapshot, the message records below its offset S are not read, but those that
        recovery keeps in memory (held, or of another priority level), and those settled or
        held since the snapshot (to take them out of its counts)."""
        takes_snapshots = self.takes_snapshots()
        ledger = self._load_snapshot() if takes_snapshots else None
        if self.log.next_offset == self.log.first_offset:
            if takes_snapshots:
                self.ledger = Ledger(covers=self.log.next_offset, first=self.log.first_offset,
                                     seq=ledger.seq if ledger is not None else 0)
            return
        start = 0 if ledger is None else ledger.covers  # S: the snapshot describes below it
        settled_before, held_before, settled_after, held_after = self._read_state(start)
        store = self.messages
        paged_store = store.default if isinstance(store, LeveledStore) else store
        highest_seq = 0
        if ledger is None:
            ledger = Ledger(first=self.log.first_offset)
        else:
            highest_seq = ledger.seq
            self._from_snapshot(ledger, settled_before, held_before, settled_after, held_after)
            if ledger.buckets and isinstance(paged_store, PagedStore):
                paged_store.tail_from = max(self.log.first_offset,
                                            min(ledger.buckets) * snapshot.BUCKET)
                paged_store.tail_count = ledger.count
                paged_store.tail_bytes = ledger.bytes
        reader = self.log.reader(OffsetSpec.offset(max(start, self.log.first_offset)))
        settled, held, delivered = self.settled_offsets, self.held_offsets, self.delivered_offsets
        written, kind_of = ledger.written, self._kind
        for chunk in reader:
            for offset, record in chunk.items():
                if offset < start or offset in settled:
                    continue
                if offset in held:
                    self.recovered_held(self._unpack(offset, record, True))
                    continue
                flags, seq, _expires, priority, size = _HEAD.unpack_from(record, 0)
                highest_seq = max(highest_seq, seq)
                written(offset, kind_of(bool(flags & PERSISTENT), priority), size, seq)
                if not flags & PERSISTENT:
                    continue
                entry = partial(self._unpack, offset, record, offset in delivered)
                paged = store.paged(priority) if isinstance(store, LeveledStore) else store
                if isinstance(paged, PagedStore):
                    paged.recovered(offset, size, entry)
                else:
                    store.push(entry())
        reader.close()
        self._seq = highest_seq
        tail = ledger.changes
        ledger.covers = self.log.next_offset
        ledger.transient = minus(ledger.transient, self.settled_offsets)
        for low, high in list(ledger.transient.ranges()):
            self.settle_range(low, high)
        self.floor = self.log.first_offset
        self._truncate()
        if start and isinstance(paged_store, PagedStore):
            # the first page is read now, as a restart without a snapshot reads it (its chunks'
            # CRCs checked at the start; the first basic.get does not wait for it)
            paged_store.peek()
        log.info("durable queue recovered", queue=self.name, vhost=self.vhost.name,
                 messages=len(store), snapshot=start or None, records_read=tail)
        if takes_snapshots:
            self.ledger = ledger
            if ledger.changes >= SNAPSHOT_EVERY:
                self.write_snapshot()

    def _read_state(self, start: int) -> tuple[IntervalSet, IntervalSet, IntervalSet,
                                               IntervalSet]:
        """The settled, delivered and queue type's own records (STATE_TYPES), a filtered pass
        over the log. Returns what was settled and held as of `start` (S), and what below S
        was settled and held since (by records at or past S)."""
        settled_before, held_before = IntervalSet(), IntervalSet()
        settled_after, held_after = IntervalSet(), IntervalSet()
        settled = self.settled_offsets
        reader = self.log.reader(OffsetSpec.first(), chunk_types=self.STATE_TYPES)
        try:
            for chunk in reader:
                before = chunk.first_offset < start
                settled.add_range(chunk.first_offset, chunk.next_offset)
                if before:
                    settled_before.add_range(chunk.first_offset, chunk.next_offset)
                for record in chunk.records:
                    if chunk.chunk_type == DELIVERED:
                        for low, high in _parse_ranges(record):
                            self.delivered_offsets.add_range(low, high)
                            self.recovered_delivered(low, high)
                    elif chunk.chunk_type == TAKEN:
                        self.taken_ids.seen(*unpack_taken(bytes(record)))
                    elif chunk.chunk_type == ACKS:
                        for low, high in _parse_ranges(record):
                            settled.add_range(low, high)
                            if before:
                                settled_before.add_range(low, high)
                            elif low < start:
                                settled_after.add_range(low, min(high, start))
                    else:
                        offset = self.recovered_record(chunk.chunk_type, record)
                        if offset is not None and before:
                            held_before.add(offset)
                        elif offset is not None and offset < start:
                            held_after.add(offset)
        finally:
            reader.close()
        return settled_before, held_before, settled_after, held_after

    def _from_snapshot(self, ledger: Ledger, settled_before: IntervalSet,
                       held_before: IntervalSet, settled_after: IntervalSet,
                       held_after: IntervalSet) -> None:
        """The snapshot's counts brought up to the log as it is: what was settled or held since
        it was written is taken out; the messages below S that recovery keeps in memory (held,
        or of another level) are read, in order."""
        start = ledger.covers

        def out(offset: int) -> bool:
            return offset in settled_before or offset in held_before

        for low, high in settled_after.ranges():
            ledger.settle(low, high, (settled_before, held_before), None)
        for low, high in held_after.ranges():
            for offset in range(low, high):
                if not out(offset):
                    ledger.dirty.add(offset)
        ledger.first = 0  # its head may have been deleted since: counted again
        ledger.resolve(self.log.first_offset, self._kinds, self._recount)
        ledger.changes = 0
        keep = IntervalSet()
        for intervals in (ledger.leveled, self.held_offsets):
            for low, high in intervals.ranges():
                keep.add_range(max(low, self.log.first_offset), min(high, start))
        keep = minus(keep, self.settled_offsets)
        store, held, delivered = self.messages, self.held_offsets, self.delivered_offsets
        for offset, record in self._records(keep):
            if offset in held:
                self.recovered_held(self._unpack(offset, record, True))
            else:
                store.push(self._unpack(offset, record, offset in delivered))
        ledger.leveled = minus(ledger.leveled, self.settled_offsets)

    def recovered_delivered(self, start: int, end: int) -> None:
        """A range of delivered offsets read by recovery, in log order with the queue type's
        own records (a quorum queue counts what was checked out when the log ended)."""

    def recovered_record(self, chunk_type: int, record: bytes) -> int | None:
        """A record of one of the queue type's own STATE_TYPES, read by recovery; returns the
        offset of a message it says is held (see `held_offsets`), else None."""
        return None

    # -- snapshots ----------------------------------------------------------------------------

    def takes_snapshots(self) -> bool:
        """A FIFO queue does (its paged store's counts are what a snapshot saves reading);
        a priority classic queue keeps every message in memory and reads them all."""
        return isinstance(self.messages, PagedStore | LeveledStore)

    def snapshots_allowed(self) -> bool:
        """Whether this member may write one now (a quorum queue's replica does not)."""
        return True

    def _records(self, offsets: IntervalSet) -> Iterator[tuple[int, bytes]]:
        """The message records at `offsets`, in order (a reader per far-apart range)."""
        reader = None
        position = -1
        try:
            for low, high in offsets.ranges():
                if reader is None or low - position > snapshot.BUCKET:
                    if reader is not None:
                        reader.close()
                    reader = self.log.reader(OffsetSpec.offset(low))
                    position = low
                while position < high:
                    chunk = reader.read()
                    if chunk is None:
                        position = high
                        break
                    for offset, record in chunk.items():
                        if low <= offset < high:
                            yield offset, record
                    position = chunk.next_offset
                    if position > high:  # the chunk holds the next ranges' start too
                        break
                if position > high:
                    # what the last chunk held past this range is read again from the cache
                    reader.close()
                    reader = None
        finally:
            if reader is not None:
                reader.close()

    def _kinds(self, ranges: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int, int]]:
        """Each message record in `ranges`: (offset, kind, body size), for the ledger."""
        offsets = IntervalSet()
        for low, high in ranges:
            offsets.add_range(low, high)
        for offset, record in self._records(offsets):
            flags, _seq, _expires, priority, size = _HEAD.unpack_from(record, 0)
            yield offset, self._kind(bool(flags & PERSISTENT), priority), size

    def _recount(self, start: int, end: int) -> tuple[int, int]:
        """The ready messages of the paged level in [start, end), read from the log."""
        count = size = 0
        settled, held = self.settled_offsets, self.held_offsets
        for offset, kind, bytes_ in self._kinds([(start, end)]):
            if kind == PAGED and offset not in settled and offset not in held:
                count += 1
                size += bytes_
        return count, size

    def _chunk_check(self, covers: int) -> tuple[int, int, int] | None:
        """(first offset, epoch, CRC of the records) of the chunk that ends at `covers`:
        (0, 0, 0) if the log no longer holds it, None if the log does not end a chunk there."""
        if covers <= self.log.first_offset:
            return 0, 0, 0
        found: list[tuple[int, int, int]] = []
        start = covers - 1
        for _whole in (False, True):  # the chunk holding S - 1, then all of it from its start
            reader = self.log.reader(OffsetSpec.offset(start), chunk_types=self.CHUNK_TYPES)
            try:
                chunk = reader.read()
            finally:
                reader.close()
            if chunk is None or chunk.next_offset != covers:
                return None
            start = chunk.first_offset
            if _whole:
                found.append((chunk.first_offset, chunk.epoch,
                              zlib.crc32(chunk.record_bytes())))
        return found[0]

    def _load_snapshot(self) -> Ledger | None:
        """The queue's snapshot if it describes this log; else None (with a log line saying
        why), and the log is read in full."""
        try:
            data = snapshot.read(self.directory)
            if data is None:
                return None
            ledger, check = snapshot.decode(data)
            if ledger.covers > self.log.next_offset:
                raise SnapshotError(f"stale: it covers up to offset {ledger.covers}, beyond "
                                    f"the log's end ({self.log.next_offset})")
            found = self._chunk_check(ledger.covers)
            if found != check and found != (0, 0, 0):
                raise SnapshotError("stale: the log was written again below its offset "
                                    f"{ledger.covers}")
        except (SnapshotError, StorageError, OSError) as exc:
            log.warning("queue snapshot not used: reading the whole log", queue=self.name,
                        vhost=self.vhost.name, reason=str(exc))
            return None
        self.snapshot_covers = ledger.covers
        return ledger

    def write_snapshot(self) -> bool:
        """Write the queue's snapshot of its log as it is now, if all of it is committed
        (a snapshot never covers what a new leader could cut back). False if not written."""
        ledger = self.ledger
        if ledger is None or not self.snapshots_allowed():
            return False
        end = self.log.next_offset
        if self.writer.committer.committed < end - 1:
            return False
        try:
            ledger.covers = end
            ledger.resolve(self.log.first_offset, self._kinds, self._recount)
            check = self._chunk_check(end)
            if check is None:
                return False
            snapshot.write(self.directory, snapshot.encode(ledger, self.settled_offsets, check))
        except (StorageError, OSError) as exc:
            log.warning("queue snapshot not written", queue=self.name, vhost=self.vhost.name,
                        error=str(exc))
            return False
        ledger.changes = 0
        self.snapshot_covers = end
        return True

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
        self.log.close()  # (its folder, a uuid, is never made again: no WAL FORGET needed)
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        if not self.deleted:
            self.writer.close()
            self.write_snapshot()
            self.ledger = None  # a periodic snapshot still due finds the queue closed
            self.log.close()
