"""The `x-consistent-hash` exchange, as RabbitMQ's rabbitmq_consistent_hash_exchange plugin.

A binding's key is its weight: the number of buckets its destination owns on the ring. The
ring is the buckets 0..N-1, given out in the order the bindings were added (a destination's
buckets are contiguous; a second binding to the same destination adds none; removing one
binding of a destination removes all of its buckets and shifts the later ones down, as the
plugin does). A message's routing key, or the header named by `hash-header`, or the property
named by `hash-property`, is spelt as the Erlang term RabbitMQ would hash, hashed with
phash2, and a jump consistent hash seeded with that hash picks the bucket: so the same
bindings and the same message reach the same queue as with RabbitMQ (erlang_hash has the
arithmetic). After a restart the ring is rebuilt in RabbitMQ's recovery order (`restored`).
It must not know the vhost, the wire or any I/O. Single-threaded.
"""

from __future__ import annotations

import bisect
import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

from leveret.broker.model.binding import Binding, erlang_term
from leveret.broker.model.erlang_hash import Atom, jump_consistent_hash, phash2
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.exchange import Exchange

PROPERTIES = ("correlation_id", "message_id", "timestamp")
UNDEFINED = Atom("undefined")
PICKS_CACHED = 65_536  # hashed values whose place on the ring one exchange remembers
_INTEGER = re.compile(r"[+-]?[0-9]+")  # what list_to_integer/1 accepts


def validate_arguments(arguments: Mapping[str, Any]) -> None:
    """The plugin's validate/1: a supported property, and not both ways of choosing."""
    header = _string_arg(arguments, "hash-header")
    prop = _string_arg(arguments, "hash-property")
    if prop is not None and header is None and prop not in PROPERTIES:
        raise PreconditionFailed(f"Unsupported property: {prop}")
    if prop is not None and header is not None:
        raise PreconditionFailed("hash-header and hash-property are mutually exclusive")


def _string_arg(arguments: Mapping[str, Any], name: str) -> str | None:
    """A longstr argument's text; the plugin ignores an argument of any other type."""
    value = arguments.get(name)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def check_weight(routing_key: str) -> None:
    """The plugin's validate_binding/2: the key is a positive integer (list_to_integer)."""
    if _INTEGER.fullmatch(routing_key) is None:
        raise PreconditionFailed(
            "The binding key must be an integer: "
            + (erlang_term(routing_key) if routing_key else "<<>>"))
    if int(routing_key) < 1:
        raise PreconditionFailed("The binding key must be greater than 0")


def recovery_order(binding: Binding) -> tuple[bytes, str, bytes]:
    """Where RabbitMQ's ordered route table puts a binding of one source (a #binding record
    compares by key, then destination #resource{kind, name}); arguments never decide a
    ring, as a destination's second binding adds no buckets."""
    destination = binding.destination
    return (binding.routing_key.encode("utf-8"), destination.kind,
            destination.name.encode("utf-8"))


class ConsistentHashExchange(Exchange):
    type = "x-consistent-hash"

    @classmethod
    def validate(cls, arguments: Mapping[str, Any]) -> None:
        validate_arguments(arguments)

    def check_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        check_weight(routing_key)

    def _index_init(self) -> None:
        # the ring as runs: the destination owning buckets [ends[i-1], ends[i])
        self._owners: list[Any] = []
        self._ends: list[int] = []
        # where a hashed value goes on this ring: phash2 and the jump hash are pure Python
        # (about three times a direct exchange's routing, bench/exchanges.py); emptied
        # whenever the ring changes, and when it holds PICKS_CACHED values
        self._picks: dict[object, Any] = {}

    def _index_add(self, binding: Binding) -> None:
        if any(owner is binding.destination for owner in self._owners):
            return  # the plugin adds no buckets for a destination already on the ring
        total = self._ends[-1] if self._ends else 0
        self._picks.clear()
        self._owners.append(binding.destination)
        self._ends.append(total + int(binding.routing_key))

    def _index_remove(self, binding: Binding) -> None:
        for i, owner in enumerate(self._owners):
            if owner is binding.destination:
                size = self._ends[i] - (self._ends[i - 1] if i else 0)
                self._picks.clear()
                del self._owners[i], self._ends[i]
                for j in range(i, len(self._ends)):
                    self._ends[j] -= size
                return

    def restored(self) -> None:
        """After a restart, rebuild the ring as RabbitMQ 3.10.8 does when it recovers its
        bindings: in the order of its route table (binding key as bytes, then destination:
        exchanges before queues, by name), not in their creation order."""
        self._index_init()
        for binding in sorted(self.bindings.values(), key=recovery_order):
            self._index_add(binding)

    def ring(self) -> list[tuple[Any, int]]:
        """Each destination on the ring and its bucket count, in ring order."""
        starts = [0, *self._ends[:-1]]
        return [(o, e - s) for o, s, e in zip(self._owners, starts, self._ends, strict=True)]

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        key = routing_keys if isinstance(routing_keys, str) else next(iter(routing_keys), "")
        return self._pick(key.encode("utf-8"))

    def route_message(self, routing_keys: Iterable[str], headers: Mapping[str, Any],
                      message: Any) -> list[Any]:
        header = _string_arg(self.arguments, "hash-header")
        if header is not None:
            typed = message.typed_header(header)
            return self._pick(field_term(typed) if typed is not None else UNDEFINED)
        prop = _string_arg(self.arguments, "hash-property")
        if prop is not None:
            return self._pick(property_term(message.properties, prop))
        return self.route(routing_keys, headers)

    @property
    def routes_by_properties(self) -> bool:
        return (_string_arg(self.arguments, "hash-header") is None
                and _string_arg(self.arguments, "hash-property") is not None)

    def _pick(self, term: object) -> list[Any]:
        if not self._ends:
            return []
        picks = self._picks
        try:
            owner = picks.get(term)
        except TypeError:  # a header value that is a table or an array: not cached
            return [self._owner_of(term)]
        if owner is None:
            if len(picks) >= PICKS_CACHED:
                picks.clear()
            owner = picks[term] = self._owner_of(term)
        return [owner]

    def _owner_of(self, term: object) -> Any:
        bucket = jump_consistent_hash(phash2(term), self._ends[-1])
        return self._owners[bisect.bisect_right(self._ends, bucket)]


def property_term(properties: Any, name: str) -> object:
    """The property as the plugin reads it: a binary, or `undefined` when it is absent;
    the timestamp as the decimal text of its seconds."""
    value = getattr(properties, name, None)
    if value is None:
        return UNDEFINED
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return str(int(value.timestamp())).encode()
    if isinstance(value, int):
        return str(value).encode()
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def field_term(typed: tuple[str, Any]) -> object:
    """A header value as rabbit_misc:table_lookup returns it, `{Type, Value}`, from the
    message's own wire type (`("long", 5)` becomes `{long, 5}`)."""
    kind, value = typed
    return (Atom(kind), _field_value(kind, value))


def _field_value(kind: str, value: Any) -> object:
    if kind == "bool":
        return Atom("true" if value else "false")
    if kind == "void":
        return UNDEFINED
    if kind == "table":
        return [(name, Atom(k), _field_value(k, v)) for name, k, v in value]
    if kind == "array":
        return [field_term(item) for item in value]
    if kind == "decimal":
        return tuple(value)
    return value  # a binary, an integer or a float as it is
