"""Tracking state kept inside the log: publishers' last publishing ids, consumers' offsets,
and marks taken (the ids of messages a log's owner took, the newest MAX_TAKEN per name: a
stream keeps there the ids of the delayed exchanges' copies it appended).

Role: encode and decode tracking entries (the trailer of docs/FORMAT.md section 3.6), hold the
current state, apply a chunk's trailer to it (a snapshot replaces the state), and produce the
trimmed snapshot that starts every segment.

Must not know: files, chunks' other sections, when snapshots are written (the log decides).
Threading: a TrackingState belongs to its Log's thread; Tracking values are immutable copies.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from leveret.storage.chunk import ChunkType, crc32c
from leveret.storage.errors import BadChunk

PUBLISHER = 0
CONSUMER = 1
TAKEN = 2  # value: the first of `ref` consecutive marks taken under that name
MAX_NAME_BYTES = 255
MAX_SNAPSHOT_PUBLISHERS = 4096
MAX_TAKEN = 100_000  # marks kept per name, the newest (as broker/model/delayed_ids.py's WINDOW)
# runs of marks in a snapshot at most, all names together (50 bytes each: 10 MB at most, under
# the cluster link's frame limit that a snapshot chunk is shipped in)
MAX_SNAPSHOT_TAKEN_RUNS = 200_000
_KIND_LEN = struct.Struct("<BB")
_VALUE_REF = struct.Struct("<qQ")
_CRC = struct.Struct("<I")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Tracking:
    """A copy of the tracking state: publisher name -> last publishing id, and consumer name ->
    stored offset."""

    publishers: dict[bytes, int] = field(default_factory=dict)
    consumers: dict[bytes, int] = field(default_factory=dict)


Entry = tuple[int, bytes, int, int]  # kind, name, value, ref


def _check(name: bytes, value: int) -> None:
    if not isinstance(name, bytes | bytearray):
        raise TypeError(f"tracking names are bytes, not {type(name).__name__}")
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"a tracking name is at most {MAX_NAME_BYTES} bytes")
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("tracking values are ints")
    if not _I64_MIN <= value <= _I64_MAX:
        raise ValueError("a tracking value must fit in a signed 64-bit integer")


def encode_entries(entries: list[Entry]) -> bytes:
    """A trailer: the entries, then the CRC-32C of the entries (b"" when there are none)."""
    if not entries:
        return b""
    parts = []
    for kind, name, value, ref in entries:
        parts.append(_KIND_LEN.pack(kind, len(name)))
        parts.append(bytes(name))
        parts.append(_VALUE_REF.pack(value, ref))
    data = b"".join(parts)
    return data + _CRC.pack(crc32c(data))


def decode_entries(data: bytes) -> Iterator[Entry]:
    """The entries of a trailer; BadChunk if it is malformed or its CRC does not match."""
    if not data:
        return
    end = len(data) - _CRC.size
    if end < 0 or crc32c(data[:end]) != _CRC.unpack_from(data, end)[0]:
        raise BadChunk("tracking trailer CRC mismatch")
    pos = 0
    while pos < end:
        if pos + 2 > end:
            raise BadChunk("truncated tracking entry")
        kind, size = _KIND_LEN.unpack_from(data, pos)
        name_end = pos + 2 + size
        if kind not in (PUBLISHER, CONSUMER, TAKEN) or name_end + 16 > end:
            raise BadChunk("malformed tracking entry")
        value, ref = _VALUE_REF.unpack_from(data, name_end)
        yield kind, data[pos + 2 : name_end], value, ref
        pos = name_end + 16


def publisher_trailer(publishers: Mapping[bytes, int], chunk_offset: int) -> bytes:
    """The trailer of a data chunk carrying these publishers' last publishing ids."""
    entries = []
    for name, publishing_id in publishers.items():
        _check(name, publishing_id)
        entries.append((PUBLISHER, bytes(name), publishing_id, chunk_offset))
    return encode_entries(entries)


def _runs(marks: Iterable[int]) -> list[tuple[int, int]]:
    """Marks in their order as (first, count) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for mark in marks:
        if runs and runs[-1][0] + runs[-1][1] == mark:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((mark, 1))
    return runs


def taken_entries(taken: Iterable[tuple[bytes, int]]) -> list[Entry]:
    """The entries of marks taken, (name, value) in order: a run of consecutive values of a
    name is one entry."""
    by_name: dict[bytes, list[int]] = {}
    for name, value in taken:
        _check(name, value)
        if value < 0:
            raise ValueError("a mark taken is not negative")
        by_name.setdefault(bytes(name), []).append(value)
    return [(TAKEN, name, first, count)
            for name, values in by_name.items() for first, count in _runs(values)]


def data_trailer(publishers: Mapping[bytes, int] | None, chunk_offset: int,
                 taken: Iterable[tuple[bytes, int]] | None) -> bytes:
    """The trailer of a data chunk: its publishers' last publishing ids, and marks taken."""
    entries = []
    for name, publishing_id in (publishers or {}).items():
        _check(name, publishing_id)
        entries.append((PUBLISHER, bytes(name), publishing_id, chunk_offset))
    if taken:
        entries += taken_entries(taken)
    return encode_entries(entries)


def consumer_trailer(consumers: Mapping[bytes, int]) -> bytes:
    """The trailer of a TRACKING_DELTA chunk storing these consumers' offsets."""
    entries = []
    for name, offset in consumers.items():
        _check(name, offset)
        entries.append((CONSUMER, bytes(name), offset, 0))
    return encode_entries(entries)


class TrackingState:
    """The live tracking state of a log."""

    def __init__(self) -> None:
        self.publishers: dict[bytes, tuple[int, int]] = {}  # name -> (publishing id, ref)
        self.consumers: dict[bytes, int] = {}
        self.taken: dict[bytes, dict[int, None]] = {}  # name -> marks, oldest first

    def __bool__(self) -> bool:
        return bool(self.publishers or self.consumers or self.taken)

    def apply(self, chunk_type: int, trailer: bytes) -> None:
        """Apply one chunk's trailer; BadChunk if it is malformed."""
        entries = list(decode_entries(trailer))
        if chunk_type == ChunkType.TRACKING_SNAPSHOT:
            self.publishers.clear()
            self.consumers.clear()
            self.taken.clear()
        for kind, name, value, ref in entries:
            if kind == PUBLISHER:
                self.publishers[name] = (value, ref)
            elif kind == CONSUMER:
                self.consumers[name] = value
            else:
                self._take(name, range(value, value + ref))

    def _take(self, name: bytes, values: Iterable[int]) -> None:
        marks = self.taken.get(name)
        if marks is None:
            marks = self.taken[name] = {}
        for value in values:
            marks.pop(value, None)
            marks[value] = None
        over = len(marks) - MAX_TAKEN
        if over > 0:
            for old in list(itertools.islice(marks, over)):
                del marks[old]

    def add_taken(self, taken: Iterable[tuple[bytes, int]]) -> None:
        """Record marks taken, (name, value) in order, written in a chunk's trailer."""
        for name, value in taken:
            self._take(bytes(name), (value,))

    def set_publishers(self, publishers: Mapping[bytes, int], ref: int) -> None:
        """Record publishers' last publishing ids, written in the chunk at offset `ref`."""
        for name, publishing_id in publishers.items():
            self.publishers[bytes(name)] = (publishing_id, ref)

    def set_consumers(self, consumers: Mapping[bytes, int]) -> None:
        for name, offset in consumers.items():
            self.consumers[bytes(name)] = offset

    def trim(self, first_offset: int, max_publishers: int = MAX_SNAPSHOT_PUBLISHERS) -> None:
        """Drop consumers below `first_offset` and all but the most recent publishers."""
        self.consumers = {n: o for n, o in self.consumers.items() if o >= first_offset}
        if len(self.publishers) > max_publishers:
            ranked = sorted(self.publishers.items(), key=lambda item: (-item[1][1], item[0]))
            self.publishers = dict(ranked[:max_publishers])
        runs = {name: _runs(marks) for name, marks in self.taken.items()}
        if sum(map(len, runs.values())) > MAX_SNAPSHOT_TAKEN_RUNS:
            keep = max(1, MAX_SNAPSHOT_TAKEN_RUNS // len(runs))  # the newest runs of each
            for name, name_runs in runs.items():
                if len(name_runs) > keep:
                    self.taken[name] = {value: None for first, count in name_runs[-keep:]
                                        for value in range(first, first + count)}

    def snapshot_trailer(self) -> bytes:
        entries: list[Entry] = [(PUBLISHER, n, v, r) for n, (v, r) in self.publishers.items()]
        entries += [(CONSUMER, n, o, 0) for n, o in self.consumers.items()]
        entries += [(TAKEN, n, first, count) for n, marks in self.taken.items()
                    for first, count in _runs(marks)]
        return encode_entries(entries)

    def public(self) -> Tracking:
        return Tracking(
            publishers={name: value for name, (value, _ref) in self.publishers.items()},
            consumers=dict(self.consumers),
        )
