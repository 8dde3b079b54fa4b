"""Links between cluster nodes, with a real etcd and real `leveret serve` processes: one link per
pair, dropped when a node dies and back when it returns, redialed when the TCP connection is cut,
never made to a node with the wrong secret, and a taken cluster port refused in one line."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.brokers import BrokerProcess
from support.cluster import (
    TTL_S,
    ClusterNode,
    api_nodes,
    make_node,
    one_line,
    states,
    status,
    wait_until,
)
from support.etcd import EtcdServer

from leveret.broker.broker import VERSION
from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.link import (
    AuthenticationFailed,
    Handlers,
    Link,
    LinkConfig,
    PeerStarting,
    connect,
)
from leveret.broker.cluster.peers import PING, ClusterLinks


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
    """How many times `node` logged a link it dialed to `peer` coming up."""
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
    before = {(a, b): ups(a, b.node_name) for a in (n1, n2, n3) for b in (n1, n2, n3)}
    # cut every TCP connection to n3's cluster port: n1's and n2's links to it
    cut = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(n3.cluster_port)],
                         capture_output=True, text=True, check=False)
    if cut.returncode != 0:
        pytest.skip(f"ss -K cannot cut sockets here: {cut.stderr.strip()}")
    wait_until(lambda: ups(n1, "n3") > before[n1, n3] and ups(n2, "n3") > before[n2, n3],
               timeout=20)  # the dialers of the links cut linked again
    wait_until(lambda: linked(n1, "n2", "n3") and linked(n2, "n1", "n3")
               and linked(n3, "n1", "n2"), timeout=20)
    assert ups(n1, "n2") == before[n1, n2]  # the link not cut was left alone
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
    assert "n1" not in states(etcd.url, cluster)  # refused before it registered

    # the AMQP port taken after the node has joined: one line, and it leaves the cluster
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node = make_node(tmp_path, etcd.url, cluster, "n2")
        node.port = taken.getsockname()[1]
        result = node.run_to_exit()
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert f"port {node.port} on 127.0.0.1 is already in use" in result.stderr
    assert "n2" not in states(etcd.url, cluster) or states(etcd.url, cluster)["n2"] == "down"


def test_cluster_port_zero_advertises_the_port_bound(tmp_path: Path, etcd: EtcdServer,
                                                     cluster: str,
                                                     nodes: list[BrokerProcess]) -> None:
    n1 = make_node(tmp_path, etcd.url, cluster, "n1", management=True)
    n2 = make_node(tmp_path, etcd.url, cluster, "n2", management=True)
    n2.args[n2.args.index("--cluster-port") + 1] = "0"
    for node in (n1, n2):
        nodes.append(node.start())
    wait_until(lambda: linked(n1, "n2") and linked(n2, "n1"), timeout=20)
    advertised = {n["name"]: n["cluster_port"] for n in status(etcd.url, cluster)["nodes"]}
    assert advertised["n2"] not in (0, None)
    assert links_of(n1)["n2"]["peer_port"] == advertised["n2"]


def test_a_node_out_of_the_cluster_closes_its_links_and_rejoins(
        tmp_path: Path, etcd_factory: Callable[[], EtcdServer], cluster: str,
        nodes: list[BrokerProcess]) -> None:
    etcd = etcd_factory()
    n1, n2 = (make_node(tmp_path, etcd.url, cluster, name, management=True)
              for name in ("n1", "n2"))
    for node in (n1, n2):
        nodes.append(node.start())
    wait_until(lambda: linked(n1, "n2") and linked(n2, "n1"), timeout=20)
    etcd.kill()  # both lose their lease: each closes its links and dials nobody
    wait_until(lambda: "lost the etcd lease" in n1.log() and "lost the etcd lease" in n2.log(),
               timeout=TTL_S + 10)
    wait_until(lambda: links_of(n1) == {} and links_of(n2) == {}, timeout=5)
    assert "this node lost its etcd lease" in n1.log() + n2.log()
    time.sleep(1.0)
    assert links_of(n1) == {} and links_of(n2) == {}  # no dialing while out
    etcd.restart()
    wait_until(lambda: "rejoined the cluster" in n1.log() and "rejoined the cluster" in n2.log(),
               timeout=30)
    wait_until(lambda: linked(n1, "n2") and linked(n2, "n1"), timeout=20)
    for node in (n1, n2):
        assert "Traceback" not in node.log()


# -- ClusterLinks in this process, with records put by hand --------------------------------------

def put_record(client: EtcdClient, cluster: str, name: str, port: int,
               started_at: int = 1, **extra: Any) -> Awaitable[Any]:
    record = {"name": name, "advertise_host": "127.0.0.1", "cluster_port": port,
              "started_at": started_at, "version": "test", **extra}
    return client.put(f"/leveret/{cluster}/nodes/{name}", json.dumps(record))


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def running_links(client: EtcdClient, cluster: str,
                        *names: str, secret: bytes = b"s") -> list[ClusterLinks]:
    started = []
    for name in names:
        links = ClusterLinks(client, cluster, name, secret, version="test", host="127.0.0.1",
                             port=0)
        await links.listen()
        await put_record(client, cluster, name, links.port)
        links.set_in_cluster(True)
        await links.start()
        started.append(links)
    return started


async def test_links_follow_the_records_and_the_lease(etcd_client: EtcdClient,
                                                      cluster: str) -> None:
    a, b = await running_links(etcd_client, cluster, "a", "b")
    try:
        await until(lambda: "b" in a.pings and "a" in b.pings)
        first = a.link_to("b")
        assert first is not None and a.link_to("nobody") is None
        assert [v["direction"] for v in a.link_views()] == ["outbound"]
        assert [v["direction"] for v in b.link_views()] == ["inbound"]
        assert a.pings["b"]["name"] == "b" and a.pings["b"]["revision"] >= b.revision - 1

        a.set_in_cluster(False)  # the dialer leaves: both sides lose the link, nobody redials
        await until(lambda: not a.links and not b.links)
        await asyncio.sleep(0.5)
        assert not a.links and not b.links and not a._dialers
        a.set_in_cluster(True)
        await until(lambda: "b" in a.pings and "a" in b.pings)

        b.set_in_cluster(False)  # the acceptor leaves: it refuses the dialer's retries
        await until(lambda: not b.links)
        await asyncio.sleep(0.6)
        assert not b.links
        b.set_in_cluster(True)
        await until(lambda: "b" in a.pings and "a" in b.pings)

        same = a.link_to("b")
        await put_record(etcd_client, cluster, "b", b.port, alarms=["disk"])  # same process
        await asyncio.sleep(0.3)
        assert a.link_to("b") is same
        await put_record(etcd_client, cluster, "b", b.port, started_at=2)  # b restarted
        await until(lambda: a.link_to("b") not in (None, same) and "b" in a.pings)

        await etcd_client.delete(f"/leveret/{cluster}/nodes/b")  # b's lease expired
        await until(lambda: not a.links and not b.links and "b" not in a.records)
        await asyncio.sleep(0.3)
        assert not a.links and "b" not in a._dialers
    finally:
        for links in (a, b):
            await links.close()


async def test_a_starting_peer_is_linked_as_soon_as_it_starts(etcd_client: EtcdClient,
                                                              cluster: str) -> None:
    (a,) = await running_links(etcd_client, cluster, "a")
    b = ClusterLinks(etcd_client, cluster, "b", b"s", version="test", host="127.0.0.1", port=0)
    try:
        await b.listen()
        await put_record(etcd_client, cluster, "b", b.port)
        b.set_in_cluster(True)
        await b.read_records()  # b knows the running nodes before it starts
        assert set(b.records) == {"a"} and not b.links
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await a.wait_linked(["b"], 0.5) == {"b"}  # refused while b starts: the bound
        assert 0.5 <= loop.time() - began < 1.0
        await asyncio.sleep(3.0)  # a backoff doubling from 0.2 s would wait 3.2 s by now
        await b.start()
        await until(lambda: a.link_to("b") is not None, timeout=0.8)  # a tries every 0.2 s
        assert await a.wait_linked(["b", "a"], 5.0) == set()  # (its own name: nothing to wait)
        assert await b.wait_linked(["a"], 5.0) == set()
        assert await a.wait_linked(["nobody"], 0.2) == {"nobody"}
    finally:
        for links in (a, b):
            await links.close()


async def test_bad_records_and_a_peer_with_another_secret_are_retried(
        etcd_client: EtcdClient, cluster: str) -> None:
    (a,) = await running_links(etcd_client, cluster, "a")
    (c,) = await running_links(etcd_client, cluster, "c", secret=b"another secret")
    try:
        await etcd_client.put(f"/leveret/{cluster}/nodes/b", "not json")
        await asyncio.sleep(1.0)  # a dials b (no address) and c (refused), and keeps trying
        assert a.links == {} and c.links == {}
        assert not a._dialers["b"].done() and not a._dialers["c"].done()
        await put_record(etcd_client, cluster, "b", c.port)  # b's record names c's port
        await asyncio.sleep(0.5)
        assert a.links == {}
    finally:
        for links in (a, c):
            await links.close()


async def test_links_the_rule_does_not_expect_are_closed(etcd_client: EtcdClient,
                                                         cluster: str) -> None:
    (m,) = await running_links(etcd_client, cluster, "m")
    try:
        # a higher name must not dial: m closes the link
        config = LinkConfig(cluster, "z", b"s")
        wrong_way = await connect("127.0.0.1", m.port, config, Handlers())
        await asyncio.wait_for(wrong_way.wait_closed(), 5)
        assert "'m' dials 'z'" in (wrong_way.close_reason or "")

        # a lower name may; one that cannot answer node.ping is dropped
        mute = await connect("127.0.0.1", m.port, LinkConfig(cluster, "a", b"s"), Handlers())
        await asyncio.wait_for(mute.wait_closed(), 5)
        assert "no answer to node.ping" in (mute.close_reason or "")

        handlers = Handlers()

        async def pong(link: Link, body: Any) -> dict[str, Any]:
            return {"name": "b", "version": "test", "revision": 0}

        handlers.on_request(PING, pong)
        peer = await connect("127.0.0.1", m.port, LinkConfig(cluster, "b", b"s"), handlers)
        answer = await peer.call(PING, {"name": "b"})
        assert answer["name"] == "m" and answer["version"] == "test" and answer["revision"] > 0
        await until(lambda: "b" in m.pings)
        assert [v["name"] for v in m.link_views()] == ["b"]
        await peer.close()
        await until(lambda: not m.links)
    finally:
        await m.close()


async def test_links_are_refused_until_started(etcd_client: EtcdClient, cluster: str) -> None:
    links = ClusterLinks(etcd_client, cluster, "m", b"s", version="test", host="127.0.0.1",
                         port=0)
    await links.listen()
    try:
        with pytest.raises(PeerStarting, match="node 'm' is starting"):  # in the handshake
            await connect("127.0.0.1", links.port, LinkConfig(cluster, "a", b"s"), Handlers())
        links.set_in_cluster(False)
        await links.start()
        out = await connect("127.0.0.1", links.port, LinkConfig(cluster, "a", b"s"),
                            Handlers())
        await asyncio.wait_for(out.wait_closed(), 5)
        assert "not in the cluster" in (out.close_reason or "")
    finally:
        await links.close()
