"""Fixtures for cluster tests: a real etcd (Debian's etcd-server), shared or private.

`etcd` is one etcd for the whole session; tests keep apart by the unique `key_prefix`.
`etcd_factory` starts private ones, for tests that pause or kill etcd. `abc` is three
`leveret serve` nodes of one cluster, linked to each other, for replicated streams. Every
fixture skips, with the reason, when etcd is not installed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, linked, make_node, wait_until
from support.etcd import SKIP_REASON, EtcdServer, etcd_binary

from leveret.broker.cluster.etcd import EtcdClient


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One real etcd for the session. Do not pause or kill it: use etcd_factory for that."""
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture
def etcd_factory(tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    """Start private etcds (stopped at the end of the test), each in its own folder."""
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    started: list[EtcdServer] = []

    def start() -> EtcdServer:
        server = EtcdServer(tmp_path / f"etcd{len(started)}")
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def key_prefix() -> str:
    """A key prefix no other test uses, so tests can share the session's etcd."""
    return f"/test/{uuid.uuid4().hex}/"


@pytest.fixture
async def etcd_client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    async with EtcdClient([etcd.url], timeout_s=3.0) as client:
        yield client


@pytest.fixture
def cluster() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


@pytest.fixture
def nodes() -> Iterator[list[BrokerProcess]]:
    started: list[BrokerProcess] = []
    yield started
    for node in started:
        if node.proc is not None and node.proc.poll() is None:
            node.stop()


@pytest.fixture
def node_env() -> dict[str, str]:
    """Settings every node of `abc` gets (a module overrides it: quorum queues fsync)."""
    return {}


@pytest.fixture
def abc(tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess],
        node_env: dict[str, str]) -> Iterator[tuple[ClusterNode, ClusterNode, ClusterNode]]:
    """Nodes a, b and c (with management), each linked to the other two."""
    three = [make_node(tmp_path, etcd.url, cluster, name, management=True, env=node_env)
             for name in ("a", "b", "c")]
    for node in three:
        nodes.append(node.start())
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    yield three[0], three[1], three[2]
