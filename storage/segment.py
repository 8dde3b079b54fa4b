"""Segment files: create them, and read whole chunks out of them at known positions.

Role: the file-level primitives shared by the writer, recovery, readers and inspection: create a
segment and its index (with their headers), read and check the chunk header or the whole chunk
at a position, and walk a segment chunk by chunk. SegmentInfo is the little a log remembers
about each segment (no per-chunk state, so memory does not grow with the log).

Must not know: offset specs, retention or tracking policy, fsync policy.
Threading: stateless functions over file descriptors (pread only); SegmentInfo is a plain
record owned by one Log.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from leveret.storage import layout
from leveret.storage.chunk import (
    MAX_HEADER_SIZE,
    ChunkHeader,
    check_body,
    decode_header,
    header_length,
)
from leveret.storage.errors import BadChunk, LogIOError, io_error
from leveret.storage.index import FLAG_TRAILER, IndexEntry, MemoryIndex
from leveret.storage.index import encode_entry as encode_index_entry

FIRST_CHUNK_POSITION = layout.FILE_HEADER_SIZE


@dataclass
class SegmentInfo:
    """What a log keeps in memory about one segment."""

    base: int  # the first offset it can hold (its name)
    size: int  # bytes in the segment file
    next_offset: int  # the offset after its last record (== base if it holds none)
    chunks: int
    first_timestamp_ms: int | None = None
    last_timestamp_ms: int | None = None
    last_epoch: int = 0  # the epoch of its last chunk

    def add(self, header: ChunkHeader) -> None:
        """Account for one more chunk written at the end of the segment."""
        self.last_epoch = header.epoch
        self.size += header.total_size
        self.chunks += 1
        self.next_offset = header.next_offset
        if self.first_timestamp_ms is None:
            self.first_timestamp_ms = header.timestamp_ms
        self.last_timestamp_ms = header.timestamp_ms


def entry_for(header: ChunkHeader, position: int) -> IndexEntry:
    flags = FLAG_TRAILER if header.trailer_size else 0
    return IndexEntry(
        header.first_offset,
        header.timestamp_ms,
        position,
        header.num_records,
        header.chunk_type,
        flags,
    )


def index_entry(header: ChunkHeader, position: int) -> bytes:
    return encode_index_entry(entry_for(header, position))


def create(directory: Path, base: int, durable: bool) -> tuple[int, int]:
    """Create an empty segment and index named by `base`; return their append descriptors.
    Nothing is left behind if it fails."""
    seg = layout.segment_path(directory, base)
    idx = layout.index_path(directory, base)
    fds: list[int] = []
    try:
        for path, magic in ((seg, layout.SEGMENT_MAGIC), (idx, layout.INDEX_MAGIC)):
            current = path
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            fds.append(fd)
            os.write(fd, layout.file_header(magic))
            if durable:
                os.fdatasync(fd)
        if durable:
            sync_directory(directory)
    except OSError as exc:
        for fd, path in zip(fds, (seg, idx)[: len(fds)], strict=True):
            os.close(fd)
            with contextlib.suppress(LogIOError):  # the first error is the one to report
                remove(path)
        raise io_error(current, exc) from exc
    return fds[0], fds[1]


def open_append(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_APPEND)
    except OSError as exc:
        raise io_error(path, exc) from exc


def sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Write all of `data` (one os.write unless the kernel takes less; then the rest)."""
    view = memoryview(data)
    written = os.write(fd, view)
    while written < len(view):
        written += os.write(fd, view[written:])


def remove(path: Path) -> None:
    """Delete a file of the log; one that is already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise io_error(path, exc) from exc


def read_header(fd: int, position: int) -> ChunkHeader | None:
    """The checked header of the chunk at `position`; None if the file ends before it is whole."""
    data = os.pread(fd, MAX_HEADER_SIZE, position)
    if len(data) < header_length(data):
        return None
    try:
        return decode_header(data)
    except BadChunk as exc:
        raise BadChunk(exc.reason, position) from None


def read_chunk(fd: int, position: int) -> tuple[ChunkHeader, bytes] | None:
    """The checked header and body (CRC verified) of the chunk at `position`; None if the
    file ends before its header. BadChunk (with the position) if it is partial or corrupt."""
    header = read_header(fd, position)
    if header is None:
        return None
    body = os.pread(fd, header.body_size, position + header.header_size)
    try:
        check_body(header, body)
    except BadChunk as exc:
        raise BadChunk(exc.reason, position) from None
    return header, body


def walk(
    fd: int,
    position: int,
    *,
    verify: bool,
    next_offset: int | None = None,
    last_timestamp_ms: int | None = None,
) -> Iterator[tuple[int, ChunkHeader]]:
    """(position, header) of each whole chunk from `position` to the end of the file.

    BadChunk (with its position) at the first chunk that is invalid or partial, whose body
    CRC fails (when `verify`), or that does not continue `next_offset` / `last_timestamp_ms`.
    """
    size = os.fstat(fd).st_size
    while position < size:
        if verify:
            found = read_chunk(fd, position)
            header = found[0] if found else None
        else:
            header = read_header(fd, position)
        if header is None or position + header.total_size > size:
            raise BadChunk("partial chunk", position)
        if next_offset is not None and header.first_offset != next_offset:
            raise BadChunk(f"chunk offset {header.first_offset}, expected {next_offset}", position)
        if last_timestamp_ms is not None and header.timestamp_ms < last_timestamp_ms:
            raise BadChunk("chunk timestamp goes backwards", position)
        yield position, header
        next_offset, last_timestamp_ms = header.next_offset, header.timestamp_ms
        position += header.total_size


def header_problem(fd: int) -> str | None:
    return layout.header_problem(os.pread(fd, layout.FILE_HEADER_SIZE, 0), layout.SEGMENT_MAGIC)


def memory_index(fd: int) -> MemoryIndex:
    """An index built by walking the chunk headers, up to the first chunk that is not whole."""
    entries = []
    try:
        for position, header in walk(fd, FIRST_CHUNK_POSITION, verify=False):
            entries.append(entry_for(header, position))
    except BadChunk:
        pass
    return MemoryIndex(entries)
