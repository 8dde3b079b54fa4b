"""The topology port on one node: the model, which persists durable entities to SQLite.

Role: `TopologyPort` for a broker composed without a cluster. Every change is the model's own
(`VHost.add_queue`, `bind`, ...), applied at once: the vhost writes durable entities to the
SQLite metastore through its observer. A new queue or exchange was checked by the front end
(`VHost.check_*_declaration`, which also names a server-named queue) and is added as it is; a
redeclaration gets the model's equivalence check unless the front end made it against that
queue (`QueueSpec.new` false). Every queue lives on this node.

It must not know AMQP, the stream protocol, HTTP, etcd or the SQLite schema.
Single-threaded: the broker's event loop (the methods never wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from leveret.broker.topology.port import (
    BindingSpec,
    DeclaredQueue,
    DeletedQueue,
    ExchangeSpec,
    Placement,
    QueueSpec,
)

if TYPE_CHECKING:
    from leveret.broker.model.vhost import VHost


class LocalTopology:
    """The single-node implementation of `TopologyPort`."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._here = Placement(node)  # where every queue lives (immutable: shared)

    @property
    def node(self) -> str:
        return self._node

    def running_nodes(self) -> set[str]:
        return {self._node}

    async def place(self, vhost: VHost, spec: QueueSpec) -> Placement:
        return self._here

    def placements(self, vhost: VHost) -> dict[str, Placement]:
        return {name: self._here for name in vhost.queues}

    async def refresh(self, vhost: VHost, exchanges: Sequence[str] = (),
                      queues: Sequence[str] = ()) -> None:
        return None  # the model is the store

    async def declare_queue(self, vhost: VHost, spec: QueueSpec) -> DeclaredQueue:
        existing = vhost.queues.get(spec.name)
        if existing is not None:
            if spec.new:  # the front end did not see it: the model's equivalence check (406)
                vhost.declare_queue(
                    spec.name, owner=spec.owner, durable=spec.durable,
                    exclusive=spec.exclusive, auto_delete=spec.auto_delete,
                    arguments=dict(spec.arguments))
            else:  # checked against this queue by the front end
                existing.touch()
            return DeclaredQueue(spec.name, self._here, False)
        vhost.add_queue(spec.name, spec.type, durable=spec.durable and not spec.exclusive,
                        exclusive_owner=spec.owner if spec.exclusive else None,
                        auto_delete=spec.auto_delete, arguments=dict(spec.arguments))
        return DeclaredQueue(spec.name, self._here, True)

    async def delete_queue(self, vhost: VHost, name: str) -> DeletedQueue | None:
        queue = vhost.queues.get(name)
        if queue is None:
            return None
        return DeletedQueue(vhost.delete_queue(queue))

    async def declare_exchange(self, vhost: VHost, spec: ExchangeSpec) -> bool:
        if spec.name in vhost.exchanges:  # the model's equivalence check (406)
            vhost.declare_exchange(spec.name, spec.type, durable=spec.durable,
                                   auto_delete=spec.auto_delete, internal=spec.internal,
                                   arguments=dict(spec.arguments))
            return False
        vhost.add_exchange(spec.name, spec.type, durable=spec.durable,
                           auto_delete=spec.auto_delete, internal=spec.internal,
                           arguments=dict(spec.arguments))
        return True

    async def delete_exchange(self, vhost: VHost, name: str) -> bool:
        if name not in vhost.exchanges:
            return False
        vhost.delete_exchange(name)
        return True

    async def bind(self, vhost: VHost, spec: BindingSpec) -> None:
        vhost.bind(spec.source, spec.destination_type, spec.destination, spec.routing_key,
                   dict(spec.arguments), owner=spec.owner)

    async def unbind(self, vhost: VHost, spec: BindingSpec) -> bool:
        vhost.unbind(spec.source, spec.destination_type, spec.destination, spec.routing_key,
                     dict(spec.arguments), owner=spec.owner)
        return True
