"""Recovery: torn and corrupt tails are cut back to the last whole chunk, indexes are rebuilt,
tracking is reloaded, and damage in the middle of a log is reported, never skipped."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leveret.storage import (
    CorruptLogError,
    FakeClock,
    Log,
    LogConfig,
    LogIOError,
    OffsetSpec,
    Reader,
    Tracking,
    inspect,
)
from leveret.storage import chunk as ck

T0 = 1_700_000_000_000


def _name(base: int, suffix: str = "segment") -> str:
    return f"{base:020d}.{suffix}"


@dataclass
class Written:
    """What a test log holds: its chunks (segment base, position, next offset after it), the
    tracking state after each operation with the number of chunks written by then, and the
    records."""

    chunks: list[tuple[int, int, int]]
    tracking: list[tuple[int, Tracking]]
    records: dict[int, bytes]

    def tracking_after(self, chunks: int) -> Tracking:
        return max(((n, t) for n, t in self.tracking if n <= chunks), default=(0, Tracking()))[1]


def _build(directory: Path, ops: list[tuple[str, int]], **cfg: object) -> Written:
    written = Written([], [], {})
    clock = FakeClock(T0)
    with Log.open(directory, LogConfig(clock=clock, **cfg)) as log:
        for i, (kind, n) in enumerate(ops):
            clock.advance(1)
            if kind == "offsets":
                log.store_offsets({b"c%d" % (i % 3): max(log.last_offset, 0)})
            else:
                records = [b"%d-%d" % (i, j) * (j + 1) for j in range(n)]
                first = log.append(
                    records, [b"f%d" % j if j % 2 else None for j in range(n)], {b"p": i}
                )
                written.records.update(zip(range(first, first + n), records, strict=True))
            chunk_count = sum(s["chunks"] for s in log.summary()["segments"])
            written.tracking.append((chunk_count, log.tracking()))
    for base in sorted(int(n[:20]) for n in os.listdir(directory) if n.endswith(".segment")):
        for chunk in inspect.dump_segment(directory / _name(base)):
            written.chunks.append(
                (base, chunk["position"], chunk["first_offset"] + chunk["records"])
            )
    return written


def _check_reopened(directory: Path, written: Written, whole_chunks: int) -> None:
    """The log ends after `whole_chunks` chunks with everything before intact, sound on disk."""
    with Log.open(directory, LogConfig(clock=FakeClock(T0 + 10**6))) as log:
        next_offset = written.chunks[whole_chunks - 1][2] if whole_chunks else 0
        assert log.next_offset == next_offset
        assert log.tracking() == written.tracking_after(whole_chunks)
        got = {o: r for view in log.reader(OffsetSpec.first()) for o, r in view.items()}
        assert got == {o: r for o, r in written.records.items() if o < next_offset}
        assert inspect.verify(directory) == []
        assert log.append([b"after"]) == next_offset
        assert inspect.verify(directory) == []


ops_st = st.lists(
    st.one_of(st.tuples(st.just("append"), st.integers(1, 4)), st.just(("offsets", 0))),
    min_size=1,
    max_size=8,
)
SMALL = {"max_segment_size_bytes": 700}
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ops_st, st.data())
def test_a_torn_last_chunk_is_cut_back_at_any_byte(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("log")
    written = _build(directory, ops, **SMALL)
    base, position, _ = written.chunks[-1]
    segment = directory / _name(base)
    cut = data.draw(st.integers(position, segment.stat().st_size - 1), label="cut")
    os.truncate(segment, cut)
    _check_reopened(directory, written, len(written.chunks) - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ops_st, st.data())
def test_a_flipped_byte_in_the_last_chunk_is_cut_back(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("log")
    written = _build(directory, ops, **SMALL)
    base, position, _ = written.chunks[-1]
    segment = directory / _name(base)
    raw = bytearray(segment.read_bytes())
    at = data.draw(st.integers(position, len(raw) - 1), label="at")
    raw[at] ^= data.draw(st.integers(1, 255), label="xor")
    segment.write_bytes(bytes(raw))
    _check_reopened(directory, written, len(written.chunks) - 1)


def test_every_byte_boundary_of_the_last_chunk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    original = tmp_path / "original"
    written = _build(original, [("append", 3), ("offsets", 0), ("append", 2)])
    base, position, _ = written.chunks[-1]
    end = (original / _name(base)).stat().st_size
    for cut in range(position, end):
        directory = tmp_path / f"cut{cut}"
        shutil.copytree(original, directory)
        os.truncate(directory / _name(base), cut)
        with caplog.at_level(logging.WARNING, logger="leveret.storage"):
            _check_reopened(directory, written, len(written.chunks) - 1)
        if cut > position:
            assert f"truncated torn tail of {directory / _name(base)} at {position}" in caplog.text
        caplog.clear()


def test_a_torn_snapshot_drops_the_new_segment(tmp_path: Path) -> None:
    # max_segment_chunks=2: the 3rd chunk rolls to segment 2, which starts with a snapshot.
    written = _build(tmp_path, [("append", 1), ("append", 1), ("append", 1)], max_segment_chunks=2)
    assert [c[0] for c in written.chunks] == [0, 0, 2, 2]
    os.truncate(tmp_path / _name(2), 30)  # inside the snapshot: the segment holds nothing whole
    with Log.open(tmp_path):
        assert sorted(os.listdir(tmp_path)) == [_name(0, "index"), _name(0)]
    _check_reopened(tmp_path, written, 2)


def test_a_torn_segment_header(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 1)], max_segment_chunks=1)
    with Log.open(tmp_path, LogConfig(max_segment_chunks=1)) as log:
        log.append([b"x"])  # rolls to segment 1
    os.truncate(tmp_path / _name(1), 3)
    (tmp_path / _name(1, "index")).unlink()
    _check_reopened(tmp_path, written, 1)
    only = tmp_path / "only"
    only.mkdir()
    (only / _name(0)).write_bytes(b"LVS")
    with Log.open(only) as log:
        assert log.next_offset == 0 and log.append([b"a"]) == 0


def test_index_entries_past_the_end_and_garbage_are_dropped(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 2), ("append", 2)])
    index = tmp_path / _name(0, "index")
    good = index.read_bytes()
    bogus = bytearray(good[-32:])
    bogus[16:24] = (10**6).to_bytes(8, "little")  # a position past the segment's end
    index.write_bytes(good + bytes(bogus) + b"\x07" * 13)
    _check_reopened(tmp_path, written, 2)
    assert index.read_bytes()[: len(good)] == good


def test_chunks_missing_from_the_active_index_are_reindexed(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 2), ("offsets", 0), ("append", 3)])
    index = tmp_path / _name(0, "index")
    index.write_bytes(index.read_bytes()[:-64])  # as if we crashed before writing two entries
    _check_reopened(tmp_path, written, 3)


@pytest.mark.parametrize("damage", ["missing", "bad magic", "partial entry", "wrong entry"])
def test_a_damaged_index_is_rebuilt_from_its_segment(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    written = _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)
    for base in (0, 6):  # a sealed segment and the active one
        index = tmp_path / _name(base, "index")
        good = index.read_bytes()
        if damage == "missing":
            index.unlink()
        elif damage == "bad magic":
            index.write_bytes(b"XXXX" + good[4:])
        elif damage == "partial entry":
            index.write_bytes(good + b"\x01\x02")
        else:
            index.write_bytes(good[:-32] + bytes(32))
        with caplog.at_level(logging.WARNING, logger="leveret.storage"), Log.open(tmp_path):
            pass
        assert index.read_bytes() == good
    _check_reopened(tmp_path, written, len(written.chunks))


def test_orphan_index_files_are_deleted(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 2)])
    orphan = tmp_path / _name(99, "index")
    orphan.write_bytes(b"LVIX\x01\x00\x00\x00")
    _check_reopened(tmp_path, written, 1)
    assert not orphan.exists()


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_corrupt_chunk_in_the_middle_is_reported_by_readers(tmp_path: Path) -> None:
    # segment 0: chunks at offsets 0 2 4 6; segment 8 (active): snapshot, 8 10 12
    written = _build(tmp_path, [("append", 2)] * 7, max_segment_chunks=4)
    assert [c[0] for c in written.chunks] == [0] * 4 + [8] * 4
    for base, position, _ in (written.chunks[1], written.chunks[5]):  # sealed, then active
        segment = tmp_path / _name(base)
        _flip(segment, position + 60)  # in the bloom filter, covered by the body CRC
        with Log.open(tmp_path) as log:  # opening does not read the middle of the log
            assert log.next_offset == 14
            with pytest.raises(CorruptLogError) as raised:
                for _ in log.reader(OffsetSpec.first()):
                    pass
            assert (raised.value.path, raised.value.position) == (segment, position)
        problems = inspect.verify(tmp_path)
        assert [(p.path, p.position) for p in problems] == [(segment, position)]
        _flip(segment, position + 60)


def test_damaged_tracking_in_the_active_segment_fails_the_open(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 2)] * 7, max_segment_chunks=4)
    segment = tmp_path / _name(8)
    snapshot, middle, after = (c[1] for c in written.chunks[4:7])  # all in segment 8
    cases = [
        (snapshot + 10, snapshot, "header CRC"),
        (middle - 3, snapshot, "tracking trailer CRC"),  # the end of the snapshot's trailer
        (middle + 10, middle, "header CRC"),
        (after - 3, middle, "tracking trailer CRC"),  # a publisher trailer
    ]
    for at, position, reason in cases:
        _flip(segment, at)
        with pytest.raises(CorruptLogError, match=reason) as raised:
            Log.open(tmp_path)
        assert (raised.value.path, raised.value.position) == (segment, position)
        _flip(segment, at)
    with Log.open(tmp_path) as log:
        assert log.next_offset == 14


def test_a_damaged_older_segment_fails_to_open_with_its_file_and_position(tmp_path: Path) -> None:
    written = _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)
    base, position, _ = written.chunks[2]  # the last chunk of sealed segment 0
    segment = tmp_path / _name(base)
    os.truncate(segment, position + 20)
    with pytest.raises(CorruptLogError) as raised:
        Log.open(tmp_path)
    assert (raised.value.path, raised.value.position) == (segment, position)
    assert "partial chunk" in raised.value.reason


def test_a_gap_between_segments_is_reported(tmp_path: Path) -> None:
    _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)  # segments 0, 6, 10
    (tmp_path / _name(6)).unlink()
    (tmp_path / _name(6, "index")).unlink()
    with pytest.raises(CorruptLogError, match="next segment starts at 10") as raised:
        Log.open(tmp_path)
    assert raised.value.path == tmp_path / _name(0)


def test_a_renamed_segment_is_reported(tmp_path: Path) -> None:
    _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)
    os.rename(tmp_path / _name(6), tmp_path / _name(7))
    with pytest.raises(CorruptLogError, match="chunk offset 6, expected 7") as raised:
        Log.open(tmp_path)
    assert (raised.value.path, raised.value.position) == (tmp_path / _name(7), 8)


def test_a_foreign_file_is_reported_not_rewritten(tmp_path: Path) -> None:
    (tmp_path / _name(0)).write_bytes(b"NOTALOG!" + bytes(100))
    with pytest.raises(CorruptLogError, match="bad magic"):
        Log.open(tmp_path)
    assert (tmp_path / _name(0)).read_bytes()[:8] == b"NOTALOG!"
    (tmp_path / _name(0)).write_bytes(b"LVSG\x09\x00\x00\x00")
    with pytest.raises(CorruptLogError, match="unsupported format version 9"):
        Log.open(tmp_path)


def test_a_corrupt_trailer_is_reported(tmp_path: Path) -> None:
    """A chunk whose CRCs pass but whose tracking trailer is malformed (hand-made)."""
    with Log.open(tmp_path) as log:
        log.append([b"a"])
    trailer = b"\x05\x00" + ck.crc32c(b"\x05\x00").to_bytes(4, "little")
    bad = bytes(ck.encode_chunk(0, 1, 2 * T0, [b"b"], trailer=trailer))
    with open(tmp_path / _name(0), "ab") as f:
        f.write(bad)
    with pytest.raises(CorruptLogError, match="malformed tracking entry"):
        Log.open(tmp_path)
    assert Reader.open(tmp_path, OffsetSpec.first()).read() is not None


def test_an_empty_older_segment_is_reported(tmp_path: Path) -> None:
    _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)  # segments 0, 6, 10
    (tmp_path / _name(6)).write_bytes(b"LVSG\x01\x00\x00\x00")
    with pytest.raises(CorruptLogError, match="holds no chunks") as raised:
        Log.open(tmp_path)
    assert raised.value.path == tmp_path / _name(6)


def test_files_that_cannot_be_opened_are_typed_errors(tmp_path: Path) -> None:
    _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)  # segments 0, 6, 10
    active_index = tmp_path / _name(10, "index")
    active_index.unlink()
    active_index.mkdir()
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path)
    assert raised.value.path == tmp_path / _name(10)
    active_index.rmdir()
    sealed = tmp_path / _name(6)
    saved = sealed.read_bytes()
    sealed.unlink()
    sealed.mkdir()
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path)
    assert raised.value.path == sealed
    sealed.rmdir()
    sealed.write_bytes(b"LVXX" + saved[4:])
    with pytest.raises(CorruptLogError, match="bad magic") as raised:
        Log.open(tmp_path)
    assert (raised.value.path, raised.value.position) == (sealed, 0)


def test_an_index_that_cannot_be_rewritten(tmp_path: Path) -> None:
    _build(tmp_path, [("append", 2)] * 6, max_segment_chunks=3)
    index = tmp_path / _name(6, "index")
    index.unlink()
    index.symlink_to(tmp_path / "no-such-dir" / "x.index")
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path)
    assert raised.value.path == index


def test_a_tail_chunk_stamped_in_the_past_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written = _build(tmp_path, [("append", 2)])
    stale = bytes(ck.encode_chunk(0, 2, T0 - 1, [b"x"]))  # whole, but out of order in time
    with open(tmp_path / _name(0), "ab") as f:
        f.write(stale)
    with caplog.at_level(logging.WARNING, logger="leveret.storage"):
        _check_reopened(tmp_path, written, 1)
    assert "chunk timestamp goes backwards" in caplog.text
