"""Deliver frames: stored records re-framed as an osiris chunk, as stream clients read them.

A Deliver carries a 48-byte big-endian chunk header (magic 5 and version 0, chunk type 0,
entry and record counts, timestamp, epoch, first offset, the CRC-32 of the data as zlib
computes it, data length, trailer length, bloom size) and then simple entries
(`0:1 size:31 body`). Clients check the CRC and count offsets from the first one, so one
Deliver holds one run of consecutive offsets.

Pure: no I/O; knows nothing of the model or of how a record becomes an AMQP 1.0 message.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

_HEAD = struct.Struct(">IHHB")
_HEAD_V2 = struct.Struct(">IHHBQ")
_CHUNK = struct.Struct(">BBHIqQQIIIB3x")
_ENTRY = struct.Struct(">I")
MAGIC_VERSION = 0x50
DELIVER = 0x08


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
    pack = _ENTRY.pack
    data = b"".join([part for m in messages for part in (pack(len(m)), m)])
    n = len(messages)
    chunk = _CHUNK.pack(MAGIC_VERSION, 0, n, n, timestamp_ms, epoch, first_offset,
                        zlib.crc32(data), len(data), 0, 0)
    if version >= 2:
        head = _HEAD_V2.pack(4 + 1 + 8 + len(chunk) + len(data), DELIVER, 2, subscription_id,
                             committed)
    else:
        head = _HEAD.pack(4 + 1 + len(chunk) + len(data), DELIVER, 1, subscription_id)
    return head + chunk + data


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
