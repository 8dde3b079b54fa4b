"""What the management API says about a replicated stream on every node (real etcd, three
`leveret serve` nodes): `GET /api/queues/%2F/<stream>` and `/api/queues` give the same `node`,
`leader`, `members` and counts on the leader's node, on a replica's and on a node that holds no
copy, and they agree with the queue record in etcd and with `stream_status`; with the leader
down, every other node still names it, its members, and `state: "down"` without figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.brokers import BrokerProcess
from support.cluster import (
    ClusterNode,
    declare,
    in_etcd,
    linked,
    make_node,
    publish_confirmed,
    wait_until,
)
from support.cluster_api import ok
from support.etcd import EtcdServer

FIELDS = ("node", "leader", "members", "online", "state", "messages", "type")


def view(node: ClusterNode, name: str) -> dict[str, Any]:
    found: dict[str, Any] = ok(node, "GET", f"/api/queues/%2F/{name}")
    return found


def listed(node: ClusterNode, name: str) -> dict[str, Any]:
    return next(q for q in ok(node, "GET", "/api/queues/%2F") if q["name"] == name)


def status_nodes(node: ClusterNode, name: str) -> list[str]:
    rows = ok(node, "GET", f"/api/leveret/streams/%2F/{name}/status")["members"]
    return sorted(row["node"] for row in rows)


def test_every_node_shows_a_stream_as_its_leader_does(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(b, "s.three")  # led by b, replicated on a and c
    declare(a, "s.two", **{"x-initial-cluster-size": 2})  # led by a: one node holds no copy
    publish_confirmed(b, "s.three", [b"m"] * 3)
    publish_confirmed(a, "s.two", [b"m"] * 2)
    for name, count in (("s.three", 3), ("s.two", 2)):
        record, _ = in_etcd(etcd, cluster, name)
        assert record is not None
        expected = {"node": record.node, "leader": record.node, "members": list(record.members),
                    "online": list(record.members), "state": "running", "messages": count,
                    "type": "stream"}
        for node in (a, b, c):
            assert {k: view(node, name).get(k) for k in FIELDS} == expected, (node.node_name,
                                                                               name)
            assert {k: listed(node, name).get(k) for k in FIELDS} == expected
            assert status_nodes(node, name) == sorted(record.members)


def test_with_its_leader_down_every_node_still_names_it(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    # the leader's record stays (a long lease) and nobody takes over (a long failover delay)
    env = {"LEVERET_CLUSTER_LEASE_TTL_S": "60", "LEVERET_STREAM_FAILOVER_AFTER_S": "600"}
    three = [make_node(tmp_path, etcd.url, cluster, name, management=True, env=env)
             for name in ("a", "b", "c")]
    for node in three:
        nodes.append(node.start())
    a, b, c = three
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    declare(b, "s.three")
    declare(b, "s.two", **{"x-queue-leader-locator": "client-local",
                           "x-initial-cluster-size": 2})
    publish_confirmed(b, "s.three", [b"m"])
    b.kill()
    wait_until(lambda: linked(a, 1) and linked(c, 1), timeout=10)
    for name in ("s.three", "s.two"):
        record, _ = in_etcd(etcd, cluster, name)
        assert record is not None and record.node == "b"
        for node in (a, c):  # a replica's node, and (for s.two) maybe a node without a copy
            shown = view(node, name)
            assert (shown["node"], shown["leader"], shown["members"], shown["state"]) == (
                "b", "b", list(record.members), "down"), (node.node_name, name)
            assert shown["online"] == [m for m in record.members if m != "b"]
            for figure in ("messages", "first_offset", "committed_offset", "segments"):
                assert figure not in shown, figure
            assert listed(node, name)["state"] == "down"
