"""Deliver frames: stored records re-framed as an osiris chunk, as stream clients read them.

A Deliver carries a 48-byte big-endian chunk header (magic 5 and version 0, chunk type 0,
entry and record counts, timestamp, epoch, first offset, the CRC-32 of the data as zlib
computes it, data length, trailer length, bloom size) and then simple entries
(`0:1 size:31 body`). Clients check the CRC and count offsets from the first one, so one
Deliver holds one run of consecutive offsets. A run's entries and CRC (`Entries`) are built
once and framed for each subscription that reads them. The epoch is the stored chunk's writer
epoch, and the trailer length what osiris's trailer of the chunk would take (its publishers'
sequence entries, `trailer_length`): RabbitMQ sends neither the trailer nor a bloom filter,
only their sizes, and clients such as rstream compare the whole header.

Pure: no I/O; knows nothing of the model or of how a record becomes an AMQP 1.0 message.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence

_HEAD = struct.Struct(">IHHB")
_HEAD_V2 = struct.Struct(">IHHBQ")
_CHUNK = struct.Struct(">BBHIqQQIIIB3x")
_ENTRY = struct.Struct(">I")
MAGIC_VERSION = 0x50
DELIVER = 0x08


class Entries:
    """The data of one chunk's run of consecutive messages, ready for any subscription:
    the simple entries, their count and their CRC-32 (computed once, however many
    subscribers the run goes to; or given, when the log kept it with the chunk)."""

    __slots__ = ("count", "crc", "data", "trailer_length")

    def __init__(self, data: bytes | memoryview, count: int, crc: int | None = None) -> None:
        self.data = data
        self.count = count
        self.crc = zlib.crc32(data) if crc is None else crc
        self.trailer_length = 0  # of the chunk the run is from (trailer_length())


def trailer_length(publishers: Iterable[bytes]) -> int:
    """The size of osiris's trailer of a chunk that tracks these publishers' sequences: one
    `type:8 size:8 reference seq:64` entry each (osiris_tracking:flush)."""
    return sum(10 + len(name) for name in publishers)


def entries(messages: Sequence[bytes]) -> Entries:
    """Simple entries (`0:1 size:31`, then the message) of these messages."""
    pack = _ENTRY.pack
    return Entries(b"".join([part for m in messages for part in (pack(len(m)), m)]),
                   len(messages))


def cut_entries(records: Sequence[bytes], cut: int) -> Entries:
    """Simple entries of each record's bytes after its first `cut` bytes."""
    pack = _ENTRY.pack
    return Entries(b"".join([pack(len(r) - cut) + r[cut:] for r in records]), len(records))


def deliver_entries(subscription_id: int, first_offset: int, timestamp_ms: int, run: Entries,
                    *, epoch: int = 0, version: int = 1, committed: int = 0) -> bytes:
    """One Deliver frame (v1, or v2 with the committed chunk id) of a run of entries."""
    return b"".join(deliver_parts(subscription_id, first_offset, timestamp_ms, run, epoch=epoch,
                                  version=version, committed=committed))


def deliver_parts(subscription_id: int, first_offset: int, timestamp_ms: int, run: Entries,
                  *, epoch: int = 0, version: int = 1,
                  committed: int = 0) -> tuple[bytes, bytes | memoryview]:
    """deliver_entries as its two parts, the frame's head and the entries, so that a sender
    that joins its output anyway copies the entries once."""
    n = run.count
    data = run.data
    chunk = _CHUNK.pack(MAGIC_VERSION, 0, n, n, timestamp_ms, epoch, first_offset,
                        run.crc, len(data), run.trailer_length, 0)
    if version >= 2:
        head = _HEAD_V2.pack(4 + 1 + 8 + len(chunk) + len(data), DELIVER, 2, subscription_id,
                             committed)
    else:
        head = _HEAD.pack(4 + 1 + len(chunk) + len(data), DELIVER, 1, subscription_id)
    return head + chunk, data


def deliver(
    subscription_id: int,
    first_offset: int,
    timestamp_ms: int,
    messages: Sequence[bytes],
    *,
    epoch: int = 0,
    version: int = 1,
    committed: int = 0,
) -> bytes:
    """One Deliver frame (v1, or v2 with the committed chunk id) of consecutive messages."""
    return deliver_entries(subscription_id, first_offset, timestamp_ms, entries(messages),
                           epoch=epoch, version=version, committed=committed)


def runs(first: int, offsets: Sequence[int] | None, count: int) -> list[tuple[int, int, int]]:
    """Split a chunk's returned records into runs of consecutive offsets:
    (first offset, start index, end index)."""
    if offsets is None:
        return [(first, 0, count)]
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(offsets) + 1):
        if i == len(offsets) or offsets[i] != offsets[i - 1] + 1:
            out.append((offsets[start], start, i))
            start = i
    return out
