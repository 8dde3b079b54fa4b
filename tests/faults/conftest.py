"""Fixtures of the fault suite: a private network of namespaces, etcd on its bridge, and three
`leveret serve` nodes, one per namespace (module-scoped: the rounds of a module share them and
restore them between rounds).

The fixture skips, with the reason, where the suite cannot run: not root, no `ip` or `nft`, a
namespace that cannot be created or in which nftables cannot load a table, no etcd, or a bridge
over which the namespaces cannot reach each other. Whatever happens, the nodes and etcd are
stopped and the namespaces, veths, bridge and route are removed at the end.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from faults.cluster import FaultCluster
from faults.net import NetError, TestNet, unavailable
from faults.rounds import RoundResult, failover_table
from support.etcd import SKIP_REASON, etcd_binary


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    try:
        net = TestNet.create(3)
    except NetError as exc:
        pytest.skip(f"cannot build the test network: {exc}")
    cluster = FaultCluster(net, tmp_path_factory.mktemp("faults"), f"f{uuid.uuid4().hex[:8]}")
    pika_logger = logging.getLogger("pika")
    pika_level = pika_logger.level
    pika_logger.setLevel(logging.CRITICAL)  # a fault makes pika log every lost connection
    try:
        print(f"\nfault network {net.subnet}: clients {net.client_ip}, etcd {net.etcd_ip}, "
              + ", ".join(f"{ns.name} {ns.ip}" for ns in net.namespaces)
              + f"; nodes' data and logs under {cluster.base}")
        cluster.start()
        yield cluster
    finally:
        pika_logger.setLevel(pika_level)
        try:
            cluster.stop()
        finally:
            net.destroy()


@pytest.fixture(scope="module")
def round_results() -> Iterator[list[RoundResult]]:
    """Every round of the module; at the end, the failover times per nemesis."""
    results: list[RoundResult] = []
    yield results
    if results:
        print("\n" + failover_table(results))
