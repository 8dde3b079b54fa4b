"""Fixtures for the topology port's unit tests: a broker's model composed with each
implementation, and no AMQP, stream or HTTP listener.

`local_broker` (tests/broker/conftest.py) is one node (the model and its SQLite metastore).
`cluster_node` is one node of a cluster on the session's real etcd (`tests/cluster/conftest.py`'s
`etcd`, shared): the server's own cluster composition (membership, links, topology cache and
sync) without its listeners, so the port is called directly on the test's event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from support.etcd import SKIP_REASON, EtcdServer, etcd_binary

from leveret.broker.broker import Broker
from leveret.broker.process.config import Config
from leveret.broker.server import Server


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One real etcd for these tests (the cluster tests' own, when they run in the same
    session, is another fixture of the same name in their folder)."""
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


async def start_cluster_node(data_dir: Path, etcd_url: str, cluster: str, node: str) -> Server:
    """A node of `cluster` as `leveret serve` composes it, less its listeners."""
    config = Config(data_dir=data_dir, port=0, etcd=[etcd_url], cluster_name=cluster,
                    node_name=node, cluster_port=0, cluster_secret="port-test-secret",
                    cluster_lease_ttl_s=2)
    data_dir.mkdir(parents=True, exist_ok=True)
    server = Server(config)
    await server._join_cluster()
    broker = server.broker = Broker(config, asyncio.get_running_loop())
    broker.membership = server.membership
    broker.cluster_links = server.cluster_links
    await server._start_topology(broker)
    assert server.cluster_links is not None
    await server.cluster_links.start()
    return server


StartNode = Callable[[str, str], Awaitable[Broker]]


@pytest.fixture
async def start_node(tmp_path: Path, etcd: EtcdServer) -> AsyncIterator[StartNode]:
    """Start nodes (cluster name, node name) on the session's etcd; stopped at the end."""
    started: list[Server] = []

    async def start(cluster: str, node: str) -> Broker:
        server = await start_cluster_node(tmp_path / node, etcd.url, cluster, node)
        started.append(server)
        assert server.broker is not None
        return server.broker

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def cluster_node(start_node: StartNode) -> Broker:
    return await start_node(f"p{uuid.uuid4().hex[:10]}", "n1")
