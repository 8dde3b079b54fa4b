"""Erlang's `erlang:phash2/1` and the `exs1024` generator of its `rand` module, in Python.

The consistent-hash exchange must put a message in the queue RabbitMQ would: RabbitMQ hashes
an Erlang term with phash2, seeds `rand` (exs1024) with the hash and walks a jump consistent
hash with its floats. This module reproduces both, bit for bit, for the term shapes the
exchange hashes: binaries, atoms, integers, floats, tuples and lists. Erlang terms are spelt
as Python values: bytes is a binary, `Atom` an atom, int an integer, tuple a tuple, list a
list. It knows nothing of AMQP or the broker; pure functions, any thread.
"""

from __future__ import annotations

import struct

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = 0x9E3779B9  # HCONST: the golden ratio, and its multiples below
_C = {n: (_GOLDEN * n) & _M32 for n in range(2, 23)}
_NIL_DEF = 2  # the type number erts mixes in for [] (NIL_DEF)
_NIL_ALONE = 3468870702
_SMALL_MIN, _SMALL_MAX = -(2**59), 2**59 - 1  # a small integer on a 64-bit emulator


class Atom(str):
    """An Erlang atom (its text)."""


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' 96-bit mix, on 32-bit unsigned words."""
    a = (a - b - c) & _M32 ^ (c >> 13)
    b = (b - c - a) & _M32 ^ (a << 8) & _M32
    c = (c - a - b) & _M32 ^ (b >> 13)
    a = (a - b - c) & _M32 ^ (c >> 12)
    b = (b - c - a) & _M32 ^ (a << 16) & _M32
    c = (c - a - b) & _M32 ^ (b >> 5)
    a = (a - b - c) & _M32 ^ (c >> 3)
    b = (b - c - a) & _M32 ^ (a << 10) & _M32
    c = (c - a - b) & _M32 ^ (b >> 15)
    return a, b, c


def _word2(x: int, y: int, const: int, h: int) -> int:
    """UINT32_HASH_2: mix two 32-bit words, each offset by a constant, into the hash."""
    return _mix((const + x) & _M32, (const + y) & _M32, h)[2]


def _block(data: bytes, initval: int) -> int:
    """The block hash of a binary, chained from the previous hash value."""
    a = b = _GOLDEN
    c = initval
    full = len(data) - len(data) % 12
    for i in range(0, full, 12):
        x, y, z = struct.unpack_from("<III", data, i)
        a, b, c = _mix((a + x) & _M32, (b + y) & _M32, (c + z) & _M32)
    tail = data[full:] + bytes(12)
    c = (c + len(data)) & _M32
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M32  # c's low byte: the length
    return _mix(a, b, c)[2]


def atom_hash(text: str) -> int:
    """The atom table's hash of an atom's text (hashpjw over its Latin-1 bytes)."""
    h = 0
    for v in text.encode("latin-1"):
        h = ((h << 4) + v) & _M32
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def _integer(n: int, h: int) -> int:
    if -(2**27) <= n < 2**27:  # fits 28 bits: hashed as a signed 32-bit word
        if n < 0:
            h = _word2(-n, 0, _GOLDEN, h)
        return _word2(n & _M32, 0, _GOLDEN, h)
    const = _C[10] if n < 0 else _C[11]
    t = -n if n < 0 else n
    if _SMALL_MIN <= n <= _SMALL_MAX:
        return _word2(t & _M32, t >> 32, const, h)
    while True:  # a bignum: its 64-bit digits, least significant first
        digit, t = t & _M64, t >> 64
        h = _word2(digit & _M32, digit >> 32, const, h)
        if not t:
            return h


def make_hash2(term: object) -> int:
    """erts' make_hash2: the full 32-bit hash behind phash2."""
    if isinstance(term, Atom):
        return atom_hash(term)
    h = 0
    stack: list[object] = [term]
    while stack:
        t = stack.pop()
        if isinstance(t, Atom):
            h = atom_hash(t) if h == 0 else _word2(atom_hash(t), 0, _C[3], h)
        elif isinstance(t, bool):
            raise TypeError("spell Erlang booleans as Atom('true') / Atom('false')")
        elif isinstance(t, int):
            h = _integer(t, h)
        elif isinstance(t, bytes | bytearray):
            con = (_C[13] + h) & _M32
            h = _block(bytes(t), con) if t else con
        elif isinstance(t, tuple):
            h = _word2(len(t), 0, _C[9], h)
            stack.extend(reversed(t))
        elif isinstance(t, float):
            bits = struct.unpack("<Q", struct.pack("<d", t if t != 0.0 else 0.0))[0]
            h = _word2(bits >> 32, bits & _M32, _C[12], h)
        elif isinstance(t, list):
            h = _list(t, h, stack)
        else:
            raise TypeError(f"no Erlang term for {type(t).__name__}")
    return h


def _list(items: list[object], h: int, stack: list[object]) -> int:
    """A list: runs of bytes (0..255) four at a time, other elements one by one, then []."""
    if not items:
        return _NIL_ALONE if h == 0 else _word2(_NIL_DEF, 0, _C[2], h)
    run, count = 0, 0
    for i, item in enumerate(items):
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 255:
            run = (run << 8) + item
            count += 1
            if count == 4:
                h = _word2(run, 0, _C[4], h)
                run = count = 0
            continue
        if count:
            h = _word2(run, 0, _C[4], h)
        stack.append(items[i + 1:])  # the tail, then [] at its end
        stack.append(item)
        return h
    if count:
        h = _word2(run, 0, _C[4], h)
    return _NIL_ALONE if h == 0 else _word2(_NIL_DEF, 0, _C[2], h)


def phash2(term: object) -> int:
    """erlang:phash2/1: make_hash2 in the range 0..2**27-1."""
    return make_hash2(term) & ((1 << 27) - 1)


# -- rand's exs1024 (xorshift1024*), as `rand:seed_s(exs1024, {A, A, A})` seeds it ----------


def _exs64_next(r: int) -> tuple[int, int]:
    r ^= r >> 12
    r ^= (r << 25) & _M64
    r ^= r >> 27
    return (r * 2685821657736338717) & _M64, r


class Exs1024:
    """The exs1024 state: sixteen 64-bit words, consumed as rand's list pair is."""

    def __init__(self, a1: int, a2: int, a3: int) -> None:
        b1 = (((a1 & 0x1FFFFF) + 1) * 2097131) & 0x1FFFFF
        b2 = (((a2 & 0x1FFFFF) + 1) * 2097133) & 0x1FFFFF
        b3 = (((a3 & 0x1FFFFF) + 1) * 2097143) & 0x1FFFFF
        r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
        words: list[int] = []
        for _ in range(16):
            x, r = _exs64_next(r)
            words.append(x)
        self._ahead = words[::-1]  # rand builds its list by prepending
        self._behind: list[int] = []

    def next(self) -> int:
        if len(self._ahead) == 1:
            self._ahead = self._ahead + self._behind
            self._behind = []
        s0, s1 = self._ahead[0], self._ahead[1]
        s11 = s1 ^ ((s1 << 31) & _M64)
        s12 = s11 ^ (s11 >> 11)
        s01 = s0 ^ (s0 >> 30)
        ns1 = s01 ^ s12
        self._ahead = [ns1, *self._ahead[2:]]
        self._behind.append(s0)
        return (ns1 * 1181783497276652981) & _M64

    def uniform(self) -> float:
        """rand:uniform_s/1: the 64-bit word times 2**-64, as rand does for exs1024."""
        return self.next() * 2.0**-64


def jump_consistent_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash, with exs1024 seeded by the key, as the
    consistent-hash exchange computes it."""
    if buckets == 1:
        return 0
    rng = Exs1024(key, key, key)
    b, j = -1, 0
    while j < buckets:
        b = j
        j = int((b + 1) / rng.uniform())
    return b
