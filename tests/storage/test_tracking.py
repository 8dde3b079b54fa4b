"""Tracking entries: encoding round trips, snapshots, trimming, validation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.storage import ChunkType
from leveret.storage import tracking as tr
from leveret.storage.chunk import crc32c
from leveret.storage.errors import BadChunk

names = st.binary(max_size=255)
ids = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(names, ids, max_size=8), st.dictionaries(names, ids, max_size=8))
def test_snapshot_round_trip(publishers: dict[bytes, int], consumers: dict[bytes, int]) -> None:
    state = tr.TrackingState()
    state.apply(ChunkType.USER, tr.publisher_trailer(publishers, 5))
    state.apply(ChunkType.TRACKING_DELTA, tr.consumer_trailer(consumers))
    again = tr.TrackingState()
    again.apply(ChunkType.TRACKING_SNAPSHOT, state.snapshot_trailer())
    assert again.public() == tr.Tracking(publishers, consumers)
    assert again.publishers == state.publishers


def test_snapshot_replaces_and_deltas_overwrite() -> None:
    state = tr.TrackingState()
    state.apply(ChunkType.USER, tr.publisher_trailer({b"p": 1, b"q": 2}, 0))
    state.apply(ChunkType.USER, tr.publisher_trailer({b"p": 9}, 10))
    assert state.public().publishers == {b"p": 9, b"q": 2}
    state.apply(ChunkType.TRACKING_SNAPSHOT, tr.consumer_trailer({b"c": 4}))
    assert state.public() == tr.Tracking({}, {b"c": 4})
    assert state and not tr.TrackingState()


def test_trim_keeps_recent_publishers_and_consumers_at_or_after_first() -> None:
    state = tr.TrackingState()
    for i in range(10):
        state.apply(ChunkType.USER, tr.publisher_trailer({b"p%d" % i: i}, i * 100))
    state.apply(ChunkType.TRACKING_DELTA, tr.consumer_trailer({b"old": 3, b"new": 50, b"at": 40}))
    state.trim(first_offset=40, max_publishers=3)
    assert state.public().publishers == {b"p9": 9, b"p8": 8, b"p7": 7}
    assert state.public().consumers == {b"new": 50, b"at": 40}


def _with_crc(entries: bytes) -> bytes:
    return entries + struct.pack("<I", crc32c(entries))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_with_crc(b"\x00"), "truncated"),
        (_with_crc(b"\x07\x01a" + bytes(16)), "malformed"),
        (_with_crc(b"\x00\x05ab"), "malformed"),
        (b"\x01\x02", "CRC mismatch"),
        (tr.consumer_trailer({b"c": 1})[:-1] + b"\x00", "CRC mismatch"),
    ],
)
def test_malformed_trailers(data: bytes, reason: str) -> None:
    with pytest.raises(BadChunk, match=reason):
        tr.TrackingState().apply(ChunkType.USER, data)


def test_validation() -> None:
    with pytest.raises(ValueError, match="at most 255"):
        tr.consumer_trailer({b"x" * 256: 1})
    with pytest.raises(TypeError, match="bytes"):
        tr.consumer_trailer({"name": 1})
    with pytest.raises(TypeError, match="ints"):
        tr.publisher_trailer({b"p": True}, 0)
    with pytest.raises(ValueError, match="64-bit"):
        tr.publisher_trailer({b"p": 2**63}, 0)


def test_marks_taken_round_trip_as_runs_and_keep_the_newest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Marks taken (TAKEN entries: a run of consecutive values of a name is one entry) go
    through a chunk's trailer and a snapshot in their order; each name keeps its newest
    MAX_TAKEN; publishers and consumers do not see them."""
    monkeypatch.setattr(tr, "MAX_TAKEN", 5)
    trailer = tr.data_trailer({b"p": 3}, 9, [(b"log1", 7), (b"log1", 8), (b"log2", 1),
                                             (b"log1", 9), (b"log1", 2)])
    entries = list(tr.decode_entries(trailer))
    assert entries == [(tr.PUBLISHER, b"p", 3, 9), (tr.TAKEN, b"log1", 7, 3),
                       (tr.TAKEN, b"log1", 2, 1), (tr.TAKEN, b"log2", 1, 1)]
    state = tr.TrackingState()
    state.apply(ChunkType.USER, trailer)
    assert state.public() == tr.Tracking({b"p": 3}, {})
    assert {n: list(m) for n, m in state.taken.items()} == {b"log1": [7, 8, 9, 2], b"log2": [1]}
    state.add_taken([(b"log1", 20), (b"log1", 21)])  # over 5: the oldest (7) goes
    assert list(state.taken[b"log1"]) == [8, 9, 2, 20, 21]
    again = tr.TrackingState()
    again.apply(ChunkType.TRACKING_SNAPSHOT, state.snapshot_trailer())
    assert again.taken == state.taken and again.publishers == state.publishers
    assert tr.TrackingState().taken == {} and not tr.TrackingState()
    assert again  # marks alone make a state to snapshot


def test_a_snapshot_keeps_the_newest_runs_of_each_name_within_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot holds MAX_SNAPSHOT_TAKEN_RUNS runs at most (it is one chunk, shipped in
    one link frame): past it, each name keeps its newest runs, the state as the snapshot."""
    monkeypatch.setattr(tr, "MAX_SNAPSHOT_TAKEN_RUNS", 4)
    state = tr.TrackingState()
    state.add_taken([(b"a", v) for v in (1, 3, 5, 6, 9)] + [(b"b", 100), (b"b", 200)])
    state.trim(first_offset=0)
    assert {n: list(m) for n, m in state.taken.items()} == {b"a": [5, 6, 9], b"b": [100, 200]}
    again = tr.TrackingState()
    again.apply(ChunkType.TRACKING_SNAPSHOT, state.snapshot_trailer())
    assert again.taken == state.taken


def test_marks_taken_are_checked() -> None:
    with pytest.raises(ValueError, match="not negative"):
        tr.data_trailer(None, 0, [(b"log", -1)])
    with pytest.raises(TypeError, match="bytes"):
        tr.data_trailer(None, 0, [("log", 1)])  # type: ignore[list-item]
