"""Index files: one 32-byte entry per chunk of a segment (docs/FORMAT.md section 4).

Role: encode entries, and read an index file through an open descriptor as a lazy sequence
that bisects by offset or timestamp with a few preads, never loading the whole file. The index
is a derived cache: callers check what it says against the segment.

Must not know: chunk bodies, tracking, retention, readers' offset specs.
Threading: an IndexView belongs to one thread; it reads with pread and holds no file offset.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, overload

from leveret.storage.chunk import offset_key
from leveret.storage.layout import FILE_HEADER_SIZE

ENTRY = struct.Struct("<QqQIBBH")
ENTRY_SIZE = ENTRY.size  # 32
FLAG_TRAILER = 0x01
_BLOCK_ENTRIES = 4096


class IndexEntry(NamedTuple):
    first_offset: int
    timestamp_ms: int
    position: int
    num_records: int
    chunk_type: int
    flags: int = 0

    @property
    def has_trailer(self) -> bool:
        return bool(self.flags & FLAG_TRAILER)

    @property
    def offset_key(self) -> int:
        return offset_key(self.first_offset, self.num_records)


def encode_entry(entry: IndexEntry) -> bytes:
    return ENTRY.pack(*entry, 0)


def decode_entries(data: bytes | memoryview) -> list[IndexEntry]:
    usable = len(data) - len(data) % ENTRY_SIZE
    return [IndexEntry(*fields[:6]) for fields in ENTRY.iter_unpack(data[:usable])]


def entry_count(index_size: int) -> int:
    """Whole entries in an index file of this size (a partial last entry is ignored)."""
    return max(0, (index_size - FILE_HEADER_SIZE) // ENTRY_SIZE)


def entry_position(i: int) -> int:
    return FILE_HEADER_SIZE + i * ENTRY_SIZE


class Bisectable(Sequence[IndexEntry]):
    """Bisection over a sequence of index entries in file order."""

    def find_offset(self, offset: int) -> int:
        """The first entry whose chunk holds `offset` or comes after it (len(self) if none)."""
        return bisect.bisect_right(self, offset, key=_offset_key)

    def find_timestamp(self, timestamp_ms: int) -> int:
        """The first entry with a timestamp >= `timestamp_ms` (len(self) if none)."""
        return bisect.bisect_left(self, timestamp_ms, key=_timestamp_key)

    def blocks(self, start: int = 0) -> Iterator[list[IndexEntry]]:
        """All entries from `start`, in lists."""
        yield [self[i] for i in range(start, len(self))]

    def find_last(self, wanted: Callable[[IndexEntry], bool]) -> int | None:
        """The last entry for which `wanted` is true."""
        for i in range(len(self) - 1, -1, -1):
            if wanted(self[i]):
                return i
        return None


class MemoryIndex(Bisectable):
    """Entries held in memory: an index rebuilt from a segment when its file cannot be used."""

    def __init__(self, entries: list[IndexEntry]):
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> IndexEntry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[IndexEntry]: ...

    def __getitem__(self, i: int | slice) -> IndexEntry | Sequence[IndexEntry]:
        return self._entries[i]


class IndexView(Bisectable):
    """The entries of an open index file, read on demand with pread."""

    def __init__(self, fd: int, count: int | None = None):
        self._fd = fd
        self._count = entry_count(os.fstat(fd).st_size) if count is None else count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> IndexEntry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[IndexEntry]: ...

    def __getitem__(self, i: int | slice) -> IndexEntry | Sequence[IndexEntry]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(i)
        data = os.pread(self._fd, ENTRY_SIZE, entry_position(i))
        if len(data) < ENTRY_SIZE:
            raise IndexError(i)
        return IndexEntry(*ENTRY.unpack(data)[:6])

    def blocks(self, start: int = 0) -> Iterator[list[IndexEntry]]:
        """All entries from `start`, in blocks read with one pread each."""
        for first in range(start, self._count, _BLOCK_ENTRIES):
            count = min(_BLOCK_ENTRIES, self._count - first)
            yield decode_entries(os.pread(self._fd, count * ENTRY_SIZE, entry_position(first)))

    def find_last(self, wanted: Callable[[IndexEntry], bool]) -> int | None:
        """The last entry for which `wanted` is true, reading backwards in blocks."""
        stop = self._count
        while stop > 0:
            first = max(0, stop - _BLOCK_ENTRIES)
            data = os.pread(self._fd, (stop - first) * ENTRY_SIZE, entry_position(first))
            entries = decode_entries(data)
            for i in range(len(entries) - 1, -1, -1):
                if wanted(entries[i]):
                    return first + i
            stop = first
        return None


def _offset_key(entry: IndexEntry) -> int:
    return entry.offset_key


def _timestamp_key(entry: IndexEntry) -> int:
    return entry.timestamp_ms
