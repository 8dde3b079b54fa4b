"""The Log: the single writer of a log directory.

Role: open (and recover) a directory, append one chunk per call, roll segments (writing the
tracking snapshot first in each new one), advance the committed offset according to the fsync
policy, apply retention, keep tracking state, and hand out readers. A failed write is undone
(truncated) before the error is raised, so committed never covers a half-written chunk.

Must not know: AMQP, asyncio, the broker's messages. Readers are independent: they read the
files and share only `committed_offset` (through a callable) with the writer.
Threading: one thread owns a Log and calls every method; nothing here is thread-safe. An
exclusive flock on the directory keeps other Log objects (and processes) from writing to it;
with `LogConfig.folder_lock` False the owner holds one lock over all its folders (the broker:
on its queues folder) and a second Log of the folder in this process is refused all the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from leveret.storage import chunk as ck
from leveret.storage import fence, inspect, layout, recovery, retention, shipping, tracking, wal
from leveret.storage import segment as seg
from leveret.storage.cache import ChunkCache
from leveret.storage.config import LogConfig, check_retention
from leveret.storage.errors import (
    BadChunk,
    LogClosedError,
    LogIOError,
    LogLockedError,
    StorageError,
    io_error,
)
from leveret.storage.index import entry_position
from leveret.storage.locate import OffsetSpec
from leveret.storage.reader import Reader, ReaderFilter
from leveret.storage.tracking import Tracking

log = logging.getLogger("leveret.storage.log")
_UNCHANGED: Any = object()
# A shipping log keeps its newest chunks in memory too, so that a leader ships what it just
# wrote without opening and reading the segment again: at most this many, of at most this
# many bytes in all (a chunk bigger than that is read back from the file).
RECENT_CHUNKS = 16
RECENT_BYTES = 256 * 1024


class SyncTicket:
    """An fsync of a log's active segment that may run on any thread. A held ticket has its
    own duplicate of the file's descriptor (open for reading too), so a roll, a close or a
    release of the log's files meanwhile (storage/openlogs.py) cannot close it under the
    fdatasync; a ticket taken with `hold` False has none, for a round that syncs the whole file
    system (syncfs, by a descriptor of its own that sees every writeback error there). `run`
    once (or have a syncer make its bytes durable otherwise, then `covered`), then hand it to
    the log's `synced`.

    `start`..`end` is the byte range of the segment written since the log last knew it durable
    (`start` None when it does not know: its first sync since it was opened), for a syncer that
    copies those bytes to a write-ahead log (storage/wal.py) instead of fsyncing the segment."""

    __slots__ = ("_device", "_fd", "base", "end", "error", "folder", "generation", "offset",
                 "path", "start")

    def __init__(self, fd: int, offset: int, generation: int, path: Path, device: int, *,
                 base: int = 0, start: int | None = None, end: int = 0,
                 folder: str = "") -> None:
        self._fd = fd  # -1: not held
        self._device = device
        self.offset = offset  # the last offset written when it was taken
        self.generation = generation
        self.path = path
        self.base = base  # the segment's base offset
        self.start = start
        self.end = end
        self.folder = folder  # the log's folder (realpath): its key in the WAL
        self.error: OSError | None = None

    def run(self) -> None:
        """fdatasync the segment (on any thread); an error is kept for `synced`. A ticket
        that holds no descriptor opens the file for it (a syncfs round that failed and
        fdatasyncs each log: a writeback error nobody has seen is reported to a descriptor
        opened after it, and the log's own descriptors never fsync under this policy)."""
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDONLY)
            os.fdatasync(self._fd)
        except OSError as exc:
            self.error = exc
        finally:
            self.release()

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def device(self) -> int:
        """The file system the segment is on (st_dev), for a sync of that whole file system."""
        return self._device

    def read(self) -> bytes | None:
        """(On any thread.) The bytes of `start`..`end`; None if they cannot all be read (the
        syncer then fsyncs the segment instead)."""
        if self.start is None or self._fd < 0:
            return None
        try:
            data = os.pread(self._fd, self.end - self.start, self.start)
        except OSError:
            return None
        return data if len(data) == self.end - self.start else None

    def covered(self) -> None:
        """A sync that covers the ticket's bytes (a syncfs of the segment's file system, or a
        write-ahead log's fdatasync), begun after this ticket was taken, ended without error:
        what it covers is durable; release the descriptor."""
        self.release()

    def release(self) -> None:
        """Close the ticket's descriptor, if it holds one (`run` then opens the segment by
        its path)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


_UNLOCKED_OPEN: set[str] = set()  # folders of this process's logs opened without a flock


def _release(lock_fd: int, key: str) -> None:
    """A log's folder is free again: its flock's descriptor closed, or its entry removed."""
    if lock_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(lock_fd)
    else:
        _UNLOCKED_OPEN.discard(key)


class Log:
    """An append-only log in one directory. Build it with Log.open(directory, config)."""

    def __init__(self, directory: Path, config: LogConfig, lock_fd: int):
        self._dir = directory
        self._cache = ChunkCache()
        self._config = config
        self._lock_fd = lock_fd  # -1: no flock of its own (LogConfig.folder_lock False)
        self._open_key = ""  # its folder, as Log.open registered it
        # the process's cap on logs with open files (None: the files stay open); -1 below
        # is a file released under that cap, reopened when next needed (_files)
        self._open_logs = config.open_logs
        self._fd = self._ifd = -1
        # (segment base, size) when the last sync ticket was taken: while it is the active
        # segment's, what is written is covered by that ticket's round
        self._ticketed: tuple[int, int] | None = None
        self._max_length_bytes = config.max_length_bytes
        self._max_age_ms = config.max_age_ms
        self._load()

    def _load(self) -> None:
        """Recover the directory and take its state: at open, and after truncate_from."""
        directory, config = self._dir, self._config
        found = recovery.recover(directory)
        self._segments = found.segments
        self._tracking = found.tracking
        if not self._segments:
            self._fd, self._ifd = seg.create(directory, 0, self._durable)
            self._segments.append(seg.SegmentInfo(0, seg.FIRST_CHUNK_POSITION, 0, 0))
        else:
            self._fd, self._ifd = self._open_active()
        self._device = os.fstat(self._fd).st_dev
        self._ticketed = None
        self._next = self._segments[-1].next_offset
        self._committed = self._next - 1
        stamps = [s.last_timestamp_ms for s in self._segments if s.last_timestamp_ms is not None]
        self._last_ts = stamps[-1] if stamps else 0
        epochs = [s.last_epoch for s in self._segments if s.chunks]
        self._last_epoch = epochs[-1] if epochs else 0  # the epoch of the last chunk written
        self._epoch = self._last_epoch  # the epoch new chunks are stamped with
        self._fence = fence.read(directory)
        self._last_sync_ms = config.clock()
        self._unsynced = False
        # the active segment's size known durable (in place, or in a write-ahead log); None
        # until its first fsync since the log was loaded (what recovery found may be only in
        # the page cache of a process that was killed)
        self._durable_size: int | None = None
        self._generation = getattr(self, "_generation", 0) + 1  # a SyncTicket's log state
        # (segment base, position, the chunk's bytes, its next offset), oldest first; kept
        # only once the log ships (read_chunks), so a replica or a lone log pays nothing
        self._recent: deque[tuple[int, int, bytes | bytearray, int]] = deque()
        self._recent_bytes = 0
        self._ships = getattr(self, "_ships", False)
        self._snapshot_due = False
        self._broken: LogIOError | None = None
        self._closed = False
        if self._open_logs is not None:
            self._open_logs.opened(self)

    def _open_active(self) -> tuple[int, int]:
        """Append descriptors of the active segment and its index (seg.open_append)."""
        active = self._segments[-1].base
        fd = seg.open_append(layout.segment_path(self._dir, active))
        try:
            ifd = seg.open_append(layout.index_path(self._dir, active))
        except LogIOError:
            os.close(fd)
            raise
        return fd, ifd

    def _files(self) -> tuple[int, int]:
        """The active segment's and index's descriptors, reopened if they were released."""
        if self._fd < 0:
            self._fd, self._ifd = self._open_active()
            if self._open_logs is not None:
                self._open_logs.opened(self)
        elif self._open_logs is not None:
            self._open_logs.used(self)
        return self._fd, self._ifd

    def _close_files(self) -> None:
        fds, self._fd, self._ifd = (self._fd, self._ifd), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):  # nothing is left to flush: writes were direct
                    os.close(fd)
        if self._open_logs is not None:
            self._open_logs.closed(self)

    @property
    def files_open(self) -> bool:
        """Whether the active segment's and index's descriptors are open now."""
        return self._fd >= 0

    def release_files(self, sync: bool = False) -> bool:
        """Close the active segment's and index's descriptors, to be reopened when next
        needed (storage/openlogs.py asks). Refused (False) while something written is not
        durable yet and no sync ticket taken since covers it (closing a descriptor must never
        be what decides whether a write is made durable or its error seen), unless `sync`:
        then it is fsynced and committed first (on this thread), and refused only if that
        fails (the log is broken then)."""
        if self._fd < 0:
            return True
        if self._unsynced and self._ticketed != self._written_to():
            if not sync or self._broken is not None:
                return False
            try:
                self._sync()
            except StorageError:
                return False
        self._close_files()
        return True

    def _over_cap(self) -> None:
        """What this log wrote no longer needs its files (a ticket covers it, or it is
        synced): release them if the process's open logs are past their target."""
        if self._open_logs is not None and self._open_logs.over and self.release_files():
            self._open_logs.released += 1

    def _written_to(self) -> tuple[int, int]:
        active = self._segments[-1]
        return active.base, active.size

    @classmethod
    def open(cls, directory: Path | str, config: LogConfig | None = None) -> Log:
        """Open the log in `directory` (created if missing), recovering from a crash."""
        directory = Path(directory)
        config = config or LogConfig()
        try:
            made = not directory.is_dir()
            directory.mkdir(parents=True, exist_ok=True)
            if made and config.fsync != "never":  # its name durable in its parent, as its
                seg.sync_directory(directory.parent)  # files are in it (seg.create)
            lock_fd = (os.open(directory, os.O_RDONLY | os.O_DIRECTORY) if config.folder_lock
                       else -1)
            key = os.path.realpath(directory)
        except OSError as exc:
            raise io_error(directory, exc) from exc
        if lock_fd >= 0:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock_fd)
                raise LogLockedError(directory) from None
        elif key in _UNLOCKED_OPEN:  # (the owner's lock keeps other processes out)
            raise LogLockedError(directory)
        else:
            _UNLOCKED_OPEN.add(key)
        try:
            opened = cls(directory, config, lock_fd)
            opened._retain_or_warn()
        except BaseException:
            _release(lock_fd, key)
            raise
        opened._open_key = key
        return opened

    # -- offsets ---------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def first_offset(self) -> int:
        """The first offset still on disk (== next_offset when the log holds no record)."""
        return self._segments[0].base

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def last_offset(self) -> int:
        return self._next - 1

    @property
    def empty(self) -> bool:
        """No chunk at all (a tracking chunk counts)."""
        return not any(segment.chunks for segment in self._segments)

    @property
    def committed_offset(self) -> int:
        return self._committed

    # -- epochs ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch every chunk appended from now on is stamped with (docs/FORMAT.md 3.1)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """A new writer term (a stream's leader after an election). Epochs never go back."""
        if epoch < self._last_epoch:
            raise ValueError(f"epoch {epoch} is older than the log's last epoch "
                             f"{self._last_epoch}")
        self._epoch = epoch

    def epoch_end(self, epoch: int) -> int:
        """The offset after this log's last chunk of `epoch` or an older one: a replica whose
        last epoch is `epoch` agrees with this log up to there (and truncates after it)."""
        self._check_open()
        return shipping.epoch_end(self._dir, epoch, self._next)

    def epoch_ranges(self) -> list[tuple[int, int]]:
        """Each epoch of this log's chunks, oldest first, with the offset after its last chunk
        (shipping.epoch_ranges): what a replica sends its leader on a sync."""
        self._check_open()
        return shipping.epoch_ranges(self._dir, self._next)

    def mark_epoch(self) -> None:
        """Write an empty tracking chunk (it takes no offset) stamped with the current epoch: a
        new leader's first chunk, which a quorum must hold before anything it inherited counts
        as committed (docs/REPLICATION.md, "Commit rule")."""
        self._check_writable()
        self._write_chunk(ck.encode_chunk(ck.ChunkType.TRACKING_DELTA, self._next,
                                          self._timestamp(), [], epoch=self._epoch))

    @property
    def fence(self) -> int:
        """The oldest leader epoch this member takes chunks from (storage/fence.py)."""
        return self._fence

    def raise_fence(self, epoch: int) -> None:
        """Refuse every epoch older than `epoch` from now on, durably. Fences never go back."""
        self._check_writable()
        if epoch > self._fence:
            fence.write(self._dir, epoch)
            self._fence = epoch

    @property
    def tail(self) -> tuple[int, int]:
        """(epoch of the last chunk, next offset): how advanced this log is. Of two logs, the
        one with the greater tail holds more of what its leaders wrote (an election's order)."""
        return self._last_epoch, self._next

    # -- writing ---------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[bytes],
        filter_values: Sequence[bytes | None] | None = None,
        publishers: Mapping[bytes, int] | None = None,
        chunk_type: int = ck.ChunkType.USER,
        records_crc: bool = False,
        taken: Sequence[tuple[bytes, int]] | None = None,
    ) -> int:
        """Write `records` as one chunk; return the offset of the first one.

        With no records but some publishers, only the publishers' ids are stored, in a tracking
        chunk that takes no offset (the return value is then the next offset). With
        `records_crc`, the chunk also keeps the zlib CRC-32 of its record bytes
        (ChunkView.records_crc; docs/FORMAT.md 3.1, version 3). `taken`: marks taken, (name,
        value), kept in the chunk's trailer with it (`taken()`; only with records)."""
        self._check_writable()
        if not ck.takes_offsets(chunk_type):
            raise ValueError(
                f"chunk type {chunk_type} is not USER (0) or an application type 16..255"
            )
        if not records and not publishers:
            raise ValueError("append needs records or publishers")
        if taken and not records:
            raise ValueError("marks taken go with records")
        if not records:
            chunk_type = ck.ChunkType.TRACKING_DELTA
        first = self._next
        trailer = (tracking.data_trailer(publishers, first, taken) if publishers or taken
                   else b"")
        chunk = ck.encode_chunk(
            chunk_type,
            first,
            self._timestamp(),
            records,
            filter_values,
            self._config.filter_size_bytes,
            trailer,
            self._epoch,
            records_crc=records_crc and bool(records),
        )
        self._write_chunk(chunk)
        if publishers:
            self._tracking.set_publishers(publishers, first)
        if taken:
            self._tracking.add_taken(taken)
        return first

    def store_offsets(self, consumers: Mapping[bytes, int]) -> None:
        """Store consumers' offsets in a tracking chunk (it takes no offset)."""
        self._check_writable()
        if not consumers:
            return
        trailer = tracking.consumer_trailer(consumers)
        chunk = ck.encode_chunk(
            ck.ChunkType.TRACKING_DELTA, self._next, self._timestamp(), [], trailer=trailer,
            epoch=self._epoch,
        )
        self._write_chunk(chunk)
        self._tracking.set_consumers(consumers)

    # -- replication ---------------------------------------------------------------------

    def ship_from(self, offset: int) -> shipping.Cursor:
        """Where shipping starts for a replica whose log ends just before `offset`."""
        self._check_open()
        return shipping.cursor_at(self._dir, offset)

    def read_chunks(self, cursor: shipping.Cursor,
                    max_bytes: int) -> tuple[bytes, shipping.Cursor]:
        """Whole chunks as they are on disk from `cursor`, for a replica (see
        shipping.read_chunks); returns them and the cursor after them."""
        self._check_open()
        self._ships = True
        active = self._segments[-1]
        if cursor.base == active.base:
            if cursor.position >= active.size:
                return b"", cursor  # nothing written since: no file to open (an idle ship)
            kept = self._recent_from(cursor, max_bytes)
            if kept is not None:
                return kept
        return shipping.read_chunks(self._dir, cursor, max_bytes, self._next)

    def append_chunks(self, data: bytes | bytearray | memoryview) -> int:
        """A replica's append: whole chunks as the leader wrote them, checked (both CRCs, the
        offsets following on from this log's, epochs never going back) and written unchanged,
        their tracking entries applied. Returns the next offset. ValueError (BadChunk) for a
        chunk that does not fit, before anything of it is written."""
        self._check_writable()
        view = memoryview(data)
        while view:
            header = ck.decode_header(view)
            ck.check_body(header, view[header.header_size:header.total_size])
            if header.first_offset != self._next:
                raise BadChunk(f"chunk at offset {header.first_offset} does not follow "
                                  f"this log's next offset {self._next}")
            if header.epoch < self._last_epoch:
                raise BadChunk(f"chunk of epoch {header.epoch} after epoch "
                                  f"{self._last_epoch}")
            chunk = bytearray(view[:header.total_size])
            self._write_replicated(chunk, header)
            if header.trailer_size:
                at = header.header_size + header.trailer_start
                self._tracking.apply(header.chunk_type, bytes(chunk[at:header.total_size]))
            view = view[header.total_size:]
        return self._next

    def _write_replicated(self, chunk: bytearray, header: ck.ChunkHeader) -> None:
        """A replica's write. It rolls where the leader rolled and writes no snapshot of its
        own: the leader's tracking snapshot, which starts each of its new segments, starts the
        replica's too, and a chunk that made the leader roll with no tracking to snapshot makes
        the replica roll by the same size rule. So every member's segment files are the same,
        byte for byte. Retention runs after each roll, as on the leader."""
        active = self._segments[-1]
        rolled = active.next_offset > active.base and (
            header.chunk_type == ck.ChunkType.TRACKING_SNAPSHOT or self._full(active, len(chunk)))
        if rolled:
            self._roll()
            self._snapshot_due = False
        self._write(chunk, header)
        self._after_write()
        if rolled:
            self._retain_or_warn()

    def _full(self, active: seg.SegmentInfo, size: int) -> bool:
        return (active.size + size > self._config.max_segment_size_bytes
                or active.chunks >= self._config.max_segment_chunks)

    def reset_to(self, offset: int) -> None:
        """Drop every chunk and start again, empty, at `offset`. For a replica whose log ends
        before the leader's first chunk (the leader's retention removed what the replica still
        lacks, or the replica is new): as osiris's replicas do, it starts where the leader's
        log starts, and the leader's first segment brings the tracking snapshot."""
        self._check_writable()
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self._forget()
        self._close_files()
        self._cache.clear()
        try:
            while self._segments:
                base = self._segments.pop().base
                seg.remove(layout.segment_path(self._dir, base))
                seg.remove(layout.index_path(self._dir, base))
            fd, ifd = seg.create(self._dir, offset, self._durable)
            os.close(fd)
            os.close(ifd)
        finally:
            self._load()

    def truncate_from(self, offset: int) -> None:
        """Remove every chunk whose records start at `offset` or later (a replica's tail that
        a new leader does not have: never committed), tracking chunks at `offset` included,
        which the leader ships again. Tracking state is rebuilt."""
        self._check_writable()
        if offset > self._next or (offset == self._next and not self._chunks_from(offset)):
            return
        if offset < self.first_offset:
            raise ValueError(f"cannot truncate below the log's first offset {self.first_offset}")
        self._forget()
        self._close_files()
        self._cache.clear()  # its keys (segment, position) are about to name other chunks
        try:
            recovery.truncate_from(self._dir, [s.base for s in self._segments], offset)
        finally:
            self._load()

    def _forget(self, keep: bool = True) -> None:
        """Before bytes of this log are removed or rewritten: if a write-ahead log may hold
        records of it (storage/wal.py), make its active segment durable in place (older ones
        were at their roll; not when nothing is kept: `keep` False), then have the WAL write a
        FORGET of it, so that a replay never writes removed bytes back. OSError is raised as a
        LogIOError (the log is broken)."""
        folder = self._open_key or os.path.realpath(self._dir)
        owner = wal.holding(folder)
        if owner is None:
            return
        path = layout.segment_path(self._dir, self._segments[-1].base)
        try:
            if keep:
                os.fdatasync(self._files()[0])
                self._durable_size = self._segments[-1].size
            owner.forget(folder)
        except OSError as exc:
            self._broken = io_error(path, exc)
            raise self._broken from exc

    def discard(self) -> None:
        """Close the log before its folder is deleted, when a log may be made again in the
        same folder (a delayed exchange's store: its folder is named by the exchange): a
        write-ahead log's records of it are forgotten first, so the new log never gets them
        back. (A queue's folder is a uuid, never reused: its delete just closes.)"""
        try:
            if not self._closed:
                self._forget(keep=False)
        finally:
            self.close()

    def _chunks_from(self, offset: int) -> bool:
        """Whether any chunk starts at `offset` or later (at the next offset: tracking ones)."""
        cursor = shipping.cursor_at(self._dir, offset)
        return cursor.position < os.path.getsize(layout.segment_path(self._dir, cursor.base))

    def _timestamp(self) -> int:
        self._last_ts = max(self._config.clock(), self._last_ts)
        return self._last_ts

    def _write_chunk(self, chunk: bytearray) -> None:
        header = ck.decode_header(chunk)
        active = self._segments[-1]
        if active.next_offset > active.base and self._full(active, len(chunk)):
            self._roll()
        if self._snapshot_due:
            self._write_snapshot(header.timestamp_ms)
        self._write(chunk, header)
        self._after_write()

    def _write(self, chunk: bytearray, header: ck.ChunkHeader) -> None:
        """One chunk, then its index entry; on failure both files are cut back and a typed
        error is raised."""
        active = self._segments[-1]
        position, in_index = active.size, False
        try:
            fd, ifd = self._files()
            seg.write_all(fd, chunk)
            if self._sync_each_write:
                os.fdatasync(fd)
            in_index = True
            seg.write_all(ifd, seg.index_entry(header, position))
        except OSError as exc:
            where = layout.index_path if in_index else layout.segment_path
            error = io_error(where(self._dir, active.base), exc, position)
            self._undo(position, entry_position(active.chunks), error)
            raise error from exc
        active.add(header)
        self._next = header.next_offset
        self._last_epoch = header.epoch
        if self._ships:
            self._remember(active.base, position, chunk, header.next_offset)

    def _remember(self, base: int, position: int, chunk: bytes | bytearray,
                  next_offset: int) -> None:
        recent = self._recent
        recent.append((base, position, chunk, next_offset))
        self._recent_bytes += len(chunk)
        while recent and (len(recent) > RECENT_CHUNKS or self._recent_bytes > RECENT_BYTES):
            self._recent_bytes -= len(recent.popleft()[2])

    def _recent_from(self, cursor: shipping.Cursor,
                     max_bytes: int) -> tuple[bytes, shipping.Cursor] | None:
        """The chunks kept in memory from `cursor` on (up to `max_bytes`, at least one), as
        shipping.read_chunks would read them; None if the first is not kept."""
        recent = self._recent
        start = len(recent) - 1
        while start >= 0 and (recent[start][0], recent[start][1]) > (cursor.base,
                                                                       cursor.position):
            start -= 1
        if start < 0 or recent[start][:2] != (cursor.base, cursor.position):
            return None
        parts: list[bytes | bytearray] = []
        size, next_offset = 0, cursor.offset
        for base, _position, chunk, chunk_next in itertools.islice(recent, start, None):
            if base != cursor.base or (parts and size + len(chunk) > max_bytes):
                break
            parts.append(chunk)
            size += len(chunk)
            next_offset = chunk_next
        return b"".join(parts), shipping.Cursor(cursor.base, cursor.position + size, next_offset)

    def _undo(self, position: int, index_size: int, error: LogIOError) -> None:
        try:
            os.ftruncate(self._fd, position)
            os.ftruncate(self._ifd, index_size)
        except OSError:
            self._broken = error

    @property
    def _sync_each_write(self) -> bool:
        return self._config.fsync == "always" and self._config.fsync_on_write

    def _after_write(self) -> None:
        if self._config.fsync == "always" and not self._config.fsync_on_write:
            self._unsynced = True  # committed by synced(), once its owner had it fsynced
        elif self._config.fsync_interval_ms is None:
            self._committed = self._next - 1
        else:
            self._unsynced = True
            self.sync_due()

    def _roll(self) -> None:
        durable = self._durable
        if durable:
            self._sync()
        fd, ifd = seg.create(self._dir, self._next, durable)
        self._close_files()
        self._fd, self._ifd = fd, ifd
        if self._open_logs is not None:
            self._open_logs.opened(self)
        self._segments.append(seg.SegmentInfo(self._next, seg.FIRST_CHUNK_POSITION, self._next, 0))
        # its header is durable (seg.create fdatasynced it and its folder), the old one too
        self._durable_size = seg.FIRST_CHUNK_POSITION if durable else None
        self._snapshot_due = True

    def _write_snapshot(self, timestamp_ms: int) -> None:
        """The tracking snapshot that starts a new segment, then retention (which may now
        delete older segments without losing tracking state)."""
        if self._tracking:
            self._tracking.trim(self.first_offset)
            trailer = self._tracking.snapshot_trailer()
            snapshot = ck.encode_chunk(
                ck.ChunkType.TRACKING_SNAPSHOT, self._next, timestamp_ms, [], trailer=trailer,
                epoch=self._last_epoch,
            )
            self._write(snapshot, ck.decode_header(snapshot))
        self._snapshot_due = False
        self._retain_or_warn()

    # -- syncing ---------------------------------------------------------------------------

    @property
    def _durable(self) -> bool:
        return self._config.fsync != "never"

    @property
    def awaits_sync(self) -> bool:
        """Something written waits for its owner to have it fsynced (sync_ticket)."""
        return self._unsynced and self._config.fsync == "always" and not self._config.fsync_on_write

    @property
    def kept_next(self) -> int:
        """The offset after what this log keeps as its fsync policy promises: under "always",
        what is fsynced; under the others, what is written (a replica's acknowledgement)."""
        return self._committed + 1 if self._config.fsync == "always" else self._next

    def sync_ticket(self, hold: bool = True) -> SyncTicket | None:
        """Under "always" with fsync_on_write False: a ticket to fsync what is written so far
        (on any thread: SyncTicket.run), to hand back to synced() on this log's thread, which
        commits it. None when nothing written waits for an fsync, or under other settings.
        With `hold` False the ticket holds no descriptor: for a round that syncs the whole
        file system (SyncTicket). Either way, what it covers no longer keeps this log's files
        open when the process's cap on open logs asks for them (release_files)."""
        if (self._config.fsync != "always" or self._config.fsync_on_write
                or not self._unsynced or self._broken is not None or self._closed):
            return None
        fd = os.dup(self._files()[0]) if hold else -1
        active = self._segments[-1]
        ticket = SyncTicket(fd, self._next - 1, self._generation,
                            layout.segment_path(self._dir, active.base), self._device,
                            base=active.base, start=self._durable_size, end=active.size,
                            folder=self._open_key or os.path.realpath(self._dir))
        self._ticketed = self._written_to()
        self._over_cap()
        return ticket

    def synced(self, ticket: SyncTicket) -> bool:
        """The fsync of `ticket` ended: commit what it covered. True if the committed offset
        moved. Its failure breaks the log (LogIOError, now and on every write). A ticket of
        this log before it was closed, truncated or reset commits nothing."""
        if ticket.generation != self._generation or self._closed:
            return False
        if ticket.error is not None:
            if self._broken is None:
                self._broken = io_error(ticket.path, ticket.error)
            raise self._broken from ticket.error
        moved = ticket.offset > self._committed
        if moved:
            self._committed = ticket.offset
            self._last_sync_ms = self._config.clock()
        if ticket.base == self._segments[-1].base:  # (after a roll, the new one's is known)
            self._durable_size = max(self._durable_size or 0, ticket.end)
        if self._committed >= self._next - 1:
            self._unsynced = False
            self._over_cap()
        return moved

    def sync_due(self) -> bool:
        """With fsync every N ms: fsync if N ms have passed since the last one. True if the
        committed offset moved."""
        interval = self._config.fsync_interval_ms
        if interval is None or not self._unsynced:
            return False
        if self._config.clock() - self._last_sync_ms < interval:
            return False
        return self._sync()

    def sync(self) -> None:
        """fsync now and commit everything written."""
        self._check_writable()
        self._sync()

    def _sync(self) -> bool:
        try:
            os.fdatasync(self._files()[0])
        except OSError as exc:
            self._broken = io_error(layout.segment_path(self._dir, self._segments[-1].base), exc)
            raise self._broken from exc
        self._last_sync_ms = self._config.clock()
        self._unsynced = False
        self._durable_size = self._segments[-1].size
        moved = self._committed != self._next - 1
        self._committed = self._next - 1
        return moved

    # -- retention ---------------------------------------------------------------------------

    def set_retention(
        self, *, max_length_bytes: int | None = _UNCHANGED, max_age_ms: int | None = _UNCHANGED
    ) -> list[Path]:
        """Change the retention limits (None = unlimited) and apply them now."""
        length = self._max_length_bytes if max_length_bytes is _UNCHANGED else max_length_bytes
        age = self._max_age_ms if max_age_ms is _UNCHANGED else max_age_ms
        check_retention(length, age)
        self._max_length_bytes, self._max_age_ms = length, age
        return self.apply_retention()

    def apply_retention(self) -> list[Path]:
        """Delete the segments that retention allows; return the deleted segment files."""
        self._check_open()
        return self._delete_oldest(self._retention_plan())

    def truncate_before(self, offset: int) -> list[Path]:
        """Delete the segments all of whose records are below `offset` (never the active one)."""
        self._check_open()
        return self._delete_oldest(retention.below_offset(self._segments, offset))

    def _retain_or_warn(self) -> None:
        """Retention on open and on roll: a file that cannot be deleted does not fail them;
        the next roll or apply_retention() tries again."""
        try:
            self._delete_oldest(self._retention_plan())
        except LogIOError as exc:
            log.warning("retention could not delete %s: %s", exc.path, exc.reason)

    def _retention_plan(self) -> int:
        return retention.plan(
            self._segments, self._max_length_bytes, self._max_age_ms, self._config.clock()
        )

    def _delete_oldest(self, count: int) -> list[Path]:
        deleted: list[Path] = []
        try:
            for info in self._segments[:count]:
                path = layout.segment_path(self._dir, info.base)
                seg.remove(path)
                deleted.append(path)
                seg.remove(layout.index_path(self._dir, info.base))  # a leftover is removed on open
        finally:
            del self._segments[: len(deleted)]
        return deleted

    # -- tracking and reading -----------------------------------------------------------------

    def publisher_id(self, name: bytes) -> int | None:
        """The last publishing id stored for publisher `name`."""
        found = self._tracking.publishers.get(bytes(name))
        return found[0] if found else None

    def consumer_offset(self, name: bytes) -> int | None:
        """The offset last stored for consumer `name`."""
        return self._tracking.consumers.get(bytes(name))

    def tracking(self) -> Tracking:
        return self._tracking.public()

    def taken(self) -> dict[bytes, list[int]]:
        """The marks taken that the log keeps, by name, oldest first (append's `taken`)."""
        return {name: list(marks) for name, marks in self._tracking.taken.items()}

    def reader(
        self,
        spec: OffsetSpec,
        filter: ReaderFilter | None = None,
        chunk_types: Iterable[int] = (ck.ChunkType.USER,),
        limit: Callable[[], int] | None = None,
    ) -> Reader:
        """A reader of this log that never reads past its committed offset, nor past `limit()`
        when given (a replicated stream's commit point: what a majority holds). Readers of one
        Log share a cache of the chunks they have read."""
        self._check_open()
        committed = self._committed_now
        if limit is not None:
            def committed() -> int:
                return min(self._committed, limit())
        return Reader.open(self._dir, spec, committed, filter, chunk_types, self._cache)

    def _committed_now(self) -> int:
        return self._committed

    def summary(self) -> dict[str, Any]:
        """first, last, committed and next offsets, the segments, bytes and tracking."""
        return inspect.describe(self._dir, self._segments, self._tracking.public(), self._committed)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Sync what the policy left unsynced, then release the files and the lock."""
        if self._closed:
            return
        try:
            if self._unsynced and self._broken is None:
                self._sync()
        finally:
            self._closed = True
            self._close_files()
            _release(self._lock_fd, self._open_key)

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._dir} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._broken is not None:
            raise LogIOError(
                self._broken.path,
                f"a failed write could not be undone ({self._broken.reason}); reopen the log",
                errno=self._broken.errno,
            )
