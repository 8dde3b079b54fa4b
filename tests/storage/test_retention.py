"""Retention: whole segments, oldest first, never the active one, never losing tracking."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.storage import FakeClock, Log, LogConfig, OffsetSpec
from leveret.storage import retention as rt
from leveret.storage.segment import SegmentInfo

OpenLog = Callable[..., Log]


def _segments(directory: Path) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(directory) if n.endswith(".segment"))


def _indexes(directory: Path) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(directory) if n.endswith(".index"))


def _fill(log: Log, clock: FakeClock, chunks: int = 10) -> None:
    for _ in range(chunks):
        log.append([b"x" * 100])
        clock.advance(1000)


def test_max_length_bytes_deletes_the_oldest_segments(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _fill(log, clock)  # 5 segments of 2 chunks
    sizes = [s["bytes"] for s in log.summary()["segments"]]
    deleted = log.set_retention(max_length_bytes=sum(sizes[-3:]))
    assert [p.name for p in deleted] == [f"{b:020d}.segment" for b in (0, 2)]
    assert _segments(log.directory) == _indexes(log.directory) == [4, 6, 8]
    assert log.first_offset == 4 and log.next_offset == 10
    assert [v.first_offset for v in log.reader(OffsetSpec.first())] == [4, 5, 6, 7, 8, 9]


def test_the_active_segment_is_never_deleted(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _fill(log, clock)
    log.set_retention(max_length_bytes=0, max_age_ms=0)
    assert _segments(log.directory) == [8]
    assert log.first_offset == 8 and log.last_offset == 9
    clock.advance(10**9)
    assert log.apply_retention() == []
    assert _segments(log.directory) == [8]


def test_max_age_uses_each_segments_last_chunk(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _fill(log, clock)  # segment k's last chunk is stamped T0 + (2k + 1) * 1000
    # now = T0 + 10_000: segments 0 (last at +1000) and 2 (+3000) are older than 6_500 ms
    deleted = log.set_retention(max_age_ms=6_500)
    assert [p.name[:20] for p in deleted] == [f"{b:020d}" for b in (0, 2)]
    assert log.first_offset == 4
    clock.advance(2_000)
    assert [p.name[:20] for p in log.apply_retention()] == [f"{4:020d}"]


def test_retention_runs_on_roll_and_on_open(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2, max_length_bytes=1)
    _fill(log, clock)
    assert _segments(log.directory) == [8]  # every roll dropped the previous segment
    log.close()
    log = open_log(max_segment_chunks=2)
    _fill(log, clock)
    log.close()
    again = open_log(max_segment_chunks=2, max_age_ms=0)
    assert _segments(again.directory) == [18]


def test_truncate_before(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2)
    _fill(log, clock)
    assert log.truncate_before(3) == [log.directory / f"{0:020d}.segment"]
    assert log.truncate_before(3) == []  # segment 2 still holds offset 2
    assert log.truncate_before(5) == [log.directory / f"{2:020d}.segment"]  # 4 holds 4 and 5
    assert [p.name[:20] for p in log.truncate_before(1000)] == [f"{b:020d}" for b in (4, 6)]
    assert _segments(log.directory) == [8]


def test_set_retention_keeps_what_it_is_not_given(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(max_segment_chunks=2, max_age_ms=10**9)
    _fill(log, clock)
    log.set_retention(max_length_bytes=10**9)
    clock.advance(10**9)
    assert len(log.apply_retention()) == 4  # the age limit set at open still applies
    with pytest.raises(ValueError, match="max_length_bytes"):
        log.set_retention(max_length_bytes=-1)


def _info(size: int, last_ts: int | None, base: int = 0, next_offset: int = 1) -> SegmentInfo:
    return SegmentInfo(base, size, next_offset, 1, last_ts, last_ts)


def test_retention_rules() -> None:
    segments = [_info(100, 10), _info(100, 20), _info(100, 30), _info(100, 40)]
    assert rt.by_length(segments, 250) == 2 and rt.by_length(segments, 400) == 0
    assert rt.by_length(segments[:1], 0) == 0
    assert rt.by_age(segments, max_age_ms=15, now_ms=40) == 2  # last < 25
    # it stops at the first segment that is not expired
    assert rt.by_age([_info(1, 10), _info(1, 99), _info(1, 10), _info(1, 0)], 5, 100) == 1
    assert rt.plan(segments, 350, 15, 40) == 2 and rt.plan(segments, None, None, 40) == 0
    with_offsets = [_info(1, 1, 0, 5), _info(1, 1, 5, 9), _info(1, 1, 9, 12)]
    assert rt.below_offset(with_offsets, 9) == 2 and rt.below_offset(with_offsets, 100) == 2


ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3), st.sampled_from([b"p", b"q", b"r", b""])),
        st.tuples(st.just("offsets"), st.sampled_from([b"c", b"d"])),
        st.tuples(st.just("tick"), st.integers(0, 3_000)),
        st.tuples(st.just("retain"), st.one_of(st.none(), st.integers(0, 2_000))),
    ),
    max_size=50,
)


@settings(max_examples=40, deadline=None)
@given(ops_st)
def test_retention_never_loses_the_active_segment_or_tracking(tmp_path_factory, ops: list) -> None:
    directory = tmp_path_factory.mktemp("log")
    clock = FakeClock(1_700_000_000_000)
    cfg = LogConfig(clock=clock, max_segment_size_bytes=300, max_age_ms=5_000)
    publishers: dict[bytes, int] = {}
    consumers: dict[bytes, int] = {}
    with Log.open(directory, cfg) as log:
        for i, op in enumerate(ops):
            if op[0] == "append":
                log.append([b"m" * 40] * op[1], publishers={op[2]: i})
                publishers[op[2]] = i
            elif op[0] == "offsets":
                consumers[op[1]] = log.next_offset
                log.store_offsets({op[1]: log.next_offset})
            elif op[0] == "tick":
                clock.advance(op[1])
            else:
                log.set_retention(max_length_bytes=op[1])
            bases = _segments(directory)
            assert bases and log.first_offset == bases[0] and bases == _indexes(directory)
            assert log.summary()["segments"][-1]["first_offset"] == bases[-1]
            tracked = log.tracking()
            assert tracked.publishers == publishers
            assert all(consumers[name] == offset for name, offset in tracked.consumers.items())
            kept = {n: o for n, o in consumers.items() if o >= log.first_offset}
            assert kept.items() <= tracked.consumers.items()
        before = log.tracking()
        first, last = log.first_offset, log.last_offset
    with Log.open(directory, LogConfig(clock=clock, max_segment_size_bytes=300)) as again:
        assert again.tracking() == before
        assert (again.first_offset, again.last_offset) == (first, last)
        offsets = [o for view in again.reader(OffsetSpec.first()) for o, _ in view.items()]
        assert offsets == list(range(first, last + 1))
