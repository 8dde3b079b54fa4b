"""The topology port on one node (`topology.local.LocalTopology`): the model and SQLite."""

from __future__ import annotations

import asyncio

import pytest

from leveret.broker.broker import Broker
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.topology.local import LocalTopology
from leveret.broker.topology.port import BindingSpec, ExchangeSpec, Placement, QueueSpec


async def test_the_broker_is_composed_with_the_local_port(local_broker: Broker) -> None:
    assert isinstance(local_broker.topology, LocalTopology)
    assert local_broker.topology.running_nodes() == {"solo"}


async def test_declare_place_list_and_delete_a_queue(local_broker: Broker) -> None:
    port, vhost = local_broker.topology, local_broker.vhosts["/"]
    spec = QueueSpec("q", durable=True, arguments={"x-queue-leader-locator": "balanced"})
    assert await port.place(vhost, spec) == Placement("solo")
    first = await port.declare_queue(vhost, spec)
    again = await port.declare_queue(vhost, spec)
    assert (first.created, again.created) == (True, False)
    assert first.placement == Placement("solo") and first.name == "q"
    assert port.placements(vhost)["q"] == Placement("solo")
    assert "q" in vhost.queues
    deleted = await port.delete_queue(vhost, "q")
    assert deleted is not None and deleted.message_count == 0
    assert await port.delete_queue(vhost, "q") is None
    assert "q" not in vhost.queues


async def test_a_different_redeclaration_is_the_models_406(local_broker: Broker) -> None:
    port, vhost = local_broker.topology, local_broker.vhosts["/"]
    await port.declare_queue(vhost, QueueSpec("q", durable=True))
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'durable'"):
        await port.declare_queue(vhost, QueueSpec("q", durable=False))


async def test_exchanges_and_bindings(local_broker: Broker) -> None:
    port, vhost = local_broker.topology, local_broker.vhosts["/"]
    assert await port.declare_exchange(vhost, ExchangeSpec("x", "direct"))
    assert not await port.declare_exchange(vhost, ExchangeSpec("x", "direct"))
    await port.declare_queue(vhost, QueueSpec("q"))
    await port.bind(vhost, BindingSpec("x", "queue", "q", "k"))
    assert [b.routing_key for b in vhost.exchanges["x"].bindings.values()] == ["k"]
    assert await port.unbind(vhost, BindingSpec("x", "queue", "q", "k"))
    assert not vhost.exchanges["x"].bindings
    assert await port.delete_exchange(vhost, "x")
    assert not await port.delete_exchange(vhost, "x")


async def test_durable_declarations_reach_the_metastore(local_broker: Broker) -> None:
    port, vhost = local_broker.topology, local_broker.vhosts["/"]
    await port.declare_exchange(vhost, ExchangeSpec("kept-x", "fanout"))
    await port.declare_queue(vhost, QueueSpec("kept", durable=True))
    await port.declare_queue(vhost, QueueSpec("gone", durable=False))
    await port.bind(vhost, BindingSpec("kept-x", "queue", "kept"))
    config = local_broker.config
    local_broker.close()
    reopened = Broker(config, asyncio.get_running_loop())
    try:
        again = reopened.vhosts["/"]
        assert "kept" in again.queues and "gone" not in again.queues
        assert [b.destination.name for b in again.exchanges["kept-x"].bindings.values()] == ["kept"]
    finally:
        reopened.close()


async def test_refresh_has_nothing_to_read(local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    await local_broker.topology.refresh(vhost, exchanges=["none"], queues=["none"])
    assert "none" not in vhost.exchanges and "none" not in vhost.queues
