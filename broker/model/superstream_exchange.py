"""The super stream's exchange: a direct exchange marked `x-super-stream: true` that knows its
partitions and can hash-route a key that matches no binding (`superstream` has the rest).

It is a leaf of the model: the vhost declares it without importing the super stream
operations, which take a vhost. It must not know the vhost, the queue types or any I/O.
Single-threaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import mmh3

from leveret.broker.model.binding import Binding, amqp_type_name
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.exchange import DirectExchange, Exchange

HASH_SEED = 104729
MAX_PARTITIONS = 1000
STREAM_OPTION_ARGS = ("x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes",
                      "x-initial-cluster-size", "x-queue-leader-locator",
                      "x-stream-filter-size-bytes")


def check_exchange_arguments(arguments: dict[str, Any], rs: str) -> None:
    """x-super-stream must be a boolean and x-super-stream-routing the string "hash": a
    mistyped value would otherwise quietly declare a plain direct exchange."""
    marker = arguments.get("x-super-stream")
    if "x-super-stream" in arguments and not isinstance(marker, bool):
        raise PreconditionFailed(
            f"invalid arg 'x-super-stream' for {rs}: must be a boolean, got "
            f"{amqp_type_name(marker)}"
        )
    routing = arguments.get("x-super-stream-routing")
    if "x-super-stream-routing" in arguments and routing != "hash":
        raise PreconditionFailed(
            f"invalid arg 'x-super-stream-routing' for {rs}: must be 'hash', got "
            f"{amqp_type_name(routing)} {routing!r}"[:200]
        )


def is_super_stream(arguments: dict[str, Any]) -> bool:
    return arguments.get("x-super-stream") is True


def partition_for(key: str, count: int) -> int:
    """The stream clients' hash routing: murmur3 32-bit, seed 104729, modulo the count."""
    return mmh3.hash(key.encode("utf-8"), HASH_SEED, signed=False) % count


def _order(binding: Binding) -> tuple[int, int, str]:
    order = binding.arguments.get("x-stream-partition-order")
    if isinstance(order, bytes | str):  # rabbit_data_coercion:to_integer reads "2" as 2
        try:
            order = int(order)
        except ValueError:
            order = None
    if isinstance(order, int) and not isinstance(order, bool):
        return (0, order, binding.destination.name)
    suffix = binding.destination.name.rsplit("-", 1)[-1]
    if suffix.isdigit():
        return (1, int(suffix), binding.destination.name)
    return (2, 0, binding.destination.name)


def partitions_of(exchange: Exchange) -> list[Any]:
    """The queues bound to `exchange`, in partition order (each once): a super stream's
    partitions, and what the stream protocol's Partitions lists for any exchange, which
    rabbit_stream_manager takes whether or not it was made as a super stream."""
    bindings = sorted((b for b in exchange.bindings.values()
                       if b.destination.kind == "queue"), key=_order)
    return list(dict.fromkeys(b.destination for b in bindings))


def binding_index(exchange: Exchange, queue: object) -> int:
    """The partition index rabbit_stream_manager:partition_index gives `queue` in `exchange`:
    its binding's `x-stream-partition-order`, else the number after the last `-` of its
    name; -1 when neither, or when the exchange does not bind it."""
    bindings = sorted((b for b in exchange.bindings.values() if b.destination is queue),
                      key=_order)
    if not bindings:
        return -1
    rank, index, _ = _order(bindings[0])
    return index if rank < 2 else -1


class SuperStreamExchange(DirectExchange):
    """A direct exchange that knows its partitions, and can hash-route unmatched keys."""

    def partitions(self) -> list[Any]:
        """The partition streams, in partition order (each once)."""
        return partitions_of(self)

    def partition_keys(self) -> list[tuple[str, Any]]:
        bindings = sorted((b for b in self.bindings.values()
                           if b.destination.kind == "queue"), key=_order)
        return [(b.routing_key, b.destination) for b in bindings]

    def route(self, routing_keys: Iterable[str], headers: Mapping[str, Any]) -> list[Any]:
        routed = super().route(routing_keys, headers)
        if routed or self.arguments.get("x-super-stream-routing") != "hash":
            return routed
        partitions = self.partitions()
        if not partitions:
            return []
        keys = [routing_keys] if isinstance(routing_keys, str) else list(routing_keys)
        return list(dict.fromkeys(partitions[partition_for(k, len(partitions))] for k in keys))

    def index_of(self, queue: object) -> int:
        for index, partition in enumerate(self.partitions()):
            if partition is queue:
                return index
        return -1
