"""aio-pika and kombu against different nodes of one cluster (real etcd, real `leveret serve`
nodes): what one node declares the other knows before the -ok, a different redeclaration is 406,
an exclusive queue of another node's connection is 405, a killed node's consumers elsewhere are
cancelled and its queues answer RabbitMQ's node-down text, its confirmed messages come back with
it, and with etcd gone changes are refused while messaging goes on. (pika covers the same points
in test_cluster_topology.py and test_forwarding.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import aio_pika
import kombu
import pytest
from aio_pika.exceptions import ChannelClosed
from aiormq.exceptions import ChannelLockedResource, ChannelPreconditionFailed
from amqp.exceptions import ConsumerCancelled
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, linked, make_node, wait_until
from support.etcd import EtcdServer

DOWN = "home node 'a' of durable queue '{}' in vhost '/' is down or inaccessible"


@pytest.fixture
def ab(tmp_path: Path, etcd_factory: Callable[[], EtcdServer], cluster: str,
       nodes: list[BrokerProcess]) -> Iterator[tuple[ClusterNode, ClusterNode, EtcdServer]]:
    etcd = etcd_factory()  # its own: one test stops it
    a = make_node(tmp_path, etcd.url, cluster, "a", management=True)
    b = make_node(tmp_path, etcd.url, cluster, "b", management=True)
    nodes.extend((a.start(), b.start()))
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=20)
    yield a, b, etcd


async def _refusal(url: str,
                   declare: Callable[[aio_pika.abc.AbstractChannel], object]) -> ChannelClosed:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        with pytest.raises(ChannelClosed) as closed:
            await declare(channel)  # type: ignore[misc]
        return closed.value
    finally:
        await connection.close()


def test_aio_pika_topology_across_nodes(
        ab: tuple[ClusterNode, ClusterNode, EtcdServer]) -> None:
    a, b, _etcd = ab

    async def run() -> None:
        on_a = await aio_pika.connect(a.url)
        channel_a = await on_a.channel()
        await channel_a.declare_queue("c.orders", durable=True, arguments={"x-max-length": 5})
        on_b = await aio_pika.connect(b.url)
        queue = await (await on_b.channel()).declare_queue("c.orders", passive=True)
        assert queue.name == "c.orders"  # known on b as soon as a had its declare-ok
        refused = await _refusal(b.url, lambda ch: ch.declare_queue(
            "c.orders", durable=True, arguments={"x-max-length": 6}))
        assert isinstance(refused, ChannelPreconditionFailed)  # 406
        assert "inequivalent arg 'x-max-length' for queue 'c.orders'" in str(refused)
        await channel_a.declare_queue("c.mine", exclusive=True)
        refused = await _refusal(b.url, lambda ch: ch.declare_queue("c.mine", passive=True))
        assert isinstance(refused, ChannelLockedResource)  # 405
        assert "exclusive access to locked queue 'c.mine'" in str(refused)
        await on_b.close()
        await on_a.close()

    asyncio.run(run())


def test_kombu_through_a_kill_of_the_holding_node(
        ab: tuple[ClusterNode, ClusterNode, EtcdServer]) -> None:
    a, b, _etcd = ab
    with kombu.Connection(a.url) as conn:
        queue = kombu.Queue("c.kill", durable=True)
        queue(conn.default_channel).declare()
    with kombu.Connection(b.url) as conn:
        producer = conn.Producer()
        for i in range(10):
            producer.publish(f"m{i}", routing_key="c.kill", delivery_mode=2, retry=False)
    with kombu.Connection(b.url) as conn:
        consumer = kombu.Consumer(conn.channel(),
                                  [kombu.Queue("c.kill", durable=True, no_declare=True)],
                                  prefetch_count=1, on_message=lambda message: None)
        consumer.consume()
        a.kill()
        with pytest.raises(ConsumerCancelled):  # py-amqp's answer to the server's basic.cancel
            for _ in range(50):
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    continue
    with kombu.Connection(b.url) as conn:
        with pytest.raises(conn.channel_errors) as down:
            conn.default_channel.queue_declare("c.kill", passive=True)
        assert DOWN.format("c.kill") in str(down.value)
    a.start()
    wait_until(lambda: _passive_ok(b, "c.kill"), timeout=30)
    got: list[str] = []
    with kombu.Connection(b.url) as conn:
        simple = conn.SimpleQueue(kombu.Queue("c.kill", durable=True, no_declare=True))
        for _ in range(10):
            message = simple.get(timeout=5)
            got.append(message.payload)
            message.ack()
        simple.close()
    assert sorted(got, key=lambda s: int(s[1:])) == [f"m{i}" for i in range(10)]


def _passive_ok(node: ClusterNode, name: str) -> bool:
    with kombu.Connection(node.url) as conn:
        try:
            conn.default_channel.queue_declare(name, passive=True)
            return True
        except conn.channel_errors:
            return False


def test_kombu_with_etcd_gone_refuses_changes_and_keeps_messaging(
        ab: tuple[ClusterNode, ClusterNode, EtcdServer]) -> None:
    """Each node keeps serving its own queues; changes are refused. (Once the nodes' leases
    expire they leave the cluster and close their links, so queues of other nodes answer the
    node-down text until etcd is back: docs/CLUSTER.md, failure cases.)"""
    a, b, etcd = ab
    with kombu.Connection(b.url) as conn:
        conn.default_channel.queue_declare("c.live", durable=True, auto_delete=False)
    etcd.kill()
    with kombu.Connection(b.url) as conn:
        with pytest.raises(conn.connection_errors + conn.channel_errors) as refused:
            conn.default_channel.queue_declare("c.new", durable=True, auto_delete=False)
        assert "INTERNAL_ERROR" in str(refused.value)
        assert "metadata store is unavailable" in str(refused.value)
    wait_until(lambda: "lost the etcd lease" in b.log(), timeout=15)
    assert _round_trip(b, "c.live", "still here")  # messaging on b's own queue goes on
    etcd.restart()
    wait_until(lambda: "rejoined the cluster" in b.log() and "rejoined the cluster" in a.log(),
               timeout=30)
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=30)
    assert _round_trip(a, "c.live", "across")  # and across nodes again once etcd is back


def _round_trip(node: ClusterNode, queue: str, body: str) -> bool:
    """Publish `body` to `queue` through `node` (default exchange) and get it back there."""
    with kombu.Connection(node.url) as conn:
        conn.Producer().publish(body, routing_key=queue, retry=False)
        simple = conn.SimpleQueue(kombu.Queue(queue, durable=True, no_declare=True))
        message = simple.get(timeout=5)
        message.ack()
        got = message.payload
        simple.close()
    return bool(got == body)
