"""Where a reader starts: offset specs resolved by bisecting segment names and index files.

Role: turn an OffsetSpec (first, last, next, an absolute offset, a timestamp) into a Start: the
segment, the file position of the first chunk to look at, the reader's initial offset, and the
offset below which the reader must still skip records. It bisects the sorted segment names, then
the chosen segment's index with a few preads; it never scans. An index entry is checked against
the chunk header it points at; if it disagrees (a damaged index), that segment's chunk headers
are walked instead.

Must not know: the writer, chunk bodies, filters, retention.
Threading: stateless functions; each call opens and closes its own descriptors.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from leveret.storage import layout
from leveret.storage import segment as seg
from leveret.storage.chunk import is_committed
from leveret.storage.errors import BadChunk
from leveret.storage.index import Bisectable, IndexEntry, IndexView

log = logging.getLogger("leveret.storage.reader")
_LATEST = 2**63 - 1


@dataclass(frozen=True)
class OffsetSpec:
    """Where a reader attaches. Build one with first(), last(), next(), offset(n) or
    timestamp(ms)."""

    kind: str
    value: int = 0

    @staticmethod
    def first() -> OffsetSpec:
        return OffsetSpec("first")

    @staticmethod
    def last() -> OffsetSpec:
        return OffsetSpec("last")

    @staticmethod
    def next() -> OffsetSpec:
        return OffsetSpec("next")

    @staticmethod
    def offset(offset: int) -> OffsetSpec:
        return OffsetSpec("offset", offset)

    @staticmethod
    def timestamp(timestamp_ms: int) -> OffsetSpec:
        return OffsetSpec("timestamp", timestamp_ms)

    def __post_init__(self) -> None:
        if self.kind not in ("first", "last", "next", "offset", "timestamp"):
            raise ValueError(f"unknown offset spec {self.kind!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise TypeError("an offset spec's value is an int")


@dataclass(frozen=True)
class Start:
    base: int | None  # the segment to open; None when the directory has no segment yet
    position: int  # file position of the first chunk header to look at
    offset: int  # the reader's position: the next offset it would hand out
    skip_below: int | None = None  # skip records with offsets below this


class SegmentIndex:
    """The index of one segment, opened for a lookup: the file, or the segment walked.
    Also what shipping.py reads a segment's chunks with."""

    def __init__(self, directory: Path, base: int):
        self.fd = os.open(layout.segment_path(directory, base), os.O_RDONLY)
        self.ifd: int | None = None
        self.entries: Bisectable
        try:
            self.ifd = os.open(layout.index_path(directory, base), os.O_RDONLY)
            self.entries = IndexView(self.ifd)
        except FileNotFoundError:
            self.entries = seg.memory_index(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        if self.ifd is not None:
            os.close(self.ifd)

    def checked(self, i: int) -> IndexEntry:
        """Entry i, after checking it against its chunk header; walks the segment instead if
        the index is damaged."""
        entry = self.entries[i]
        try:
            header = seg.read_header(self.fd, entry.position)
        except BadChunk:
            header = None
        if header is None or seg.entry_for(header, entry.position) != entry:
            raise _DamagedIndex
        return entry


class _DamagedIndex(Exception):
    pass


def locate(
    directory: Path, spec: OffsetSpec, committed: int, chunk_types: Collection[int]
) -> Start:
    bases = layout.list_bases(directory)
    if not bases:
        return Start(None, seg.FIRST_CHUNK_POSITION, 0)
    first = bases[0]
    next_offset = max(committed + 1, first)
    if spec.kind == "first":
        return Start(first, seg.FIRST_CHUNK_POSITION, first)
    if spec.kind == "next":
        return _at_offset(directory, bases, next_offset)
    if spec.kind == "offset":
        return _at_offset(directory, bases, min(max(spec.value, first), next_offset))
    if spec.kind == "timestamp":
        return _at_timestamp(directory, bases, spec.value, next_offset)
    found = _at_last(directory, bases, committed, chunk_types)
    return found if found is not None else _at_offset(directory, bases, next_offset)


def _with_index(
    directory: Path, base: int, lookup: Callable[[SegmentIndex], Start | None]
) -> Start | None:
    index = SegmentIndex(directory, base)
    try:
        try:
            return lookup(index)
        except _DamagedIndex:
            log.warning("index of segment %d disagrees with it; walking the segment", base)
            index.entries = seg.memory_index(index.fd)
            return lookup(index)
    finally:
        index.close()


def _at_offset(directory: Path, bases: list[int], offset: int) -> Start:
    base = bases[max(0, bisect.bisect_right(bases, offset) - 1)]

    def lookup(index: SegmentIndex) -> Start:
        i = min(index.entries.find_offset(offset), len(index.entries) - 1)
        position = index.checked(i).position if i >= 0 else seg.FIRST_CHUNK_POSITION
        return Start(base, position, offset, skip_below=offset)

    start = _with_index(directory, base, lookup)
    assert start is not None
    return start


def _at_timestamp(directory: Path, bases: list[int], timestamp_ms: int, next_offset: int) -> Start:
    # The first segment whose last chunk is stamped at or after timestamp_ms (the last one
    # if none is): only it can hold the first such chunk.
    k = bisect.bisect_left(bases, timestamp_ms, key=lambda b: _last_timestamp(directory, b))
    base = bases[min(k, len(bases) - 1)]

    def lookup(index: SegmentIndex) -> Start:
        i = index.entries.find_timestamp(timestamp_ms)
        if i < len(index.entries):
            entry = index.checked(i)
            return Start(base, entry.position, entry.first_offset)
        i = len(index.entries) - 1
        position = index.checked(i).position if i >= 0 else seg.FIRST_CHUNK_POSITION
        return Start(base, position, next_offset, skip_below=next_offset)

    start = _with_index(directory, base, lookup)
    assert start is not None
    return start


def _last_timestamp(directory: Path, base: int) -> int:
    """The timestamp of a segment's last chunk (the largest int64 when it has none)."""
    index = SegmentIndex(directory, base)
    try:
        entries = index.entries
        return entries[-1].timestamp_ms if len(entries) else _LATEST
    finally:
        index.close()


def _at_last(
    directory: Path, bases: list[int], committed: int, chunk_types: Collection[int]
) -> Start | None:
    """The start of the last committed chunk of one of `chunk_types`, newest segment first."""

    def wanted(entry: IndexEntry) -> bool:
        return entry.chunk_type in chunk_types and is_committed(
            entry.first_offset, entry.num_records, committed
        )

    for base in reversed(bases):

        def lookup(index: SegmentIndex, base: int = base) -> Start | None:
            i = index.entries.find_last(wanted)
            if i is None:
                return None
            entry = index.checked(i)
            return Start(base, entry.position, entry.first_offset)

        found = _with_index(directory, base, lookup)
        if found is not None:
            return found
    return None
