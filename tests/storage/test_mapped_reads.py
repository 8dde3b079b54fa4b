"""Reader.read(mapped=...): big chunks of the given types, taken whole, are checked in the mapped
segment and handed out as views of it (not copied); everything else is read as before, and a
reader that shares the cache still gets bytes."""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import CorruptLogError, Log, OffsetSpec, ReaderFilter
from leveret.storage.reader import BIG_CHUNK_BYTES

SEGMENT = "00000000000000000000.segment"
MAPPED = frozenset({32})
TYPES = (0, 32)


def big(tag: bytes, n: int = 1200) -> list[bytes]:
    """Records whose chunk body is over BIG_CHUNK_BYTES."""
    records = [tag + b"-%05d-" % i + b"x" * 120 for i in range(n)]
    assert sum(map(len, records)) > BIG_CHUNK_BYTES
    return records


def exporter(view: memoryview | bytes) -> type:
    return type(view.obj) if isinstance(view, memoryview) else type(view)


def test_a_big_chunk_is_handed_out_from_the_mapping(open_log: Callable[..., Log]) -> None:
    log = open_log()
    first, small, second = big(b"a"), [b"small"], big(b"b")
    log.append(first, chunk_type=32, records_crc=True)
    log.append(small, chunk_type=32, records_crc=True)
    log.append([b"user"] * 3000)  # big, but not of a mapped type
    log.append(second, chunk_type=32)  # big, without a kept CRC
    reader = log.reader(OffsetSpec.first(), chunk_types=TYPES)
    views = [reader.read(mapped=MAPPED) for _ in range(4)]
    assert reader.read(mapped=MAPPED) is None
    assert [exporter(v.record_bytes()) for v in views] == [mmap.mmap, bytes, bytes, mmap.mmap]
    assert bytes(views[0].record_bytes()) == b"".join(first)
    assert views[0].records_crc == zlib.crc32(views[0].record_bytes())
    assert views[3].records_crc is None
    assert [v.records for v in views] == [first, small, [b"user"] * 3000, second]
    assert all(type(r) is bytes for r in views[0].records)
    assert views[0].filter_values == [None] * len(first)
    reader.close()
    assert bytes(views[3].record_bytes()) == b"".join(second)  # still readable after close


def test_a_reader_sharing_the_cache_gets_bytes(open_log: Callable[..., Log]) -> None:
    log = open_log()
    records = big(b"c")
    log.append(records, chunk_type=32, records_crc=True)
    mapped = log.reader(OffsetSpec.first(), chunk_types=TYPES)
    assert exporter(mapped.read(mapped=MAPPED).record_bytes()) is mmap.mmap
    plain = log.reader(OffsetSpec.first(), chunk_types=TYPES)
    view = plain.read()
    assert exporter(view.record_bytes()) is bytes
    assert view.records == records and all(type(r) is bytes for r in view.records)
    again = log.reader(OffsetSpec.first(), chunk_types=TYPES).read(mapped=MAPPED)
    assert again.records == records


def test_parts_of_chunks_and_filtered_readers_are_read_as_before(
        open_log: Callable[..., Log]) -> None:
    log = open_log()
    records = big(b"d")
    log.append(records, [b"f"] * len(records), chunk_type=32, records_crc=True)
    inside = log.reader(OffsetSpec.offset(10), chunk_types=TYPES).read(mapped=MAPPED)
    assert inside.offsets == list(range(10, len(records)))
    assert inside.records == records[10:]
    filtered = log.reader(OffsetSpec.first(), ReaderFilter(frozenset({b"f"})),
                          chunk_types=TYPES).read(mapped=MAPPED)
    assert exporter(filtered.record_bytes()) is bytes
    assert filtered.records == records


def test_a_growing_segment_is_mapped_again(open_log: Callable[..., Log]) -> None:
    log = open_log()
    reader = log.reader(OffsetSpec.first(), chunk_types=TYPES)
    sent = []
    for tag in (b"e", b"f", b"g"):
        records = big(tag)
        log.append(records, chunk_type=32, records_crc=True)
        sent.append(records)
        view = reader.read(mapped=MAPPED)
        assert exporter(view.record_bytes()) is mmap.mmap
        assert bytes(view.record_bytes()) == b"".join(records)
    assert reader.read(mapped=MAPPED) is None


def test_a_new_segment_is_mapped(open_log: Callable[..., Log]) -> None:
    log = open_log(max_segment_chunks=1)
    batches = [big(b"h"), big(b"i"), big(b"j")]
    for records in batches:
        log.append(records, chunk_type=32, records_crc=True)
    reader = log.reader(OffsetSpec.first(), chunk_types=TYPES)
    got = [reader.read(mapped=MAPPED) for _ in batches]
    assert [bytes(v.record_bytes()) for v in got] == [b"".join(r) for r in batches]
    assert [v.first_offset for v in got] == [0, 1200, 2400]


def test_a_corrupt_big_chunk_is_reported_as_when_read(open_log: Callable[..., Log],
                                                      tmp_path: Path) -> None:
    log = open_log()
    log.append(big(b"k"), chunk_type=32, records_crc=True)
    segment = tmp_path / "log" / SEGMENT
    data = bytearray(segment.read_bytes())
    data[-100] ^= 0xFF  # a record byte of the chunk
    segment.write_bytes(bytes(data))
    for mapped in (MAPPED, frozenset()):
        reader = log.reader(OffsetSpec.first(), chunk_types=TYPES)
        with pytest.raises(CorruptLogError, match="chunk CRC mismatch"):
            reader.read(mapped=mapped)
        reader.close()
