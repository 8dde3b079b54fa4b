"""The topology port: the one interface through which a front end changes the topology.

A front end (AMQP's queue.declare, the stream protocol's Create, the management API,
definitions) runs the model's checks for its own reply texts, then calls one of these methods.
The implementation decides where the change goes (the model and SQLite on one node, etcd in a
cluster), which node holds a new queue (`placement.py`), and what is undone when a change
may have been applied although it was refused (`cluster.py`): every front end gets the same
answer, as typed errors that each maps to its own codes and texts.

It must not know AMQP, the stream protocol, HTTP, etcd or the SQLite schema.
Plain data and a Protocol: any thread; the methods run on the broker's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from leveret.broker.model.vhost import VHost


# The declarations and the answers are made once per AMQP method: plain dataclasses with slots
# (a frozen one's __init__ costs three times as much), never changed once made.


@dataclass(slots=True)
class QueueSpec:
    """A queue as its declaration asks for it (already checked by the model)."""

    name: str
    type: str = "classic"
    durable: bool = True
    auto_delete: bool = False
    exclusive: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    owner: object | None = None  # the declaring connection (an exclusive queue's owner)
    owner_key: str | None = None  # that connection's cluster-wide key (in etcd records)
    new: bool = True  # no queue of that name is known here (a new stream is placed over nodes)


@dataclass(slots=True)
class ExchangeSpec:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class BindingSpec:
    source: str
    destination_type: Literal["queue", "exchange"]
    destination: str
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    owner: object | None = None  # the connection that asks (an exclusive queue's own may bind it)


@dataclass(frozen=True)
class Placement:
    """The node holding a queue (a stream's leader) and a replicated stream's members, the
    leader first (() for a queue held by one node)."""

    node: str
    members: tuple[str, ...] = ()


@dataclass(slots=True)
class DeclaredQueue:
    """The answer to a declaration: where the queue is, and whether this call created it."""

    name: str
    placement: Placement
    created: bool


@dataclass(slots=True)
class DeletedQueue:
    """A deleted queue; `message_count` when this node held it (None: another node held it
    and drops it as the change reaches it)."""

    message_count: int | None


class TopologyError(Exception):
    """The topology cannot take a change now. Each front end words it its own way."""


class StoreUnavailable(TopologyError):
    """The metadata store did not answer. `maybe_applied`: the change may have been applied
    anyway; for a queue declaration the port then undoes it once the store answers."""

    def __init__(self, endpoints: tuple[str, ...] = (), maybe_applied: bool = False) -> None:
        super().__init__(f"the metadata store is unavailable at {', '.join(endpoints)}")
        self.endpoints = endpoints
        self.maybe_applied = maybe_applied


class OutOfCluster(StoreUnavailable):
    """This node has lost its lease: it cannot hold leased (transient, exclusive,
    auto-delete) entities, and refuses topology changes until it rejoins."""


class NotSettled(TopologyError):
    """The change is stored, but this node did not apply it in time."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision {revision} was not applied in time")
        self.revision = revision


class TopologyPort(Protocol):
    """Declare, bind, delete, place and list exchanges and queues. Model errors (406, 404,
    405...) pass through with the model's texts; unavailability is a `TopologyError`."""

    @property
    def node(self) -> str:
        """This node's name."""

    def running_nodes(self) -> set[str]:
        """The nodes a new queue may be placed on (this one alone on a single node)."""

    async def place(self, vhost: VHost, spec: QueueSpec) -> Placement:
        """Where a new queue declared here would live."""

    async def declare_queue(self, vhost: VHost, spec: QueueSpec) -> DeclaredQueue: ...

    async def declare_exchange(self, vhost: VHost, spec: ExchangeSpec) -> bool:
        """True when the exchange is new."""

    async def bind(self, vhost: VHost, spec: BindingSpec) -> None: ...

    async def unbind(self, vhost: VHost, spec: BindingSpec) -> bool:
        """False when the store had no such binding (the local model does not say: True)."""

    async def delete_queue(self, vhost: VHost, name: str) -> DeletedQueue | None:
        """None when there was no such queue."""

    async def delete_exchange(self, vhost: VHost, name: str) -> bool:
        """False when there was no such exchange."""

    def placements(self, vhost: VHost) -> dict[str, Placement]:
        """Every queue of the vhost and where it lives."""

    async def refresh(self, vhost: VHost, exchanges: Sequence[str] = (),
                      queues: Sequence[str] = ()) -> None:
        """Bring into the model the named entities it lacks that the store holds (a change
        made through another node and still on its way here); no-op where the model is the
        store. `NotSettled` if this node does not apply them in time."""
