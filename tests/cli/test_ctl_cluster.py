"""`leveretctl cluster_status` and `--node` against three `leveret serve` nodes of one cluster
(a real etcd): the local credential, derived from the cluster's shared secret, opens every
node's API from the machine's loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import ClusterNode, linked, make_node, wait_until
from support.etcd import SKIP_REASON, EtcdServer, etcd_binary


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ClusterNode]]:
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    base = tmp_path_factory.mktemp("ctl-cluster")
    etcd = EtcdServer(base / "etcd").start()
    nodes = [make_node(base, etcd.url, "ctl", name, management=True) for name in "abc"]
    try:
        for node in nodes:
            node.start()
        wait_until(lambda: all(linked(node, 2) for node in nodes), timeout=60)
        yield nodes
    finally:
        for node in nodes:
            node.kill()
        etcd.stop()


def ctl(node: ClusterNode, *args: str, tool: str = "ctl") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"leveret.cli.{tool}", *args,
                           "--data-dir", str(node.data_dir),
                           "--management-port", str(node.management_port)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cluster_status_and_node(three: list[ClusterNode], tmp_path: Path) -> None:
    a, b, _c = three
    result = ctl(a, "cluster_status", "--formatter", "json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert sorted(status["running_nodes"]) == ["a", "b", "c"]
    assert sorted(status["disk_nodes"]) == ["a", "b", "c"] and status["cluster_name"] == "ctl"
    text = ctl(a, "cluster_status").stdout.splitlines()
    assert text[0] == "Cluster status of node a ..." and "Running Nodes" in text
    # --node: b's API, with a's credential (the same secret derives the same token)
    on_b = ctl(a, "-n", f"127.0.0.1:{b.management_port}", "status", "--formatter", "json")
    assert on_b.returncode == 0, on_b.stderr
    assert json.loads(on_b.stdout)["data_directory"] == str(b.data_dir)
    ping = ctl(a, "-q", "ping", "--node", f"http://127.0.0.1:{b.management_port}",
               tool="diagnostics")
    assert (ping.returncode, ping.stdout) == (0, "Ping succeeded\n")
    assert ctl(a, "add_vhost", "from-a", "-n", f"127.0.0.1:{b.management_port}").returncode == 0
    wait_until(lambda: "from-a" in ctl(a, "-q", "list_vhosts").stdout.split())
    alarms = ctl(a, "check_alarms", tool="diagnostics")
    assert alarms.returncode == 0 and "no alarms" in alarms.stdout
