"""Chunk encoding and decoding, with both CRCs (docs/FORMAT.md section 3).

Role: turn records (plus optional filter values and a tracking trailer) into the bytes of one
chunk, and parse those bytes back: the 48-byte header, the body CRC, the records, the filter
values and the trailer. This is the hot path of both appending and reading, so records are
handled in bulk (an array of end offsets, one b"".join, one CRC call), never one struct call per
record.

Must not know: files, positions, segments, offsets policy, tracking semantics. Errors are raised
as BadChunk(reason); the caller knows the file and position and turns them into CorruptLogError.
Threading: pure functions over bytes; safe from any thread.
"""

from __future__ import annotations

import logging
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from enum import IntEnum
from itertools import accumulate, chain
from typing import NamedTuple

import crc32c as _crc32c

from leveret.storage import bloom
from leveret.storage.errors import BadChunk

# CRC-32C (Castagnoli): `crc32c(data, value=0)` continues from `value`, the CRC of the bytes
# before `data`. The `crc32c` package computes it with the CPU's CRC instructions (SSE 4.2,
# ARMv8): about 27 GB/s on 64 KB chunks here, where crcmod's C function did 480 MB/s and CRCs were
# 64% of append time and 55% of read time (docs/STORAGE.md). It takes any buffer, writable
# memoryviews included, so nothing is copied to be checked.
crc32c: Callable[..., int] = _crc32c.crc32c
_CRC_IN_HARDWARE = bool(_crc32c.hardware_based)

if not _CRC_IN_HARDWARE:  # pragma: no cover - depends on the CPU
    logging.getLogger("leveret.storage").warning(
        "this CPU has no CRC-32C instructions: the crc32c package falls back to software"
    )

# Version 2 (written unless the chunk keeps a records CRC): the version 1 fields, then the
# writer's epoch before the two CRCs.
HEADER = struct.Struct("<4sBBBBIIIIQqQII")
HEADER_SIZE = HEADER.size  # 56: a version 2 header
_HEADER_CRC_AT = HEADER_SIZE - 4
# Version 3 (written when asked to keep a records CRC): the version 2 fields, then the zlib
# CRC-32 of the record bytes (what a stream-protocol Deliver carries) before the two CRCs.
HEADER_V3 = struct.Struct("<4sBBBBIIIIQqQIII")
MAX_HEADER_SIZE = HEADER_V3.size  # 60: the most bytes any header takes
_V3_CRC_AT = MAX_HEADER_SIZE - 4
# Version 1 (read only: logs written before epochs): no epoch, which reads as 0.
HEADER_V1 = struct.Struct("<4sBBBBIIIIQqII")
MIN_HEADER_SIZE = HEADER_V1.size  # 48
_V1_CRC_AT = MIN_HEADER_SIZE - 4
CHUNK_MAGIC = b"LVCK"
CHUNK_VERSION = 2
CHUNK_VERSION_RECORDS_CRC = 3
_HEADER_SIZES = {1: MIN_HEADER_SIZE, 2: HEADER_SIZE}
FIRST_APPLICATION_TYPE = 16
MAX_CHUNK_TYPE = 255
MAX_FILTER_VALUE_BYTES = 0xFFFE
_NO_FILTER_VALUE = 0xFFFF
_MAX_SECTION_BYTES = 0xFFFFFFFF
_BIG_ENDIAN_HOST = sys.byteorder == "big"


class ChunkType(IntEnum):
    """The chunk types the engine knows; application types are any int in 16..255."""

    USER = 0
    TRACKING_DELTA = 1
    TRACKING_SNAPSHOT = 2


TRACKING_TYPES = frozenset({ChunkType.TRACKING_DELTA, ChunkType.TRACKING_SNAPSHOT})


def takes_offsets(chunk_type: int) -> bool:
    """True for USER and application types: each of their records takes one offset."""
    return chunk_type == ChunkType.USER or FIRST_APPLICATION_TYPE <= chunk_type <= MAX_CHUNK_TYPE


def is_valid_type(chunk_type: int) -> bool:
    return takes_offsets(chunk_type) or chunk_type in TRACKING_TYPES


def offset_key(first_offset: int, num_records: int) -> int:
    """The chunk holds offsets below this; one with no records counts as holding its first
    offset. Non-decreasing along a log, so chunks can be bisected by it."""
    return first_offset + max(num_records, 1)


def is_committed(first_offset: int, num_records: int, committed: int) -> bool:
    """Whether a reader bound by `committed` may see this chunk: all its records are committed
    (a chunk without records: every record before it is)."""
    if num_records:
        return first_offset + num_records - 1 <= committed
    return first_offset <= committed + 1


class ChunkHeader(NamedTuple):
    chunk_type: int
    bloom_size: int
    num_records: int
    data_size: int
    filter_size: int
    trailer_size: int
    first_offset: int
    timestamp_ms: int
    body_crc: int
    epoch: int = 0  # the writer's epoch (0 in a version 1 chunk)
    header_size: int = HEADER_SIZE  # 56; 60 for a version 3 chunk, 48 for a version 1 chunk
    # the zlib CRC-32 of the record bytes, concatenated (version 3 chunks only; else None)
    records_crc: int | None = None

    @property
    def body_size(self) -> int:
        return self.bloom_size + self.data_size + self.filter_size + self.trailer_size

    @property
    def total_size(self) -> int:
        return self.header_size + self.body_size

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.num_records

    @property
    def trailer_start(self) -> int:
        """Where the trailer starts, counted from the start of the body."""
        return self.bloom_size + self.data_size + self.filter_size


def _u32s(values: array[int]) -> bytes:
    if _BIG_ENDIAN_HOST:
        values.byteswap()
    return values.tobytes()


def _uint_list(typecode: str, data: bytes | memoryview) -> list[int]:
    """Little-endian unsigned integers ("H": 16-bit, "I": 32-bit) as a list."""
    values = array(typecode)
    values.frombytes(data)
    if _BIG_ENDIAN_HOST:
        values.byteswap()
    return values.tolist()


def encode_filter_section(filter_values: Sequence[bytes | None]) -> bytes:
    """The filter-value section (3.4); b"" when no record has a value."""
    lengths = array("H")
    present = []
    for value in filter_values:
        if value is None:
            lengths.append(_NO_FILTER_VALUE)
            continue
        if len(value) > MAX_FILTER_VALUE_BYTES:
            raise ValueError(f"a filter value is at most {MAX_FILTER_VALUE_BYTES} bytes")
        lengths.append(len(value))
        present.append(value)
    if not present:
        return b""
    if _BIG_ENDIAN_HOST:
        lengths.byteswap()
    return lengths.tobytes() + b"".join(present)


def encode_chunk(
    chunk_type: int,
    first_offset: int,
    timestamp_ms: int,
    records: Sequence[bytes],
    filter_values: Sequence[bytes | None] | None = None,
    filter_size_bytes: int = bloom.MIN_SIZE_BYTES,
    trailer: bytes = b"",
    epoch: int = 0,
    records_crc: bool = False,
) -> bytearray:
    """The bytes of one chunk, stamped with the writer's `epoch`. `filter_values`, if given,
    has one entry per record. With `records_crc`, the chunk is a version 3 one that keeps the
    zlib CRC-32 of its record bytes, concatenated (ChunkHeader.records_crc): computed once
    here, for readers that send the records on as one block with that CRC (the stream
    protocol's Deliver)."""
    n = len(records)
    try:
        ends = array("I", accumulate(map(len, records)))
    except OverflowError:
        ends = None
    if ends is None or 4 * n + (ends[-1] if n else 0) > _MAX_SECTION_BYTES:
        raise ValueError("a chunk holds less than 4 GiB")
    if filter_values is not None and len(filter_values) != n:
        raise ValueError("filter_values must have one entry per record")
    filters = encode_filter_section(filter_values) if filter_values is not None else b""
    bloom_bytes = (
        bloom.build(filter_values, filter_size_bytes)
        if filter_values is not None and filters else b""
    )
    data_size = 4 * n + (ends[-1] if n else 0)
    size = MAX_HEADER_SIZE if records_crc else HEADER_SIZE
    parts: list[bytes] = [bytes(size), bloom_bytes, _u32s(ends)]
    parts += records
    parts.append(filters)
    parts.append(trailer)
    chunk = bytearray().join(parts)
    view = memoryview(chunk)
    body_crc = crc32c(view[size:])
    fields = [CHUNK_MAGIC, CHUNK_VERSION, chunk_type, len(bloom_bytes), 0, n, data_size,
              len(filters), len(trailer), first_offset, timestamp_ms, epoch, body_crc, 0]
    if records_crc:
        records_at = size + len(bloom_bytes) + 4 * n
        fields[1] = CHUNK_VERSION_RECORDS_CRC
        fields[12:12] = [zlib.crc32(view[records_at : size + len(bloom_bytes) + data_size])]
        HEADER_V3.pack_into(chunk, 0, *fields)
    else:
        HEADER.pack_into(chunk, 0, *fields)
    header_crc = crc32c(view[: size - 4])
    struct.pack_into("<I", chunk, size - 4, header_crc)
    return chunk


def header_length(data: bytes | bytearray | memoryview) -> int:
    """How many bytes the chunk header at the start of `data` takes, by its version byte (the
    most a header can take while that byte is not there yet)."""
    return _HEADER_SIZES.get(data[4], MAX_HEADER_SIZE) if len(data) > 4 else MAX_HEADER_SIZE


def decode_header(data: bytes | bytearray | memoryview) -> ChunkHeader:
    """Parse and check a chunk header from the start of `data` (version 2; 3, which adds the
    records CRC; or 1, as epoch 0)."""
    if len(data) < header_length(data):
        raise BadChunk("partial chunk header")
    version = data[4]
    records_crc = None
    if version == 1:
        fields = HEADER_V1.unpack_from(data)
        crc_at, epoch, size = _V1_CRC_AT, 0, MIN_HEADER_SIZE
        body_crc, header_crc = fields[11], fields[12]
    elif version == CHUNK_VERSION_RECORDS_CRC:
        fields = HEADER_V3.unpack_from(data)
        crc_at, epoch, size = _V3_CRC_AT, fields[11], MAX_HEADER_SIZE
        records_crc, body_crc, header_crc = fields[12], fields[13], fields[14]
    else:
        fields = HEADER.unpack_from(data)
        crc_at, epoch, size = _HEADER_CRC_AT, fields[11], HEADER_SIZE
        body_crc, header_crc = fields[12], fields[13]
    if fields[0] != CHUNK_MAGIC:
        raise BadChunk(f"bad chunk magic {bytes(fields[0])!r}")
    if crc32c(memoryview(data)[:crc_at]) != header_crc:
        raise BadChunk("chunk header CRC mismatch")
    if version not in (1, CHUNK_VERSION, CHUNK_VERSION_RECORDS_CRC):
        raise BadChunk(f"unsupported chunk version {version}")
    header = ChunkHeader(fields[2], fields[3], fields[5], fields[6], fields[7], fields[8],
                         fields[9], fields[10], body_crc, epoch, size, records_crc)
    _check_shape(header)
    return header


def _check_shape(h: ChunkHeader) -> None:
    if not is_valid_type(h.chunk_type):
        raise BadChunk(f"unknown chunk type {h.chunk_type}")
    if takes_offsets(h.chunk_type) != (h.num_records > 0):
        raise BadChunk(f"chunk type {h.chunk_type} with {h.num_records} records")
    if h.data_size < 4 * h.num_records:
        raise BadChunk("data section shorter than its offsets table")
    if h.filter_size and h.filter_size < 2 * h.num_records:
        raise BadChunk("filter section shorter than its lengths table")
    if h.bloom_size and (h.bloom_size < bloom.MIN_SIZE_BYTES or not h.filter_size):
        raise BadChunk(f"bad bloom filter size {h.bloom_size}")


def check_body(header: ChunkHeader, body: bytes | memoryview) -> None:
    """Raise BadChunk unless `body` is the whole body of `header`'s chunk, with a matching CRC."""
    if len(body) < header.body_size:
        raise BadChunk("partial chunk")
    if crc32c(body[: header.body_size]) != header.body_crc:
        raise BadChunk("chunk CRC mismatch")


def decode_records(header: ChunkHeader, body: bytes) -> list[bytes]:
    """The records of a chunk, as bytes, in offset order. `body` is the checked body."""
    n = header.num_records
    if not n:
        return []
    table_at = header.bloom_size
    data_at = table_at + 4 * n
    data = body[data_at : table_at + header.data_size]
    ends = _uint_list("I", body[table_at:data_at])
    if ends[-1] != len(data):
        raise BadChunk("record offsets do not match the data length")
    return [data[a:b] for a, b in zip(chain((0,), ends), ends)]  # noqa: B905 (n+1 vs n)


def check_ends(header: ChunkHeader, body: bytes | memoryview) -> None:
    """Raise BadChunk unless the last record ends where the data section does (what
    decode_records checks, without splitting the chunk)."""
    n = header.num_records
    if n:
        start = header.bloom_size + 4 * n
        if _uint_list("I", body[start - 4 : start])[0] != header.data_size - 4 * n:
            raise BadChunk("record offsets do not match the data length")


def record_bytes(header: ChunkHeader, body: bytes | memoryview) -> memoryview:
    """The record bytes of a chunk's data section (after its table of ends), as one view of
    `body` (nothing copied): every record, concatenated in offset order. `body` is the checked
    body (check_ends too)."""
    start = header.bloom_size + 4 * header.num_records
    return memoryview(body)[start : header.bloom_size + header.data_size]


def decode_filter_values(header: ChunkHeader, body: bytes) -> list[bytes | None] | None:
    """Each record's filter value (None: it has none); None when no record has one."""
    if not header.filter_size:
        return None
    n = header.num_records
    start = header.bloom_size + header.data_size
    lengths = _uint_list("H", body[start : start + 2 * n])
    section = body[start + 2 * n : start + header.filter_size]
    values: list[bytes | None] = []
    pos = 0
    for length in lengths:
        if length == _NO_FILTER_VALUE:
            values.append(None)
        else:
            values.append(section[pos : pos + length])
            pos += length
    if pos != len(section):
        raise BadChunk("filter value lengths do not match the filter section")
    return values


def trailer_bytes(header: ChunkHeader, body: bytes | memoryview) -> bytes:
    start = header.trailer_start
    return bytes(body[start : start + header.trailer_size])
