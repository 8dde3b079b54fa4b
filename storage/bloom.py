"""Per-chunk bloom filters over records' filter values (docs/FORMAT.md section 3.5).

Role: build a chunk's filter from its records' filter values, and decide for a reader whether a
chunk can hold a record it wants. Bit 0 means "this chunk holds records with no filter value";
a chunk whose records are all unfiltered has an empty (0-byte) filter. Hashing is mmh3.hash64.

Must not know: chunk layout, files, readers. It sees byte strings only.
Threading: build() is pure; a BloomMatcher caches per-size bit positions and belongs to one reader.
"""

from __future__ import annotations

from collections.abc import Iterable

import mmh3

MIN_SIZE_BYTES = 16
MAX_SIZE_BYTES = 255
_UNFILTERED_MASK = 0x80  # bit 0: the most significant bit of byte 0


def bit_positions(value: bytes, size_bytes: int) -> tuple[int, int]:
    """The two bits (1 .. 8*size-1) that `value` sets in a filter of `size_bytes`."""
    h1, h2 = mmh3.hash64(value, seed=0, signed=False)
    modulus = size_bytes * 8 - 1
    return 1 + h1 % modulus, 1 + h2 % modulus


def build(values: Iterable[bytes | None], size_bytes: int) -> bytes:
    """The filter for a chunk whose records have these filter values (None = no value)."""
    distinct = set(values)
    unfiltered = None in distinct
    distinct.discard(None)
    if not distinct:
        return b""
    bits = bytearray(size_bytes)
    if unfiltered:
        bits[0] |= _UNFILTERED_MASK
    for value in distinct:
        for bit in bit_positions(value, size_bytes):  # type: ignore[arg-type]
            bits[bit >> 3] |= 0x80 >> (bit & 7)
    return bytes(bits)


class BloomMatcher:
    """A reader's side of the filter: wanted values, and whether unfiltered records match."""

    def __init__(self, values: Iterable[bytes], match_unfiltered: bool):
        self.values = tuple(sorted(set(values)))
        self.match_unfiltered = match_unfiltered
        self._probes: dict[int, list[tuple[int, int, int, int]]] = {}

    def matches(self, bloom: bytes | memoryview) -> bool:
        """False only if no record of a chunk with this filter can be wanted."""
        size = len(bloom)
        if size == 0:
            return self.match_unfiltered
        if self.match_unfiltered and bloom[0] & _UNFILTERED_MASK:
            return True
        return any(bloom[i1] & m1 and bloom[i2] & m2 for i1, m1, i2, m2 in self._probes_for(size))

    def _probes_for(self, size: int) -> list[tuple[int, int, int, int]]:
        probes = self._probes.get(size)
        if probes is None:
            probes = []
            for value in self.values:
                b1, b2 = bit_positions(value, size)
                probes.append((b1 >> 3, 0x80 >> (b1 & 7), b2 >> 3, 0x80 >> (b2 & 7)))
            self._probes[size] = probes
        return probes
