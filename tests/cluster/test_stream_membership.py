"""A replicated stream's members changed with `leveret-streams add_replica` and
`delete_replica` in a real cluster (real etcd, three real `leveret serve` nodes, pika): a node
added to a two-member stream copies the leader's log byte for byte and serves its consumers;
a deleted replica's local log is deleted; RabbitMQ's refusals with their texts and exit code 1;
`stream_status` has one row per member on every node; `/metrics` has per-member gauges."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from support.brokers import BrokerProcess
from support.cluster import (  # the replicated streams' helpers
    ClusterNode,
    connect,
    consume,
    declare,
    in_etcd,
    linked,
    make_node,
    one_line,
    publish_confirmed,
    same_logs,
    wait_until,
)
from support.cluster_api import ok
from support.etcd import EtcdServer

NAMES = ("a", "b", "c")


@pytest.fixture
def trio(tmp_path: Path, etcd: EtcdServer, cluster: str,
         nodes: list[BrokerProcess]) -> Iterator[dict[str, ClusterNode]]:
    three = [make_node(tmp_path, etcd.url, cluster, name, management=True) for name in NAMES]
    for node in three:
        nodes.append(node.start())
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    yield {node.node_name: node for node in three}


def streams_cli(node: ClusterNode, *args: str) -> subprocess.CompletedProcess[str]:
    """`leveret-streams ARGS` as a process, against `node`'s management API."""
    return subprocess.run(
        [sys.executable, "-c", "from leveret.cli.streams import main; main()", *args,
         "--url", f"http://guest:guest@127.0.0.1:{node.management_port}"],
        capture_output=True, text=True, timeout=60, check=False)


def status_rows(node: ClusterNode, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ok(node, "GET", f"/api/leveret/streams/%2F/{name}/status")[
        "members"]
    return rows


def member_gauges(node: ClusterNode, name: str) -> dict[tuple[str, str, str], float]:
    """(metric, member node, role) -> value, of the stream `name`, from node's /metrics."""
    with urlopen(f"http://127.0.0.1:{node.management_port}/metrics", timeout=15) as answer:
        text = answer.read().decode()
    found = {}
    pattern = re.compile(r'^leveret_stream_member_(\w+)\{([^}]*)\} (\S+)$')
    for line in text.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if labels["stream"] == name:
            found[(match.group(1), labels["node"], labels["role"])] = float(match.group(3))
    return found


def test_add_replica_catches_up_then_delete_replica(
        trio: dict[str, ClusterNode], etcd: EtcdServer, cluster: str) -> None:
    a = trio["a"]
    declare(a, "s.m", **{"x-initial-cluster-size": 2})
    record, _ = in_etcd(etcd, cluster, "s.m")
    assert record is not None and record.node == "a" and len(record.members) == 2
    storage_id = record.storage_id or ""
    [third] = [n for n in NAMES if n not in record.members]
    second = record.members[1]
    new = trio[third]
    assert not (new.data_dir / "queues" / storage_id).exists()
    publish_confirmed(a, "s.m", [f"m{i}".encode() for i in range(300)])

    added = streams_cli(a, "add_replica", "s.m", third)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == f"Adding a replica for stream s.m on node {third}..."
    record, leadership = in_etcd(etcd, cluster, "s.m")
    assert record is not None and leadership is not None
    assert record.members == ("a", second, third) == leadership.members
    assert (record.node, leadership.leader, leadership.epoch) == ("a", "a", 1)

    # the new member copies the leader's log up to the commit point, byte for byte
    wait_until(lambda: same_logs(tuple(trio.values()), storage_id), timeout=60)
    expected = [f"m{i}".encode() for i in range(300)]
    assert consume(new, "s.m", 300) == expected  # from its own copy
    publish_confirmed(new, "s.m", [b"after"])  # forwarded to the leader, confirmed at 2 of 3
    assert consume(new, "s.m", 301) == [*expected, b"after"]
    wait_until(lambda: same_logs(tuple(trio.values()), storage_id), timeout=60)

    # stream_status: the same row per member from every node
    def settled() -> bool:
        return all(r["offset"] == 300 and r["committed_offset"] == 300
                   for r in status_rows(a, "s.m"))

    wait_until(settled, timeout=30)
    for node in trio.values():
        rows = status_rows(node, "s.m")
        assert sorted((r["role"], r["node"], r["epoch"], r["offset"], r["committed_offset"],
                       r["lag"]) for r in rows) == sorted([
            ("writer", "a", 1, 300, 300, 0), ("replica", second, 1, 300, 300, 0),
            ("replica", third, 1, 300, 300, 0)])
    table = streams_cli(new, "stream_status", "s.m")
    assert table.returncode == 0 and "lag" in table.stdout and "writer" in table.stdout

    # /metrics on the leader's node: one gauge per member; the replicas' nodes report none
    gauges = member_gauges(a, "s.m")
    for node_name, role in (("a", "writer"), (second, "replica"), (third, "replica")):
        assert gauges[("offset", node_name, role)] == 300
        assert gauges[("committed_offset", node_name, role)] == 300
        assert gauges[("lag", node_name, role)] == 0
        assert gauges[("epoch", node_name, role)] == 1
    assert member_gauges(new, "s.m") == {}

    # adding a member again changes nothing, as RabbitMQ
    again = streams_cli(a, "add_replica", "s.m", third, "--formatter", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["added"] is False

    # the leader's own membership (asked on another node): as RabbitMQ, another member is
    # elected first, in the next epoch (equal logs: the lowest name); its node deletes its log
    stepped = streams_cli(new, "delete_replica", "s.m", "a")
    assert stepped.returncode == 0, stepped.stderr
    assert stepped.stdout.strip() == "Removing a replica of queue s.m on node a..."
    leader, follower = sorted((second, third))
    record, leadership = in_etcd(etcd, cluster, "s.m")
    assert record is not None and leadership is not None
    assert (record.node, record.members) == (leader, (leader, follower))
    assert (leadership.leader, leadership.members, leadership.epoch) == (
        leader, (leader, follower), 2)
    wait_until(lambda: not (a.data_dir / "queues" / storage_id).exists(), timeout=30)
    publish_confirmed(a, "s.m", [b"two"])  # forwarded to the new leader, confirmed at 2 of 2
    assert consume(a, "s.m", 302)[-2:] == [b"after", b"two"]
    wait_until(lambda: same_logs((trio[leader], trio[follower]), storage_id), timeout=60)
    gone = streams_cli(a, "delete_replica", "s.m", "a", "--formatter", "json")
    assert gone.returncode == 0 and json.loads(gone.stdout)["deleted"] is False

    # delete_replica of a replica: it stops and its local log is deleted
    deleted = streams_cli(a, "delete_replica", "s.m", follower)
    assert deleted.returncode == 0, deleted.stderr
    record, leadership = in_etcd(etcd, cluster, "s.m")
    assert record is not None and leadership is not None
    assert record.members == (leader,) == leadership.members and leadership.epoch == 2
    wait_until(lambda: not (trio[follower].data_dir / "queues" / storage_id).exists(),
               timeout=30)

    # the stream, down to one member, still confirms, through any node
    publish_confirmed(trio[follower], "s.m", [b"alone"])  # forwarded to the leader
    assert consume(trio[follower], "s.m", 303)[-3:] == [b"after", b"two", b"alone"]
    for node in trio.values():
        assert [(r["role"], r["node"], r["epoch"]) for r in status_rows(node, "s.m")] == [
            ("writer", leader, 2)]
    assert one_line(streams_cli(a, "delete_replica", "s.m", leader)) == (
        "Error: Cannot delete the last member of a stream")


def test_membership_refusals(trio: dict[str, ClusterNode], etcd: EtcdServer,
                             cluster: str) -> None:
    a = trio["a"]
    conn = connect(a)
    conn.channel().queue_declare("classic", durable=True)
    conn.close()
    assert one_line(streams_cli(a, "add_replica", "nope", "b")) == (
        "Error: The stream does not exist")
    assert one_line(streams_cli(a, "delete_replica", "nope", "b")) == (
        "Error: The stream does not exist")
    assert one_line(streams_cli(a, "add_replica", "classic", "b")) == (
        "Error: Cannot add replicas to classic queues")
    assert one_line(streams_cli(a, "delete_replica", "classic", "b")) == (
        "Error: Cannot delete replicas from a classic queue")
    declare(a, "s.r", **{"x-initial-cluster-size": 2})
    record, _ = in_etcd(etcd, cluster, "s.r")
    assert record is not None
    second = record.members[1]
    [third] = [n for n in NAMES if n not in record.members]
    assert one_line(streams_cli(a, "add_replica", "s.r", "z")) == (
        "Error: node_not_running: node 'z' is not a running node of this cluster")

    # a replica that is down is out of sync: no other replica may be added meanwhile
    publish_confirmed(a, "s.r", [b"one"])
    trio[second].kill()
    wait_until(lambda: not next(r for r in status_rows(a, "s.r")
                                if r["node"] == second)["synced"], timeout=30)
    assert one_line(streams_cli(a, "add_replica", "s.r", third)) == (
        f"Error: disallowed, out_of_sync_replica: the replica of stream 's.r' on node "
        f"'{second}' is not in sync with its leader")
    # nor can the leader hand over to it: refused, and the leader leads on (below)
    assert one_line(streams_cli(trio[third], "delete_replica", "s.r", "a")) == (
        "Error: Cannot delete the replica of stream 's.r' on node 'a': no other member holds "
        "everything it committed; try again once they are in sync")
    # once its node record is gone (its lease expired), the node is not running
    wait_until(lambda: not linked(a, 2), timeout=30)
    wait_until(lambda: streams_cli(a, "add_replica", "s.r", second).returncode == 1
               and "node_not_running" in streams_cli(a, "add_replica", "s.r", second).stderr,
               timeout=30)
    assert one_line(streams_cli(a, "add_replica", "s.r", second)) == (
        f"Error: node_not_running: node '{second}' is not a running node of this cluster")
    record, _ = in_etcd(etcd, cluster, "s.r")
    assert record is not None and len(record.members) == 2  # nothing changed

    # back and synced again: the third one can be added
    trio[second].restart()
    wait_until(lambda: all(r.get("synced", True) and r["offset"] == 0
                           for r in status_rows(a, "s.r")) and len(status_rows(a, "s.r")) == 2,
               timeout=60)
    publish_confirmed(a, "s.r", [b"two"])  # the leader still leads and confirms
    assert streams_cli(a, "add_replica", "s.r", third).returncode == 0
    wait_until(lambda: same_logs(tuple(trio.values()), record.storage_id or ""), timeout=60)
    assert consume(trio[third], "s.r", 2) == [b"one", b"two"]


def test_a_replica_added_after_retention_starts_at_the_leaders_first_offset(
        trio: dict[str, ClusterNode], etcd: EtcdServer, cluster: str) -> None:
    """The leader's retention has removed the stream's first segments before the node is
    added: the new member starts at the leader's first offset (as osiris's replicas do) and
    ends up with the leader's segment files, byte for byte, instead of refusing every chunk."""
    a = trio["a"]
    declare(a, "s.ret", **{"x-initial-cluster-size": 2, "x-max-length-bytes": 20_000,
                           "x-stream-max-segment-size-bytes": 4_000})
    record, _ = in_etcd(etcd, cluster, "s.ret")
    assert record is not None
    storage_id = record.storage_id or ""
    [third] = [n for n in NAMES if n not in record.members]
    bodies = [b"%04d" % i + b"x" * 200 for i in range(400)]
    publish_confirmed(a, "s.ret", bodies)
    wait_until(lambda: "00000000000000000000.segment" not in segments_of(a, storage_id))

    assert streams_cli(a, "add_replica", "s.ret", third).returncode == 0
    new = trio[third]
    wait_until(lambda: same_logs((a, new), storage_id), timeout=60)
    kept = consume(a, "s.ret", 400, timeout=5)
    assert 0 < len(kept) < 400 and kept == bodies[-len(kept):]
    assert consume(new, "s.ret", len(kept)) == kept  # from its own copy
    publish_confirmed(new, "s.ret", [b"after"])
    wait_until(lambda: same_logs(tuple(trio.values()), storage_id), timeout=60)


def segments_of(node: ClusterNode, storage_id: str) -> set[str]:
    return {p.name for p in (node.data_dir / "queues" / storage_id).glob("*.segment")}
