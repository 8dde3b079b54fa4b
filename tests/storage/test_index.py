"""Index files: entries round trip, and bisection agrees with a linear scan."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.storage import layout
from leveret.storage.index import IndexEntry, IndexView, MemoryIndex, decode_entries, encode_entry


@st.composite
def index_entries(draw: st.DrawFn) -> list[IndexEntry]:
    """Entries as the writer makes them: offsets dense, zero-record (tracking) chunks sharing
    the next offset, timestamps never decreasing, positions increasing."""
    entries = []
    offset = draw(st.integers(0, 1000))
    ts = draw(st.integers(0, 10_000))
    position = 8
    for _ in range(draw(st.integers(0, 60))):
        tracking = draw(st.integers(0, 4)) == 0
        n = 0 if tracking else draw(st.integers(1, 5))
        ts += draw(st.integers(0, 3))
        entries.append(IndexEntry(offset, ts, position, n, 1 if tracking else 0, int(tracking)))
        offset += n
        position += draw(st.integers(48, 500))
    return entries


def _write_index(path: Path, entries: list[IndexEntry]) -> int:
    with open(path, "wb") as f:
        f.write(layout.file_header(layout.INDEX_MAGIC))
        f.write(b"".join(encode_entry(e) for e in entries))
    return os.open(path, os.O_RDONLY)


def _linear_offset(entries: list[IndexEntry], offset: int) -> int:
    for i, e in enumerate(entries):
        holds = e.first_offset <= offset < e.first_offset + e.num_records
        if holds or e.first_offset > offset or (e.num_records == 0 and e.first_offset >= offset):
            return i
    return len(entries)


def _linear_timestamp(entries: list[IndexEntry], ts: int) -> int:
    return next((i for i, e in enumerate(entries) if e.timestamp_ms >= ts), len(entries))


@settings(max_examples=120, deadline=None)
@given(index_entries(), st.lists(st.integers(-5, 1400), max_size=20), st.data())
def test_bisection_agrees_with_a_linear_scan(
    tmp_path_factory, entries: list[IndexEntry], offsets: list[int], data: st.DataObject
) -> None:
    path = tmp_path_factory.mktemp("idx") / "x.index"
    fd = _write_index(path, entries)
    try:
        view = IndexView(fd)
        assert list(view) == entries
        memory = MemoryIndex(entries)
        for offset in offsets:
            assert view.find_offset(offset) == _linear_offset(entries, offset)
            assert memory.find_offset(offset) == _linear_offset(entries, offset)
        for ts in data.draw(st.lists(st.integers(-5, 10_300), max_size=20)):
            assert view.find_timestamp(ts) == _linear_timestamp(entries, ts)
        tracking_only = view.find_last(lambda e: e.num_records == 0)
        expected = max((i for i, e in enumerate(entries) if e.num_records == 0), default=None)
        assert tracking_only == expected
    finally:
        os.close(fd)


def test_partial_last_entry_is_ignored(tmp_path: Path) -> None:
    entries = [IndexEntry(0, 5, 8, 3, 0, 0), IndexEntry(3, 6, 100, 2, 0, 1)]
    fd = _write_index(tmp_path / "x.index", entries)
    os.close(fd)
    with open(tmp_path / "x.index", "ab") as f:
        f.write(b"\x01" * 20)
    fd = os.open(tmp_path / "x.index", os.O_RDONLY)
    try:
        view = IndexView(fd)
        assert len(view) == 2 and view[-1] == entries[1] and view[-1].has_trailer
        assert list(view[0:1]) == entries[:1]
        assert [e for block in view.blocks() for e in block] == entries
    finally:
        os.close(fd)


def test_decode_entries_ignores_a_partial_entry() -> None:
    entry = IndexEntry(1, 2, 3, 4, 16, 0)
    assert decode_entries(encode_entry(entry) + b"\x00" * 5) == [entry]
