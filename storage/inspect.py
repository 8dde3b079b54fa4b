"""Inspection: dump a segment's chunks, dump an index, verify every CRC, summarise a log.

Role: read-only tools over a log directory for operators and the CLI (which renders what these
return). They never repair, lock or write; they work on a live log or a copy of one.

Must not know: the write path or readers' offset specs; nothing here changes a file.
Threading: stateless functions; each call opens and closes its own descriptors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leveret.storage import chunk as ck
from leveret.storage import layout, recovery
from leveret.storage import segment as seg
from leveret.storage.errors import BadChunk, CorruptLogError
from leveret.storage.index import ENTRY_SIZE, Bisectable, IndexEntry, IndexView, MemoryIndex
from leveret.storage.tracking import Tracking, TrackingState, decode_entries


@dataclass(frozen=True)
class Problem:
    """Something verify() found: the file, the byte position in it, and what is wrong."""

    path: Path
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} at {self.position}: {self.reason}"


def dump_segment(path: Path | str) -> Iterator[dict[str, Any]]:
    """One dict per chunk of a segment file, in file order. A chunk that cannot be parsed
    ends the dump with a dict holding its `position` and the `error`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = seg.header_problem(fd)
        if problem:
            raise CorruptLogError(path, 0, problem)
        try:
            for position, header in _headers(fd):
                body = os.pread(fd, header.body_size, position + header.header_size)
                yield _chunk_dict(position, header, body)
        except BadChunk as exc:
            yield {"position": exc.position, "error": exc.reason}
    finally:
        os.close(fd)


def _headers(fd: int) -> Iterator[tuple[int, ck.ChunkHeader]]:
    """(position, header) of each chunk of an open segment, read by its header alone: unlike
    segment.walk, a chunk whose body is cut short is still yielded, for the caller to judge.
    BadChunk (with its position) at a header that is invalid or cut short."""
    position, size = seg.FIRST_CHUNK_POSITION, os.fstat(fd).st_size
    while position < size:
        header = seg.read_header(fd, position)
        if header is None:
            raise BadChunk("partial chunk header", position)
        yield position, header
        position += header.total_size


def _chunk_dict(position: int, header: ck.ChunkHeader, body: bytes) -> dict[str, Any]:
    try:
        ck.check_body(header, body)
        crc_ok, entries = True, list(decode_entries(ck.trailer_bytes(header, body)))
    except BadChunk:
        crc_ok, entries = False, []
    return {
        "position": position,
        "chunk_type": header.chunk_type,
        "first_offset": header.first_offset,
        "records": header.num_records,
        "timestamp_ms": header.timestamp_ms,
        "epoch": header.epoch,
        "bloom_bytes": header.bloom_size,
        "data_bytes": header.data_size,
        "filter_bytes": header.filter_size,
        "trailer_bytes": header.trailer_size,
        "size": header.total_size,
        "crc_ok": crc_ok,
        "tracking": [
            {"kind": ("publisher", "consumer", "taken")[kind], "name": name, "value": value}
            | ({"count": ref} if kind == 2 else {})
            for kind, name, value, ref in entries
        ],
    }


def dump_index(path: Path | str) -> Iterator[dict[str, Any]]:
    """One dict per entry of an index file. A partial last entry is ignored."""
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = layout.header_problem(
            os.pread(fd, layout.FILE_HEADER_SIZE, 0), layout.INDEX_MAGIC
        )
        if problem:
            raise CorruptLogError(path, 0, problem)
        for block in IndexView(fd).blocks():
            for entry in block:
                yield entry._asdict()
    finally:
        os.close(fd)


def verify(directory: Path | str) -> list[Problem]:
    """Check every chunk's CRCs, the offsets' continuity, and every index entry, in every
    segment. Returns the problems found (empty when the log is sound)."""
    directory = Path(directory)
    problems: list[Problem] = []
    bases = layout.list_bases(directory)
    for base in layout.list_bases(directory, layout.INDEX_SUFFIX):
        if base not in bases:
            problems.append(
                Problem(layout.index_path(directory, base), 0, "index without a segment")
            )
    expected: int | None = None
    for base in bases:
        if expected is not None and base != expected:
            reason = f"segment starts at offset {base}, expected {expected}"
            problems.append(Problem(layout.segment_path(directory, base), 0, reason))
        entries, expected = _verify_segment(directory, base, problems)
        _verify_index(directory, base, entries, problems)
    return problems


def _verify_segment(
    directory: Path, base: int, problems: list[Problem]
) -> tuple[list[IndexEntry], int]:
    """The entries the segment's chunks call for, and the offset after its last record."""
    path = layout.segment_path(directory, base)
    entries: list[IndexEntry] = []
    next_offset = base
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = seg.header_problem(fd)
        if problem:
            problems.append(Problem(path, 0, problem))
            return entries, next_offset
        try:
            for position, header in _headers(fd):
                if header.first_offset != next_offset:
                    reason = f"chunk offset {header.first_offset}, expected {next_offset}"
                    problems.append(Problem(path, position, reason))
                body = os.pread(fd, header.body_size, position + header.header_size)
                try:
                    ck.check_body(header, body)
                except BadChunk as exc:
                    problems.append(Problem(path, position, exc.reason))
                entries.append(seg.entry_for(header, position))
                next_offset = header.next_offset
        except BadChunk as exc:
            problems.append(Problem(path, exc.position or 0, exc.reason))
    finally:
        os.close(fd)
    return entries, next_offset


def _verify_index(
    directory: Path, base: int, expected: list[IndexEntry], problems: list[Problem]
) -> None:
    path = layout.index_path(directory, base)
    try:
        found = list(dump_index(path))
    except FileNotFoundError:
        problems.append(Problem(path, 0, "index is missing"))
        return
    except CorruptLogError as exc:
        problems.append(Problem(path, 0, exc.reason))
        return
    if (os.path.getsize(path) - layout.FILE_HEADER_SIZE) % ENTRY_SIZE:
        problems.append(Problem(path, os.path.getsize(path), "partial index entry"))
    for i, entry in enumerate(expected):
        if i >= len(found):
            problems.append(Problem(path, _entry_at(i), f"{len(expected) - i} entries missing"))
            return
        if IndexEntry(**found[i]) != entry:
            problems.append(Problem(path, _entry_at(i), f"entry {i} does not match its chunk"))
    if len(found) > len(expected):
        problems.append(Problem(path, _entry_at(len(expected)), "entries past the last chunk"))


def _entry_at(i: int) -> int:
    return layout.FILE_HEADER_SIZE + i * ENTRY_SIZE


def summarise(directory: Path | str) -> dict[str, Any]:
    """first, last and next offsets, the segments, bytes and tracking, read without repair.
    Every whole indexed chunk counts as committed."""
    directory = Path(directory)
    segments: list[seg.SegmentInfo] = []
    tracking = TrackingState()
    bases = layout.list_bases(directory)
    for base in bases:
        segments.append(_survey(directory, base, tracking if base == bases[-1] else None))
    committed = segments[-1].next_offset - 1 if segments else -1
    return describe(directory, segments, tracking.public(), committed)


def _survey(directory: Path, base: int, tracking: TrackingState | None) -> seg.SegmentInfo:
    """A segment as recovery would keep it (up to its last whole indexed chunk), read only."""
    path = layout.segment_path(directory, base)
    fd = os.open(path, os.O_RDONLY)
    ifd = None
    try:
        entries: Bisectable
        try:
            ifd = os.open(layout.index_path(directory, base), os.O_RDONLY)
            entries = IndexView(ifd)
        except FileNotFoundError:
            entries = seg.memory_index(fd)
        count, last, header = recovery.last_good_entry(fd, entries, os.fstat(fd).st_size)
        info = seg.SegmentInfo(base, seg.FIRST_CHUNK_POSITION, base, 0)
        if last is not None and header is not None:
            end = last.position + header.total_size
            first_ts = entries[0].timestamp_ms
            info = seg.SegmentInfo(
                base, end, header.next_offset, count, first_ts, header.timestamp_ms
            )
        if tracking is not None:
            kept = IndexView(ifd, count) if ifd is not None else MemoryIndex(list(entries)[:count])
            for block in kept.blocks():
                recovery.apply_trailers(path, fd, block, tracking)
        return info
    finally:
        os.close(fd)
        if ifd is not None:
            os.close(ifd)


def describe(
    directory: Path, segments: Sequence[seg.SegmentInfo], tracking: Tracking, committed: int
) -> dict[str, Any]:
    """The summary dict shared by Log.summary() and summarise()."""
    first = segments[0].base if segments else 0
    next_offset = segments[-1].next_offset if segments else 0
    return {
        "directory": str(directory),
        "first_offset": first,
        "last_offset": next_offset - 1,
        "next_offset": next_offset,
        "committed_offset": committed,
        "records": next_offset - first,
        "bytes": sum(s.size for s in segments),
        "segments": [
            {
                "file": layout.file_name(s.base, layout.SEGMENT_SUFFIX),
                "first_offset": s.base,
                "next_offset": s.next_offset,
                "bytes": s.size,
                "chunks": s.chunks,
                "first_timestamp_ms": s.first_timestamp_ms,
                "last_timestamp_ms": s.last_timestamp_ms,
            }
            for s in segments
        ],
        "tracking": {
            "publishers": dict(tracking.publishers),
            "consumers": dict(tracking.consumers),
        },
    }
