"""What replication reads from a log's files: whole chunks as they are on disk, and where an
epoch ends.

Role: a stream's leader ships its chunks to the replicas unchanged (each keeps its two CRCs, so a
replica checks what arrives without re-encoding anything): `read_chunks` returns the bytes of
whole chunks from a cursor (a segment and a position: tracking chunks take no offset), in one
pread, from one segment. When a replica rejoins, its log and
the leader's agree up to where the replica's last epoch ends in the leader's log: `epoch_end`
finds that offset by bisecting segments and chunks by epoch (epochs never decrease along a log).

Must not know: the writer's state beyond the offsets it is given, the network, the broker.
Threading: stateless functions; each call opens and closes its own descriptors.
"""

from __future__ import annotations

import bisect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from leveret.storage import chunk as ck
from leveret.storage import layout
from leveret.storage import segment as seg
from leveret.storage.errors import BadChunk, CorruptLogError
from leveret.storage.locate import SegmentIndex


class _Segment(SegmentIndex):
    """One segment opened for a lookup (locate's), as a context manager, with chunk epochs."""

    def __init__(self, directory: Path, base: int) -> None:
        self.path = layout.segment_path(directory, base)
        super().__init__(directory, base)

    def __enter__(self) -> _Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def epoch(self, i: int) -> int:
        position = self.entries[i].position
        try:
            header = seg.read_header(self.fd, position)
        except BadChunk as exc:
            raise CorruptLogError(self.path, position, exc.reason) from None
        if header is None:
            raise CorruptLogError(self.path, position, "partial chunk header")
        return header.epoch


class _SegmentFile:
    """One segment file opened to read its chunks (not its index: shipping reads in order)."""

    def __init__(self, directory: Path, base: int) -> None:
        self.path = layout.segment_path(directory, base)
        self.fd = os.open(self.path, os.O_RDONLY)

    def __enter__(self) -> _SegmentFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Cursor:
    """Where shipping to one replica stands: the next chunk to send (its segment and file
    position) and the offset that follows what was sent. Tracking chunks take no offset, so
    the position, not the offset, says which chunks went."""

    base: int
    position: int
    offset: int


def cursor_at(directory: Path, offset: int) -> Cursor:
    """A cursor at the first chunk whose records start at `offset` or later (tracking chunks at
    `offset` come first, even those that end the segment before the one holding `offset`): for
    a replica whose log ends just before `offset`."""
    bases = layout.list_bases(directory)
    if not bases:
        return Cursor(0, seg.FIRST_CHUNK_POSITION, offset)
    k = max(0, bisect.bisect_left(bases, offset) - 1)  # the last segment based below `offset`
    for base in bases[k:]:
        with _Segment(directory, base) as segment:
            entries = segment.entries
            i = bisect.bisect_left(entries, offset, key=lambda e: e.first_offset)
            if i < len(entries):
                return Cursor(base, entries[i].position, offset)
            end = os.fstat(segment.fd).st_size
    return Cursor(bases[-1], end, offset)


def read_chunks(directory: Path, cursor: Cursor, max_bytes: int,
                end_offset: int) -> tuple[bytes, Cursor]:
    """Whole chunks as they are on disk from `cursor`, up to `max_bytes` (always at least one
    whole chunk), none whose records reach `end_offset` (the writer's next offset), from one
    segment. Returns them and the cursor after them; b"" when there is nothing new yet."""
    try:
        segment = _SegmentFile(directory, cursor.base)
    except FileNotFoundError:  # retention removed it: start again where the offset now is
        return b"", cursor_at(directory, cursor.offset)
    with segment:
        size = os.fstat(segment.fd).st_size
        if cursor.position >= size:
            later = [b for b in layout.list_bases(directory) if b > cursor.base]
            if not later:
                return b"", cursor
            return read_chunks(directory, Cursor(later[0], seg.FIRST_CHUNK_POSITION,
                                                 cursor.offset), max_bytes, end_offset)
        start = cursor.position
        data = os.pread(segment.fd, min(size - start, max(max_bytes, ck.MAX_HEADER_SIZE)), start)
        data, length, offset = _whole_chunks(segment, data, start, end_offset, cursor.offset)
        return data[:length], Cursor(cursor.base, start + length, offset)


def _whole_chunks(segment: _SegmentFile, data: bytes, start: int, end_offset: int,
                  offset: int) -> tuple[bytes, int, int]:
    """The longest run of whole, checked chunks at the start of `data` (reading the first one
    in full if `data` holds only part of it)."""
    pos = 0
    while pos < len(data):
        view = memoryview(data)[pos:]
        if len(view) < ck.header_length(view):
            break
        try:
            header = ck.decode_header(view)
        except BadChunk as exc:
            raise CorruptLogError(segment.path, start + pos, exc.reason) from None
        if header.next_offset > end_offset:
            break
        if header.total_size > len(view):
            if pos:
                break
            data = os.pread(segment.fd, header.total_size, start)  # one chunk above max_bytes
            view = memoryview(data)
            if len(view) < header.total_size:
                break
        try:
            ck.check_body(header, view[header.header_size:header.total_size])
        except BadChunk as exc:
            raise CorruptLogError(segment.path, start + pos, exc.reason) from None
        pos += header.total_size
        offset = header.next_offset
    return data, pos, offset


def epoch_end(directory: Path, epoch: int, next_offset: int) -> int:
    """The offset after the last chunk whose epoch is `epoch` or older (`next_offset`, the
    writer's, if every chunk is): where a log holding chunks of newer epochs parts from one
    whose last epoch is `epoch`."""
    found = _first_chunk_above(directory, epoch)
    return next_offset if found is None else found[1]


def epoch_ranges(directory: Path, next_offset: int) -> list[tuple[int, int]]:
    """The log's epochs, oldest first, each with the offset after its last chunk: what a
    replica tells its leader on a sync, so that the leader finds where their logs part. Found
    by bisecting (epochs never decrease along a log): a few header reads per epoch."""
    found = _first_chunk_above(directory, -1)
    ranges: list[tuple[int, int]] = []
    while found is not None:
        epoch = found[0]
        found = _first_chunk_above(directory, epoch)
        ranges.append((epoch, next_offset if found is None else found[1]))
    return ranges


def _first_chunk_above(directory: Path, epoch: int) -> tuple[int, int] | None:
    """(epoch, first offset) of the first chunk whose epoch is newer than `epoch`, or None."""
    bases = layout.list_bases(directory)

    def last_epoch(base: int) -> int:  # an empty segment (a new log's, or just rolled) last
        with _Segment(directory, base) as segment:
            n = len(segment.entries)
            return segment.epoch(n - 1) if n else sys.maxsize

    k = bisect.bisect_right(bases, epoch, key=last_epoch)  # segments entirely within `epoch`
    while k < len(bases):
        with _Segment(directory, bases[k]) as segment:
            entries = segment.entries
            i = bisect.bisect_right(range(len(entries)), epoch, key=segment.epoch)
            if i < len(entries):
                return segment.epoch(i), entries[i].first_offset
        k += 1  # an empty segment (the active one, just rolled)
    return None
