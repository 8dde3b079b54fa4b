"""Failure detection between real `leveret serve` nodes (real etcd, real sockets): the link
heartbeat settings reach the links from flags and from LEVERET_* variables, and with the
default settings a stream leader cut off from its replicas (paused with SIGSTOP, its etcd lease
still live) is replaced within 5 s."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from support.brokers import BrokerProcess
from support.cluster import (
    ClusterNode,
    api_nodes,
    declare,
    in_etcd,
    linked,
    make_node,
    paused,
    publish_confirmed,
    wait_until,
)
from support.etcd import EtcdServer

DEFAULT_LEASE = {"LEVERET_CLUSTER_LEASE_TTL_S": "10"}  # the lease must not end a link first


def links_of(node: ClusterNode) -> set[str]:
    """The peers `node`'s own /api/nodes entry lists in its `cluster_links`."""
    own = next(n for n in api_nodes(node) if n["name"] == node.node_name)
    return {link["name"] for link in own["cluster_links"]}


def seconds_until(check: Callable[[], bool], timeout: float) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - began


def test_heartbeat_settings_reach_the_links_from_flags_and_env(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a = make_node(tmp_path, etcd.url, cluster, "a", management=True, env=DEFAULT_LEASE,
                  extra=["--cluster-heartbeat-interval-s", "0.2",
                         "--cluster-heartbeat-timeout-s", "1"])
    b = make_node(tmp_path, etcd.url, cluster, "b", management=True,
                  env={**DEFAULT_LEASE, "LEVERET_CLUSTER_HEARTBEAT_INTERVAL_S": "0.5",
                       "LEVERET_CLUSTER_HEARTBEAT_TIMEOUT_S": "3"})
    for node in (a, b):
        nodes.append(node.start())
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=60)

    # b paused: a, with a timeout of 1 s from its flags, drops b's link; b's last heartbeat
    # left at most b's interval (0.5 s) before the pause
    with paused(b):
        elapsed = seconds_until(lambda: links_of(a) == set(), timeout=10)
    assert 0.4 <= elapsed <= 1.6, elapsed
    assert "nothing received for 1 s (heartbeat timeout)" in a.log()
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=60)

    # a paused: b, with a timeout of 3 s from its environment, drops a's link
    with paused(a):
        elapsed = seconds_until(lambda: links_of(b) == set(), timeout=10)
    assert 2.7 <= elapsed <= 3.8, elapsed
    assert "nothing received for 3 s (heartbeat timeout)" in b.log()


def test_a_paused_leader_is_replaced_within_5_s_by_default(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    three = [make_node(tmp_path, etcd.url, cluster, name, management=True, env=DEFAULT_LEASE)
             for name in ("a", "b", "c")]
    for node in three:
        nodes.append(node.start())
    a, b, _c = three
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    declare(a, "s.cut")
    publish_confirmed(a, "s.cut", [b"before"])

    def new_leader() -> bool:
        record, _ = in_etcd(etcd, cluster, "s.cut")
        return record is not None and record.node != "a"

    with paused(a):  # its lease (10 s) outlives the test's wait: only the links tell
        elapsed = seconds_until(new_leader, timeout=9)
        record, leadership = in_etcd(etcd, cluster, "s.cut")
    print(f"paused leader replaced after {elapsed:.2f} s")
    assert elapsed < 5.0, elapsed
    assert record is not None and leadership is not None
    assert record.node in ("b", "c") and leadership.epoch == 2
    publish_confirmed(b, "s.cut", [b"after"])  # the new leader confirms
