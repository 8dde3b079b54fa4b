"""Every `leveretctl` and `leveret-diagnostics` command against three `leveret serve` nodes of
one cluster (a real etcd), started once for the module. The tools run with node a's settings
(its data directory's credential, derived from the cluster's shared secret, opens every node's
API from the loopback) and reach the others with `-n NAME`: a change made through one node is
read back through another. Each mistake is one line on stderr and rabbitmqctl's exit code.

Most commands run in this process (`support.ctl.Tool`) to keep the module fast; one runs the
console script as a subprocess. The last test stops node c.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pika
import pytest
from support.cluster import ClusterNode, api_nodes, linked, make_node, wait_until
from support.ctl import Result, Tool, close_connection
from support.etcd import SKIP_REASON, EtcdServer, etcd_binary

from leveret.cli import ctl, diagnostics


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ClusterNode]]:
    if etcd_binary() is None:
        pytest.skip(SKIP_REASON)
    base = tmp_path_factory.mktemp("ctl-cluster")
    etcd = EtcdServer(base / "etcd").start()
    nodes = [make_node(base, etcd.url, "ctl", name, management=True) for name in "abc"]
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(ClusterNode.start, nodes))
        wait_until(lambda: all(linked(node, 2) for node in nodes), timeout=60)
        yield nodes
    finally:
        for node in nodes:
            node.kill()
        etcd.stop()


@pytest.fixture(scope="module")
def ctl_(three: list[ClusterNode]) -> Tool:
    """leveretctl with node a's settings."""
    return Tool(ctl.app, three[0].data_dir, three[0].management_port)


@pytest.fixture(scope="module")
def diag(three: list[ClusterNode]) -> Tool:
    """leveret-diagnostics with node a's settings."""
    return Tool(diagnostics.app, three[0].data_dir, three[0].management_port)


def eventually(tool: Tool, *args: str, check: Callable[[Result], bool]) -> Result:
    """The first result of the command that passes `check`: a change made through one node
    is read through another once the cluster has applied it."""
    found: list[Result] = []

    def passes() -> bool:
        result = tool.attempt(*args)
        found[:] = [result]
        return check(result)

    wait_until(passes, timeout=15)
    return found[0]


def json_of(tool: Tool, *args: str, check: Callable[[Any], bool]) -> Any:
    """`args`' JSON output, once it passes `check`."""
    result = eventually(tool, *args, "--formatter", "json",
                        check=lambda r: r.code == 0 and check(json.loads(r.stdout)))
    return json.loads(result.stdout)


def amqp(node: ClusterNode, user: str = "guest", password: str = "guest",
         ) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials(user, password)))


def test_nodes_api_gives_each_node_management_address(three: list[ClusterNode]) -> None:
    """What `--node NAME` is resolved with: each node's management port, seen from any node."""
    for node in three:
        listed = {n["name"]: n for n in api_nodes(node)}
        assert {name: n["management_port"] for name, n in listed.items()} == {
            n.node_name: n.management_port for n in three}
        assert all(n["advertise_host"] for n in listed.values())


def test_cluster_status_through_every_node(ctl_: Tool, three: list[ClusterNode]) -> None:
    for node in three:
        status = ctl_.json("cluster_status", "-n", node.node_name)
        assert sorted(status["running_nodes"]) == sorted(status["disk_nodes"]) == ["a", "b", "c"]
        assert status["cluster_name"] == "ctl" and status["alarms"] == []
        assert sorted(status["versions"]) == ["a", "b", "c"]
        ports = {lst["protocol"]: lst["port"] for lst in status["listeners"][node.node_name]}
        assert (ports["http"], ports["amqp"]) == (node.management_port, node.port)
        assert ports["clustering"] == node.cluster_port
        text = ctl_("cluster_status", "--node", node.node_name).lines
        assert text[0] == f"Cluster status of node {node.node_name} ..."
        running = text.index("Running Nodes")
        assert text[running + 2:running + 5] == ["a", "b", "c"]
        assert f"Node: {node.node_name}, status: not under maintenance" in text


def test_node_by_name_or_address(ctl_: Tool, diag: Tool, three: list[ClusterNode]) -> None:
    _a, b, c = three
    for node in three:
        assert ctl_.json("status", "-n", node.node_name)["data_directory"] == str(node.data_dir)
    assert ctl_.json("status", "-n", f"127.0.0.1:{b.management_port}")["data_directory"] == (
        str(b.data_dir))
    assert ctl_.json("status", "-n", f"http://127.0.0.1:{c.management_port}")[
        "data_directory"] == str(c.data_dir)
    assert ctl_("-q", "await_startup", "--node", "c").stdout == ""
    assert diag("-q", "ping", "-n", "b").lines == ["Ping succeeded"]
    assert ctl_.error("list_queues", "-n", "nosuch", code=69) == (
        "Error: no node named 'nosuch' in the cluster of the local node (its nodes: a, b, c)")
    assert "no node named 'leveret@c'" in diag.error("-q", "ping", "-n", "leveret@c", code=69)
    assert "--node takes a node's name" in ctl_.error("status", "-n", "http://c", code=64)


def test_node_by_name_through_the_console_script(three: list[ClusterNode]) -> None:
    """The real process, finding node a from its flags and reaching c by name."""
    a, _b, c = three
    result = subprocess.run(
        [sys.executable, "-m", "leveret.cli.ctl", "-n", "c", "status", "--formatter", "json",
         "--data-dir", str(a.data_dir), "--management-port", str(a.management_port)],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["data_directory"] == str(c.data_dir)
    unknown = subprocess.run(
        [sys.executable, "-m", "leveret.cli.diagnostics", "-q", "ping", "-n", "z",
         "--data-dir", str(a.data_dir), "--management-port", str(a.management_port)],
        capture_output=True, text=True, timeout=60, check=False)
    assert (unknown.returncode, unknown.stdout) == (69, "")
    assert unknown.stderr.splitlines() == [
        "Error: no node named 'z' in the cluster of the local node (its nodes: a, b, c)"]


def test_users_across_nodes(ctl_: Tool, three: list[ClusterNode]) -> None:
    _a, _b, c = three
    assert ctl_("add_user", "cu", "pw1").lines[0] == 'Adding user "cu" ...'
    listed = json_of(ctl_, "list_users", "-n", "c",
                     check=lambda rows: any(r["user"] == "cu" for r in rows))
    assert {"user": "cu", "tags": []} in listed
    assert ctl_.error("add_user", "cu", "pw", "-n", "b",
                      code=70) == 'Error: User "cu" already exists'
    assert ctl_("set_user_tags", "cu", "monitoring", "management", "-n", "c").lines == [
        'Setting tags for user "cu" to [monitoring, management] ...']
    eventually(ctl_, "-q", "list_users", "-n", "b",
               check=lambda r: "cu\t[monitoring, management]" in r.lines)
    ctl_("change_password", "cu", "pw2", "-n", "b")
    ctl_("set_permissions", "cu", ".*", ".*", ".*", "-n", "c")
    wait_until(lambda: _logs_in(c, "cu", "pw2"), timeout=15)
    assert not _logs_in(c, "cu", "pw1")
    ctl_("delete_user", "cu", "-n", "c")
    eventually(ctl_, "list_users", "-n", "a", check=lambda r: "cu" not in r.stdout.split())
    for command in (["delete_user", "cu"], ["change_password", "cu", "x"],
                    ["set_user_tags", "cu", "administrator"], ["clear_permissions", "cu"],
                    ["set_permissions", "cu", ".*", ".*", ".*"]):
        assert ctl_.error(*command, "-n", "b", code=67) == 'Error: User "cu" does not exist'


def _logs_in(node: ClusterNode, user: str, password: str) -> bool:
    try:
        amqp(node, user, password).close()
    except pika.exceptions.AMQPError:
        return False
    return True


def test_vhosts_and_permissions_across_nodes(ctl_: Tool) -> None:
    assert ctl_("add_vhost", "cv", "--description", "d", "-n", "a").lines == [
        'Adding vhost "cv" ...']
    listed = json_of(ctl_, "list_vhosts", "name", "description", "-n", "c",
                     check=lambda rows: any(r["name"] == "cv" for r in rows))
    assert {"name": "cv", "description": "d"} in listed
    ctl_("add_user", "cp", "pw", "-n", "c")
    eventually(ctl_, "set_permissions", "-p", "cv", "cp", "^a", "^b", "^c", "-n", "b",
               check=lambda r: r.code == 0)
    assert eventually(ctl_, "-q", "list_permissions", "-p", "cv", "-n", "a",
                      check=lambda r: len(r.lines) == 2).lines == [
        "user\tconfigure\twrite\tread", "cp\t^a\t^b\t^c"]
    ctl_("clear_permissions", "-p", "cv", "cp", "-n", "c")
    assert json_of(ctl_, "list_permissions", "-p", "cv", "-n", "b",
                   check=lambda rows: rows == []) == []
    assert ctl_.error("set_permissions", "-p", "nosuch", "cp", ".*", ".*", ".*", "-n", "b",
                      code=69) == "Error: Virtual host nosuch does not exist"
    assert ctl_.error("list_permissions", "-p", "nosuch", "-n", "c",
                      code=65) == "Error: Virtual host 'nosuch' does not exist"
    ctl_("delete_vhost", "cv", "-n", "b")
    eventually(ctl_, "-q", "list_vhosts", "-n", "c", check=lambda r: "cv" not in r.lines)
    assert ctl_.error("delete_vhost", "cv", code=65) == "Error: Virtual host 'cv' does not exist"
    ctl_("delete_user", "cp")


def test_policies_across_nodes(ctl_: Tool) -> None:
    assert ctl_("set_policy", "cpol", "^x", '{"max-length":10}', "--priority", "3",
                "-n", "b").lines[0].startswith('Setting policy "cpol" for pattern "^x"')
    assert eventually(ctl_, "-q", "list_policies", "-n", "c",
                      check=lambda r: len(r.lines) == 2).lines == [
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority",
        '/\tcpol\t^x\tall\t{"max-length":10}\t3']
    ctl_("clear_policy", "cpol", "-n", "a")
    assert json_of(ctl_, "list_policies", "-n", "b", check=lambda rows: rows == []) == []
    assert ctl_.error("clear_policy", "cpol", "-n", "c",
                      code=69) == "Error: Parameter does not exist"
    assert ctl_.error("set_policy", "-p", "nosuch", "p", "^x", "{}", "-n", "c",
                      code=69) == "Error: Virtual host nosuch does not exist"
    assert "not valid JSON" in ctl_.error("set_policy", "p", "^x", "{nope", "-n", "b", code=65)


def test_queues_exchanges_bindings_across_nodes(ctl_: Tool, three: list[ClusterNode]) -> None:
    a = three[0]
    conn = amqp(a)
    ch = conn.channel()
    ch.exchange_declare("cx", "topic", durable=True)
    ch.queue_declare("cq", durable=True)
    ch.queue_bind("cq", "cx", "k.#")
    for _ in range(3):
        ch.basic_publish("cx", "k.1", b"m")
    listed = json_of(ctl_, "list_queues", "name", "messages", "node", "-n", "c",
                     check=lambda rows: {"name": "cq", "messages": 3, "node": "a"} in rows)
    assert [r for r in listed if r["name"] == "cq"] == [{"name": "cq", "messages": 3, "node": "a"}]
    assert "cq\t3" in ctl_("list_queues", "-n", "b").lines
    assert {"name": "cx", "type": "topic"} in json_of(
        ctl_, "list_exchanges", "-n", "b", check=lambda rows: {"name": "cx", "type": "topic"}
        in rows)
    assert "cx\texchange\tcq\tqueue\tk.#\t{}" in eventually(
        ctl_, "-q", "list_bindings", "-n", "c", check=lambda r: "cq" in r.stdout).lines
    assert ctl_("purge_queue", "cq", "-n", "b").lines == ["Purging queue 'cq' in vhost '/' ..."]
    assert json_of(ctl_, "list_queues", "name", "messages", "-n", "c",
                   check=lambda rows: {"name": "cq", "messages": 0} in rows)
    ch.basic_publish("cx", "k.2", b"m")
    ch.basic_publish("cx", "k.3", b"m")
    conn.close()
    json_of(ctl_, "list_queues", "name", "messages_ready", "-n", "c",
            check=lambda rows: {"name": "cq", "messages_ready": 2} in rows)
    assert ctl_("delete_queue", "cq", "-n", "c").lines[-1] == (
        "Queue was successfully deleted with 2 ready messages")
    eventually(ctl_, "-q", "list_queues", "-n", "a", check=lambda r: "cq" not in r.stdout)
    assert ctl_.error("purge_queue", "cq", "-n", "b", code=69) == "Error: not_found"
    assert ctl_.error("delete_queue", "cq", "-n", "a", code=64) == "Error: Queue not found"
    assert ctl_("list_queues", "-p", "nosuch", "-n", "b").lines[1:] == [
        "Listing queues for vhost nosuch ..."]


def test_connections_channels_consumers_across_nodes(ctl_: Tool,
                                                     three: list[ClusterNode]) -> None:
    b = three[1]
    conn = amqp(b)
    ch = conn.channel()
    ch.queue_declare("cc", auto_delete=True)
    ch.basic_consume("cc", lambda *_: None, consumer_tag="ctag")
    try:
        rows = json_of(ctl_, "list_connections", "name", "user", "state", "node", "-n", "a",
                       check=lambda rows: any(r["node"] == "b" for r in rows))
        on_b = [r for r in rows if r["node"] == "b"]
        assert len(on_b) == 1 and on_b[0]["user"] == "guest" and on_b[0]["state"] == "running"
        channels = ctl_.json("list_channels", "pid", "user", "consumer_count", "node", "-n", "c")
        assert [ch_["consumer_count"] for ch_ in channels if ch_["node"] == "b"] == [1]
        consumers = ctl_.json("list_consumers", "-n", "a")
        assert [(r["queue_name"], r["consumer_tag"], r["ack_required"]) for r in consumers] == [
            ("cc", "ctag", True)]
        name = on_b[0]["name"]
        close_connection(ctl_, conn, name, "-n", "c")
    finally:
        if conn.is_open:
            conn.close()
    eventually(ctl_, "-q", "list_connections", "node", "-n", "b",
               check=lambda r: "b" not in r.lines)
    assert ctl_.error("close_connection", name, "again", "-n", "a",
                      code=69) == f"Error: no connection named '{name}'"


def test_definitions_across_nodes(ctl_: Tool, tmp_path: Path) -> None:
    ctl_("add_vhost", "cdefs", "-n", "a")
    path = tmp_path / "defs.json"

    def exported() -> bool:
        ctl_("export_definitions", str(path), "-n", "b")
        return "cdefs" in [v["name"] for v in json.loads(path.read_text())["vhosts"]]

    wait_until(exported, timeout=15)
    ctl_("delete_vhost", "cdefs", "-n", "c")
    eventually(ctl_, "-q", "list_vhosts", "-n", "a", check=lambda r: "cdefs" not in r.lines)
    assert ctl_("import_definitions", str(path), "-n", "c").lines == [
        f'Importing definitions in JSON from a file at "{path}" ...',
        "Successfully imported definitions"]
    eventually(ctl_, "-q", "list_vhosts", "-n", "a", check=lambda r: "cdefs" in r.lines)
    assert "cdefs" in [v["name"] for v in json.loads(
        ctl_("export_definitions", "-", "-n", "a").stdout)["vhosts"]]
    assert ctl_.error("import_definitions", str(tmp_path / "none.json"), "-n", "b", code=66)
    (tmp_path / "bad.json").write_text("{")
    assert "not valid JSON" in ctl_.error("import_definitions", str(tmp_path / "bad.json"),
                                          "-n", "b", code=65)
    ctl_("delete_vhost", "cdefs")


def test_diagnostics_by_name(diag: Tool, three: list[ClusterNode]) -> None:
    for node in three[1:]:
        name = node.node_name
        assert diag("ping", "-n", name).lines[-1] == "Ping succeeded"
        assert diag("check_running", "-n", name).lines == [
            f"Checking if Leveret is running on node {name} ...",
            f"Leveret on node {name} is fully booted and running"]
        assert diag("check_local_alarms", "-n", name).lines[-1] == (
            f"Node {name} reported no local alarms")
        assert diag("check_alarms", "-n", name).lines[-1] == (
            f"Node {name} reported no alarms, local or clusterwide")
        ports = ", ".join(str(p) for p in sorted([node.port, node.cluster_port,
                                                  node.management_port]))
        assert diag.json("check_port_connectivity", "-n", name) == {"result": "ok",
                                                                    "node": name}
        connected = diag("check_port_connectivity", "-n", name).lines[-1]
        assert sorted(connected.split(" on node ")[0].split("ports ")[1].split(", ")) == (
            ports.split(", "))
        listeners = diag.json("listeners", "-n", name)
        assert (listeners["node"], listeners["result"]) == (name, "ok")
        assert {(lst["protocol"], lst["port"]) for lst in listeners["listeners"]} == {
            ("amqp", node.port), ("clustering", node.cluster_port),
            ("http", node.management_port)}
        assert all(line.startswith("Interface: ")
                   for line in diag("-q", "listeners", "-n", name).lines)
        breakdown = diag.json("memory_breakdown", "-n", name)
        assert breakdown["rss"] == breakdown["total"]["rss"] > 0
        assert diag.json("status", "-n", name)["data_directory"] == str(node.data_dir)


def test_memory_alarm_of_one_node_seen_from_another(ctl_: Tool, diag: Tool) -> None:
    """A watermark of 0.0 raises node c's memory alarm: c's local check fails, a's passes, and
    every node's cluster-wide check fails until c's watermark is back."""
    assert ctl_("set_vm_memory_high_watermark", "0.0", "-n", "c").lines == [
        "Setting memory threshold on c to 0.0 ..."]
    try:
        assert diag.error("check_local_alarms", "-n", "c", code=69) == (
            "Error: Node c reported local alarms: memory")
        assert diag("check_local_alarms").lines[-1] == "Node a reported no local alarms"
        eventually(diag, "check_alarms", "-n", "b", check=lambda r: r.code == 69)
        assert diag.error("check_alarms", code=69) == (
            "Error: Node a reported alarms: c: memory")
        assert {"node": "c", "resource": "memory"} in ctl_.json("cluster_status")["alarms"]
        assert ctl_.json("status", "-n", "c")["alarms"] == [{"node": "c", "resource": "memory"}]
    finally:
        ctl_("-q", "set_vm_memory_high_watermark", "0.4", "-n", "c")
    eventually(diag, "check_alarms", check=lambda r: r.code == 0)
    assert ctl_.error("set_vm_memory_high_watermark", "1.5", "-n", "b", code=65)


def test_usage_mistakes_reach_no_node(ctl_: Tool, diag: Tool) -> None:
    assert "frobnicate" in ctl_.error("frobnicate", "-n", "b", code=64)
    assert "frobnicate" in diag.error("frobnicate", "-n", "b", code=64)
    assert "nosuchcol" in ctl_.error("list_queues", "nosuchcol", "-n", "c", code=64)
    assert ctl_.error("list_users", "--formatter", "xml", "-n", "c", code=64)


def test_a_stopped_node(ctl_: Tool, diag: Tool, three: list[ClusterNode]) -> None:
    """Last: node c is killed; the others list it as down, and `-n c` says it is not running."""
    three[2].kill()
    status = json_of(ctl_, "cluster_status", "-n", "b",
                     check=lambda s: sorted(s["running_nodes"]) == ["a", "b"])
    assert sorted(status["disk_nodes"]) == ["a", "b", "c"]
    text = ctl_("cluster_status").lines
    assert text[text.index("Running Nodes") + 2:text.index("Running Nodes") + 5] == [
        "a", "b", ""]
    assert ctl_.error("status", "-n", "c", code=69) == "Error: node 'c' is not running"
    assert diag.error("check_running", "-n", "c", code=69) == "Error: node 'c' is not running"
