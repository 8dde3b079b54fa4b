"""Links between cluster nodes, with a real etcd and real `leveret serve` processes: one link per
pair, dropped when a node dies and back when it returns, redialed when the TCP connection is cut,
never made to a node with the wrong secret, and a taken cluster port refused in one line."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.brokers import BrokerProcess
from support.cluster import TTL_S, ClusterNode, api_nodes, make_node, one_line, wait_until
from support.etcd import EtcdServer

from leveret.broker.broker import VERSION
from leveret.broker.cluster.link import AuthenticationFailed, Handlers, LinkConfig, connect


def links_of(node: ClusterNode) -> dict[str, dict[str, Any]]:
    """The local node's cluster_links in its /api/nodes, by peer name."""
    local = [n for n in api_nodes(node) if "os_pid" in n]
    assert len(local) == 1
    return {link["name"]: link for link in local[0]["cluster_links"]}


def linked(node: ClusterNode, *peers: str) -> bool:
    """`node` has a link to exactly `peers`, each having answered a ping."""
    links = links_of(node)
    return set(links) == set(peers) and all(
        link["peer_version"] == VERSION for link in links.values())


def ups(node: ClusterNode, peer: str) -> int:
    """How many times `node` logged a link to `peer` coming up."""
    return sum(1 for line in node.log().splitlines()
               if "cluster link up" in line and f'"peer_node": "{peer}"' in line)


def running(node: ClusterNode) -> dict[str, bool]:
    return {n["name"]: n["running"] for n in api_nodes(node)}


def start_three(tmp_path: Path, etcd: EtcdServer, cluster: str,
                nodes: list[BrokerProcess]) -> tuple[ClusterNode, ClusterNode, ClusterNode]:
    n1, n2, n3 = (make_node(tmp_path, etcd.url, cluster, name, management=True)
                  for name in ("n1", "n2", "n3"))
    for node in (n1, n2, n3):
        nodes.append(node.start())
    wait_until(lambda: linked(n1, "n2", "n3") and linked(n2, "n1", "n3")
               and linked(n3, "n1", "n2"), timeout=20)
    return n1, n2, n3


def test_links_between_every_pair_go_with_a_killed_node_and_come_back(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    n1, n2, n3 = start_three(tmp_path, etcd, cluster, nodes)
    n1_links, n3_links = links_of(n1), links_of(n3)
    # the lower name dials: n1 dials n2 and n3, n3 accepts from both
    assert {link["direction"] for link in n1_links.values()} == {"outbound"}
    assert {link["direction"] for link in n3_links.values()} == {"inbound"}
    assert n1_links["n3"]["peer_port"] == n3.cluster_port == n3_links["n1"]["sock_port"]
    assert n1_links["n2"]["peer_addr"] == "127.0.0.1"
    assert links_of(n2)["n1"]["direction"] == "inbound"
    assert links_of(n2)["n3"]["direction"] == "outbound"
    assert n1_links["n2"]["peer_revision"] > 0  # the etcd revision n2 had applied

    n2.kill()  # kill -9: the others keep their link until the lease expires (or it breaks)
    killed_at = time.monotonic()
    wait_until(lambda: linked(n1, "n3") and linked(n3, "n1"), timeout=TTL_S + 15)
    wait_until(lambda: not running(n1)["n2"], timeout=TTL_S + 15)
    assert time.monotonic() - killed_at >= TTL_S - 1  # the lease, not anything sooner
    assert running(n3) == {"n1": True, "n2": False, "n3": True}
    assert linked(n1, "n3")  # the dialer stopped: its peer's record is gone

    n2.restart()
    wait_until(lambda: linked(n1, "n2", "n3") and linked(n2, "n1", "n3")
               and linked(n3, "n1", "n2"), timeout=20)

    assert n3.stop() == 0  # a clean stop: its record and its links go at once
    wait_until(lambda: linked(n1, "n2") and linked(n2, "n1"), timeout=10)
    for node in (n1, n2):
        log = node.log()
        assert "Traceback" not in log
        assert "cluster link up" in log


def test_a_cut_connection_is_redialed(tmp_path: Path, etcd: EtcdServer, cluster: str,
                                      nodes: list[BrokerProcess]) -> None:
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2) to cut a TCP connection")
    n1, n2, n3 = start_three(tmp_path, etcd, cluster, nodes)
    # cut every TCP connection to n3's cluster port: n1's and n2's links to it
    cut = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(n3.cluster_port)],
                         capture_output=True, text=True, check=False)
    if cut.returncode != 0:
        pytest.skip(f"ss -K cannot cut sockets here: {cut.stderr.strip()}")
    wait_until(lambda: ups(n1, "n3") == 2 and ups(n2, "n3") == 2 and ups(n3, "n1") == 2
               and ups(n3, "n2") == 2, timeout=20)
    wait_until(lambda: linked(n1, "n2", "n3") and linked(n2, "n1", "n3")
               and linked(n3, "n1", "n2"), timeout=20)
    assert ups(n1, "n2") == 1  # the others were left alone
    for node in (n1, n2, n3):
        assert "Traceback" not in node.log()


def test_a_node_with_the_wrong_secret_gets_no_link(tmp_path: Path, etcd: EtcdServer,
                                                   cluster: str,
                                                   nodes: list[BrokerProcess]) -> None:
    good = make_node(tmp_path, etcd.url, cluster, "b-good", management=True)
    nodes.append(good.start())
    wrong = make_node(tmp_path, etcd.url, cluster, "a-wrong",
                      env={"LEVERET_CLUSTER_SECRET": "not-the-secret"})
    assert "cluster secret does not match" in one_line(wrong.run_to_exit())
    # a process that speaks the link protocol with the wrong secret is refused by the listener

    async def dial() -> None:
        config = LinkConfig(cluster, "a-wrong", b"not-the-secret")
        with pytest.raises(AuthenticationFailed):
            await connect("127.0.0.1", good.cluster_port, config, Handlers())

    asyncio.run(dial())
    assert links_of(good) == {}
    assert good.proc is not None and good.proc.poll() is None
    assert "cluster link refused" in good.log() and "Traceback" not in good.log()


def test_a_taken_cluster_port_is_refused_in_one_line(tmp_path: Path, etcd: EtcdServer,
                                                     cluster: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = make_node(tmp_path, etcd.url, cluster, "n1")
        node.args[node.args.index("--cluster-port") + 1] = str(port)
        line = one_line(node.run_to_exit())
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--cluster-port" in line
