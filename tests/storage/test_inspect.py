"""Inspection: dumps, verify, summarise; read-only on a live log."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import CorruptLogError, FakeClock, Log, LogConfig, inspect

OpenLog = Callable[..., Log]


def test_dump_segment_and_index(open_log: OpenLog, tmp_path: Path, clock: FakeClock) -> None:
    log = open_log()
    log.append([b"a", b"bb"], [b"x", None], {b"pub": 3})
    log.store_offsets({b"con": 1})
    segment = tmp_path / "log" / "00000000000000000000.segment"
    chunks = list(inspect.dump_segment(segment))
    assert chunks[0] | {"tracking": None} == {
        "position": 8, "chunk_type": 0, "first_offset": 0, "records": 2,
        "timestamp_ms": clock(), "epoch": 0, "bloom_bytes": 16, "data_bytes": 11,
        "filter_bytes": 5, "trailer_bytes": 25, "size": 56 + 16 + 11 + 5 + 25, "crc_ok": True,
        "tracking": None,
    }  # fmt: skip
    assert chunks[0]["tracking"] == [{"kind": "publisher", "name": b"pub", "value": 3}]
    assert chunks[1]["tracking"] == [{"kind": "consumer", "name": b"con", "value": 1}]
    entries = list(inspect.dump_index(tmp_path / "log" / "00000000000000000000.index"))
    assert entries == [
        {"first_offset": 0, "timestamp_ms": clock(), "position": 8, "num_records": 2,
         "chunk_type": 0, "flags": 1},
        {"first_offset": 2, "timestamp_ms": clock(), "position": chunks[1]["position"],
         "num_records": 0, "chunk_type": 1, "flags": 1},
    ]  # fmt: skip


def test_dumps_report_damage(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"])
    log.append([b"b"])
    log.close()
    segment = tmp_path / "log" / "00000000000000000000.segment"
    raw = bytearray(segment.read_bytes())
    second = next(c["position"] for c in inspect.dump_segment(segment) if c["first_offset"] == 1)
    raw[-1] ^= 0xFF
    segment.write_bytes(bytes(raw) + b"torn")
    dumped = list(inspect.dump_segment(segment))
    assert dumped[1]["position"] == second and dumped[1]["crc_ok"] is False
    assert dumped[2] == {"position": len(raw), "error": "partial chunk header"}
    (tmp_path / "x.index").write_bytes(b"nope")
    with pytest.raises(CorruptLogError, match="shorter than its 8-byte header"):
        list(inspect.dump_index(tmp_path / "x.index"))
    (tmp_path / "x.segment").write_bytes(b"LVIX\x01\x00\x00\x00")
    with pytest.raises(CorruptLogError, match="bad magic"):
        list(inspect.dump_segment(tmp_path / "x.segment"))


def test_verify_finds_every_kind_of_problem(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=2)
    for i in range(6):
        log.append([b"r%d" % i])
    log.close()
    directory = tmp_path / "log"
    assert inspect.verify(directory) == []
    seg2 = directory / "00000000000000000002.segment"
    raw = bytearray(seg2.read_bytes())
    raw[-2] ^= 0x01  # a record byte of the last chunk of segment 2
    seg2.write_bytes(bytes(raw))
    (directory / "00000000000000000004.index").unlink()
    (directory / "00000000000000000000.index").write_bytes(
        (directory / "00000000000000000000.index").read_bytes()[:-32] + b"\x01"
    )
    (directory / "00000000000000000077.index").write_bytes(b"LVIX\x01\x00\x00\x00")
    found = {(p.path.name, p.reason) for p in inspect.verify(directory)}
    assert found == {
        ("00000000000000000077.index", "index without a segment"),
        ("00000000000000000002.segment", "chunk CRC mismatch"),
        ("00000000000000000004.index", "index is missing"),
        ("00000000000000000000.index", "partial index entry"),
        ("00000000000000000000.index", "1 entries missing"),
    }
    crc = next(p for p in inspect.verify(directory) if p.reason == "chunk CRC mismatch")
    assert str(crc) == f"{seg2} at {crc.position}: chunk CRC mismatch"


def test_verify_checks_offsets_and_index_contents(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", LogConfig(max_segment_chunks=2)) as log:
        for i in range(4):
            log.append([b"r%d" % i])
    directory = tmp_path / "log"
    index = directory / "00000000000000000000.index"
    raw = bytearray(index.read_bytes())
    raw[8 + 8] ^= 0x01  # entry 0's timestamp
    index.write_bytes(bytes(raw) + raw[-32:])
    os.rename(
        directory / "00000000000000000002.segment", directory / "00000000000000000003.segment"
    )
    os.rename(directory / "00000000000000000002.index", directory / "00000000000000000003.index")
    found = {(p.path.name, p.position, p.reason) for p in inspect.verify(directory)}
    assert found == {
        ("00000000000000000000.index", 8, "entry 0 does not match its chunk"),
        ("00000000000000000000.index", 72, "entries past the last chunk"),
        ("00000000000000000003.segment", 0, "segment starts at offset 3, expected 2"),
        ("00000000000000000003.segment", 8, "chunk offset 2, expected 3"),
    }


def test_summarise_reads_without_repairing(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=2)
    for i in range(5):
        log.append([b"r%d" % i], publishers={b"p": i})
    log.store_offsets({b"c": 2})
    expected = log.summary()
    assert inspect.summarise(tmp_path / "log") == expected  # while the log is open
    log.close()
    directory = tmp_path / "log"
    (directory / "00000000000000000004.index").unlink()
    before = sorted(os.listdir(directory))
    assert inspect.summarise(directory) == expected
    assert sorted(os.listdir(directory)) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert inspect.summarise(empty)["segments"] == []


def test_verify_reports_unreadable_files(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", LogConfig(max_segment_chunks=1)) as log:
        for i in range(3):
            log.append([b"r%d" % i])
    directory = tmp_path / "log"
    (directory / "00000000000000000000.segment").write_bytes(b"LVSG\x07\x00\x00\x00")
    (directory / "00000000000000000001.index").write_bytes(b"junk")
    with open(directory / "00000000000000000002.segment", "ab") as f:
        f.write(b"torn")
    found = {(p.path.name, p.position, p.reason) for p in inspect.verify(directory)}
    size2 = os.path.getsize(directory / "00000000000000000002.segment")
    assert found == {
        ("00000000000000000000.segment", 0, "unsupported format version 7"),
        ("00000000000000000000.index", 8, "entries past the last chunk"),
        ("00000000000000000001.segment", 0, "segment starts at offset 1, expected 0"),
        ("00000000000000000001.index", 0, "file shorter than its 8-byte header"),
        ("00000000000000000002.segment", size2 - 4, "partial chunk header"),
    }


def test_summarise_a_fresh_or_torn_log(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log") as log:
        fresh = log.summary()
    assert inspect.summarise(tmp_path / "log") == fresh
    with Log.open(tmp_path / "log") as log:
        log.append([b"a"], publishers={b"p": 1})
        log.append([b"b"], publishers={b"p": 2})
    segment = tmp_path / "log" / "00000000000000000000.segment"
    os.truncate(segment, segment.stat().st_size - 5)
    summary = inspect.summarise(tmp_path / "log")
    assert summary["next_offset"] == 1 and summary["tracking"]["publishers"] == {b"p": 1}
    with Log.open(tmp_path / "log") as log:  # recovery agrees
        assert log.summary() == summary
