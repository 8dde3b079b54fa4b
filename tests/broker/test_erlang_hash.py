"""erlang_hash.phash2 on the lists of binaries x-modulus-hash hashes ([RoutingKey | CC ++
BCC]): values printed by `erlang:phash2(Term, 134217728)` in erl (OTP 25)."""

from __future__ import annotations

import pytest

from leveret.broker.model.erlang_hash import phash2


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ([b"order-1"], 26672245),
        ([b"order-2"], 13633627),
        ([b""], 38220213),
        ([b"a", b"b"], 3094894),
        ([b"k", b"cc1", b"bcc1"], 71696430),
        (["éè".encode()], 116989827),
        ([b"z" * 40], 40394368),
    ],
)
def test_phash2_of_routing_key_lists(term: list[bytes], expected: int) -> None:
    assert phash2(term) == expected
