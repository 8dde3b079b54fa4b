"""Snapshots of a durable queue's log: what recovery would otherwise rebuild by reading every
message record, so that a restart reads a snapshot plus the records after it.

A `Ledger` describes the log below an offset S (`covers`) as recovery sees it: for the ready
messages of the paged level (those that wait in the log, not in memory), a count and a byte
size per bucket of BUCKET offsets; the offsets of the other messages recovery must load
(the other priority levels of a quorum queue) and of the transient ones (dropped at a restart);
and the highest seq. "Ready" means written, persistent, not settled and not held. The queue
keeps its ledger up to date as it writes (durable.py): a message written adds to it; a message
settled or held takes its count out, at once when the queue knows its level and size, else
later (`dirty`), by reading the record from the log before the next snapshot is written.

Buckets are what lets the head of the log be deleted under a snapshot: a bucket wholly below
the log's first offset is dropped (all its messages were settled), the one the first offset
falls in is counted again from the log (at most BUCKET records), and a bucket wholly covered
by a settled range is emptied without reading a record.

The file (`queue.snapshot` in the queue's directory) is written atomically: a temporary file,
fsync, rename, fsync of the directory. It ends with a CRC-32 of everything before it; it also
holds the first offset, epoch and CRC of the log's chunk that ends at S, so that a snapshot of
a log that has since been cut back (a replica's or a deposed leader's uncommitted tail) and
written again is recognised as stale. A missing, stale or corrupt snapshot is not used: the
log is read in full, as without snapshots.

It must not know the record format, the queue's stores, AMQP or the cluster: the queue reads
the records for it (`Kinds`) and says which offsets were already settled (`Out`).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from leveret.broker.model.intervals import IntervalSet, pack_ranges
from leveret.storage.layout import replace_durably

NAME = "queue.snapshot"
MAGIC = b"LVQSNAP1"
BUCKET = 16384  # offsets per bucket: the most a restart reads again at the log's first offset
# what a message record is for the ledger
PAGED = 1  # a ready message of the paged level: counted in its bucket
OTHER = 2  # a message recovery keeps in memory (another priority level): its offset is kept
TRANSIENT = 3  # dropped at a restart: its offset is kept, to settle it then
NONE = 0  # not a message (a record of the queue's own)

_HEAD = struct.Struct(">8sQQQQIBI")  # magic, covers, seq, chunk first, epoch, crc, kinds, n

Kinds = Callable[[Iterable[tuple[int, int]]], Iterator[tuple[int, int, int]]]
"""Given ranges of offsets, the (offset, kind, size) of the records in them, in order."""
Out = Sequence[IntervalSet]
"""The offsets that were already not ready (settled or held) before."""


class SnapshotError(Exception):
    """A snapshot file that cannot be used (corrupt or of another version)."""


@dataclass
class Ledger:
    covers: int = 0  # S: the ledger describes the offsets below it
    seq: int = 0
    buckets: dict[int, list[int]] = field(default_factory=dict)  # index: [count, bytes]
    leveled: IntervalSet = field(default_factory=IntervalSet)
    transient: IntervalSet = field(default_factory=IntervalSet)
    dirty: IntervalSet = field(default_factory=IntervalSet)  # out, not yet taken out
    first: int = 0  # the log's first offset when last resolved
    changes: int = 0  # records written or settled since the last snapshot

    # -- what the queue tells it as it writes --------------------------------------------------

    def written(self, offset: int, kind: int, size: int, seq: int) -> None:
        self.written_many(offset, ((kind, size),), seq)

    def written_many(self, first: int, kinds: Iterable[tuple[int, int]], seq: int) -> None:
        """`written` for the records at `first`, `first` + 1, ... of the (kind, size) pairs
        `kinds`, the highest seq among them `seq`: one write's messages."""
        buckets = self.buckets
        offset = first
        for kind, size in kinds:
            if kind == PAGED:
                bucket = buckets.get(offset // BUCKET)
                if bucket is None:
                    buckets[offset // BUCKET] = [1, size]
                else:
                    bucket[0] += 1
                    bucket[1] += size
            elif kind == OTHER:
                self.leveled.add(offset)
            elif kind == TRANSIENT:
                self.transient.add(offset)
            offset += 1
        if seq > self.seq:
            self.seq = seq
        self.changes += offset - first

    def gone(self, offset: int, kind: int, size: int) -> None:
        """A ready message of the ledger's is settled or held: its count is taken out."""
        if kind != PAGED:
            return
        index = offset // BUCKET
        bucket = self.buckets.get(index)
        if bucket is None:
            return
        bucket[0] -= 1
        bucket[1] -= size
        if bucket[0] <= 0:
            del self.buckets[index]

    def settle(self, start: int, end: int, out: Out,
               known: Callable[[int], tuple[int, int] | None] | None) -> None:
        """[start, end) is settled: what was ready there is taken out (`known` gives the kind
        and size of an offset the queue still holds in memory, None if it knows none; the
        others are read later). Range by range: what `out`, the leveled and the transient
        offsets cover is passed by without a look at each offset."""
        if end <= start:
            return
        self.changes += end - start
        index = start // BUCKET
        skips = (*out, self.leveled, self.transient)
        while index * BUCKET < end:
            low, high = max(start, index * BUCKET), min(end, (index + 1) * BUCKET)
            if low == index * BUCKET and high == (index + 1) * BUCKET:
                self.buckets.pop(index, None)  # every record of the bucket is settled now
            elif index in self.buckets:
                pieces = [(low, high)]
                for skip in skips:
                    if skip.range_count:
                        pieces = [gap for s, e in pieces for gap in skip.gaps_in(s, e)]
                for s, e in pieces:
                    if known is None:
                        self.dirty.add_range(s, e)
                        continue
                    for offset in range(s, e):
                        what = known(offset)
                        if what is None:
                            self.dirty.add(offset)
                        else:
                            self.gone(offset, *what)
            index += 1

    # -- before a snapshot is written, and at a restart ----------------------------------------

    def resolve(self, first: int, kinds: Kinds, recount: Callable[[int, int], tuple[int, int]]
                ) -> None:
        """Bring the counts up to date with the log: drop what lies below its first offset,
        count the bucket it falls in again, and read the dirty offsets' records."""
        counted = first  # below it, the counts are exact
        if first > self.first:
            for index in [i for i in self.buckets if (i + 1) * BUCKET <= first]:
                del self.buckets[index]
            index = first // BUCKET
            if first % BUCKET and index in self.buckets:
                counted = min((index + 1) * BUCKET, self.covers)
                count, size = recount(first, counted)
                if count:
                    self.buckets[index] = [count, size]
                else:
                    del self.buckets[index]
            self.first = first
        self.leveled.discard_below(first)
        self.transient.discard_below(first)
        self.dirty.discard_below(counted)
        if self.dirty.range_count:
            for offset, kind, size in kinds(list(self.dirty.ranges())):
                self.gone(offset, kind, size)
            self.dirty = IntervalSet()

    @property
    def count(self) -> int:
        return sum(bucket[0] for bucket in self.buckets.values())

    @property
    def bytes(self) -> int:
        return sum(bucket[1] for bucket in self.buckets.values())


def minus(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """The members of `a` that are not in `b`, range by range."""
    result = IntervalSet()
    cuts = list(b.ranges())
    j = 0
    for start, end in a.ranges():
        while j < len(cuts) and cuts[j][1] <= start:
            j += 1
        k = j
        while start < end:
            if k >= len(cuts) or cuts[k][0] >= end:
                result.add_range(start, end)
                break
            cut_start, cut_end = cuts[k]
            if cut_start > start:
                result.add_range(start, cut_start)
            start = max(start, cut_end)
            k += 1
    return result


def _pairs(intervals: IntervalSet) -> bytes:
    return struct.pack(">I", intervals.range_count) + pack_ranges(intervals)


def _read_pairs(data: bytes, at: int) -> tuple[IntervalSet, int]:
    (count,) = struct.unpack_from(">I", data, at)
    at += 4
    flat = array("Q")
    flat.frombytes(data[at: at + 16 * count])
    if len(flat) != 2 * count:
        raise SnapshotError("truncated ranges")
    if sys.byteorder == "little":
        flat.byteswap()
    intervals = IntervalSet()
    for start, end in zip(flat[0::2], flat[1::2], strict=True):
        intervals.add_range(start, end)
    return intervals, at + 16 * count


def encode(ledger: Ledger, out: IntervalSet, check: tuple[int, int, int]) -> bytes:
    """The file's bytes: `check` is (first offset, epoch, CRC) of the chunk ending at S; the
    leveled and transient offsets in `out` (settled or held) are left out."""
    flat = array("Q")
    for index, (count, size) in sorted(ledger.buckets.items()):
        flat.extend((index, count, size))
    if sys.byteorder == "little":
        flat.byteswap()
    leveled, transient = minus(ledger.leveled, out), minus(ledger.transient, out)
    body = (_HEAD.pack(MAGIC, ledger.covers, ledger.seq, check[0], check[1], check[2], 0,
                       len(ledger.buckets))
            + flat.tobytes() + _pairs(leveled) + _pairs(transient))
    return body + struct.pack(">I", zlib.crc32(body))


def decode(data: bytes) -> tuple[Ledger, tuple[int, int, int]]:
    if len(data) < _HEAD.size + 4 or not data.startswith(MAGIC):
        raise SnapshotError("not a snapshot of this version")
    body, (crc,) = data[:-4], struct.unpack(">I", data[-4:])
    if zlib.crc32(body) != crc:
        raise SnapshotError("checksum mismatch")
    _magic, covers, seq, first, epoch, chunk_crc, _kinds, buckets = _HEAD.unpack_from(body, 0)
    at = _HEAD.size
    flat = array("Q")
    flat.frombytes(body[at: at + 24 * buckets])
    if len(flat) != 3 * buckets:
        raise SnapshotError("truncated buckets")
    if sys.byteorder == "little":
        flat.byteswap()
    at += 24 * buckets
    ledger = Ledger(covers=covers, seq=seq, buckets={
        flat[i]: [flat[i + 1], flat[i + 2]] for i in range(0, len(flat), 3)})
    ledger.leveled, at = _read_pairs(body, at)
    ledger.transient, at = _read_pairs(body, at)
    if at != len(body):
        raise SnapshotError("trailing bytes")
    return ledger, (first, epoch, chunk_crc)


def write(directory: Path, data: bytes) -> None:
    """Replace the snapshot with `data`, durably (the file and the directory entry synced)."""
    replace_durably(directory / NAME, data)


def read(directory: Path) -> bytes | None:
    """The snapshot's bytes, or None if there is none."""
    try:
        return (directory / NAME).read_bytes()
    except FileNotFoundError:
        return None
