"""Retention rules: which whole segments to delete (docs/FORMAT.md section 6).

Role: pure decisions over the list of segments, oldest first. max_length_bytes walks from the
newest segment back and drops everything older than the first segment that does not fit;
max_age_ms drops segments whose last chunk is older than now - max_age, from the oldest,
stopping at the first one that is not. The active (last) segment is never chosen.

Must not know: files, deletion, the clock (it is given `now_ms`), tracking.
Threading: pure functions; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from leveret.storage.segment import SegmentInfo


def by_length(segments: Sequence[SegmentInfo], max_length_bytes: int) -> int:
    """How many of the oldest segments to delete so the rest fit in `max_length_bytes`."""
    total = segments[-1].size if segments else 0  # the active segment is always kept
    for i in range(len(segments) - 2, -1, -1):
        total += segments[i].size
        if total > max_length_bytes:
            return i + 1
    return 0


def by_age(segments: Sequence[SegmentInfo], max_age_ms: int, now_ms: int) -> int:
    """How many of the oldest segments are older than `max_age_ms` (never the active one)."""
    horizon = now_ms - max_age_ms
    count = 0
    for info in segments[:-1]:
        if info.last_timestamp_ms is None or info.last_timestamp_ms >= horizon:
            break
        count += 1
    return count


def below_offset(segments: Sequence[SegmentInfo], offset: int) -> int:
    """How many of the oldest segments hold only records below `offset` (never the active one)."""
    count = 0
    for info in segments[:-1]:
        if info.next_offset > offset:
            break
        count += 1
    return count


def plan(
    segments: Sequence[SegmentInfo],
    max_length_bytes: int | None,
    max_age_ms: int | None,
    now_ms: int,
) -> int:
    """How many of the oldest segments retention deletes: size first, then age."""
    count = by_length(segments, max_length_bytes) if max_length_bytes is not None else 0
    if max_age_ms is not None:
        count += by_age(segments[count:], max_age_ms, now_ms)
    return count
