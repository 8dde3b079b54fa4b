"""Recovery when a log is opened: find what is whole, repair the tail, rebuild indexes, reload
tracking (docs/FORMAT.md section 7).

Role: turn whatever a crash left in a directory into a consistent list of SegmentInfo plus the
tracking state. The active (last) segment is checked chunk by chunk from its last good index
entry and a torn or corrupt tail is truncated; older segments are checked cheaply through their
index (first and last entries against the chunk headers) and their index is rebuilt when it is
missing or disagrees. Damage in the middle of the log raises CorruptLogError. Index files are
caches; segment data is the truth.

Must not know: the write path, fsync policy, readers, retention.
Threading: runs once in Log.open (or inspect), on the caller's thread, before any reader exists.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from leveret.storage import layout
from leveret.storage import segment as seg
from leveret.storage.chunk import ChunkHeader
from leveret.storage.errors import BadChunk, CorruptLogError, io_error
from leveret.storage.index import ENTRY_SIZE, Bisectable, IndexEntry, IndexView, entry_position
from leveret.storage.tracking import TrackingState

log = logging.getLogger("leveret.storage.recovery")


@dataclass
class Recovered:
    segments: list[seg.SegmentInfo] = field(default_factory=list)
    tracking: TrackingState = field(default_factory=TrackingState)


def recover(directory: Path) -> Recovered:
    """Repair the log in `directory` and describe it. The directory must exist."""
    bases = layout.list_bases(directory)
    _delete_orphan_indexes(directory, set(bases))
    active: seg.SegmentInfo | None = None
    while bases:
        active = repair_active(directory, bases[-1])
        if active.chunks or len(bases) == 1:
            break
        log.warning("deleted empty last segment %s", layout.segment_path(directory, bases[-1]))
        _delete_segment(directory, bases.pop())
    if active is None:
        return Recovered()
    segments = [check_sealed(directory, base) for base in bases[:-1]]
    segments.append(active)
    check_continuity(directory, segments)
    return Recovered(segments, load_tracking(directory, active.base))


def _delete_orphan_indexes(directory: Path, segment_bases: set[int]) -> None:
    for base in layout.list_bases(directory, layout.INDEX_SUFFIX):
        if base not in segment_bases:
            path = layout.index_path(directory, base)
            log.warning("deleted index without a segment %s", path)
            seg.remove(path)


def _delete_segment(directory: Path, base: int) -> None:
    seg.remove(layout.segment_path(directory, base))
    seg.remove(layout.index_path(directory, base))


def check_continuity(directory: Path, segments: list[seg.SegmentInfo]) -> None:
    for older, newer in itertools.pairwise(segments):
        if older.next_offset != newer.base:
            path = layout.segment_path(directory, older.base)
            reason = (
                f"ends at offset {older.next_offset} but the next segment starts at {newer.base}"
            )
            raise CorruptLogError(path, older.size, reason)


# -- the active segment --------------------------------------------------------------------


def repair_active(directory: Path, base: int) -> seg.SegmentInfo:
    """Check the last segment chunk by chunk from its last good index entry; truncate a torn
    or corrupt tail; re-index chunks the index missed."""
    seg_path = layout.segment_path(directory, base)
    idx_path = layout.index_path(directory, base)
    try:
        fd = os.open(seg_path, os.O_RDWR)
        ifd = os.open(idx_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise io_error(seg_path, exc) from exc
    try:
        return _repair_active(seg_path, idx_path, fd, ifd, base)
    except OSError as exc:
        raise io_error(seg_path, exc) from exc
    finally:
        os.close(fd)
        os.close(ifd)


def _repair_active(seg_path: Path, idx_path: Path, fd: int, ifd: int, base: int) -> seg.SegmentInfo:
    size = os.fstat(fd).st_size
    if size < layout.FILE_HEADER_SIZE:
        log.warning("reset segment %s with a torn file header", seg_path)
        _reset(fd, layout.SEGMENT_MAGIC)
        size = layout.FILE_HEADER_SIZE
    problem = seg.header_problem(fd)
    if problem:
        raise CorruptLogError(seg_path, 0, problem)
    if layout.header_problem(os.pread(ifd, layout.FILE_HEADER_SIZE, 0), layout.INDEX_MAGIC):
        log.warning("index %s is missing or damaged; rebuilding it from its segment", idx_path)
        _reset(ifd, layout.INDEX_MAGIC)
    index = IndexView(ifd)
    kept, last, header = last_good_entry(fd, index, size)
    info = seg.SegmentInfo(base, seg.FIRST_CHUNK_POSITION, base, 0)
    if last is not None and header is not None:
        end = last.position + header.total_size
        info = seg.SegmentInfo(
            base, end, header.next_offset, kept, index[0].timestamp_ms, header.timestamp_ms,
            header.epoch,
        )
    os.ftruncate(ifd, entry_position(kept))
    _reindex_tail(seg_path, fd, ifd, info)
    return info


def truncate_from(directory: Path, bases: list[int], offset: int) -> None:
    """Cut the log so that no chunk's records start at `offset` or later: later segments are
    deleted (the first one is emptied instead), and the segment holding `offset` is cut, with
    its index, at its first such chunk. The caller loads the log again afterwards."""
    keep = [b for b in bases if b < offset] or bases[:1]
    for base in bases[len(keep):]:
        _delete_segment(directory, base)
    base = keep[-1]
    seg_path, idx_path = layout.segment_path(directory, base), layout.index_path(directory, base)
    fd = os.open(seg_path, os.O_RDWR)
    try:
        entries: Bisectable = seg.memory_index(fd)  # the segment is the truth
        i = next((k for k, e in enumerate(entries) if e.first_offset >= offset), len(entries))
        if i < len(entries):
            os.ftruncate(fd, entries[i].position)
            os.fsync(fd)
        with contextlib.suppress(FileNotFoundError):  # recovery rebuilds a missing index
            os.truncate(idx_path, min(os.path.getsize(idx_path), entry_position(i)))
    except OSError as exc:
        raise io_error(seg_path, exc) from exc
    finally:
        os.close(fd)


def _reset(fd: int, magic: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, layout.file_header(magic), 0)


def last_good_entry(
    fd: int, index: Bisectable, size: int
) -> tuple[int, IndexEntry | None, ChunkHeader | None]:
    """(entries to keep, the last kept entry, its chunk's header): the last entry whose chunk
    is whole and agrees with it."""
    for i in range(len(index) - 1, -1, -1):
        entry = index[i]
        if not seg.FIRST_CHUNK_POSITION <= entry.position < size:
            continue
        try:
            found = seg.read_chunk(fd, entry.position)
        except BadChunk:
            continue
        if found is not None and seg.entry_for(found[0], entry.position) == entry:
            return i + 1, entry, found[0]
    return 0, None, None


def _reindex_tail(seg_path: Path, fd: int, ifd: int, info: seg.SegmentInfo) -> None:
    """Walk from the end of the last indexed chunk; index each whole chunk; truncate the rest."""
    entries = []
    chunks = seg.walk(
        fd,
        info.size,
        verify=True,
        next_offset=info.next_offset,
        last_timestamp_ms=info.last_timestamp_ms,
    )
    try:
        for position, header in chunks:
            entries.append(seg.index_entry(header, position))
            info.add(header)
    except BadChunk as exc:
        log.warning("truncated torn tail of %s at %d: %s", seg_path, exc.position, exc.reason)
        os.ftruncate(fd, info.size)
    if entries:
        os.pwrite(ifd, b"".join(entries), os.fstat(ifd).st_size)


# -- older segments ---------------------------------------------------------------------------


def check_sealed(directory: Path, base: int) -> seg.SegmentInfo:
    """Describe an older segment from its index, checked cheaply against the segment; rebuild
    the index from the segment's chunk headers if it is missing or disagrees. Damage in the
    segment itself raises CorruptLogError."""
    seg_path = layout.segment_path(directory, base)
    try:
        fd = os.open(seg_path, os.O_RDONLY)
    except OSError as exc:
        raise io_error(seg_path, exc) from exc
    try:
        problem = seg.header_problem(fd)
        if problem:
            raise CorruptLogError(seg_path, 0, problem)
        size = os.fstat(fd).st_size
        info = _sealed_info_from_index(directory, base, fd, size)
        if info is None:
            info = _rebuild_index(directory, base, fd)
        return info
    except OSError as exc:
        raise io_error(seg_path, exc) from exc
    finally:
        os.close(fd)


def _sealed_info_from_index(
    directory: Path, base: int, fd: int, size: int
) -> seg.SegmentInfo | None:
    idx_path = layout.index_path(directory, base)
    try:
        ifd = os.open(idx_path, os.O_RDONLY)
    except FileNotFoundError:
        log.warning("index %s is missing", idx_path)
        return None
    try:
        isize = os.fstat(ifd).st_size
        bad = layout.header_problem(os.pread(ifd, layout.FILE_HEADER_SIZE, 0), layout.INDEX_MAGIC)
        if (
            bad
            or (isize - layout.FILE_HEADER_SIZE) % ENTRY_SIZE
            or isize == layout.FILE_HEADER_SIZE
        ):
            log.warning("index %s is damaged", idx_path)
            return None
        index = IndexView(ifd)
        first, last = index[0], index[-1]
        try:
            header = seg.read_header(fd, last.position)
        except BadChunk:
            header = None
        if (
            first.position != seg.FIRST_CHUNK_POSITION
            or first.first_offset != base
            or header is None
            or seg.entry_for(header, last.position) != last
            or last.position + header.total_size != size
        ):
            log.warning("index %s disagrees with its segment", idx_path)
            return None
        return seg.SegmentInfo(
            base, size, header.next_offset, len(index), first.timestamp_ms, last.timestamp_ms,
            header.epoch,
        )
    finally:
        os.close(ifd)


def _rebuild_index(directory: Path, base: int, fd: int) -> seg.SegmentInfo:
    seg_path = layout.segment_path(directory, base)
    info = seg.SegmentInfo(base, seg.FIRST_CHUNK_POSITION, base, 0)
    entries = [layout.file_header(layout.INDEX_MAGIC)]
    try:
        for position, header in seg.walk(fd, info.size, verify=False, next_offset=base):
            entries.append(seg.index_entry(header, position))
            info.add(header)
    except BadChunk as exc:
        raise CorruptLogError(seg_path, exc.position or 0, exc.reason) from None
    if not info.chunks:
        raise CorruptLogError(seg_path, info.size, "an older segment holds no chunks")
    idx_path = layout.index_path(directory, base)
    _write_file(idx_path, b"".join(entries))
    log.warning("rebuilt index %s from its segment", idx_path)
    return info


def _write_file(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            seg.write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise io_error(path, exc) from exc


# -- tracking ---------------------------------------------------------------------------------


def load_tracking(directory: Path, base: int) -> TrackingState:
    """The tracking state: every trailer of the active segment, applied in file order."""
    seg_path = layout.segment_path(directory, base)
    state = TrackingState()
    fd = os.open(seg_path, os.O_RDONLY)
    ifd = os.open(layout.index_path(directory, base), os.O_RDONLY)
    try:
        for block in IndexView(ifd).blocks():
            apply_trailers(seg_path, fd, block, state)
    finally:
        os.close(fd)
        os.close(ifd)
    return state


def apply_trailers(
    seg_path: Path, fd: int, entries: Iterable[IndexEntry], state: TrackingState
) -> None:
    for entry in entries:
        if not entry.has_trailer:
            continue
        try:
            header = seg.read_header(fd, entry.position)
            if header is None:
                raise BadChunk("partial chunk", entry.position)
            at = entry.position + header.header_size + header.trailer_start
            trailer = os.pread(fd, header.trailer_size, at)
            state.apply(header.chunk_type, trailer)
        except BadChunk as exc:
            raise CorruptLogError(seg_path, entry.position, exc.reason) from None
