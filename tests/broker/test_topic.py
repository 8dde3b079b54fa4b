"""The topic exchange's trie against a plain recursive matcher written from RabbitMQ's rules.

Words are split on "."; an empty key has no words, and an empty word is a word ("a..b" has
three). `*` matches exactly one word, `#` zero or more, and they may repeat ("#.#", "a.#.#").
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.broker.model.binding import Binding
from leveret.broker.model.exchange import TopicExchange

WORDS = st.sampled_from(["a", "b", "", "*", "#", "ab"])
KEY_WORDS = st.sampled_from(["a", "b", "", "ab", "*", "#"])


def words(key: str) -> list[str]:
    return key.split(".") if key else []


def reference_match(pattern: list[str], key: list[str]) -> bool:
    """RabbitMQ's topic semantics, by direct recursion (no regular expressions)."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_match(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_match(rest, key[1:])


def as_key(parts: list[str]) -> str:
    return ".".join(parts)


patterns = st.lists(WORDS, min_size=0, max_size=5).map(as_key)
keys = st.lists(KEY_WORDS, min_size=0, max_size=6).map(as_key)


class Dest:
    kind = "queue"

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"<Dest {self.label!r}>"


def exchange_with(bindings: list[str]) -> tuple[TopicExchange, list[Dest]]:
    exchange = TopicExchange("/", "t")
    dests = [Dest(pattern) for pattern in bindings]
    for pattern, dest in zip(bindings, dests, strict=True):
        exchange.add(Binding(exchange, dest, pattern, {}))
    return exchange, dests


@settings(max_examples=300, deadline=None)
@given(bindings=st.lists(patterns, min_size=1, max_size=8), key=keys)
def test_trie_matches_the_reference(bindings: list[str], key: str) -> None:
    exchange, dests = exchange_with(bindings)
    expected = {
        id(d) for d, p in zip(dests, bindings, strict=True) if reference_match(words(p), words(key))
    }
    assert {id(d) for d in exchange.route(key, {})} == expected


@settings(max_examples=200, deadline=None)
@given(
    bindings=st.lists(patterns, min_size=1, max_size=8),
    removed=st.lists(st.integers(min_value=0, max_value=7), max_size=8),
    key=keys,
)
def test_removing_bindings_keeps_the_trie_consistent(
    bindings: list[str], removed: list[int], key: str
) -> None:
    exchange, dests = exchange_with(bindings)
    gone = {i for i in removed if i < len(bindings)}
    for i in gone:
        exchange.remove(Binding(exchange, dests[i], bindings[i], {}).key)
    kept = [i for i in range(len(bindings)) if i not in gone]
    expected = {id(dests[i]) for i in kept if reference_match(words(bindings[i]), words(key))}
    assert {id(d) for d in exchange.route(key, {})} == expected
    for i in kept:
        exchange.remove(Binding(exchange, dests[i], bindings[i], {}).key)
    assert exchange.route(key, {}) == []
    assert not exchange._root.children and not exchange._root.destinations


@settings(max_examples=100, deadline=None)
@given(bindings=st.lists(patterns, min_size=1, max_size=6), key_list=st.lists(keys, max_size=4))
def test_several_routing_keys_route_to_the_union_once(
    bindings: list[str], key_list: list[str]
) -> None:
    exchange, dests = exchange_with(bindings)
    expected = {
        id(d)
        for d, p in zip(dests, bindings, strict=True)
        if any(reference_match(words(p), words(k)) for k in key_list)
    }
    routed = exchange.route(key_list, {})
    assert len(routed) == len({id(d) for d in routed})
    assert {id(d) for d in routed} == expected


def test_reference_examples() -> None:
    cases = {
        ("", ""): True,
        ("#", ""): True,
        ("*", ""): False,
        ("*", "a"): True,
        ("a.*", "a."): True,  # the empty word after the dot is a word
        ("a.*", "a"): False,
        ("a.#", "a"): True,
        ("#.a", "a"): True,
        ("a.*.b", "a..b"): True,
        ("a.#.#.b", "a.b"): True,
        ("#.*.#", ""): False,
        ("#.*.#", "."): True,
        ("..", ".."): True,
        ("..", "."): False,
    }
    for (pattern, key), expected in cases.items():
        assert reference_match(words(pattern), words(key)) is expected, (pattern, key)
        exchange, dests = exchange_with([pattern])
        assert (exchange.route(key, {}) == dests) is expected, (pattern, key)


def test_one_destination_bound_twice_is_routed_once() -> None:
    exchange = TopicExchange("/", "t")
    dest = Dest("q")
    exchange.add(Binding(exchange, dest, "a.*", {}))
    exchange.add(Binding(exchange, dest, "#", {}))
    assert exchange.route("a.b", {}) == [dest]
    exchange.remove(Binding(exchange, dest, "#", {}).key)
    assert exchange.route("a.b", {}) == [dest]
    assert exchange.route("b", {}) == []
