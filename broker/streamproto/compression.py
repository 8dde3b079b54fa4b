"""Sub-entry batches of the stream protocol: decompress, then split into messages.

A batch's data is `u32 size` + message, repeated, compressed as its code says: 0 none, 1 gzip,
2 snappy (framed), 3 lz4 (frame format), 4 zstd, as the stream clients write them (the Java
client's codecs; rstream writes none and gzip). gzip is the stdlib's; the others are cramjam's.
A batch that does not decompress, or whose contents do not add up, raises ValueError.
Pure: no I/O, nothing of the broker.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam

_U32 = struct.Struct(">I")
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)


def decompress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    try:
        if codec == GZIP:
            return gzip.decompress(data)
        if codec == SNAPPY:
            return bytes(cramjam.snappy.decompress(data))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (OSError, EOFError, zlib.error, cramjam.DecompressionError) as exc:
        raise ValueError(f"sub-entry batch does not decompress: {exc}") from None
    raise ValueError(f"unknown compression {codec}")


def compress(codec: int, data: bytes) -> bytes:
    """The other way (tests and the load generator)."""
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression {codec}")


def unpack(codec: int, count: int, uncompressed: int, data: bytes) -> list[bytes]:
    """The messages of one sub-entry batch."""
    raw = decompress(codec, data)
    if len(raw) != uncompressed:
        raise ValueError("sub-entry batch: uncompressed size does not match")
    out: list[bytes] = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(raw):
            raise ValueError("sub-entry batch: truncated")
        size = _U32.unpack_from(raw, pos)[0]
        pos += 4
        if pos + size > len(raw):
            raise ValueError("sub-entry batch: truncated")
        out.append(raw[pos : pos + size])
        pos += size
    return out


def pack(messages: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(m)) + m for m in messages)
