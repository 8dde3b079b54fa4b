"""The delayed store: the messages a delayed exchange holds, in a log, indexed by due time.

One store per delayed exchange, in its own folder of the storage engine (like a queue's). A
held message is a record of a HELD chunk (its due time, then the broker's encoding of the
message as published); the store's writer (writer.py) appends a turn's held messages as one
chunk, commits it at the fsync policy and only then settles their confirms. A message routed
(once its targets hold it: `routed_one`) or deleted by an operator is recorded as a range of
offsets in a ROUTED chunk, written by the same writer, so a restart does not route it again;
whole segments below the lowest offset not yet routed are deleted.

The index (`DueIndex`) does not keep every held message in memory: held messages are filed in
buckets of `BUCKET_MS` of due time, each an append-only file of (due, offset) pairs beside the
log; only the nearest bucket is loaded (a heap of packed ints). The bucket files are a derived
cache: a clean close leaves a marker naming the log's next offset; without it (kill -9) the
index is rebuilt from the log, skipping what the ROUTED chunks name. A message is routed only
once its record is committed (`Writer` commit point), so in a cluster only what a majority
holds would be routed.

Must not know: AMQP, exchanges, routing, the vhost. It calls `route(batch)` with (offset,
message) pairs that fell due, and is told the time by the model's Scheduler.
Threading: single-threaded, on the event loop; storage calls are synchronous.
"""

from __future__ import annotations

import heapq
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from leveret.broker.model.durable import _parse_ranges, _ranges
from leveret.broker.model.intervals import IntervalSet
from leveret.broker.model.message import Confirm, InboundMessage
from leveret.broker.model.replication import ONE_NODE, Appends
from leveret.broker.model.scheduler import Scheduler, Timer
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.writer import Writer
from leveret.broker.process import logs
from leveret.storage import Log, LogConfig, OffsetSpec, StorageError
from leveret.storage.reader import ChunkView, Reader

log = logs.get("leveret.delayed")

HELD = 24  # chunk type: held messages (due time u64, then the message record)
ROUTED = 25  # chunk type: ranges of offsets routed or deleted
SEGMENT_BYTES = 16 * 1024 * 1024
BUCKET_MS = 10_000  # the due-time width of one index file
ROUTE_PER_TURN = 2_000  # messages routed per turn of the loop before it yields
_DUE = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_OFFSET_BITS = 48  # a loaded entry is the int due << 48 | offset
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
CLEAN = "clean"
FOLDER = "delayed"  # the stores' folder under the queues' root
TRANSIENT = "t-"  # the folder prefix of a transient exchange's store (removed at boot)


def remove_transient_stores(root: Path) -> None:
    """At boot: the stores of transient delayed exchanges left by a crash."""
    for path in (root / FOLDER).glob(TRANSIENT + "*"):
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class _Batch:
    held: list[bytes] = field(default_factory=list)  # packed records of this turn
    dues: list[int] = field(default_factory=list)
    routed: IntervalSet = field(default_factory=IntervalSet)


def _records(view: ChunkView) -> tuple[int, list[bytes]]:
    """(the offset of its first record, its records): a reader that started inside a chunk
    hands out only the records from its start on."""
    start = view.offsets[0] if view.offsets else view.first_offset
    return start, view.records


class DueIndex:
    """Held (due, offset) pairs in due-time buckets on disk; the nearest bucket in memory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.on_disk: dict[int, int] = {}  # bucket -> entries in its file
        self._buckets: list[int] = []  # a heap of the keys of on_disk
        self.near: list[int] = []  # a heap of due << 48 | offset: the loaded bucket and earlier
        self.loaded = -1  # every entry of a bucket <= loaded is in `near`
        self._pending: dict[int, bytearray] = {}  # file appends not written yet
        self.count = 0  # entries, ghosts included
        self.ghosts = 0  # entries deleted while in a bucket file: dropped when it loads

    def add(self, due: int, offset: int) -> None:
        self.count += 1
        bucket = due // BUCKET_MS
        if bucket <= self.loaded:
            heapq.heappush(self.near, due << _OFFSET_BITS | offset)
            return
        if bucket not in self.on_disk:
            self.on_disk[bucket] = 0
            heapq.heappush(self._buckets, bucket)
        self.on_disk[bucket] += 1
        self._pending.setdefault(bucket, bytearray()).extend(_PAIR.pack(due, offset))

    def flush(self) -> None:
        """Write the pending file appends (one open per bucket touched this turn)."""
        pending, self._pending = self._pending, {}
        for bucket, data in pending.items():
            with open(self.directory / f"{bucket}.idx", "ab") as f:
                f.write(data)

    def peek(self, skip: IntervalSet) -> tuple[int, int] | None:
        """The nearest (due, offset), loading the next bucket when the loaded one is done;
        entries whose offset is in `skip` (routed or deleted) are dropped on the way."""
        near = self.near
        while True:
            while near:
                key = near[0]
                offset = key & _OFFSET_MASK
                if offset in skip:
                    heapq.heappop(near)
                    self.count -= 1
                    self.ghosts = max(0, self.ghosts - 1)
                    continue
                return key >> _OFFSET_BITS, offset
            if not self._buckets:
                return None
            self._load(heapq.heappop(self._buckets))

    def pop(self) -> None:
        heapq.heappop(self.near)
        self.count -= 1

    def remove(self, offset: int) -> bool:
        """Drop a loaded entry; False if it is not loaded (the caller skips it at load)."""
        for i, key in enumerate(self.near):
            if key & _OFFSET_MASK == offset:
                self.near[i] = self.near[-1]
                self.near.pop()
                heapq.heapify(self.near)
                self.count -= 1
                return True
        return False

    def _load(self, bucket: int) -> None:
        self.flush()
        path = self.directory / f"{bucket}.idx"
        del self.on_disk[bucket]
        data = path.read_bytes() if path.exists() else b""
        near = self.near
        near.extend(due << _OFFSET_BITS | offset for due, offset in _PAIR.iter_unpack(data))
        heapq.heapify(near)
        self.loaded = bucket
        path.unlink(missing_ok=True)

    def entries(self, skip: IntervalSet) -> Iterator[tuple[int, int]]:
        """Every held (due, offset) in due order, without changing the index (the API's
        listing: it reads bucket files one at a time)."""
        self.flush()
        heap = list(self.near)  # popped lazily: the first few of a big bucket cost little
        while heap:
            key = heapq.heappop(heap)
            if key & _OFFSET_MASK not in skip:
                yield key >> _OFFSET_BITS, key & _OFFSET_MASK
        for bucket in sorted(self.on_disk):
            data = (self.directory / f"{bucket}.idx").read_bytes()
            yield from sorted(p for p in _PAIR.iter_unpack(data) if p[1] not in skip)

    def save(self) -> None:
        """A clean close: the loaded entries go back to their files."""
        for key in self.near:
            due, offset = key >> _OFFSET_BITS, key & _OFFSET_MASK
            self._pending.setdefault(due // BUCKET_MS, bytearray()).extend(
                _PAIR.pack(due, offset))
        self.near = []
        self.flush()

    def load_files(self) -> None:
        """After a clean close: count the entries of the bucket files (nothing is loaded)."""
        for path in self.directory.glob("*.idx"):
            bucket = int(path.stem)
            self.on_disk[bucket] = path.stat().st_size // _PAIR.size
            heapq.heappush(self._buckets, bucket)
        self.count = sum(self.on_disk.values())

    def reset(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        self.__init__(self.directory)  # type: ignore[misc]


class DelayedStore:
    """A delayed exchange's held messages: its log, writer, index and due-time timer."""

    def __init__(self, scheduler: Scheduler, env: StorageEnv, directory: Path,
                 route: Callable[[list[tuple[int, InboundMessage]]], None], *, name: str = "",
                 replication: Appends = ONE_NODE, leading: bool = True) -> None:
        self.scheduler = scheduler
        self.env = env
        self.directory = directory
        self.name = name
        self._route = route
        self.log = Log.open(directory / "log", LogConfig(
            max_segment_size_bytes=SEGMENT_BYTES, fsync=env.fsync_policy,
            fsync_on_write=False))
        self.routed = IntervalSet()  # offsets routed or deleted (and the ROUTED chunks')
        self.floor = self.log.first_offset
        self.writer: Writer[_Batch] = Writer(
            scheduler, env.fsync_policy, lambda: self.log, batch=_Batch, append=self._write,
            failed=self._failed, name=name, replication=replication, on_commit=self._kick,
            syncer=env.syncer)
        self.index = DueIndex(directory / "index")
        self.routed_total = 0
        self.unroutable_total = 0
        self.refused_total = 0  # dropped after a target refused every retry
        self._timer: Timer | None = None
        self._timer_due: int | None = None
        self._soon = False
        self._reader: Reader | None = None
        self._chunk: tuple[int, list[bytes]] | None = None  # (first offset, records)
        self.closed = False
        self.leading = leading  # only the leader (or the one node) indexes and routes
        self._followed = 0  # a replica: where its reading of ROUTED records got to
        self.in_flight: set[int] = set()  # routed, its targets' answers awaited (`routed_one`)
        self.term = 0  # one more at each change of role: answers to an older term's copies
        if leading:
            self._recover()
            self.scheduler.call_soon(self._kick)  # after the rest of the topology is restored

    # -- the role (a replicated log's: delayed_log.py) ------------------------------------------

    def lead(self) -> None:
        """Lead: the index and the routed set are rebuilt from the log (ROUTED records up to
        what it holds are skipped) and what is due is routed once committed."""
        self._forget()
        self.leading = True
        (self.directory / CLEAN).unlink(missing_ok=True)  # a replica's bucket files are stale
        self.floor = self.log.first_offset
        self._recover()
        self.scheduler.call_soon(self._kick)

    def follow(self) -> None:
        """A replica, or no role: no index, no routing (the leader's log comes in as is)."""
        self._forget()
        self.leading = False

    def follow_commit(self, bound: int) -> None:
        """A replica: take the ROUTED records up to the commit point `bound` and delete whole
        segments below the lowest offset not routed yet, as the leader does, so that disk use
        follows the held messages on every member."""
        try:
            reader = self.log.reader(OffsetSpec.offset(max(self._followed, self.log.first_offset)),
                                     chunk_types=(ROUTED,))
        except StorageError:
            return
        try:
            for chunk in reader:
                if chunk.next_offset - 1 > bound:
                    break
                self.routed.add(chunk.first_offset)
                for record in chunk.records:
                    for start, end in _parse_ranges(record):
                        self.routed.add_range(start, end)
                self._followed = chunk.next_offset
        finally:
            reader.close()
        self._truncate()

    def _forget(self) -> None:
        self._followed = 0
        self.in_flight.clear()
        self.term += 1
        self.floor = self.log.first_offset
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_due = None
        if self._reader is not None:
            self._reader.close()
        self._reader = self._chunk = None
        self.routed = IntervalSet()
        self.index.reset()

    # -- holding -------------------------------------------------------------------------------

    def hold(self, message: InboundMessage, due_ms: int, confirm: Confirm | None) -> None:
        """Keep `message` until `due_ms`; `confirm` is settled once the record is committed."""
        batch = self.writer.batch
        batch.held.append(_DUE.pack(due_ms) + self.env.encode_record(message))
        batch.dues.append(due_ms)
        if confirm is not None:
            self.writer.confirm_later(confirm)
        self.writer.schedule()

    @property
    def count(self) -> int:
        """Held messages, this turn's not yet written included."""
        return self.index.count - self.index.ghosts + len(self.writer.batch.held)

    def next_due(self) -> int | None:
        head = self.index.peek(self.routed)
        return None if head is None else head[0]

    def first(self, limit: int) -> list[tuple[int, int, InboundMessage]]:
        """The first `limit` held messages in due order: (offset, due, message)."""
        out: list[tuple[int, int, InboundMessage]] = []
        for due, offset in self.index.entries(self.routed):
            if len(out) >= limit:
                break
            message = self._fetch(offset, fresh=True)
            if message is not None:
                out.append((offset, due, message))
        return out

    def delete(self, offset: int) -> bool:
        """Drop one held message (an operator's); False if it is not held."""
        if (offset in self.routed or offset in self.in_flight
                or offset > self.writer.committer.committed
                or self._fetch(offset, fresh=True) is None):
            return False
        if not self.index.remove(offset):
            self.index.ghosts += 1  # still in a bucket file: skipped when the bucket loads
        self.routed.add(offset)
        self.writer.batch.routed.add(offset)
        self.writer.schedule()
        return True

    # -- writing ------------------------------------------------------------------------------

    def _write(self, batch: _Batch) -> None:
        if batch.held:
            first = self.log.append(batch.held, chunk_type=HELD)
            for offset, due in enumerate(batch.dues, first):
                self.index.add(due, offset)
            self.index.flush()
            self._arm(min(batch.dues))
        if batch.routed.range_count:
            offset = self.log.append([_ranges(batch.routed)], chunk_type=ROUTED)
            self.routed.add(offset)
            for start, end in batch.routed.ranges():
                self.routed.add_range(start, end)
            self._truncate()

    def _failed(self, batch: _Batch, error: StorageError) -> bool:
        log.error("delayed store write failed; its publishes are nacked", exchange=self.name,
                  error=str(error))
        return False

    def _truncate(self) -> None:
        floor = self.routed.first_gap(self.floor)
        if floor == self.floor:
            return
        self.floor = floor
        if self.log.truncate_before(floor):
            self.routed.discard_below(self.log.first_offset)

    # -- routing at due time ------------------------------------------------------------------

    def _arm(self, due: int) -> None:
        if self._timer_due is not None and self._timer_due <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.scheduler.call_later(max(0, due - self.scheduler.now_ms()),
                                                self._due)

    def _due(self) -> None:
        self._timer = None
        self._timer_due = None
        self._kick()

    def _kick(self) -> None:
        """Route what is due and committed (at most ROUTE_PER_TURN, then yield to the loop);
        arm the timer for the next due time."""
        self._soon = False
        if self.closed or not self.leading:
            return
        now = self.scheduler.now_ms()
        committed = self.writer.committer.committed
        batch: list[tuple[int, InboundMessage]] = []
        index, routed = self.index, self.routed
        while len(batch) < ROUTE_PER_TURN:
            head = index.peek(routed)
            if head is None:
                break
            due, offset = head
            if due > now:
                self._arm(due)
                break
            if offset > committed:
                break  # the commit (on_commit) kicks again
            index.pop()
            message = self._fetch(offset)
            if message is not None:
                batch.append((offset, message))  # recorded as routed once its targets hold it
                self.in_flight.add(offset)  # no longer held: not to delete through the API
            else:
                self.writer.batch.routed.add(offset)
                log.error("a held message could not be read; it is dropped", exchange=self.name,
                          offset=offset)
        else:
            if not self._soon:
                self._soon = True
                self.scheduler.call_soon(self._kick)
        if batch:
            self.writer.schedule()
            self.routed_total += len(batch)
            self._route(batch)

    def routed_one(self, offset: int, term: int | None = None) -> None:
        """A message routed by `route` is held by its targets (or was held again, or dropped):
        recorded as routed, in the next ROUTED record. Not by a deposed or closed store: the
        next leader routes it again. Nor for the copies of an older `term` (a leader deposed
        and elected again while they were on their way): this term routes the message again
        and records it once its own copies are answered."""
        if self.closed or not self.leading or (term is not None and term != self.term):
            return
        self.in_flight.discard(offset)
        self.writer.batch.routed.add(offset)
        self.writer.schedule()

    def _fetch(self, offset: int, fresh: bool = False) -> InboundMessage | None:
        """The held message at `offset`. Routing reads chunks forward from where its last read
        was (messages fall due mostly in the order they were written); `fresh` reads one
        chunk on its own (the API's listing)."""
        chunk = self._chunk
        if fresh:
            return self._fetch_fresh(offset, keep=False)
        if chunk is None or offset < chunk[0]:
            return self._fetch_fresh(offset, keep=True)
        hops = 0
        while offset >= chunk[0] + len(chunk[1]):
            hops += 1
            next_chunk = self._next_chunk() if hops <= 8 else None
            if next_chunk is None:
                return self._fetch_fresh(offset, keep=True)
            chunk = next_chunk
        if offset < chunk[0]:
            return self._fetch_fresh(offset, keep=True)
        return self._decode(chunk[1][offset - chunk[0]])

    def _fetch_fresh(self, offset: int, keep: bool) -> InboundMessage | None:
        reader = self.log.reader(OffsetSpec.offset(offset), chunk_types=(HELD,))
        view = reader.read()
        chunk = _records(view) if view is not None else None
        if chunk is None or not chunk[0] <= offset < chunk[0] + len(chunk[1]):
            reader.close()
            return None
        if keep:
            if self._reader is not None:
                self._reader.close()
            self._reader = reader
            self._chunk = chunk
        else:
            reader.close()
        return self._decode(chunk[1][offset - chunk[0]])

    def _next_chunk(self) -> tuple[int, list[bytes]] | None:
        if self._reader is None:
            return None
        view = self._reader.read()
        if view is None:
            self._chunk = None
            return None
        self._chunk = _records(view)
        return self._chunk

    def _decode(self, record: bytes) -> InboundMessage:
        return self.env.decode_record(record, _DUE.size)

    # -- recovery and lifecycle ---------------------------------------------------------------

    def _recover(self) -> None:
        reader = self.log.reader(OffsetSpec.first(), chunk_types=(ROUTED,))
        for chunk in reader:
            self.routed.add(chunk.first_offset)
            for record in chunk.records:
                for start, end in _parse_ranges(record):
                    self.routed.add_range(start, end)
        reader.close()
        marker = self.directory / CLEAN
        saved = marker.read_text().split() if marker.exists() else []
        clean = len(saved) == 2 and saved[0] == str(self.log.next_offset)
        marker.unlink(missing_ok=True)
        if clean:
            self.index.load_files()
            self.index.ghosts = int(saved[1])
            return
        self.index.reset()  # kill -9: the bucket files are rebuilt from the log
        reader = self.log.reader(OffsetSpec.first(), chunk_types=(HELD,))
        for chunk in reader:
            for offset, record in chunk.items():
                if offset not in self.routed:
                    self.index.add(_DUE.unpack_from(record, 0)[0], offset)
            self.index.flush()
        reader.close()
        if self.index.count:
            log.info("delayed store rebuilt its index", exchange=self.name,
                     held=self.index.count)

    def commit_pending(self) -> None:
        self.writer.commit_pending()

    def close(self) -> None:
        """Shutdown: write and commit what is pending, save the index, mark it clean."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.writer.close()
        if self._reader is not None:
            self._reader.close()
        self.index.save()
        next_offset = self.log.next_offset
        self.log.close()
        tmp = self.directory / (CLEAN + ".tmp")
        tmp.write_text(f"{next_offset} {self.index.ghosts}")
        os.replace(tmp, self.directory / CLEAN)

    def destroy(self) -> None:
        """The exchange is deleted: nack what waits, drop the folder."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.writer.delete()
        if self._reader is not None:
            self._reader.close()
        self.log.discard()  # its folder is made again for an exchange of the same name
        shutil.rmtree(self.directory, ignore_errors=True)
