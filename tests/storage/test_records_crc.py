"""The records CRC of chunk format version 3 (docs/FORMAT.md 3.1): a chunk written with
`records_crc` keeps the zlib CRC-32 of its record bytes, checked by the header CRC; chunks
without it stay version 2, and logs of version 1 and 2 chunks still open, read, recover, ship
and take version 3 chunks."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import Log, OffsetSpec, inspect
from leveret.storage import chunk as ck
from leveret.storage.errors import BadChunk

SEGMENT = "00000000000000000000.segment"
RECORDS = [b"first record", b"", b"x" * 300, b"\x00\x01\x02"]


def _views(log: Log, spec: OffsetSpec | None = None) -> list:
    reader = log.reader(spec or OffsetSpec.first(), chunk_types=(0, 32))
    views = list(reader)
    reader.close()
    return views


def test_a_chunk_keeps_the_crc_32_of_its_record_bytes() -> None:
    data = bytes(ck.encode_chunk(32, 5, 1, RECORDS, [b"f", None, b"g", None], epoch=2,
                                 trailer=b"", records_crc=True))
    header = ck.decode_header(data)
    assert (header.header_size, header.epoch, header.first_offset) == (ck.MAX_HEADER_SIZE, 2, 5)
    assert ck.header_length(data) == 60
    assert header.records_crc == zlib.crc32(b"".join(RECORDS))
    body = data[header.header_size:]
    ck.check_body(header, body)
    assert header.total_size == len(data)
    assert ck.decode_records(header, body) == RECORDS
    assert bytes(ck.record_bytes(header, body)) == b"".join(RECORDS)
    assert ck.decode_filter_values(header, body) == [b"f", None, b"g", None]


def test_without_it_a_chunk_is_written_as_version_2() -> None:
    data = bytes(ck.encode_chunk(0, 0, 1, RECORDS))
    header = ck.decode_header(data)
    assert (data[4], header.header_size, header.records_crc) == (2, 56, None)


def test_a_flipped_records_crc_is_a_header_crc_mismatch() -> None:
    data = bytearray(ck.encode_chunk(32, 0, 1, RECORDS, records_crc=True))
    data[48] ^= 0x01  # inside the records CRC (bytes 48-51)
    with pytest.raises(BadChunk, match="chunk header CRC mismatch"):
        ck.decode_header(data)


def test_a_partial_version_3_header_is_partial() -> None:
    data = bytes(ck.encode_chunk(32, 0, 1, RECORDS, records_crc=True))
    with pytest.raises(BadChunk, match="partial chunk header"):
        ck.decode_header(data[:57])  # a whole version 2 header's worth, not a version 3 one


def test_a_log_hands_out_the_kept_crc(open_log: Callable[..., Log]) -> None:
    log = open_log()
    log.append(RECORDS, chunk_type=32, records_crc=True)
    log.append([b"amqp 0.9.1"])  # not asked: no records CRC
    first, second = _views(log)
    assert first.records_crc == zlib.crc32(first.record_bytes()) == zlib.crc32(b"".join(RECORDS))
    assert [r for _o, r in first.items()] == RECORDS
    assert second.records_crc is None
    assert second.records == [b"amqp 0.9.1"]


def test_records_crc_is_not_kept_for_a_chunk_without_records(open_log: Callable[..., Log],
                                                               tmp_path: Path) -> None:
    log = open_log()
    log.append([], publishers={b"p": 1}, records_crc=True)  # a tracking chunk: nothing to keep
    log.close()
    sizes = [c["size"] - c["trailer_bytes"] for c in inspect.dump_segment(tmp_path / "log"
                                                                            / SEGMENT)]
    assert sizes == [56]


def test_a_version_2_log_opens_reads_and_takes_version_3_chunks(
    open_log: Callable[..., Log], tmp_path: Path
) -> None:
    log = open_log()
    log.append([b"v2-a", b"v2-b"], chunk_type=32)  # as Leveret wrote it before version 3
    log.close()
    segment = tmp_path / "log" / SEGMENT
    old = open_log()
    old.append([b"v3-a", b"v3-b", b"v3-c"], chunk_type=32, records_crc=True)
    old.append([b"v2-c"], chunk_type=32)
    old.close()
    chunks = list(inspect.dump_segment(segment))
    assert [c["size"] - c["data_bytes"] for c in chunks] == [56, 60, 56]
    assert all(c["crc_ok"] for c in chunks)
    reopened = open_log()  # recovery walks the three versions
    assert reopened.next_offset == 6
    views = _views(reopened)
    assert [v.records_crc for v in views] == [None, zlib.crc32(b"v3-av3-bv3-c"), None]
    assert [r for v in views for _o, r in v.items()] == [b"v2-a", b"v2-b", b"v3-a", b"v3-b",
                                                         b"v3-c", b"v2-c"]
    assert [r for v in _views(reopened, OffsetSpec.offset(3)) for _o, r in v.items()] == [
        b"v3-b", b"v3-c", b"v2-c"]


def test_a_version_1_chunk_before_a_version_3_one(
    open_log: Callable[..., Log], tmp_path: Path, version_1: Callable[[bytes], bytes]
) -> None:
    log = open_log()
    log.append([b"old"])
    log.close()
    segment = tmp_path / "log" / SEGMENT
    data = segment.read_bytes()
    at = next(iter(inspect.dump_segment(segment)))["position"]
    segment.write_bytes(data[:at] + version_1(data[at:]))
    (tmp_path / "log" / "00000000000000000000.index").unlink()
    old = open_log()
    old.append([b"new"], chunk_type=32, records_crc=True)
    old.close()
    assert [c["size"] - c["data_bytes"] for c in inspect.dump_segment(segment)] == [48, 60]
    views = _views(open_log())
    assert [(v.records_crc, v.records) for v in views] == [(None, [b"old"]),
                                                           (zlib.crc32(b"new"), [b"new"])]


@pytest.mark.parametrize("cut", [5, 240 - 2])  # inside the body; inside the header
def test_a_torn_version_3_tail_is_cut(open_log: Callable[..., Log], tmp_path: Path,
                                      cut: int) -> None:
    log = open_log()
    log.append([b"kept"], chunk_type=32, records_crc=True)
    log.append([b"torn" * 50], chunk_type=32, records_crc=True)  # 60 + 4 + 200 bytes
    log.close()
    segment = tmp_path / "log" / SEGMENT
    segment.write_bytes(segment.read_bytes()[:-cut])
    recovered = open_log()
    assert recovered.next_offset == 1
    assert [v.records for v in _views(recovered)] == [[b"kept"]]
    recovered.append([b"again"], chunk_type=32, records_crc=True)
    assert [v.records for v in _views(recovered)] == [[b"kept"], [b"again"]]


def test_a_replica_keeps_the_records_crc(open_log: Callable[..., Log], tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    leader.append([b"a", b"b"], chunk_type=32, records_crc=True)
    leader.append([b"c"])
    replica = open_log(tmp_path / "replica")
    data, cursor = leader.read_chunks(leader.ship_from(0), 1 << 20)
    assert replica.append_chunks(data) == cursor.offset == 3
    assert [v.records_crc for v in _views(replica)] == [zlib.crc32(b"ab"), None]


def test_a_version_3_header_keeps_the_v2_fields_in_place() -> None:
    """Bytes 0-47 are laid out as in version 2; the records CRC sits where version 2 has its
    body CRC, which moves 4 bytes on (docs/FORMAT.md)."""
    data = bytes(ck.encode_chunk(32, 9, 77, [b"r"], epoch=4, records_crc=True))
    assert data[:4] == b"LVCK" and data[4] == 3 and data[5] == 32
    assert struct.unpack_from("<QqQIII", data, 24) == (
        9, 77, 4, zlib.crc32(b"r"), ck.crc32c(data[60:]), ck.crc32c(data[:56]))
