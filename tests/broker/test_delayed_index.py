"""The delayed store's due-time index (broker/model/delayed_store.py): bucket files on disk,
the nearest bucket loaded, entries handed out in (due, offset) order whatever order they were
added in, deleted entries skipped once."""

from __future__ import annotations

import random
from pathlib import Path

from leveret.broker.model.delayed_store import BUCKET_MS, DueIndex
from leveret.broker.model.intervals import IntervalSet


def drain(index: DueIndex, skip: IntervalSet) -> list[tuple[int, int]]:
    out = []
    while (head := index.peek(skip)) is not None:
        index.pop()
        out.append(head)
    return out


def test_entries_come_out_in_due_order_across_buckets(tmp_path: Path) -> None:
    rng = random.Random(7)
    index = DueIndex(tmp_path / "index")
    entries = [(rng.randrange(0, 50 * BUCKET_MS), offset) for offset in range(5_000)]
    for due, offset in entries[:2_500]:
        index.add(due, offset)
    index.flush()
    out = [index.peek(IntervalSet())]  # loads the first bucket
    index.pop()
    for due, offset in entries[2_500:]:  # some land in or before the loaded bucket
        index.add(due, offset)
    index.flush()
    out += drain(index, IntervalSet())
    assert out == sorted(entries)
    assert index.count == 0
    assert list((tmp_path / "index").glob("*.idx")) == []  # a loaded bucket's file is gone


def test_only_the_nearest_bucket_is_in_memory(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "index")
    for offset in range(1_000):
        index.add(offset * BUCKET_MS, offset)  # one per bucket
    index.flush()
    assert index.peek(IntervalSet()) == (0, 0)
    assert len(index.near) == 1 and len(index.on_disk) == 999


def test_skipped_entries_are_dropped_and_ghosts_counted_out(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "index")
    for offset in range(10):
        index.add(BUCKET_MS * 3 + offset, offset)
    index.flush()
    skip = IntervalSet()
    skip.add(4)
    index.ghosts = 1  # offset 4 was deleted while its bucket was on disk
    assert index.count - index.ghosts == 9
    assert [offset for _due, offset in drain(index, skip)] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert (index.count, index.ghosts) == (0, 0)


def test_save_writes_the_loaded_bucket_back(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "index")
    for offset in range(20):
        index.add(offset * 1000, offset)
    index.flush()
    index.peek(IntervalSet())  # loads bucket 0
    index.pop()
    index.save()
    again = DueIndex(tmp_path / "index")
    again.load_files()
    assert again.count == 19
    assert [offset for _due, offset in drain(again, IntervalSet())] == list(range(1, 20))
