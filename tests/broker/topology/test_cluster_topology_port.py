"""The topology port in a cluster (`topology.cluster.ClusterTopology`) against a real etcd,
called directly: no AMQP, stream or HTTP socket."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from leveret.broker.broker import Broker
from leveret.broker.cluster.etcd import EtcdUnavailable
from leveret.broker.cluster.topology_records import ExchangeRecord, QueueRecord
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.topology.cluster import ClusterTopology
from leveret.broker.topology.port import (
    BindingSpec,
    ExchangeSpec,
    OutOfCluster,
    Placement,
    QueueSpec,
    StoreUnavailable,
)


def port_of(broker: Broker) -> ClusterTopology:
    assert isinstance(broker.topology, ClusterTopology)
    return broker.topology


async def record_of(broker: Broker, name: str) -> QueueRecord | None:
    return await port_of(broker).cluster.store.get_queue("/", name)


async def until(check: Any, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_declare_list_and_delete_through_etcd(cluster_node: Broker) -> None:
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    assert port.running_nodes() == {"n1"}
    spec = QueueSpec("q", durable=True)
    first = await port.declare_queue(vhost, spec)
    assert (first.created, first.placement) == (True, Placement("n1"))
    assert "q" in vhost.queues  # settled: the model has it before the answer
    assert not (await port.declare_queue(vhost, spec)).created
    assert port.placements(vhost)["q"] == Placement("n1")
    record = await record_of(cluster_node, "q")
    assert record is not None and record.node == "n1" and record.storage_id
    deleted = await port.delete_queue(vhost, "q")
    assert deleted is not None and deleted.message_count == 0  # held here: dropped at once
    assert "q" not in vhost.queues and await record_of(cluster_node, "q") is None
    assert await port.delete_queue(vhost, "q") is None


async def test_every_declaration_gets_a_storage_id(cluster_node: Broker) -> None:
    """One rule for every front end: transient queues too (the declaration's identity)."""
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    await port.declare_queue(vhost, QueueSpec("transient", durable=False))
    record = await record_of(cluster_node, "transient")
    assert record is not None and record.storage_id and record.lease


async def test_a_different_redeclaration_is_the_models_406(cluster_node: Broker) -> None:
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    await port.declare_queue(vhost, QueueSpec("q", durable=True))
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'durable'"):
        await port.declare_queue(vhost, QueueSpec("q", durable=False))


async def test_exchanges_and_bindings(cluster_node: Broker) -> None:
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    assert await port.declare_exchange(vhost, ExchangeSpec("x", "direct"))
    assert not await port.declare_exchange(vhost, ExchangeSpec("x", "direct"))
    await port.declare_queue(vhost, QueueSpec("q"))
    await port.bind(vhost, BindingSpec("x", "queue", "q", "k"))
    assert [b.routing_key for b in vhost.exchanges["x"].bindings.values()] == ["k"]
    assert await port.unbind(vhost, BindingSpec("x", "queue", "q", "k"))
    assert not await port.unbind(vhost, BindingSpec("x", "queue", "q", "k"))
    assert await port.delete_exchange(vhost, "x")
    assert "x" not in vhost.exchanges
    assert not await port.delete_exchange(vhost, "x")


async def test_a_declaration_that_may_have_been_applied_is_undone(
        cluster_node: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one answer for every front end: refused, and what etcd may have applied goes."""
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    store = port.cluster.store
    declare = store.declare_queue

    async def applied_then_lost(record: QueueRecord, lease: int = 0) -> Any:
        await declare(record, lease)
        raise EtcdUnavailable(["http://etcd"], ["timed out"], maybe_applied=True)

    monkeypatch.setattr(store, "declare_queue", applied_then_lost)
    with pytest.raises(StoreUnavailable) as refused:
        await port.declare_queue(vhost, QueueSpec("maybe", durable=True))
    assert refused.value.maybe_applied

    async def gone() -> bool:
        return await record_of(cluster_node, "maybe") is None
    await until(gone)


@pytest.fixture
async def two_nodes(start_node: Callable[[str, str], Awaitable[Broker]],
                    ) -> tuple[Broker, Broker]:
    cluster = f"p{uuid.uuid4().hex[:10]}"
    n1, n2 = await start_node(cluster, "n1"), await start_node(cluster, "n2")

    async def linked() -> bool:
        return all(b.cluster_links is not None and len(b.cluster_links.links) == 1
                   for b in (n1, n2))
    await until(linked, 20)
    return n1, n2


async def test_one_placement_for_classic_queues_and_streams(
        two_nodes: tuple[Broker, Broker]) -> None:
    n1, _n2 = two_nodes
    port, vhost = port_of(n1), n1.vhosts["/"]
    assert port.running_nodes() == {"n1", "n2"}
    here = await port.declare_queue(vhost, QueueSpec("here"))
    assert here.placement == Placement("n1")  # client-local, the default
    balanced = QueueSpec("spread", arguments={"x-queue-leader-locator": "balanced"})
    assert (await port.declare_queue(vhost, balanced)).placement == Placement("n2")
    exclusive = QueueSpec("mine", exclusive=True, owner_key="conn-1",
                          arguments={"x-queue-leader-locator": "balanced"})
    assert (await port.declare_queue(vhost, exclusive)).placement == Placement("n1")
    stream = QueueSpec("s", "stream", arguments={"x-queue-type": "stream",
                                                 "x-queue-leader-locator": "balanced"})
    placed = await port.declare_queue(vhost, stream)
    assert set(placed.placement.members) == {"n1", "n2"}
    assert placed.placement.members[0] == placed.placement.node


async def test_without_a_lease_only_leased_entities_are_refused(
        cluster_node: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Transient, exclusive and auto-delete entities go with the node's lease: none, none."""
    port, vhost = port_of(cluster_node), cluster_node.vhosts["/"]
    monkeypatch.setattr(port.cluster.membership, "lease", None)
    with pytest.raises(OutOfCluster):
        await port.declare_queue(vhost, QueueSpec("transient", durable=False))
    with pytest.raises(OutOfCluster):
        await port.declare_exchange(vhost, ExchangeSpec("gone-with-me", "fanout",
                                                        auto_delete=True))
    assert (await port.declare_queue(vhost, QueueSpec("durable", durable=True))).created
    assert await record_of(cluster_node, "transient") is None


async def test_refresh_brings_in_what_another_node_declared(
        two_nodes: tuple[Broker, Broker]) -> None:
    n1, n2 = two_nodes
    # straight into etcd, not settled: n2 may not have applied it yet
    await port_of(n1).cluster.store.declare_exchange(ExchangeRecord("/", "x", "topic", True))
    await port_of(n2).refresh(n2.vhosts["/"], exchanges=["x", "never-declared"])
    assert "x" in n2.vhosts["/"].exchanges
    assert "never-declared" not in n2.vhosts["/"].exchanges
