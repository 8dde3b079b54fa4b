"""Chunk encoding: round trips, both CRCs, and the shape checks of the header."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.storage import chunk as ck
from leveret.storage import tracking
from leveret.storage.errors import BadChunk

records_st = st.lists(st.binary(max_size=64), min_size=1, max_size=40)
filter_value_st = st.one_of(st.none(), st.binary(max_size=12))


@st.composite
def chunks(draw: st.DrawFn) -> dict:
    records = draw(records_st)
    with_filters = draw(st.booleans())
    filter_values = (
        draw(st.lists(filter_value_st, min_size=len(records), max_size=len(records)))
        if with_filters
        else None
    )
    publishers = draw(
        st.dictionaries(st.binary(max_size=20), st.integers(0, 2**63 - 1), max_size=4)
    )
    return {
        "chunk_type": draw(st.sampled_from([0, 16, 200, 255])),
        "first_offset": draw(st.integers(0, 2**62)),
        "timestamp_ms": draw(st.integers(-(2**62), 2**62)),
        "records": records,
        "filter_values": filter_values,
        "filter_size_bytes": draw(st.integers(16, 255)),
        "trailer": tracking.publisher_trailer(publishers, 7),
    }


@settings(max_examples=150, deadline=None)
@given(chunks())
def test_encode_decode_round_trip(spec: dict) -> None:
    data = bytes(ck.encode_chunk(**spec))
    header = ck.decode_header(data)
    body = data[ck.HEADER_SIZE :]
    ck.check_body(header, body)
    assert header.total_size == len(data)
    assert header.chunk_type == spec["chunk_type"]
    assert header.first_offset == spec["first_offset"]
    assert header.timestamp_ms == spec["timestamp_ms"]
    assert header.next_offset == spec["first_offset"] + len(spec["records"])
    assert ck.decode_records(header, body) == spec["records"]
    values = spec["filter_values"]
    expected = values if values is not None and any(v is not None for v in values) else None
    assert ck.decode_filter_values(header, body) == expected
    assert (header.bloom_size > 0) == (expected is not None)
    assert ck.trailer_bytes(header, body) == spec["trailer"]


def test_all_unfiltered_records_make_no_filter_section_and_no_bloom() -> None:
    data = bytes(ck.encode_chunk(0, 0, 1, [b"a", b"b"], [None, None]))
    header = ck.decode_header(data)
    assert header.bloom_size == 0 and header.filter_size == 0


def test_tracking_chunk_has_no_records() -> None:
    trailer = tracking.consumer_trailer({b"c": 3})
    data = bytes(ck.encode_chunk(ck.ChunkType.TRACKING_DELTA, 10, 1, [], trailer=trailer))
    header = ck.decode_header(data)
    assert header.num_records == 0 and header.next_offset == 10
    assert ck.decode_records(header, data[ck.HEADER_SIZE :]) == []


@settings(max_examples=60, deadline=None)
@given(chunks(), st.data())
def test_any_flipped_byte_is_detected(spec: dict, data: st.DataObject) -> None:
    chunk = bytearray(ck.encode_chunk(**spec))
    at = data.draw(st.integers(0, len(chunk) - 1))
    chunk[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(BadChunk):
        header = ck.decode_header(chunk)
        ck.check_body(header, bytes(chunk[ck.HEADER_SIZE :]))


def test_partial_header_and_partial_body() -> None:
    data = bytes(ck.encode_chunk(0, 0, 1, [b"abc"]))
    with pytest.raises(BadChunk, match="partial chunk header"):
        ck.decode_header(data[:47])
    header = ck.decode_header(data)
    with pytest.raises(BadChunk, match="partial chunk"):
        ck.check_body(header, data[ck.HEADER_SIZE : -1])


def _with_header_field(data: bytes, at: int, fmt: str, value: int) -> bytes:
    """The chunk with one header field replaced and the header CRC recomputed."""
    raw = bytearray(data)
    struct.pack_into(fmt, raw, at, value)
    struct.pack_into("<I", raw, 52, ck.crc32c(bytes(raw[:52])))
    return bytes(raw)


def test_epoch_round_trip() -> None:
    data = bytes(ck.encode_chunk(0, 7, 1, [b"abc"], epoch=2**40 + 3))
    header = ck.decode_header(data)
    assert (header.epoch, header.header_size, header.first_offset) == (2**40 + 3, 56, 7)
    assert header.total_size == len(data)


def test_version_1_chunk_reads_as_epoch_0(version_1: Callable[[bytes], bytes]) -> None:
    v1 = version_1(bytes(ck.encode_chunk(0, 5, 9, [b"ab", b"c"], epoch=4)))
    assert ck.header_length(v1) == ck.MIN_HEADER_SIZE == 48
    header = ck.decode_header(v1)
    assert (header.epoch, header.header_size, header.total_size) == (0, 48, len(v1))
    assert ck.decode_records(header, v1[48:]) == [b"ab", b"c"]


def test_version_1_header_crc_is_checked(version_1: Callable[[bytes], bytes]) -> None:
    v1 = bytearray(version_1(bytes(ck.encode_chunk(0, 5, 9, [b"ab"]))))
    v1[24] ^= 1
    with pytest.raises(BadChunk, match="chunk header CRC mismatch"):
        ck.decode_header(v1)


def test_partial_header_is_partial() -> None:
    data = bytes(ck.encode_chunk(0, 0, 1, [b"abc"]))
    with pytest.raises(BadChunk, match="partial chunk header"):
        ck.decode_header(data[:50])


@pytest.mark.parametrize(
    ("at", "fmt", "value", "reason"),
    [
        (4, "<B", 9, "unsupported chunk version 9"),
        (5, "<B", 7, "unknown chunk type 7"),
        (5, "<B", 1, "chunk type 1 with 1 records"),
        (12, "<I", 1, "data section shorter than its offsets table"),
        (6, "<B", 3, "bad bloom filter size 3"),
    ],
)
def test_header_shape_checks(at: int, fmt: str, value: int, reason: str) -> None:
    data = bytes(ck.encode_chunk(0, 0, 1, [b"abc"]))
    with pytest.raises(BadChunk, match=reason):
        ck.decode_header(_with_header_field(data, at, fmt, value))


def test_bad_magic() -> None:
    data = bytearray(ck.encode_chunk(0, 0, 1, [b"abc"]))
    data[0:4] = b"XXXX"
    with pytest.raises(BadChunk, match="bad chunk magic"):
        ck.decode_header(data)


def test_filter_values_must_match_records_and_be_short() -> None:
    with pytest.raises(ValueError, match="one entry per record"):
        ck.encode_chunk(0, 0, 1, [b"a", b"b"], [b"x"])
    with pytest.raises(ValueError, match="at most"):
        ck.encode_chunk(0, 0, 1, [b"a"], [b"x" * 70_000])


def test_chunk_types() -> None:
    assert ck.takes_offsets(ck.ChunkType.USER) and ck.takes_offsets(16) and ck.takes_offsets(255)
    assert not ck.takes_offsets(ck.ChunkType.TRACKING_DELTA) and not ck.takes_offsets(3)
    assert not ck.is_valid_type(15) and not ck.is_valid_type(256)


class _Huge:
    """Stands in for a huge record: only its length is looked at before the limit check."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def test_a_chunk_holds_less_than_4_gib() -> None:
    with pytest.raises(ValueError, match="less than 4 GiB"):  # lengths overflow 32 bits
        ck.encode_chunk(0, 0, 1, [_Huge(3 * 10**9), _Huge(3 * 10**9)])
    with pytest.raises(ValueError, match="less than 4 GiB"):  # the offsets table tips it over
        ck.encode_chunk(0, 0, 1, [_Huge(2**32 - 4)])


@pytest.mark.parametrize(
    ("sections", "reason"),
    [
        ((1, struct.pack("<I", 5) + b"abc"), "record offsets do not match"),
        ((2, struct.pack("<II", 1, 2) + b"ab", b"\x01\x00"), "filter section shorter"),
        ((1, struct.pack("<I", 1) + b"a", b"\x05\x00ab"), "filter value lengths"),
    ],
)
def test_crafted_sections_that_disagree(craft, sections: tuple, reason: str) -> None:
    chunk = craft(*sections)
    with pytest.raises(BadChunk, match=reason):
        header = ck.decode_header(chunk)
        body = chunk[ck.HEADER_SIZE :]
        ck.check_body(header, body)
        ck.decode_records(header, body)
        ck.decode_filter_values(header, body)
