"""`leveret-queues` (RabbitMQ's `rabbitmq-queues`) against three `leveret serve` nodes of one
cluster (a real etcd), started once for the module: every command, through any node, with its
RabbitMQ texts, banners and columns, and each mistake as one line on stderr with exit code 1
(69 for a failed quorum-critical check, as RabbitMQ's). Beside the CLI, the cluster's
management fields of a quorum queue (the leader's view on every node) and a definitions import
that places a quorum queue over its members.

Each test declares its own queues and deletes them at the end, so that the shared cluster is
the same for the next one (shrink and the quorum-critical check look at every queue). Most
commands run in this process with typer's CliRunner; one runs the console script's `main` as a
subprocess. The last test kills node c.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
from support.cluster import (
    ClusterNode,
    api_get,
    connect,
    in_etcd,
    linked,
    make_node,
    publish_confirmed,
    wait_until,
)
from support.etcd import SKIP_REASON, EtcdServer, etcd_binary
from support.management import Http, q
from typer.testing import CliRunner

from leveret.cli.queues import app

QUORUM = {"x-queue-type": "quorum"}
COMMANDS = ["add_member", "delete_member", "grow", "shrink", "rebalance", "quorum_status",
            "check_if_node_is_quorum_critical", "transfer_leadership", "peek"]
STATUS_COLUMNS = ["Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
                  "Last Applied", "Commit Index", "Snapshot Index", "Term"]


class Cluster:
    def __init__(self, etcd: EtcdServer, name: str, nodes: list[ClusterNode]) -> None:
        self.etcd, self.name, self.nodes = etcd, name, nodes
        self.a, self.b, self.c = nodes

    def record(self, queue: str) -> Any:
        record, _leadership = in_etcd(self.etcd, self.name, queue)
        return record

    def members(self, queue: str) -> tuple[str, ...]:
        record = self.record(queue)
        return tuple(record.members or (record.node,))

    def leader(self, queue: str) -> str:
        return str(self.record(queue).node)

    def node(self, name: str) -> ClusterNode:
        return {n.node_name: n for n in self.nodes}[name]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    base = tmp_path_factory.mktemp("queues-cli")
    etcd = EtcdServer(base / "etcd").start()
    nodes = [make_node(base, etcd.url, "qcli", name, management=True) for name in "abc"]
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(ClusterNode.start, nodes))
        wait_until(lambda: all(linked(node, 2) for node in nodes), timeout=60)
        yield Cluster(etcd, "qcli", nodes)
    finally:
        for node in nodes:
            node.kill()
        etcd.stop()


class Cli:
    """leveret-queues with a node's management URL (the node RabbitMQ's `-n` would name)."""

    def __init__(self, node: ClusterNode | int) -> None:
        port = node if isinstance(node, int) else node.management_port
        self.env = {"LEVERET_MANAGEMENT_URL": f"http://guest:guest@127.0.0.1:{port}"}

    def run(self, *args: str, code: int = 0) -> Any:
        result = CliRunner().invoke(app, list(args), env=self.env)
        assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in result.output
        return result

    def __call__(self, *args: str) -> list[str]:
        return [str(line) for line in self.run(*args).stdout.splitlines()]

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--formatter", "json").stdout)

    def error(self, *args: str) -> str:
        """A mistake: one line on stderr, exit code 1; the text after `Error: `."""
        result = self.run(*args, code=1)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: "), lines
        return str(lines[0]).removeprefix("Error: ")


def declare(node: ClusterNode, name: str, **arguments: Any) -> None:
    conn = connect(node)
    conn.channel().queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    conn.close()


def delete(node: ClusterNode, *names: str) -> None:
    conn = connect(node)
    ch = conn.channel()
    for name in names:
        ch.queue_delete(name)
    conn.close()


def ready(node: ClusterNode, name: str) -> int:
    conn = connect(node)
    try:
        return int(conn.channel().queue_declare(name, passive=True).method.message_count)
    finally:
        conn.close()


def rows_by_node(cli: Cli, queue: str) -> dict[str, dict[str, Any]]:
    return {row["Node Name"]: row for row in cli.json("quorum_status", queue)}


def in_sync(cli: Cli, queue: str, members: int) -> bool:
    """Every member is a running follower or the leader, holding what the leader holds."""
    rows = list(rows_by_node(cli, queue).values())
    return len(rows) == members and len({r["Last Log Index"] for r in rows}) == 1 and all(
        r["Raft State"] in ("leader", "follower") for r in rows)


# -- without a cluster ----------------------------------------------------------------------------


def test_every_command_has_help() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for command in COMMANDS:
        assert command in top.stdout
        assert runner.invoke(app, [command, "--help"]).exit_code == 0


def test_mistakes_before_any_call_are_one_line() -> None:
    cli = Cli(1)  # nothing listens there: these fail before asking
    assert cli.error("peek", "q", "0") == "position value must be a positive integer"
    assert cli.error("peek", "q", "x") == "position value must be a positive integer"
    assert cli.error("grow", "a", "odd") == "strategy 'odd' is not recognised."
    assert cli.error("add_member", "q", "a", "--membership", "x") == \
        "voter status 'x' is not recognised."
    assert cli.error("rebalance", "classic") == \
        "type classic is not supported. Try one of all, quorum, stream."
    assert "cannot reach the Leveret management API" in cli.error("quorum_status", "q")


# -- status, fields, peek -------------------------------------------------------------------------


def test_quorum_status_from_any_node(cluster: Cluster) -> None:
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(a, "status-q")
    assert cluster.leader("status-q") == "a" and sorted(cluster.members("status-q")) == [
        "a", "b", "c"]
    publish_confirmed(b, "status-q", [b"m%d" % i for i in range(20)])
    wait_until(lambda: in_sync(Cli(c), "status-q", 3))
    for node in (a, b, c):  # the leader's rows, whichever node is asked
        rows = rows_by_node(Cli(node), "status-q")
        assert list(rows) == ["a", "b", "c"]
        assert rows["a"]["Raft State"] == "leader"
        assert rows["b"]["Raft State"] == rows["c"]["Raft State"] == "follower"
        assert {r["Membership"] for r in rows.values()} == {"voter"}
        assert {r["Term"] for r in rows.values()} == {rows["a"]["Term"]} and rows["a"]["Term"] >= 1
        assert rows["a"]["Commit Index"] == rows["a"]["Last Log Index"] >= 19
        assert rows["a"]["Snapshot Index"] == -1 and rows["b"]["Snapshot Index"] == ""
    lines = Cli(b)("quorum_status", "status-q")
    assert lines[0] == "Status of queue status-q on node b ..."
    assert lines[1].split() == ["Node", "Name", "Raft", "State", "Membership", "Last", "Log",
                                "Index", "Last", "Written", "Last", "Applied", "Commit",
                                "Index", "Snapshot", "Index", "Term"]
    assert [line.split()[:2] for line in lines[2:]] == [
        ["a", "leader"], ["b", "follower"], ["c", "follower"]]
    assert Cli(c)("quorum_status", "status-q", "--quiet")[0].startswith("Node Name")
    assert Cli(a).error("quorum_status", "nope") == \
        "queue 'nope' was not found in virtual host '/'"
    assert Cli(a).error("quorum_status", "status-q", "-p", "nowhere") == \
        "queue 'status-q' was not found in virtual host 'nowhere'"
    delete(a, "status-q")


def test_management_fields_are_the_leaders_on_every_node(cluster: Cluster) -> None:
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(b, "fields-q", **{"x-delivery-limit": 7, "x-queue-leader-locator": "client-local"})
    assert cluster.leader("fields-q") == "b"
    publish_confirmed(c, "fields-q", [b"one", b"two", b"three"])
    for node in (a, b, c):
        view = api_get(node, f"/api/queues/{q('/')}/fields-q")
        assert view["type"] == "quorum" and view["node"] == view["leader"] == "b"
        assert view["members"] == view["online"] == ["a", "b", "c"]
        assert view["state"] == "running" and view["delivery_limit"] == 7
        assert (view["messages"], view["messages_ready"]) == (3, 3)
        listed = {x["name"]: x for x in api_get(node, "/api/queues")}["fields-q"]
        assert listed["leader"] == "b" and listed["messages"] == 3
    delete(a, "fields-q")


def test_peek_is_the_leaders_from_any_node(cluster: Cluster) -> None:
    a, c = cluster.a, cluster.c
    declare(a, "peek-q")
    conn = connect(c)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "peek-q", b"hello", pika.BasicProperties(
        content_type="text/plain", headers={"h": 1}, message_id="m1"))
    ch.basic_publish("", "peek-q", b"x" * 100)
    conn.close()
    lines = Cli(c)("peek", "peek-q", "1")
    assert lines[0] == "Peeking at quorum queue peek-q at position 1 on node c ..."
    assert [line.split()[0] for line in lines[2:]] == [
        "message_id", "content_type", "routing_keys", "exchange", "payload",
        "header.h", "header.x-delivery-count"]
    assert Cli(c).json("peek", "peek-q", "1") == {"result": "ok", "message": {
        "message_id": "m1", "content_type": "text/plain", "routing_keys": ["peek-q"],
        "exchange": "", "payload (max 64 bytes)": "hello", "header.h": 1,
        "header.x-delivery-count": 0}}
    second = Cli(a).json("peek", "peek-q", "2")["message"]
    assert second["payload (max 64 bytes)"] == "x" * 64
    assert Cli(cluster.b).error("peek", "peek-q", "3") == \
        "Target queue does not have a message at that position"
    assert Cli(a).error("peek", "nope", "1") == "Target queue was not found in virtual host '/'"
    assert ready(a, "peek-q") == 2  # nothing was taken
    delete(a, "peek-q")


# -- members --------------------------------------------------------------------------------------


def test_add_and_delete_member(cluster: Cluster) -> None:
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(a, "members-q", **{"x-quorum-initial-group-size": 1})
    assert cluster.members("members-q") == ("a",)
    publish_confirmed(a, "members-q", [b"before-%d" % i for i in range(10)])
    assert Cli(b)("add_member", "members-q", "b") == [
        "Adding a member for queue members-q on node b..."]
    assert sorted(cluster.members("members-q")) == ["a", "b"]
    wait_until(lambda: in_sync(Cli(a), "members-q", 2))  # it copied the leader's log
    assert Cli(c).json("add_member", "members-q", "b") == {  # already one: nothing changes
        "result": "ok", "node": "c"}
    assert Cli(a)("add_member", "members-q", "c", "--membership", "voter", "-q") == []
    assert sorted(cluster.members("members-q")) == ["a", "b", "c"]
    publish_confirmed(c, "members-q", [b"after"])  # committed at the new quorum
    assert Cli(c)("delete_member", "members-q", "c") == [
        "Removing a replica of queue members-q on node c..."]
    assert sorted(cluster.members("members-q")) == ["a", "b"]
    assert Cli(c)("delete_member", "members-q", "c") == [  # no member there: nothing changes
        "Removing a replica of queue members-q on node c..."]
    # the leader's own member: another member leads first, and nothing is lost
    Cli(b)("delete_member", "members-q", "a")
    assert cluster.members("members-q") == ("b",) and cluster.leader("members-q") == "b"
    wait_until(lambda: ready(c, "members-q") == 11)
    assert Cli(a).error("delete_member", "members-q", "b") == \
        "last_node: the last node cannot be removed"
    assert Cli(a).error("add_member", "members-q", "zz") == \
        "node_not_running: node 'zz' is not a running node of this cluster"
    assert Cli(a).error("add_member", "nope", "b") == \
        "queue 'nope' was not found in virtual host '/'"
    conn = connect(a)
    ch = conn.channel()
    ch.queue_declare("classic-q", durable=True)
    ch.queue_declare("stream-q", durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    for command in ("add_member", "delete_member"):
        assert Cli(a).error(command, "classic-q", "b") == "Cannot add members to a classic queue"
        assert Cli(a).error(command, "stream-q", "b").startswith(
            "not_quorum_queue: queue 'stream-q' in vhost '/' is a stream")
    delete(a, "members-q", "classic-q", "stream-q")


def test_grow_and_shrink(cluster: Cluster) -> None:
    a, c = cluster.a, cluster.c
    declare(a, "grow-1", **{"x-quorum-initial-group-size": 1})
    declare(a, "grow-2", **{"x-quorum-initial-group-size": 2})
    declare(c, "grow-c", **{"x-quorum-initial-group-size": 1,
                            "x-queue-leader-locator": "client-local"})
    assert cluster.members("grow-c") == ("c",)
    cli = Cli(a)
    # even: only the queues with an even number of members (grow-2, if it has none on c)
    had_c = "c" in cluster.members("grow-2")
    grown = cli.json("grow", "c", "even", "--queue-pattern", "^grow-")
    assert [(r["name"], r["size"], r["result"]) for r in grown] == (
        [] if had_c else [("grow-2", 3, "ok")])
    lines = cli("grow", "b", "all", "--queue-pattern", "^grow-", "--vhost-pattern", "^/$")
    assert lines[0] == "Growing all queues on b..."
    assert lines[1].split() == ["vhost", "name", "size", "result"]
    assert "b" in cluster.members("grow-1") and "b" in cluster.members("grow-c")
    assert cli.json("grow", "b", "all", "--queue-pattern", "^grow-") == []  # nothing left
    assert cli.error("grow", "zz", "all") == \
        "node_not_running: node 'zz' is not a running node of this cluster"
    # shrink c: every quorum queue loses its member there (grow-c: another member leads)
    shrunk = {r["name"]: r for r in cli.json("shrink", "c")}
    assert shrunk["grow-c"] == {"vhost": "/", "name": "grow-c", "size": 1, "result": "ok"}
    assert all("c" not in cluster.members(n) for n in ("grow-1", "grow-2", "grow-c"))
    declare(c, "only-c", **{"x-quorum-initial-group-size": 1,
                            "x-queue-leader-locator": "client-local"})
    lines = cli("shrink", "c", "--errors-only")
    assert lines[0] == "Shrinking queues on c..."
    assert lines[2].split() == ["/", "only-c", "1", "error:", "the", "last", "node", "cannot",
                                "be", "removed"]
    assert len(lines) == 3
    delete(a, "grow-1", "grow-2", "grow-c", "only-c")


# -- leaders --------------------------------------------------------------------------------------


def test_transfer_leadership(cluster: Cluster) -> None:
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(a, "move-q")
    publish_confirmed(b, "move-q", [b"m%d" % i for i in range(50)])
    lines = Cli(c)("transfer_leadership", "move-q", "b")
    assert lines == ["Transferring leadership of quorum queue move-q to node b...", "b"]
    assert cluster.leader("move-q") == "b"
    assert sorted(cluster.members("move-q")) == ["a", "b", "c"]  # the old leader stays one
    wait_until(lambda: rows_by_node(Cli(a), "move-q").get("b", {}).get("Raft State")
               == "leader" and in_sync(Cli(a), "move-q", 3))
    assert ready(a, "move-q") == 50  # nothing lost
    publish_confirmed(a, "move-q", [b"after"])  # the new leader confirms
    assert ready(c, "move-q") == 51
    assert api_get(a, f"/api/queues/{q('/')}/move-q")["leader"] == "b"
    assert Cli(b).json("transfer_leadership", "move-q", "a") == {
        "result": "ok", "node": "b", "value": "a"}
    assert cluster.leader("move-q") == "a"
    assert Cli(a).error("transfer_leadership", "move-q", "a") == \
        "The target node is already the leader of this queue"
    assert Cli(a).error("transfer_leadership", "nope", "b") == \
        "queue 'nope' was not found in virtual host '/'"
    declare(a, "pair-q", **{"x-quorum-initial-group-size": 2})
    outsider = next(n for n in "abc" if n not in cluster.members("pair-q"))
    assert Cli(b).error("transfer_leadership", "pair-q", outsider) == \
        f"unknown_member: node '{outsider}' is not a member of queue 'pair-q'"
    conn = connect(a)
    conn.channel().queue_declare("classic-t", durable=True)
    conn.close()
    assert Cli(a).error("transfer_leadership", "classic-t", "b") == \
        "Cannot transfer leadership of a non-quorum queue"
    delete(a, "move-q", "pair-q", "classic-t")


def test_a_consumer_keeps_consuming_across_a_transfer(cluster: Cluster) -> None:
    """A consumer through a member that does not lead keeps its subscription when the
    leadership moves, as across a failover; what it had unacked comes again."""
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(a, "busy-q")
    conn = connect(c)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume("busy-q", lambda chan, method, _p, body: (
        got.append(body), chan.basic_ack(method.delivery_tag)))
    publish_confirmed(b, "busy-q", [b"before-%d" % i for i in range(5)])
    while len(got) < 5:
        conn.process_data_events(0.2)
    Cli(a)("transfer_leadership", "busy-q", "b")
    publish_confirmed(a, "busy-q", [b"after-%d" % i for i in range(5)])
    deadline = 100
    while len(set(got)) < 10 and deadline:
        conn.process_data_events(0.2)
        deadline -= 1
    conn.close()
    assert set(got) == {b"before-%d" % i for i in range(5)} | {b"after-%d" % i for i in range(5)}
    delete(a, "busy-q")


def test_rebalance_spreads_the_leaders(cluster: Cluster) -> None:
    a = cluster.a
    names = [f"bal-{i}" for i in range(6)]
    for name in names:  # every leader on a
        declare(a, name, **{"x-queue-leader-locator": "client-local"})
    conn = connect(a)
    conn.channel().queue_declare("bal-stream", durable=True, arguments={
        "x-queue-type": "stream", "x-queue-leader-locator": "client-local"})
    conn.close()
    assert {cluster.leader(n) for n in [*names, "bal-stream"]} == {"a"}
    lines = Cli(cluster.b)("rebalance", "quorum", "--queue-pattern", "^bal-")
    assert lines[0] == "Re-balancing leaders of quorum queues..."
    assert lines[1].split() == ["Node", "name", "Number", "of", "quorum", "queues"]
    assert sorted(line.split() for line in lines[2:]) == [["a", "2"], ["b", "2"], ["c", "2"]]
    leaders = [cluster.leader(n) for n in names]
    assert sorted(leaders) == ["a", "a", "b", "b", "c", "c"]
    assert cluster.leader("bal-stream") == "a"  # quorum only
    assert Cli(cluster.c)("rebalance", "stream", "--queue-pattern", "^none$") == [
        "Re-balancing leaders of stream queues..."]
    rows = Cli(cluster.c).json("rebalance", "all", "--queue-pattern", "^bal-")
    assert sum(r.get("Number of streams", 0) for r in rows) == 1
    assert sum(r.get("Number of quorum queues", 0) for r in rows) == 6
    assert all(r.get("Number of quorum queues", 0) + r.get("Number of streams", 0) <= 3
               for r in rows)
    delete(a, *names, "bal-stream")


# -- health, definitions, the console script, and a node down -------------------------------------


def test_check_if_node_is_quorum_critical(cluster: Cluster) -> None:
    a, c = cluster.a, cluster.c
    declare(a, "spread-q")  # three members: no node is critical for it
    assert Cli(a)("check_if_node_is_quorum_critical") == [
        "Checking if node a is critical for quorum of any queues/streams ...",
        "Node a reported no queues/streams with minimum quorum"]
    assert Cli(a).json("check_if_node_is_quorum_critical") == {"result": "ok"}
    declare(c, "lonely-q", **{"x-quorum-initial-group-size": 1,
                              "x-queue-leader-locator": "client-local"})
    result = Cli(c).run("check_if_node_is_quorum_critical", code=69)
    assert result.stdout.splitlines() == [
        "Checking if node c is critical for quorum of any queues/streams ..."]
    assert result.stderr.splitlines() == [
        "queue 'lonely-q' in vhost '/' will become unavailable if node c stops"]
    result = Cli(c).run("check_if_node_is_quorum_critical", "--formatter", "json", code=69)
    assert json.loads(result.stderr) == {
        "result": "error", "message": "Node c reported local queues with minimum online quorum",
        "queues": [{"readable_name": "queue 'lonely-q' in vhost '/'", "name": "lonely-q",
                    "virtual_host": "/", "type": "rabbit_quorum_queue"}]}
    reply = Http(c.management_port).get("/api/health/checks/node-is-quorum-critical")
    assert reply.status == 503 and reply.body["reason"] == (
        "There are quorum queues that would lose their quorum if the target node is shut down")
    Cli(a)("check_if_node_is_quorum_critical")  # a is not c
    delete(a, "spread-q", "lonely-q")


def test_definitions_import_places_a_quorum_queue(cluster: Cluster) -> None:
    a, b = cluster.a, cluster.b
    exported = api_get(a, "/api/definitions")
    exported["queues"] = [{"name": "imported-q", "vhost": "/", "durable": True,
                           "auto_delete": False, "arguments": {"x-queue-type": "quorum",
                                                               "x-delivery-limit": 4}}]
    assert Http(b.management_port).post("/api/definitions", exported).status == 204
    assert sorted(cluster.members("imported-q")) == ["a", "b", "c"]
    assert cluster.record("imported-q").type == "quorum"
    again = next(x for x in api_get(cluster.c, "/api/definitions")["queues"]
                 if x["name"] == "imported-q")
    assert again == {"name": "imported-q", "vhost": "/", "durable": True, "auto_delete": False,
                     "type": "quorum", "arguments": {"x-queue-type": "quorum",
                                                     "x-delivery-limit": 4}}
    delete(a, "imported-q")


def test_the_console_script_exits_as_it_says(cluster: Cluster) -> None:
    env = {**os.environ, **Cli(cluster.a).env}
    script = "from leveret.cli.queues import main; main()"
    found = subprocess.run([sys.executable, "-c", script, "quorum_status", "nope"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert found.returncode == 1
    assert found.stderr.splitlines() == ["Error: queue 'nope' was not found in virtual host '/'"]
    usage = subprocess.run([sys.executable, "-c", script, "peek", "q"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert usage.returncode == 1
    assert usage.stderr.splitlines() == ["Error: Missing argument 'position'."]


def test_a_node_down(cluster: Cluster) -> None:
    """Last: node c is killed. Its member shows as noconnection, the queue stays running on a
    majority, and a and b become critical for it."""
    a, b, c = cluster.a, cluster.b, cluster.c
    declare(a, "down-q")
    publish_confirmed(a, "down-q", [b"x"])
    c.kill()
    wait_until(lambda: "c" not in api_get(a, f"/api/queues/{q('/')}/down-q")["online"],
               timeout=30)
    view = api_get(b, f"/api/queues/{q('/')}/down-q")
    assert view["members"] == ["a", "b", "c"] and view["online"] == ["a", "b"]
    assert view["state"] == "running"
    rows = rows_by_node(Cli(b), "down-q")
    assert rows["c"]["Raft State"] == "noconnection" and rows["c"]["Last Log Index"] == ""
    assert rows["a"]["Raft State"] == "leader"
    result = Cli(a).run("check_if_node_is_quorum_critical", code=69)
    assert "queue 'down-q' in vhost '/' will become unavailable if node a stops" in \
        result.stderr.splitlines()
