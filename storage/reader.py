"""Readers: independent cursors that read chunks from the files, never past `committed`.

Role: a Reader opens the segment files itself (in this process or another one), attaches where
an OffsetSpec says (see locate.py), and hands out whole chunks as ChunkViews, in file order, up
to the committed offset and never beyond. It skips, without reading their records, chunks of
types it was not asked for and chunks whose bloom filter cannot match its ReaderFilter; with an
exact filter it drops the bloom filter's false positives record by record. It checks every
chunk's CRC and reports a corrupt chunk as CorruptLogError with the file and position. When
retention deletes segments under it, it keeps reading what it has open and then moves on to the
oldest segment that remains, jumping its position forward. Big chunks of types a caller names
(`read(mapped=...)`) are checked in the mapped segment file and handed out without a copy.

Must not know: the writer (it only calls `committed()`), tracking semantics, retention rules.
Threading: a Reader belongs to one thread. Many readers, in any processes, may read one log.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leveret.storage import chunk as ck
from leveret.storage import layout
from leveret.storage.bloom import BloomMatcher
from leveret.storage.cache import ChunkCache
from leveret.storage.errors import BadChunk, CorruptLogError, LogClosedError, io_error
from leveret.storage.locate import OffsetSpec, Start, locate
from leveret.storage.segment import FIRST_CHUNK_POSITION
from leveret.storage.tracking import PUBLISHER, Tracking, TrackingState, decode_entries

log = logging.getLogger("leveret.storage.reader")

READAHEAD_BYTES = 256 * 1024
# After a chunk this big, the next header is read on its own (not with READAHEAD_BYTES after
# it) and its body with one pread of its size: big chunks are copied once, not twice (a
# readahead that holds part of a body is read again, and a body sliced out of it is copied).
BIG_CHUNK_BYTES = READAHEAD_BYTES // 2
_HEADER_READ_BYTES = 4096  # a header and a bloom filter, at most
_UNBOUNDED = 2**63 - 1
_NOT_YET = object()
_ATTACH_ATTEMPTS = 5


@dataclass(frozen=True)
class ReaderFilter:
    """Which records a reader wants by filter value: any of `values`, and records with no
    filter value too when `match_unfiltered`. With `exact`, records that do not match are
    dropped (ChunkView.offsets then lists the offsets of those kept); without it, whole chunks
    that may match are returned, as RabbitMQ does."""

    values: frozenset[bytes]
    match_unfiltered: bool = False
    exact: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", frozenset(bytes(v) for v in self.values))

    def wants(self, value: bytes | None) -> bool:
        return self.match_unfiltered if value is None else value in self.values


class ChunkView:
    """One chunk as a reader returns it.

    `records` are in offset order. `offsets` is None when records[i] has offset
    first_offset + i (the whole chunk); otherwise it lists each record's offset (records were
    dropped by an exact filter, or lie below the offset the reader attached at).
    A whole chunk is split into records only when `records` is first asked for: a reader that
    only needs the chunk's record bytes as they lie on disk takes `record_bytes()` instead.
    `filter_values` gives each returned record's filter value (None: it has none), decoded each
    time it is asked for. `tracking` holds the entries of a tracking chunk (None for other chunks).
    """

    __slots__ = (
        "_body",
        "_header",
        "_keep",
        "_records",
        "_shared",
        "_where",
        "chunk_type",
        "first_offset",
        "num_records",
        "offsets",
        "timestamp_ms",
        "tracking",
    )

    def __init__(
        self,
        header: ck.ChunkHeader,
        body: bytes | memoryview,
        records: list[bytes] | None,
        keep: list[int] | None,
        shared: list[Any] | None = None,
        where: tuple[Path, int] = (Path("."), 0),
    ):
        self.chunk_type = header.chunk_type
        self.first_offset = header.first_offset
        self.timestamp_ms = header.timestamp_ms
        self.num_records = header.num_records  # records in the chunk, returned or not
        self._records = records  # None: not split yet (a whole chunk)
        self._shared = shared  # the cache's entry, [body, records], told once they are split
        self._where = where  # the segment file and position, for errors
        self.offsets = None if keep is None else [header.first_offset + i for i in keep]
        self.tracking: Tracking | None = None
        self._header, self._body, self._keep = header, body, keep

    @property
    def records(self) -> list[bytes]:
        records = self._records
        if records is None:
            try:
                records = self._records = ck.decode_records(self._header, bytes(self._body))
            except BadChunk as exc:  # the body's CRC matched: only a writer's bug gets here
                raise CorruptLogError(*self._where, exc.reason) from None
            if self._shared is not None:
                self._shared[1] = records
        return records

    @property
    def count(self) -> int:
        """How many records this view returns (without splitting the chunk)."""
        return self.num_records if self.offsets is None else len(self.offsets)

    @property
    def epoch(self) -> int:
        """The epoch of the writer that wrote the chunk (0 in a chunk written before epochs)."""
        return self._header.epoch

    @property
    def publishers(self) -> dict[bytes, int]:
        """The last publishing id of each publisher the chunk's trailer tracks (decoded each
        time it is asked for; {} for a chunk without a trailer)."""
        header = self._header
        if not header.trailer_size or header.chunk_type == ck.ChunkType.TRACKING_SNAPSHOT:
            return {}
        start = header.trailer_start
        trailer = bytes(self._body[start : start + header.trailer_size])
        try:
            return {bytes(name): value for kind, name, value, _ref in decode_entries(trailer)
                    if kind == PUBLISHER}
        except BadChunk as exc:  # the body's CRC matched: only a writer's bug gets here
            raise CorruptLogError(*self._where, exc.reason) from None

    @property
    def records_crc(self) -> int | None:
        """The zlib CRC-32 of record_bytes(), if the writer kept it (Log.append's
        `records_crc`); None if it did not."""
        return self._header.records_crc

    def record_bytes(self) -> memoryview:
        """Every record of the chunk, concatenated in offset order, as the data section holds
        them: a read-only view of the chunk's bytes (no copy, no per-record work). Only for a
        view of the whole chunk (`offsets` is None)."""
        if self.offsets is not None:
            raise ValueError("record_bytes() needs a view of the whole chunk")
        return ck.record_bytes(self._header, self._body)

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records

    @property
    def filter_values(self) -> list[bytes | None]:
        values = ck.decode_filter_values(self._header, bytes(self._body))
        if values is None:
            return [None] * self.count
        return values if self._keep is None else [values[i] for i in self._keep]

    def items(self) -> Iterator[tuple[int, bytes]]:
        """(offset, record) pairs."""
        records = self.records
        offsets = self.offsets or range(self.first_offset, self.first_offset + len(records))
        return zip(offsets, records, strict=True)

    def __repr__(self) -> str:
        return (
            f"ChunkView(type={self.chunk_type}, first_offset={self.first_offset}, "
            f"records={self.count}/{self.num_records})"
        )


class Reader:
    """A cursor over a log directory. Use Reader.open(...) or Log.reader(...)."""

    def __init__(
        self,
        directory: Path,
        start: Start,
        committed: Callable[[], int],
        filter: ReaderFilter | None,
        chunk_types: Iterable[int],
        cache: ChunkCache | None = None,
    ):
        self._dir = directory
        self._cache = cache
        self._committed = committed
        self._types = frozenset(chunk_types)
        self._sees_trackless = any(not ck.takes_offsets(t) for t in self._types)
        self._filter = filter
        self._matcher = BloomMatcher(filter.values, filter.match_unfiltered) if filter else None
        self._base = start.base
        self._pos = start.position
        self._position = start.offset
        self._skip_below = start.skip_below
        self._fd: int | None = None
        self._map: memoryview | None = None  # the current segment, mapped (read(mapped=...))
        self._seg_path: Path | None = None
        self._buf = b""
        self._buf_at = 0
        # the committed bound when the buffer was read, and the one of this read() call: bytes
        # of a chunk that was not committed when they were read may have been cut and written
        # again since (a replica's uncommitted tail, truncated on a sync), so they are read anew
        self._buf_committed = -1
        self._reading_committed = -1
        self._ahead = READAHEAD_BYTES
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: Path | str,
        spec: OffsetSpec,
        committed: Callable[[], int] | None = None,
        filter: ReaderFilter | None = None,
        chunk_types: Iterable[int] = (ck.ChunkType.USER,),
        cache: ChunkCache | None = None,
    ) -> Reader:
        """Attach to the log in `directory`. `committed()` gives the highest offset the reader
        may return; None means every whole chunk on disk (for a log nobody is writing).
        Readers given the same `cache` share the chunks they have checked and split."""
        directory = Path(directory)
        if not directory.is_dir():
            raise io_error(directory, FileNotFoundError(2, "no such log directory"))
        committed_fn = committed if committed is not None else _unbounded
        types = tuple(chunk_types)
        for _ in range(_ATTACH_ATTEMPTS):
            try:
                start = locate(directory, spec, committed_fn(), types)
                reader = cls(directory, start, committed_fn, filter, types, cache)
                reader._open_segment()
                return reader
            except FileNotFoundError:
                continue  # retention removed a file under us: list the directory again
            except OSError as exc:
                raise io_error(directory, exc) from exc
        raise io_error(directory, FileNotFoundError(2, "segments keep disappearing"))

    @property
    def position(self) -> int:
        """The next offset this reader would hand out."""
        return self._position

    def read(self, mapped: frozenset[int] = frozenset()) -> ChunkView | None:
        """The next chunk for this reader, or None if there is none committed yet.

        Big chunks (BIG_CHUNK_BYTES and more) of the `mapped` types that this reader takes
        whole (no exact filter, no start inside them) are checked where the segment file is
        mapped into memory and not copied: their view's body, and so record_bytes(), is a
        read-only view of the mapping (records and filter values are still bytes), for a
        caller that only sends the record bytes on (docs/STREAM-PROTOCOL.md, delivery path).
        Only committed chunks are mapped, which nothing truncates."""
        if self._closed:
            raise LogClosedError("reader is closed")
        try:
            return self._read(self._committed(), mapped)
        except OSError as exc:
            raise io_error(self._path, exc) from exc

    def _read(self, committed: int, mapped: frozenset[int] = frozenset()) -> ChunkView | None:
        self._reading_committed = committed
        while True:
            if self._position > committed and not self._sees_trackless:
                return None
            header = self._next_header(committed)
            if header is None or not ck.is_committed(
                header.first_offset, header.num_records, committed
            ):
                return None
            if not ck.is_committed(header.first_offset, header.num_records,
                                   self._buf_committed):
                header = self._header_at(self._pos, committed, fresh=True)  # read before its
                if header is None or not ck.is_committed(          # commit: read it again
                    header.first_offset, header.num_records, committed
                ):
                    return None
            view = self._take(header, committed, mapped)
            if view is _NOT_YET:
                return None
            if view is not None:
                return view  # type: ignore[return-value]

    def __iter__(self) -> Iterator[ChunkView]:
        """Chunks until none is committed."""
        while (view := self.read()) is not None:
            yield view

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._map = None  # unmapped once no view of it is left
        self._buf = b""
        self._closed = True

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- moving through files --------------------------------------------------------------

    @property
    def _path(self) -> Path:
        path = self._seg_path
        if path is None:
            path = self._seg_path = layout.segment_path(self._dir, self._base or 0)
        return path

    def _open_segment(self) -> None:
        self._seg_path = None
        if self._base is not None:
            self._fd = os.open(self._path, os.O_RDONLY)
            self._buf, self._buf_at, self._buf_committed = b"", 0, -1

    def _next_header(self, committed: int) -> ck.ChunkHeader | None:
        while True:
            if self._fd is not None:
                header = self._header_at(self._pos, committed)
                if header is not None:
                    return header
            if self._position > committed or not self._move_on():
                return None

    def _move_on(self) -> bool:
        """Switch to the segment after this one if there is one (and this one is whole)."""
        try:
            bases = layout.list_bases(self._dir)
        except FileNotFoundError:
            return False  # the whole log was deleted
        later = [b for b in bases if self._base is None or b > self._base]
        if not later:
            return False
        if self._fd is not None:
            # A later segment exists, so this one can no longer grow: anything left is damage,
            # unless it is a chunk written between our last look and the roll (another process).
            size = os.fstat(self._fd).st_size
            if self._pos < size:
                if self._header_at(self._pos, _UNBOUNDED, fresh=True) is not None:
                    return True
                raise CorruptLogError(
                    self._path, self._pos, "partial chunk at the end of a segment"
                )
            os.close(self._fd)
            self._fd = None
        self._map = None  # unmapped once no view of it is left
        for base in later:
            self._base, self._pos = base, FIRST_CHUNK_POSITION
            try:
                self._open_segment()
            except FileNotFoundError:
                continue  # deleted by retention since we listed it
            if base > self._position:
                log.info("reader moved from offset %d to %d (retention)", self._position, base)
                self._position = base
            return True
        return False

    def _bytes_at(self, position: int, size: int, fresh: bool = False) -> bytes:
        """`size` bytes at `position` of the current segment (fewer at the end of the file)."""
        start = position - self._buf_at
        if not fresh and start >= 0 and start + size <= len(self._buf):
            return self._buf[start : start + size]
        assert self._fd is not None
        self._buf = os.pread(self._fd, max(size, self._ahead), position)
        self._buf_at = position
        self._buf_committed = self._reading_committed
        return self._buf[:size]

    def _header_at(
        self, position: int, committed: int, fresh: bool = False
    ) -> ck.ChunkHeader | None:
        data = self._bytes_at(position, ck.MAX_HEADER_SIZE, fresh)
        if len(data) < ck.header_length(data):
            return None
        try:
            return ck.decode_header(data)
        except BadChunk as exc:
            if not fresh:  # bytes read while a chunk was being written: look again
                return self._header_at(position, committed, fresh=True)
            if self._position > committed:
                return None  # not committed yet: not ours to judge
            raise CorruptLogError(self._path, position, exc.reason) from None

    # -- one chunk ---------------------------------------------------------------------------

    def _take(self, header: ck.ChunkHeader, committed: int,
              mapped: frozenset[int] = frozenset()) -> ChunkView | object | None:
        """The view of this chunk for this reader, or None if it skips it; moves past it.
        _NOT_YET (without moving) if the chunk is still being written."""
        view = None
        if self._wants(header):
            maps = (header.chunk_type in mapped and header.body_size >= BIG_CHUNK_BYTES
                    and self._filter is None
                    and (self._skip_below is None or header.first_offset >= self._skip_below))
            cached = self._cache.get(self._base or 0, self._pos) if self._cache else None
            if cached is not None:
                if not maps and isinstance(cached[0], memoryview):  # a mapped body: copied
                    cached[0] = bytes(cached[0])
                view = self._view(header, cached[0], cached)
            else:
                body: bytes | memoryview | None = self._mapped_body(header) if maps else None
                if body is None:
                    body = self._body(header, committed)
                if body is None:
                    return _NOT_YET  # (readers without a committed bound only)
                view = self._view(header, body)
        self._pos += header.total_size
        if header.next_offset > self._position:
            self._position = header.next_offset
        if self._skip_below is not None and header.next_offset > self._skip_below:
            self._skip_below = None
        return view

    def _wants(self, header: ck.ChunkHeader) -> bool:
        if header.chunk_type not in self._types:
            return False
        n = header.num_records
        key = ck.offset_key(header.first_offset, n)
        if self._skip_below is not None and key <= self._skip_below:
            return False
        if self._matcher is not None and n:
            bloom = self._bytes_at(self._pos + header.header_size, header.bloom_size)
            return self._matcher.matches(bloom)
        return True

    def _mapped_body(self, header: ck.ChunkHeader) -> memoryview | None:
        """The checked body of this chunk as a view of the mapped segment; None when it is
        not all in the file, or does not check (then it is read, and judged, as any other)."""
        at = self._pos + header.header_size
        end = at + header.body_size
        self._ahead = _HEADER_READ_BYTES
        view = self._map
        if view is None or len(view) < end:
            assert self._fd is not None
            size = os.fstat(self._fd).st_size
            if size < end:
                return None
            view = self._map = memoryview(mmap.mmap(self._fd, size, prot=mmap.PROT_READ))
        body = view[at:end]
        try:
            ck.check_body(header, body)
        except BadChunk:
            return None
        return body

    def _body(self, header: ck.ChunkHeader, committed: int) -> bytes | None:
        at = self._pos + header.header_size
        self._ahead = (_HEADER_READ_BYTES if header.body_size >= BIG_CHUNK_BYTES
                       else READAHEAD_BYTES)
        body = self._bytes_at(at, header.body_size)
        try:
            ck.check_body(header, body)
        except BadChunk:
            body = self._bytes_at(at, header.body_size, fresh=True)
            try:
                ck.check_body(header, body)
            except BadChunk as exc:
                if len(body) < header.body_size and committed == _UNBOUNDED:
                    return None
                raise CorruptLogError(self._path, self._pos, exc.reason) from None
        return body

    def _view(
        self, header: ck.ChunkHeader, body: bytes | memoryview, shared: list[Any] | None = None
    ) -> ChunkView | None:
        """The view of a checked chunk. A whole chunk is not split here (the view splits it
        when its records are asked for, and tells the cache); a part of one is."""
        try:
            keep = self._keep(header, body)
            if shared is None:
                ck.check_ends(header, body)
            if shared is None and self._cache is not None:
                shared = self._cache.put(self._base or 0, self._pos, body)
            records = shared[1] if shared is not None else None
            if keep is not None:
                if not keep:
                    return None
                if records is None:
                    records = ck.decode_records(header, bytes(body))  # (bytes: not mapped)
                    if shared is not None:
                        shared[1] = records
                records = [records[i] for i in keep]
        except BadChunk as exc:
            raise CorruptLogError(self._path, self._pos, exc.reason) from None
        view = ChunkView(header, body, records, keep, shared, (self._path, self._pos))
        if header.chunk_type in ck.TRACKING_TYPES:
            state = TrackingState()
            state.apply(header.chunk_type, ck.trailer_bytes(header, body))
            view.tracking = state.public()
        return view

    def _keep(self, header: ck.ChunkHeader, body: bytes | memoryview) -> list[int] | None:
        """Indexes of the records to return, or None for all of them."""
        n, first = header.num_records, header.first_offset
        keep: list[int] | None = None
        if self._filter is not None and self._filter.exact and n:
            values = ck.decode_filter_values(header, bytes(body)) or [None] * n
            wants = self._filter.wants
            keep = [i for i, value in enumerate(values) if wants(value)]
            if len(keep) == n:
                keep = None
        if self._skip_below is not None and first < self._skip_below:
            keep = [
                i for i in (range(n) if keep is None else keep) if first + i >= self._skip_below
            ]
        return keep


def _unbounded() -> int:
    return _UNBOUNDED
