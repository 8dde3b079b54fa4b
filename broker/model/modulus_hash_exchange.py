"""The `x-modulus-hash` exchange, as RabbitMQ 4.3 has it in its core.

Every binding is one slot, whatever its key (a destination bound twice has two slots). The
slots are sorted as RabbitMQ sorts its destinations (`#resource{}` records: exchanges before
queues, then by name as bytes), so routing does not depend on the order bindings were made
and survives a restart. A message goes to the slot `phash2(RoutingKeys) rem N`, where
RoutingKeys is the Erlang list of binaries RabbitMQ routes with: the routing key, then the
`CC` header's strings, then `BCC`'s. No arguments and no binding key are checked. It must not
know the vhost, the wire or any I/O. Single-threaded.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from leveret.broker.model.binding import Binding
from leveret.broker.model.erlang_hash import phash2
from leveret.broker.model.exchange import Exchange

ROUTING_HEADERS = ("CC", "BCC")
HASHES_CACHED = 65_536  # routing keys whose phash2 is remembered (it is pure Python)


def destination_order(destination: Any) -> tuple[str, bytes]:
    """Where Erlang's term order puts a destination's #resource{kind, name} in one vhost."""
    return destination.kind, destination.name.encode("utf-8")


def routing_keys_term(message: Any) -> list[bytes]:
    """[RoutingKey | CC ++ BCC] as binaries, as RabbitMQ annotates a message: only the long
    strings of each header's array count."""
    keys = [message.routing_key.encode("utf-8")]
    for name in ROUTING_HEADERS:
        typed = message.typed_header(name)
        if typed is not None and typed[0] == "array":
            keys.extend(value for kind, value in typed[1] if kind == "longstr")
    return keys


class ModulusHashExchange(Exchange):
    type = "x-modulus-hash"

    def _index_init(self) -> None:
        self._slots: list[Any] = []  # one destination per binding, in destination order
        self._order: list[tuple[str, bytes]] = []

    def _index_add(self, binding: Binding) -> None:
        order = destination_order(binding.destination)
        at = bisect.bisect_right(self._order, order)
        self._order.insert(at, order)
        self._slots.insert(at, binding.destination)

    def _index_remove(self, binding: Binding) -> None:
        at = bisect.bisect_left(self._order, destination_order(binding.destination))
        del self._order[at], self._slots[at]

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        keys = [routing_keys] if isinstance(routing_keys, str) else list(routing_keys)
        return self._pick([key.encode("utf-8") for key in keys])

    def route_message(self, routing_keys: Iterable[str], headers: Mapping[str, Any],
                      message: Any) -> list[Any]:
        if isinstance(routing_keys, str):  # no CC or BCC header
            return self._pick([routing_keys.encode("utf-8")])
        return self._pick(routing_keys_term(message))

    def _pick(self, term: list[bytes]) -> list[Any]:
        if not self._slots:
            return []
        return [self._slots[_hash_of(tuple(term)) % len(self._slots)]]


@functools.lru_cache(maxsize=HASHES_CACHED)
def _hash_of(keys: tuple[bytes, ...]) -> int:
    """phash2 of the list of routing keys: it depends on the keys alone, not on the bindings,
    so every exchange of the process shares what it remembers."""
    return phash2(list(keys))
