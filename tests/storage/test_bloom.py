"""Bloom filters: no false negatives, bit 0 for unfiltered records, empty when all unfiltered."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.storage import bloom

values_st = st.lists(st.one_of(st.none(), st.binary(max_size=16)), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(values_st, st.integers(16, 255))
def test_no_false_negatives(values: list[bytes | None], size: int) -> None:
    built = bloom.build(values, size)
    for value in {v for v in values if v is not None}:
        assert bloom.BloomMatcher([value], match_unfiltered=False).matches(built)
    if None in values:
        assert bloom.BloomMatcher([], match_unfiltered=True).matches(built)


def test_all_unfiltered_gives_an_empty_filter() -> None:
    assert bloom.build([None, None], 16) == b""
    assert bloom.build([], 16) == b""
    assert bloom.BloomMatcher([b"a"], match_unfiltered=True).matches(b"")
    assert not bloom.BloomMatcher([b"a"], match_unfiltered=False).matches(b"")


def test_bit_zero_means_some_records_are_unfiltered() -> None:
    mixed = bloom.build([b"apple", None], 16)
    only_values = bloom.build([b"apple"], 16)
    assert mixed[0] & 0x80 and not only_values[0] & 0x80
    unfiltered_reader = bloom.BloomMatcher([b"zzz"], match_unfiltered=True)
    assert unfiltered_reader.matches(mixed)


def test_value_bits_never_use_bit_zero() -> None:
    for i in range(2000):
        for size in (16, 255):
            assert all(1 <= b < size * 8 for b in bloom.bit_positions(b"%d" % i, size))


def test_skips_chunks_without_the_value() -> None:
    built = bloom.build([b"apple"] * 10, 255)
    assert not bloom.BloomMatcher([b"banana"], match_unfiltered=False).matches(built)
    assert bloom.BloomMatcher([b"banana", b"apple"], match_unfiltered=False).matches(built)


def test_matcher_handles_filters_of_another_size() -> None:
    matcher = bloom.BloomMatcher([b"apple"], match_unfiltered=False)
    assert matcher.matches(bloom.build([b"apple"], 16))
    assert matcher.matches(bloom.build([b"apple"], 200))
