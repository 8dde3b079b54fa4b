"""The management API's nodes port on one node (`management/nodes.py:OneNodeView`), without
sockets: the app is built with it, and it answers for this node only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leveret.amqp.content import Message
from leveret.broker.broker import Broker
from leveret.broker.management import cluster_views, views
from leveret.broker.management.app import create_app
from leveret.broker.management.http import ApiError
from leveret.broker.management.nodes import NODES, NodesView, OneNodeView
from leveret.broker.process.config import Config


@pytest.fixture
async def local_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    (tmp_path / "data").mkdir()
    broker = Broker(Config(data_dir=tmp_path / "data", port=0, node_name="solo"),
                    asyncio.get_running_loop())
    yield broker
    broker.close()


def one_node(broker: Broker) -> NodesView:
    return create_app(broker)[NODES]


async def test_the_app_of_one_node_is_built_with_the_one_node_view(local_broker: Broker) -> None:
    nodes = one_node(local_broker)
    assert isinstance(nodes, OneNodeView)
    assert nodes.node == "solo"


async def test_every_queue_is_this_nodes_with_its_own_counts(local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    queue = vhost.declare_queue("q", owner=None)
    queue.publish(Message.build("", "q", b"one"), None)
    queue.publish(Message.build("", "q", b"two"), None)
    nodes = one_node(local_broker)
    assert nodes.node_of(queue) == "solo"
    assert nodes.is_remote(queue) is False
    [view] = await nodes.queue_views([queue])
    assert view == views.queue_view(queue, "solo")
    assert (view["node"], view["messages"], view["state"]) == ("solo", 2, "running")
    assert await nodes.queue_totals([queue]) == {
        "messages": 2, "messages_ready": 2, "messages_unacknowledged": 0}


async def test_no_other_node_answers(local_broker: Broker) -> None:
    nodes = one_node(local_broker)
    for kind in (cluster_views.CONNECTIONS, cluster_views.CHANNELS, cluster_views.CONSUMERS):
        assert await nodes.remote_items(kind) == []
    assert nodes.running_nodes() == {"solo": "running"}
    assert nodes.metric_labels() == {}
    queue = local_broker.vhosts["/"].declare_queue("q", owner=None)
    with pytest.raises(ApiError) as held:
        await nodes.on_holder(queue, cluster_views.PURGE, {})
    assert (held.value.status, held.value.reason) == (
        503, "queue 'q' in vhost '/': its node solo does not answer")
    with pytest.raises(ApiError) as closed:
        await nodes.close_remote("other", "c1", "bye")
    assert (closed.value.status, closed.value.reason) == (
        503, "connection 'c1': its node other does not answer")
