"""Super streams: partitioned streams behind a direct exchange marked `x-super-stream: true`.

The exchange routes like a direct exchange: a publish goes to the partition whose binding key
equals the routing key. With the exchange argument `x-super-stream-routing: hash`, a routing
key that matches no binding goes to partition murmur3_32(key, seed 104729) mod N, the hash the
stream client libraries use. Partitions are ordered by the binding argument
`x-stream-partition-order`, else by the number after the last `-` of the stream's name, as
RabbitMQ orders them. `add` and `delete` build and remove the topology that
`rabbitmq-streams add_super_stream` builds, with RabbitMQ's validation texts, in this node's
model; in cluster mode the same topology goes through etcd (`access_store.ClusterAccess.
add_super_stream`, after `plan`'s checks), so each partition is placed on the nodes.

Single-threaded; no I/O beyond what declaring streams does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import mmh3

from leveret.broker.model.binding import amqp_type_name
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.exchange import DirectExchange

if TYPE_CHECKING:
    from leveret.broker.model.queue import Queue
    from leveret.broker.model.vhost import VHost

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


def _order(binding: Any) -> tuple[int, int, str]:
    order = binding.arguments.get("x-stream-partition-order")
    if isinstance(order, int) and not isinstance(order, bool):
        return (0, order, binding.destination.name)
    suffix = binding.destination.name.rsplit("-", 1)[-1]
    if suffix.isdigit():
        return (1, int(suffix), binding.destination.name)
    return (2, 0, binding.destination.name)


class SuperStreamExchange(DirectExchange):
    """A direct exchange that knows its partitions, and can hash-route unmatched keys."""

    def partitions(self) -> list[Any]:
        """The partition streams, in partition order (each once)."""
        bindings = sorted((b for b in self.bindings.values()
                           if b.destination.kind == "queue"), key=_order)
        return list(dict.fromkeys(b.destination for b in bindings))

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

    def index_of(self, queue: Any) -> int:
        for index, partition in enumerate(self.partitions()):
            if partition is queue:
                return index
        return -1


def partition_index(vhost: VHost, queue: Any) -> int:
    """The queue's position in the super stream it belongs to, or -1."""
    for exchange in vhost.exchanges.values():
        if isinstance(exchange, SuperStreamExchange):
            index = exchange.index_of(queue)
            if index >= 0:
                return index
    return -1


def plan(vhost: VHost, name: str, *, partitions: int | None = None,
         binding_keys: list[str] | None = None, names: list[str] | None = None,
         arguments: dict[str, Any] | None = None) -> tuple[list[str], list[str], dict[str, Any]]:
    """Check a new super stream `name` against the vhost: its binding keys, its partition
    names (`<name>-<key>` unless given) and the partitions' queue arguments (balanced leaders
    unless the arguments name a locator), or PreconditionFailed with RabbitMQ's texts."""
    arguments = dict(arguments or {})
    if binding_keys is None:
        count = 3 if partitions is None else partitions
        if count <= 0:
            raise PreconditionFailed("The partition number must be greater than 0")
        binding_keys = [str(i) for i in range(count)]
    binding_keys = [k.strip() for k in binding_keys if k.strip()]
    if not binding_keys:
        raise PreconditionFailed("The partition number must be greater than 0")
    if len(binding_keys) > MAX_PARTITIONS:
        raise PreconditionFailed(f"The partition number must not exceed {MAX_PARTITIONS}")
    names = names if names is not None else [f"{name}-{key}" for key in binding_keys]
    if len(names) != len(binding_keys):
        raise PreconditionFailed("The super stream needs one binding key per partition")
    if len(set(names)) != len(names):
        raise PreconditionFailed("The super stream has duplicate partition names")
    for candidate in [name, *names]:
        if candidate.startswith("amq."):
            raise PreconditionFailed(f"{candidate} is not a correct name for a super stream")
    if name in vhost.exchanges:
        raise PreconditionFailed(f"there is already an exchange named {name}")
    for queue_name in names:
        if queue_name in vhost.queues:
            raise PreconditionFailed(f"there is already a queue named {queue_name}")
    queue_args = {"x-queue-type": "stream", "x-queue-leader-locator": "balanced"}
    queue_args.update({k: v for k, v in arguments.items() if k in STREAM_OPTION_ARGS})
    return binding_keys, names, queue_args


def add(vhost: VHost, name: str, *, partitions: int | None = None,
        binding_keys: list[str] | None = None, names: list[str] | None = None,
        arguments: dict[str, Any] | None = None, owner: Any = None,
        check: Any = None) -> list[str]:
    """Create the super stream `name`; returns the partition stream names. All or nothing."""
    binding_keys, names, queue_args = plan(vhost, name, partitions=partitions,
                                           binding_keys=binding_keys, names=names,
                                           arguments=arguments)
    created: list[str] = []
    try:
        vhost.declare_exchange(name, "direct", durable=True,
                               arguments={"x-super-stream": True})
        for order, (key, queue_name) in enumerate(zip(binding_keys, names, strict=True)):
            vhost.declare_queue(queue_name, owner=owner, durable=True, arguments=queue_args)
            created.append(queue_name)
            vhost.bind(name, "queue", queue_name, key, {"x-stream-partition-order": order})
    except Exception:
        for queue_name in created:
            vhost.delete_queue(vhost.queues[queue_name])
        if name in vhost.exchanges:
            vhost.delete_exchange(name)
        raise
    return names


def delete(vhost: VHost, name: str) -> list[str]:
    """Delete the exchange, then every stream it was bound to; returns the deleted streams."""
    exchange = vhost.exchange(name)
    partitions: list[Queue] = exchange.partitions() if isinstance(
        exchange, SuperStreamExchange) else [
        b.destination for b in exchange.bindings.values() if b.destination.kind == "queue"]
    vhost.delete_exchange(name)
    deleted = []
    for queue in partitions:
        if queue.type == "stream" and vhost.queues.get(queue.name) is queue:
            vhost.delete_queue(queue)
            deleted.append(queue.name)
    return deleted
