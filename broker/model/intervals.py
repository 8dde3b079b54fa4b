"""A set of non-negative integers kept as sorted, merged half-open ranges.

Durable queues use it for offsets that are settled (acked, discarded, or not messages at all)
and offsets that were delivered. In a queue consumed mostly in order it stays a handful of
ranges however many messages pass, so its memory follows the gaps, not the history.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections.abc import Iterable, Iterator


class IntervalSet:
    __slots__ = ("_ends", "_starts")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for value in values:
            self.add(value)

    def __contains__(self, value: int) -> bool:
        index = bisect.bisect_right(self._starts, value) - 1
        return index >= 0 and value < self._ends[index]

    def __len__(self) -> int:
        return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    def ranges(self) -> Iterator[tuple[int, int]]:
        return zip(self._starts, self._ends, strict=True)

    @property
    def range_count(self) -> int:
        return len(self._starts)

    def add(self, value: int) -> None:
        ends = self._ends
        if ends and ends[-1] == value:  # the common case: one past the highest member
            ends[-1] = value + 1
            return
        self.add_range(value, value + 1)

    def add_range(self, start: int, end: int) -> None:
        """Add [start, end)."""
        if start >= end:
            return
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, start)  # first range that ends at or after start
        hi = bisect.bisect_right(starts, end)  # ranges that start after end are untouched
        if lo < hi:
            start = min(start, starts[lo])
            end = max(end, ends[hi - 1])
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def first_gap(self, value: int) -> int:
        """The smallest integer >= value that is not in the set."""
        index = bisect.bisect_right(self._starts, value) - 1
        if index >= 0 and value < self._ends[index]:
            return self._ends[index]
        return value

    def gaps_in(self, start: int, end: int) -> list[tuple[int, int]]:
        """The ranges of [start, end) that are not in the set, in order."""
        starts, ends = self._starts, self._ends
        gaps: list[tuple[int, int]] = []
        index = bisect.bisect_right(ends, start)  # the first range that ends after start
        count = len(starts)
        while start < end:
            if index >= count or starts[index] >= end:
                gaps.append((start, end))
                break
            if starts[index] > start:
                gaps.append((start, starts[index]))
            start = ends[index]
            index += 1
        return gaps

    def count_in(self, start: int, end: int) -> int:
        """How many members lie in [start, end)."""
        total = 0
        index = max(0, bisect.bisect_right(self._starts, start) - 1)
        for s, e in zip(self._starts[index:], self._ends[index:], strict=True):
            if s >= end:
                break
            total += max(0, min(e, end) - max(s, start))
        return total

    def discard_below(self, value: int) -> None:
        """Forget every member below value (they are gone from the log)."""
        index = bisect.bisect_right(self._ends, value)
        del self._starts[:index]
        del self._ends[:index]
        if self._starts and self._starts[0] < value:
            self._starts[0] = value


def pack_ranges(intervals: IntervalSet) -> bytes:
    """The [start, end) pairs of `intervals`, as big-endian u64s (a queue's settled and
    delivered records, a snapshot's offsets)."""
    flat = array("Q")
    for start, end in intervals.ranges():
        flat.append(start)
        flat.append(end)
    if sys.byteorder == "little":
        flat.byteswap()
    return flat.tobytes()
