"""IntervalSet agrees with a plain set for any sequence of operations."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.broker.model.intervals import IntervalSet

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 200)),
    st.tuples(st.just("next"), st.just(0)),  # one past the highest member: add()'s fast path
    st.tuples(st.just("range"), st.integers(0, 200), st.integers(0, 30)),
    st.tuples(st.just("below"), st.integers(0, 200)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 220), st.integers(0, 220), st.integers(0, 220))
def test_matches_a_plain_set(operations, probe, lo, width) -> None:  # type: ignore[no-untyped-def]
    model: set[int] = set()
    intervals = IntervalSet()
    for op in operations:
        if op[0] == "next":
            value = max(model, default=-1) + 1
            model.add(value)
            intervals.add(value)
        elif op[0] == "add":
            model.add(op[1])
            intervals.add(op[1])
        elif op[0] == "range":
            model.update(range(op[1], op[1] + op[2]))
            intervals.add_range(op[1], op[1] + op[2])
        else:
            model = {v for v in model if v >= op[1]}
            intervals.discard_below(op[1])
    assert len(intervals) == len(model)
    assert (probe in intervals) == (probe in model)
    gap = probe
    while gap in model:
        gap += 1
    assert intervals.first_gap(probe) == gap
    assert intervals.count_in(lo, lo + width) == len([v for v in model if lo <= v < lo + width])
    ranges = list(intervals.ranges())
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # merged, sorted


def test_gaps_in_are_the_parts_of_a_range_outside_the_set() -> None:
    intervals = IntervalSet()
    for low, high in ((2, 4), (8, 22), (25, 26), (40, 50)):
        intervals.add_range(low, high)
    assert intervals.gaps_in(0, 30) == [(0, 2), (4, 8), (22, 25), (26, 30)]
    assert intervals.gaps_in(9, 20) == []
    assert intervals.gaps_in(3, 9) == [(4, 8)]
    assert intervals.gaps_in(22, 25) == [(22, 25)]
    assert intervals.gaps_in(45, 60) == [(50, 60)]
    assert intervals.gaps_in(5, 5) == []
    assert IntervalSet().gaps_in(1, 3) == [(1, 3)]
