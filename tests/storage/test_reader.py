"""Readers: offset specs, the committed bound, filters, chunk types, segments and retention."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leveret.storage import (
    ChunkType,
    CorruptLogError,
    FakeClock,
    Log,
    LogClosedError,
    LogConfig,
    LogIOError,
    OffsetSpec,
    Reader,
    ReaderFilter,
    inspect,
)

OpenLog = Callable[..., Log]
T0 = 1_700_000_000_000


def _offsets(reader: Reader) -> list[int]:
    return [offset for view in reader for offset, _ in view.items()]


def _ten_chunks(log: Log, clock: FakeClock) -> None:
    """Chunks of 3 records at offsets 0, 3, ... 27, stamped T0, T0+10, ... T0+90."""
    for i in range(10):
        log.append([b"r%d" % (3 * i + j) for j in range(3)])
        clock.advance(10)


@pytest.fixture
def ten(open_log: OpenLog, clock: FakeClock) -> Log:
    log = open_log(max_segment_chunks=4)
    _ten_chunks(log, clock)
    return log


def test_first_next_and_last(ten: Log) -> None:
    assert _offsets(ten.reader(OffsetSpec.first())) == list(range(30))
    last = ten.reader(OffsetSpec.last())
    assert last.position == 27 and _offsets(last) == [27, 28, 29]
    nxt = ten.reader(OffsetSpec.next())
    assert nxt.position == 30 and nxt.read() is None
    ten.append([b"new"])
    view = nxt.read()
    assert view is not None and list(view.items()) == [(30, b"new")] and nxt.position == 31


def test_last_is_the_last_chunk_of_the_wanted_types(ten: Log) -> None:
    ten.store_offsets({b"c": 3})
    ten.append([b"ack"], chunk_type=20)
    assert ten.reader(OffsetSpec.last()).position == 27
    assert ten.reader(OffsetSpec.last(), chunk_types=(20,)).position == 30
    tracking = ten.reader(OffsetSpec.last(), chunk_types=(ChunkType.TRACKING_DELTA,))
    view = tracking.read()
    assert view is not None and view.tracking is not None
    assert view.tracking.consumers == {b"c": 3} and view.records == []


@pytest.mark.parametrize("spec", [OffsetSpec.first(), OffsetSpec.last(), OffsetSpec.next()])
def test_specs_on_an_empty_log(open_log: OpenLog, spec: OffsetSpec) -> None:
    log = open_log()
    reader = log.reader(spec)
    assert reader.position == 0 and reader.read() is None
    log.append([b"x"])
    assert _offsets(reader) == [0]


def test_an_absolute_offset_starts_exactly_there(ten: Log) -> None:
    reader = ten.reader(OffsetSpec.offset(13))
    view = reader.read()
    assert view is not None and view.first_offset == 12 and view.offsets == [13, 14]
    assert view.records == [b"r13", b"r14"]
    assert _offsets(reader) == list(range(15, 30))


def test_absolute_offsets_are_clamped(ten: Log) -> None:
    assert ten.reader(OffsetSpec.offset(-5)).position == 0
    beyond = ten.reader(OffsetSpec.offset(1000))
    assert beyond.position == 30 and beyond.read() is None
    ten.set_retention(max_length_bytes=0)
    assert ten.first_offset == 24
    below = ten.reader(OffsetSpec.offset(3))
    assert below.position == 24 and _offsets(below) == list(range(24, 30))


def test_timestamps(ten: Log) -> None:
    def start(ts: int) -> int:
        return ten.reader(OffsetSpec.timestamp(ts)).position

    assert start(T0 + 20) == 6  # exactly a chunk's stamp
    assert start(T0 + 21) == 9  # between two chunks: the later one
    assert start(0) == 0  # older than everything: first
    reader = ten.reader(OffsetSpec.timestamp(T0 + 1000))  # newer than everything: next
    assert reader.position == 30 and reader.read() is None
    ten.append([b"later"])
    assert _offsets(reader) == [30]


chunks_st = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.booleans()), max_size=25)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE_OK)
@given(chunks_st, st.data())
def test_attach_agrees_with_a_linear_scan(
    tmp_path_factory: pytest.TempPathFactory,
    chunks: list[tuple[int, int, bool]],
    data: st.DataObject,
) -> None:
    clock = FakeClock(T0)
    stamps: list[tuple[int, int, int]] = []  # (first offset, count, timestamp) of user chunks
    cfg = LogConfig(clock=clock, max_segment_chunks=3)
    with Log.open(tmp_path_factory.mktemp("log"), cfg) as log:
        for count, gap, with_tracking in chunks:
            clock.advance(gap)
            stamps.append((log.next_offset, count, clock()))
            log.append([b"x"] * count)
            if with_tracking:
                log.store_offsets({b"c": log.last_offset})
        every = [o for first, n, _ in stamps for o in range(first, first + n)]
        for _ in range(5):
            n = data.draw(st.integers(-3, log.next_offset + 3))
            expected = [o for o in every if o >= max(n, 0)]
            assert _offsets(log.reader(OffsetSpec.offset(n))) == expected
            ts = data.draw(st.integers(T0 - 2, clock() + 2))
            chosen = next((first for first, _, t in stamps if t >= ts), log.next_offset)
            from_ts = _offsets(log.reader(OffsetSpec.timestamp(ts)))
            assert from_ts == [o for o in every if o >= chosen]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["append", "tick", "sync_due", "read", "offsets"]), max_size=60))
def test_a_reader_never_yields_past_committed(tmp_path_factory, ops: list[str]) -> None:
    clock = FakeClock(T0)
    cfg = LogConfig(clock=clock, fsync=50, max_segment_chunks=3)
    with Log.open(tmp_path_factory.mktemp("log"), cfg) as log:
        reader = log.reader(OffsetSpec.first())
        seen: list[int] = []
        for op in ops:
            if op == "append":
                log.append([b"a", b"b"])
            elif op == "tick":
                clock.advance(30)
            elif op == "sync_due":
                log.sync_due()
            elif op == "offsets":
                log.store_offsets({b"c": max(log.last_offset, 0)})
            else:
                view = reader.read()
                if view is not None:
                    assert view.first_offset + view.num_records - 1 <= log.committed_offset
                    seen += [o for o, _ in view.items()]
        assert seen == list(range(len(seen)))
        assert all(o <= log.committed_offset for o in seen)


def _fruit_log(open_log: OpenLog) -> Log:
    log = open_log(filter_size_bytes=64)
    log.append([b"a0", b"a1"], [b"apple", b"apple"])  # 0-1
    log.append([b"b2", b"n3", b"a4"], [b"banana", None, b"apple"])  # 2-4
    log.append([b"n5"])  # 5, unfiltered
    log.append([b"c6"], [b"cherry"])  # 6
    return log


def test_bloom_filter_skips_whole_chunks_as_rabbitmq(open_log: OpenLog) -> None:
    log = _fruit_log(open_log)
    reader = log.reader(OffsetSpec.first(), ReaderFilter(frozenset({b"banana"}), exact=False))
    view = reader.read()
    assert view is not None and view.offsets is None and view.records == [b"b2", b"n3", b"a4"]
    assert view.filter_values == [b"banana", None, b"apple"]
    assert reader.read() is None and reader.position == 7


def test_exact_filter_returns_only_matching_records(open_log: OpenLog) -> None:
    log = _fruit_log(open_log)
    apple = ReaderFilter({b"apple"})
    views = list(log.reader(OffsetSpec.first(), apple))
    assert [(v.offsets, v.records) for v in views] == [(None, [b"a0", b"a1"]), ([4], [b"a4"])]
    assert views[1].filter_values == [b"apple"]
    unfiltered = ReaderFilter(frozenset({b"cherry"}), match_unfiltered=True)
    got = [item for v in log.reader(OffsetSpec.first(), unfiltered) for item in v.items()]
    assert got == [(3, b"n3"), (5, b"n5"), (6, b"c6")]
    nothing = ReaderFilter(frozenset({b"durian"}))
    assert list(log.reader(OffsetSpec.first(), nothing)) == []


def test_filtered_readers_skip_chunks_without_reading_their_records(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = _fruit_log(open_log)
    segment = tmp_path / "log" / "00000000000000000000.segment"
    banana = next(c for c in inspect.dump_segment(segment) if c["first_offset"] == 2)
    with open(segment, "r+b") as f:  # damage a record of the banana chunk
        f.seek(banana["position"] + 56 + banana["bloom_bytes"] + 12 + 1)
        f.write(b"X")
    cherries = log.reader(OffsetSpec.first(), ReaderFilter(frozenset({b"cherry"})))
    assert _offsets(cherries) == [6]
    with pytest.raises(CorruptLogError) as raised:
        _offsets(log.reader(OffsetSpec.first()))
    assert raised.value.path == segment and raised.value.position == banana["position"]
    assert "CRC" in raised.value.reason


def test_reading_across_segments_and_under_retention(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _ten_chunks(log, clock)  # segments 0, 6, 12, 18, 24
    slow = log.reader(OffsetSpec.first())
    assert slow.read().first_offset == 0
    deleted = log.truncate_before(18)
    assert [p.name for p in deleted] == [f"{b:020d}.segment" for b in (0, 6, 12)]
    # it finishes the segment it has open, then moves on to the oldest remaining one
    assert _offsets(slow) == [3, 4, 5, *range(18, 30)]
    assert slow.position == 30


def test_a_reader_whose_next_segment_is_gone_jumps(
    open_log: OpenLog, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(max_segment_chunks=2)
    _ten_chunks(log, clock)
    reader = log.reader(OffsetSpec.offset(3))
    log.truncate_before(24)  # reader has segment 0 open; 6..18 vanish
    with caplog.at_level(logging.INFO, logger="leveret.storage.reader"):
        assert _offsets(reader) == [3, 4, 5, 24, 25, 26, 27, 28, 29]
    assert "moved from offset 6 to 24" in caplog.text


def test_a_reader_of_a_deleted_log_stops_quietly(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _ten_chunks(log, clock)
    reader = log.reader(OffsetSpec.first())
    log.close()
    for name in os.listdir(log.directory):
        os.unlink(log.directory / name)
    assert _offsets(reader) == [0, 1, 2, 3, 4, 5]
    other = Reader.open(log.directory, OffsetSpec.first())
    os.rmdir(log.directory)
    assert other.read() is None


def test_standalone_readers(open_log: OpenLog, clock: FakeClock, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=3)
    _ten_chunks(log, clock)
    bound = Reader.open(tmp_path / "log", OffsetSpec.first(), committed=lambda: 7)
    assert _offsets(bound) == list(range(6))  # the chunk 6..8 is not wholly committed
    everything = Reader.open(tmp_path / "log", OffsetSpec.offset(20))
    assert _offsets(everything) == list(range(20, 30))
    with Reader.open(tmp_path / "log", OffsetSpec.last()) as last:
        assert _offsets(last) == [27, 28, 29]
    with pytest.raises(LogClosedError):
        last.read()


def test_a_reader_can_wait_for_a_log_to_appear(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    reader = Reader.open(tmp_path / "log", OffsetSpec.first())
    assert reader.read() is None and reader.position == 0
    with Log.open(tmp_path / "log") as log:
        log.append([b"hello"])
    assert _offsets(reader) == [0]


def test_a_missing_directory_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(LogIOError) as raised:
        Reader.open(tmp_path / "nope", OffsetSpec.first())
    assert raised.value.path == tmp_path / "nope"


def test_attach_survives_a_damaged_or_missing_index(
    open_log: OpenLog, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log()
    _ten_chunks(log, clock)
    log.close()
    index = tmp_path / "log" / "00000000000000000000.index"
    raw = bytearray(index.read_bytes())
    for i in range(10):  # every entry's position now points into the middle of a chunk
        raw[8 + 32 * i + 16] ^= 0x01
    index.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        assert _offsets(Reader.open(tmp_path / "log", OffsetSpec.offset(13))) == list(range(13, 30))
        assert Reader.open(tmp_path / "log", OffsetSpec.timestamp(T0 + 35)).position == 12
    assert "disagrees" in caplog.text
    index.unlink()
    assert _offsets(Reader.open(tmp_path / "log", OffsetSpec.offset(13))) == list(range(13, 30))
    assert Reader.open(tmp_path / "log", OffsetSpec.last()).position == 27


def test_offset_spec_checks() -> None:
    with pytest.raises(ValueError, match="unknown offset spec"):
        OffsetSpec("middle")
    with pytest.raises(TypeError):
        OffsetSpec.offset("5")


def test_a_partial_chunk_at_the_end_of_an_older_segment(
    open_log: OpenLog, clock: FakeClock, tmp_path: Path
) -> None:
    log = open_log(max_segment_chunks=2)
    _ten_chunks(log, clock)
    log.close()
    with open(tmp_path / "log" / "00000000000000000000.segment", "ab") as f:
        f.write(b"LVCK-garbage")
    reader = Reader.open(tmp_path / "log", OffsetSpec.first())
    assert [v.first_offset for v in (reader.read(), reader.read())] == [0, 3]
    with pytest.raises(CorruptLogError, match="partial chunk at the end") as raised:
        reader.read()
    assert raised.value.path == tmp_path / "log" / "00000000000000000000.segment"


def test_unbounded_readers_wait_for_a_chunk_being_written(
    open_log: OpenLog, clock: FakeClock, tmp_path: Path
) -> None:
    log = open_log()
    _ten_chunks(log, clock)
    log.close()
    segment = tmp_path / "log" / "00000000000000000000.segment"
    whole = segment.read_bytes()
    last = list(inspect.dump_segment(segment))[-1]
    segment.write_bytes(whole[: last["position"] + 60])  # a header and part of the body
    reader = Reader.open(tmp_path / "log", OffsetSpec.offset(24))
    assert _offsets(reader) == [24, 25, 26] and reader.position == 27
    segment.write_bytes(whole)  # the writer finishes it
    assert _offsets(reader) == [27, 28, 29]


def test_bytes_past_committed_are_not_judged(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"])
    log.append([b"b"])
    log.close()
    with open(tmp_path / "log" / "00000000000000000000.segment", "ab") as f:
        f.write(bytes(100))  # not a chunk, but beyond what the reader may see
    reader = Reader.open(
        tmp_path / "log",
        OffsetSpec.first(),
        committed=lambda: 1,
        chunk_types=(ChunkType.USER, ChunkType.TRACKING_DELTA),
    )
    assert _offsets(reader) == [0, 1] and reader.read() is None


def test_chunk_view_details(open_log: OpenLog) -> None:
    log = open_log()
    log.append([b"a", b"b"])
    view = log.reader(OffsetSpec.first()).read()
    assert view is not None
    assert (view.num_records, view.next_offset, view.filter_values) == (2, 2, [None, None])
    assert repr(view) == "ChunkView(type=0, first_offset=0, records=2/2)"


def test_exact_filters_drop_bloom_false_positives(open_log: OpenLog) -> None:
    from leveret.storage import bloom

    filter_bits = bloom.build([b"apple"], 16)
    impostor = next(
        v
        for v in (b"v%d" % i for i in range(1_000_000))
        if bloom.BloomMatcher([v], match_unfiltered=False).matches(filter_bits)
    )
    log = open_log()
    log.append([b"a0"], [b"apple"])
    loose = log.reader(OffsetSpec.first(), ReaderFilter(frozenset({impostor}), exact=False))
    assert _offsets(loose) == [0]  # the bloom filter cannot tell
    exact = log.reader(OffsetSpec.first(), ReaderFilter(frozenset({impostor})))
    assert exact.read() is None and exact.position == 1


def test_a_damaged_chunk_header_in_the_middle_is_reported(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log()
    for i in range(3):
        log.append([b"r%d" % i])  # no trailers: opening does not look at these chunks
    log.close()
    segment = tmp_path / "log" / "00000000000000000000.segment"
    middle = list(inspect.dump_segment(segment))[1]["position"]
    raw = bytearray(segment.read_bytes())
    raw[middle + 10] ^= 0xFF
    segment.write_bytes(bytes(raw))
    log = open_log()
    reader = log.reader(OffsetSpec.first())
    assert reader.read() is not None
    with pytest.raises(CorruptLogError, match="header CRC") as raised:
        reader.read()
    assert (raised.value.path, raised.value.position) == (segment, middle)


def test_a_chunk_whose_records_do_not_add_up_is_reported(
    open_log: OpenLog, tmp_path: Path, craft: Callable[..., bytes]
) -> None:
    with open_log() as log:
        log.append([b"a"])
    bad = craft(1, b"\x05\x00\x00\x00abc", first_offset=1, timestamp_ms=2 * T0)
    with open(tmp_path / "log" / "00000000000000000000.segment", "ab") as f:
        f.write(bad)
    reader = Reader.open(tmp_path / "log", OffsetSpec.offset(1))
    with pytest.raises(CorruptLogError, match="record offsets do not match"):
        reader.read()


def test_os_errors_while_reading_are_typed(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "00000000000000000000.segment").mkdir()  # not a file
    reader = Reader.open(tmp_path / "log", OffsetSpec.first())
    with pytest.raises(LogIOError) as raised:
        reader.read()
    assert raised.value.path == tmp_path / "log" / "00000000000000000000.segment"


def test_standalone_attach_without_an_index_on_a_torn_log(
    open_log: OpenLog, clock: FakeClock, tmp_path: Path
) -> None:
    log = open_log(max_segment_chunks=4)
    _ten_chunks(log, clock)  # segments 0 (0..11), 12 (12..23), 24 (24..29)
    log.close()
    for base in (0, 12, 24):
        (tmp_path / "log" / f"{base:020d}.index").unlink()
    with open(tmp_path / "log" / f"{24:020d}.segment", "ab") as f:
        f.write(b"LVCK torn")
    directory = tmp_path / "log"
    assert _offsets(Reader.open(directory, OffsetSpec.timestamp(T0 + 15))) == list(range(6, 30))
    assert Reader.open(directory, OffsetSpec.timestamp(T0 + 45)).position == 15
    assert Reader.open(directory, OffsetSpec.timestamp(T0 + 85)).position == 27
    assert Reader.open(directory, OffsetSpec.last()).position == 27


def test_a_whole_chunk_gives_its_record_bytes_without_being_split(open_log: OpenLog) -> None:
    with open_log() as log:
        log.append([b"one", b"", b"three"], chunk_type=32)
        log.append([b"four"])
        reader = log.reader(OffsetSpec.first(), chunk_types=(0, 32))
        view = reader.read()
        assert view is not None and view.chunk_type == 32
        assert view._records is None  # not split by reading
        assert view.record_bytes() == b"onethree"
        assert view.count == 3 and view.offsets is None
        assert view._records is None
        assert view.records == [b"one", b"", b"three"]  # split when asked for
        second = log.reader(OffsetSpec.first(), chunk_types=(0, 32)).read()
        assert second is not None and second._records == [b"one", b"", b"three"]  # shared
        assert [v.records for v in reader] == [[b"four"]]


def test_record_bytes_needs_the_whole_chunk(open_log: OpenLog) -> None:
    with open_log() as log:
        log.append([b"a", b"b", b"c"])
        view = log.reader(OffsetSpec.offset(1)).read()
        assert view is not None and view.records == [b"b", b"c"] and view.count == 2
        with pytest.raises(ValueError, match="whole chunk"):
            view.record_bytes()


def test_a_chunk_read_ahead_before_its_commit_is_read_again_once_committed(
        open_log: OpenLog) -> None:
    """A replica's reader reads ahead past its commit point; the sync of a new leader then cuts
    that uncommitted tail and the new leader's chunks take the same offsets and file positions
    (issue 26's dirty read in the fault suite). Once they commit, the reader must hand out the
    chunks on disk, not the ones it had read ahead."""
    log = open_log()
    bound = [0]
    log.append([b"committed"])
    log.append([b"old-1", b"old-2"])  # uncommitted: the deposed leader's
    reader = log.reader(OffsetSpec.first(), limit=lambda: bound[0])
    assert [bytes(r) for v in reader for r in v.records] == [b"committed"]  # (read ahead)
    log.truncate_from(1)
    log.append([b"new-1", b"new-2"])
    bound[0] = 2
    assert [bytes(r) for v in reader for r in v.records] == [b"new-1", b"new-2"]
    reader.close()
