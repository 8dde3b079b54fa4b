"""One member's copy of a stream, read from its segment files as they lie on disk.

Role: give the checker each member's log without asking the broker: every chunk in file order
(its type, epoch, first offset, record count and exact bytes) and every record with its offset.
It walks the segment files of the stream's folder by their chunk headers (the layout in
docs/FORMAT.md; leveret.storage's segment and chunk functions), checks each chunk's CRC, and
stops at the first chunk that is cut short (a write in progress). A chunk whose CRC fails is
kept, marked, for the checker to report.

Must not know: brokers, AMQP, what a record means (the workload decodes records).
Threading: pure reads; call it after the round's clients have stopped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from leveret.storage import chunk as ck
from leveret.storage import layout
from leveret.storage import segment as seg
from leveret.storage.errors import BadChunk


@dataclass(frozen=True)
class StoredChunk:
    chunk_type: int
    epoch: int
    first_offset: int
    num_records: int
    raw: bytes  # the whole chunk, header and body, as on disk
    records: tuple[bytes, ...]  # empty for tracking chunks
    crc_ok: bool = True

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records

    def committed_by(self, committed: int) -> bool:
        """Whether a reader bound by `committed` may see this chunk (storage's rule)."""
        return ck.is_committed(self.first_offset, self.num_records, committed)


@dataclass
class StoredLog:
    """A member's log: its chunks in file order, and where the files said something odd."""

    chunks: list[StoredChunk] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def next_offset(self) -> int:
        return max((c.next_offset for c in self.chunks), default=0)

    def entries(self) -> Iterator[tuple[int, bytes]]:
        """(offset, record) of every record, in offset order."""
        for chunk in self.chunks:
            if ck.takes_offsets(chunk.chunk_type):
                for i, record in enumerate(chunk.records):
                    yield chunk.first_offset + i, record

    def committed_chunks(self, committed: int) -> list[StoredChunk]:
        """The chunks a reader bound by `committed` sees: a prefix of the log."""
        out = []
        for chunk in self.chunks:
            if not chunk.committed_by(committed):
                break
            out.append(chunk)
        return out


def read_log(directory: Path) -> StoredLog:
    """Every chunk of every segment in `directory`, in offset order."""
    log = StoredLog()
    if not directory.is_dir():
        log.problems.append(f"{directory} does not exist")
        return log
    for base in layout.list_bases(directory):
        path = layout.segment_path(directory, base)
        log.chunks.extend(_segment_chunks(path, log.problems))
    return log


def _segment_chunks(path: Path, problems: list[str]) -> Iterator[StoredChunk]:
    fd = os.open(path, os.O_RDONLY)
    try:
        problem = seg.header_problem(fd)
        if problem:
            problems.append(f"{path.name}: {problem}")
            return
        position, size = seg.FIRST_CHUNK_POSITION, os.fstat(fd).st_size
        while position < size:
            try:
                header = seg.read_header(fd, position)
            except BadChunk as exc:
                problems.append(f"{path.name} at {position}: {exc.reason}")
                return
            if header is None or position + header.total_size > size:
                return  # a chunk still being written: not part of the log yet
            raw = os.pread(fd, header.total_size, position)
            yield _chunk(header, raw, problems, f"{path.name} at {position}")
            position += header.total_size
    finally:
        os.close(fd)


def _chunk(header: ck.ChunkHeader, raw: bytes, problems: list[str], where: str) -> StoredChunk:
    body = raw[header.header_size:]
    crc_ok = True
    records: tuple[bytes, ...] = ()
    try:
        ck.check_body(header, body)
        if ck.takes_offsets(header.chunk_type):
            records = tuple(ck.decode_records(header, body))
    except BadChunk as exc:
        crc_ok = False
        problems.append(f"{where}: {exc.reason}")
    return StoredChunk(header.chunk_type, header.epoch, header.first_offset, header.num_records,
                       raw, records, crc_ok)
