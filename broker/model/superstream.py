"""Super streams: partitioned streams behind a direct exchange marked `x-super-stream: true`.

The exchange (`superstream_exchange`, re-exported here) routes like a direct exchange: a
publish goes to the partition whose binding key equals the routing key. With the exchange
argument `x-super-stream-routing: hash`, a routing key that matches no binding goes to
partition murmur3_32(key, seed 104729) mod N, the hash the stream client libraries use.
Partitions are ordered by the binding argument `x-stream-partition-order`, else by the number
after the last `-` of the stream's name, as RabbitMQ orders them. `add` and `delete` build and
remove the topology that `rabbitmq-streams add_super_stream` builds, with RabbitMQ's validation
texts, in this node's model; in cluster mode the same topology goes through etcd
(`access_store.ClusterAccess.add_super_stream`, after `plan`'s checks), so each partition is
placed on the nodes.

It must not know the session, the stream protocol or the cluster; the vhost must not import
it (the vhost imports the exchange alone, so the two do not import each other).

Single-threaded; no I/O beyond what declaring streams does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.superstream_exchange import (
    HASH_SEED,
    MAX_PARTITIONS,
    STREAM_OPTION_ARGS,
    SuperStreamExchange,
    binding_index,
    check_exchange_arguments,
    is_super_stream,
    partition_for,
    partitions_of,
)

if TYPE_CHECKING:
    from leveret.broker.model.queue import Queue, QueueOwner
    from leveret.broker.model.vhost import Authorize, VHost

__all__ = [
    "HASH_SEED",
    "MAX_PARTITIONS",
    "STREAM_OPTION_ARGS",
    "SuperStreamExchange",
    "add",
    "check_exchange_arguments",
    "delete",
    "is_super_stream",
    "partition_for",
    "partition_index",
    "partitions_of",
    "plan",
]


def partition_index(vhost: QueueOwner, queue: Queue, super_stream: str | None = None) -> int:
    """The queue's position in a super stream, or -1: in the exchange `super_stream` when
    named (a stream-protocol subscription's `super-stream` property, any exchange of that
    name, as RabbitMQ reads it), else in the super stream it belongs to."""
    if super_stream is not None:
        exchange = vhost.exchanges.get(super_stream)
        return -1 if exchange is None else binding_index(exchange, queue)
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
        arguments: dict[str, Any] | None = None, owner: object = None,
        check: Authorize | None = None) -> list[str]:
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
    partitions: list[Queue] = partitions_of(exchange)
    vhost.delete_exchange(name)
    deleted = []
    for queue in partitions:
        if queue.type == "stream" and vhost.queues.get(queue.name) is queue:
            vhost.delete_queue(queue)
            deleted.append(queue.name)
    return deleted
