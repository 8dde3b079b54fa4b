"""`leveretctl` and `leveret-diagnostics` end to end against one real `leveret serve` (shared by
the module), through the local credential the node writes into its data directory; every
user mistake is one line and rabbitmqctl's exit code. Where it is cheap, the same commands are
run through Debian's real `rabbitmqctl` against the reference RabbitMQ and compared.

Most commands run in this process (`ctl_common.run`, as the console scripts do) to keep the
module fast; a few run the installed console scripts as subprocesses.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pika
import pytest
from support.brokers import BrokerProcess
from support.ctl import Tool, close_connection
from support.ports import free_port, wait_for_port
from support.reference import RABBITMQCTL, Reference

from leveret.cli import ctl, diagnostics
from leveret.cli import ctl_common as c


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("ctl")
    management_port = free_port()
    proc = BrokerProcess(base / "data", args=["--management-port", str(management_port),
                                               "--workers", "1"])
    proc.management_port = management_port  # type: ignore[attr-defined]
    proc.start()
    wait_for_port(management_port, 30)
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def ctl_(node: BrokerProcess) -> Tool:
    return Tool(ctl.app, node.data_dir, node.management_port)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def diag(node: BrokerProcess) -> Tool:
    return Tool(diagnostics.app, node.data_dir,
                node.management_port)  # type: ignore[attr-defined]


def test_local_credential_is_owner_only_and_refused_without_it(node: BrokerProcess,
                                                               tmp_path: Path) -> None:
    token = node.data_dir / ".leveret-cli-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text().strip()) == 64
    # another data directory's token (or none) is not this node's credential
    other = Tool(ctl.app, tmp_path, node.management_port)  # type: ignore[attr-defined]
    assert "no local credential" in other.error("list_queues", code=69)
    (tmp_path / ".leveret-cli-token").write_text("0" * 64)
    assert "refused the local credential" in other.error("list_queues", code=69)


def test_queues_exchanges_bindings_purge_delete(ctl_: Tool, node: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("ctl-q", durable=True)
    for _ in range(3):
        ch.basic_publish("", "ctl-q", b"m")
    conn.close()
    result = ctl_("list_queues")
    assert result.lines[:2] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ..."]
    assert result.lines[2] == "name\tmessages" and "ctl-q\t3" in result.lines
    assert ctl_("-q", "list_queues", "name", "durable", "--no-table-headers").lines == [
        "ctl-q\ttrue"]
    assert ctl_.json("list_queues", "name", "messages") == [{"name": "ctl-q", "messages": 3}]
    assert ctl_("list_queues", "-p", "nosuch").lines[1:] == ["Listing queues for vhost nosuch ..."]
    assert {"name": "amq.topic", "type": "topic"} in ctl_.json("list_exchanges")
    assert ctl_("-q", "list_exchanges", "name", "type", "durable").lines[0] == "name\ttype\tdurable"
    bindings = ctl_.json("list_bindings")
    assert {"source_name": "", "source_kind": "exchange", "destination_name": "ctl-q",
            "destination_kind": "queue", "routing_key": "ctl-q", "arguments": {}} in bindings
    assert ctl_("purge_queue", "ctl-q").lines == ["Purging queue 'ctl-q' in vhost '/' ..."]
    assert ctl_.json("list_queues", "name", "messages") == [{"name": "ctl-q", "messages": 0}]
    assert ctl_("delete_queue", "ctl-q").lines[-1] == (
        "Queue was successfully deleted with 0 ready messages")
    assert ctl_("-q", "list_queues").stdout == ""
    assert ctl_.error("purge_queue", "ctl-q", code=69) == "Error: not_found"
    assert ctl_.error("delete_queue", "ctl-q", code=64) == "Error: Queue not found"


def test_connections_channels_consumers_close(ctl_: Tool, node: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("ctl-c", exclusive=True)
    ch.basic_consume("ctl-c", lambda *_: None, consumer_tag="tag-1")
    try:
        rows = ctl_.json("list_connections", "name", "user", "peer_host", "state")
        assert len(rows) == 1 and rows[0]["user"] == "guest" and rows[0]["state"] == "running"
        channels = ctl_.json("list_channels")
        assert channels[0]["user"] == "guest" and channels[0]["consumer_count"] == 1
        consumers = ctl_.json("list_consumers")
        assert consumers[0]["queue_name"] == "ctl-c" and consumers[0]["consumer_tag"] == "tag-1"
        assert consumers[0]["ack_required"] is True
        close_connection(ctl_, conn, rows[0]["name"])
    finally:
        if conn.is_open:
            conn.close()
    assert ctl_.error("close_connection", "nosuch", "x", code=69)


def test_users(ctl_: Tool, node: BrokerProcess) -> None:
    assert ctl_("add_user", "ctl-u", "pw1").lines[0] == 'Adding user "ctl-u" ...'
    assert ctl_.error("add_user", "ctl-u", "pw", code=70) == 'Error: User "ctl-u" already exists'
    assert ctl_("set_user_tags", "ctl-u", "monitoring", "policymaker").lines == [
        'Setting tags for user "ctl-u" to [monitoring, policymaker] ...']
    assert {"user": "ctl-u", "tags": ["monitoring", "policymaker"]} in ctl_.json("list_users")
    assert "ctl-u\t[monitoring, policymaker]" in ctl_("-q", "list_users").lines
    ctl_("change_password", "ctl-u", "pw2")
    ctl_("set_permissions", "ctl-u", ".*", ".*", ".*")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials("ctl-u", "pw2")))
    conn.close()
    ctl_("delete_user", "ctl-u")
    for command in (["delete_user", "ctl-u"], ["change_password", "ctl-u", "x"],
                    ["set_user_tags", "ctl-u", "administrator"], ["clear_permissions", "ctl-u"],
                    ["set_permissions", "ctl-u", ".*", ".*", ".*"]):
        assert "ctl-u" in ctl_.error(*command, code=67)


def test_vhosts_and_permissions(ctl_: Tool) -> None:
    assert ctl_("add_vhost", "ctl-v", "--description", "d").lines == ['Adding vhost "ctl-v" ...']
    assert {"name": "ctl-v", "description": "d"} in ctl_.json("list_vhosts", "name",
                                                               "description")
    ctl_("add_user", "ctl-p", "pw")
    ctl_("set_permissions", "-p", "ctl-v", "ctl-p", "^a", "^b", "^c")
    assert ctl_("list_permissions", "-p", "ctl-v").lines[1:] == [
        "user\tconfigure\twrite\tread", "ctl-p\t^a\t^b\t^c"]
    ctl_("clear_permissions", "-p", "ctl-v", "ctl-p")
    assert ctl_.json("list_permissions", "-p", "ctl-v") == []
    assert ctl_.error("set_permissions", "-p", "nosuch", "ctl-p", ".*", ".*", ".*",
                      code=69) == "Error: Virtual host nosuch does not exist"
    assert ctl_.error("list_permissions", "-p", "nosuch",
                      code=65) == "Error: Virtual host 'nosuch' does not exist"
    ctl_("delete_vhost", "ctl-v")
    assert ctl_.error("delete_vhost", "ctl-v",
                      code=65) == "Error: Virtual host 'ctl-v' does not exist"
    ctl_("delete_user", "ctl-p")


def test_policies(ctl_: Tool) -> None:
    assert ctl_("set_policy", "ctl-pol", "^x", '{"max-length":10}', "--priority", "3").lines == [
        'Setting policy "ctl-pol" for pattern "^x" to "{"max-length":10}" with priority "3" '
        'for vhost "/" ...']
    assert ctl_("-q", "list_policies").lines == [
        "vhost\tname\tpattern\tapply-to\tdefinition\tpriority",
        '/\tctl-pol\t^x\tall\t{"max-length":10}\t3']
    assert ctl_.json("list_policies")[0]["definition"] == '{"max-length":10}'
    assert ctl_.error("set_policy", "bad", "^x", "{nope", code=65)
    ctl_("clear_policy", "ctl-pol")
    assert ctl_.error("clear_policy", "ctl-pol", code=69) == "Error: Parameter does not exist"


def test_definitions_round_trip(ctl_: Tool, tmp_path: Path) -> None:
    ctl_("add_vhost", "ctl-defs")
    path = tmp_path / "defs.json"
    ctl_("export_definitions", str(path))
    data = json.loads(path.read_text())
    assert {"name": "ctl-defs"} in [{"name": v["name"]} for v in data["vhosts"]]
    ctl_("delete_vhost", "ctl-defs")
    assert ctl_("import_definitions", str(path)).lines[-1] == "Successfully imported definitions"
    assert {"name": "ctl-defs"} in ctl_.json("list_vhosts")
    assert json.loads(ctl_("export_definitions", "-").stdout)["vhosts"]
    assert ctl_.error("import_definitions", str(tmp_path / "none.json"), code=66)
    (tmp_path / "bad.json").write_text("{")
    assert ctl_.error("import_definitions", str(tmp_path / "bad.json"), code=65)
    ctl_("delete_vhost", "ctl-defs")


def test_node_commands(ctl_: Tool, diag: Tool) -> None:
    ctl_("await_startup")
    status = ctl_.json("status")
    assert status["pid"] > 0 and status["product_name"] == "Leveret"
    assert {lst["protocol"] for lst in status["listeners"]} == {"amqp", "http"}
    assert "Runtime" in ctl_("status").lines
    cluster = ctl_.json("cluster_status")
    assert cluster["running_nodes"] == cluster["disk_nodes"] and len(cluster["disk_nodes"]) == 1
    assert "Running Nodes" in ctl_("cluster_status").lines
    name = cluster["running_nodes"][0]
    assert ctl_("set_vm_memory_high_watermark", "0.6").lines == [
        f"Setting memory threshold on {name} to 0.6 ..."]
    assert ctl_.error("set_vm_memory_high_watermark", "7", code=65)
    assert diag("-q", "ping").lines == ["Ping succeeded"]
    assert diag("ping").lines[-1] == "Ping succeeded"
    assert diag("check_running").lines[-1] == f"Leveret on node {name} is fully booted and running"
    assert diag("check_local_alarms").lines[-1] == f"Node {name} reported no local alarms"
    assert diag("check_alarms").lines[-1] == (
        f"Node {name} reported no alarms, local or clusterwide")
    assert diag("check_port_connectivity").lines[-1].startswith("Successfully connected to ports")
    listeners = diag.json("listeners")
    assert listeners["result"] == "ok" and len(listeners["listeners"]) == 2
    assert diag("-q", "listeners").lines[0].startswith("Interface: ")
    assert diag.json("memory_breakdown")["total"]["rss"] > 0
    assert diag.json("status")["data_directory"]


def test_usage_mistakes(ctl_: Tool, diag: Tool) -> None:
    assert "frobnicate" in ctl_.error("frobnicate", code=64)
    assert "frobnicate" in diag.error("frobnicate", code=64)
    assert "username" in ctl_.error("add_user", code=64)
    assert "nosuchcol" in ctl_.error("list_queues", "nosuchcol", code=64)
    assert ctl_.error("list_queues", "--formatter", "xml", code=64)
    assert ctl_.error("list_queues", "--bogus", code=64)
    assert ctl_.error("list_queues", "--node", "http://no-port", code=64)


def test_node_by_name(ctl_: Tool, diag: Tool, node: BrokerProcess) -> None:
    """A single node answers to its own name, and names no other node."""
    name = ctl_.json("status")["listeners"][0]["node"]
    assert ctl_.json("status", "-n", name)["data_directory"] == str(node.data_dir)
    assert diag("-q", "ping", "--node", name).lines == ["Ping succeeded"]
    assert ctl_.error("list_queues", "-n", "nosuch", code=69) == (
        f"Error: no node named 'nosuch' in the cluster of the local node (its nodes: {name})")


def test_broker_down(ctl_: Tool, diag: Tool, node: BrokerProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    assert "unable to perform an operation" in ctl_.error("list_queues", "-n", dead, code=69)
    assert "Failed to connect" in diag.error("-q", "ping", "-n", dead, code=69)
    assert diag.error("check_running", "--node", dead, code=69)
    assert ctl_.error("await_startup", "-n", dead, "--timeout", "0.5", code=69)


def test_where_a_named_node_is_reached() -> None:
    """A node advertised as this machine at the loopback, where the token is accepted; one
    elsewhere at its advertised host; a stopped node, or one without an API, not at all."""
    entry = {"name": "n", "running": True, "management_port": 15999}
    for here in ("localhost", platform.node(), "127.0.0.1"):
        assert c.management_url_of({**entry, "advertise_host": here}) == (
            "http://127.0.0.1:15999")
    assert c.management_url_of({**entry, "advertise_host": "192.0.2.7"}) == (
        "http://192.0.2.7:15999")  # TEST-NET-1: no address of this machine
    assert c.management_url_of({**entry, "advertise_host": "2001:db8::7"}) == (
        "http://[2001:db8::7]:15999")
    assert c.management_url_of({**entry, "advertise_host": "elsewhere.invalid"}) == (
        "http://elsewhere.invalid:15999")
    with pytest.raises(c.CtlError, match="node 'n' is not running") as stopped:
        c.management_url_of({**entry, "running": False, "advertise_host": "localhost"})
    with pytest.raises(c.CtlError, match="no management API") as no_api:
        c.management_url_of({**entry, "management_port": 0, "advertise_host": "localhost"})
    assert stopped.value.code == no_api.value.code == c.EX_UNAVAILABLE


class FailingApi(BaseHTTPRequestHandler):
    """A management API that answers every request with a 500 and RabbitMQ's error body."""

    def do_GET(self) -> None:  # http.server calls it by this name
        body = json.dumps({"error": "internal_error", "reason": "it broke"}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_an_api_failure_is_one_line(ctl_: Tool, diag: Tool) -> None:
    """A refusal no command has its own words for: the API's reason and 70, no traceback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        failing = f"127.0.0.1:{server.server_address[1]}"
        assert ctl_.error("list_users", "-n", failing, code=70) == "Error: it broke"
        assert diag.error("check_alarms", "-n", failing, code=70) == "Error: it broke"
    finally:
        server.shutdown()
        server.server_close()


def test_console_scripts(node: BrokerProcess) -> None:
    """The installed scripts, finding the node from LEVERET_* as `leveret serve` does."""
    env = {**os.environ, "LEVERET_DATA_DIR": str(node.data_dir),
           "LEVERET_MANAGEMENT_PORT": str(node.management_port)}  # type: ignore[attr-defined]
    for script, args in (("leveret-diagnostics", ["-q", "ping"]),
                         ("leveretctl", ["-q", "list_vhosts"])):
        path = shutil.which(script) or str(Path(sys.executable).parent / script)
        result = subprocess.run([path, *args], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, result.stderr
    bad = subprocess.run([sys.executable, "-m", "leveret.cli.ctl", "frobnicate"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 64 and len(bad.stderr.strip().splitlines()) == 1


# -- the same commands through the real rabbitmqctl ---------------------------------------------


def rabbitmqctl(reference: Reference, *args: str) -> subprocess.CompletedProcess[str]:
    if reference.ctl_env is None or not RABBITMQCTL.exists():
        pytest.skip("rabbitmqctl needs the local reference rabbitmq-server")
    return subprocess.run([str(RABBITMQCTL), *args], env=reference.ctl_env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.reference
def test_same_as_rabbitmqctl(ctl_: Tool, node: BrokerProcess, reference: Reference) -> None:
    for url in (node.url, reference.url):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare("ctl-ref", durable=True)
        ch.basic_publish("", "ctl-ref", b"x")
        conn.close()
    try:
        for args in (["list_queues"], ["-q", "list_queues", "name", "messages", "durable"],
                     ["list_queues", "name", "messages", "--formatter", "json"]):
            theirs = rabbitmqctl(reference, *args)
            ours = ctl_(*args)
            assert theirs.returncode == 0
            assert [line for line in ours.lines if "ctl-ref" in line or "name" in line] == [
                line for line in theirs.stdout.splitlines() if "ctl-ref" in line
                or "name" in line]
            assert ours.lines[0] == theirs.stdout.splitlines()[0]  # banner, header or "["
        for args, code in ((["frobnicate"], 64), (["add_user"], 64),
                           (["list_queues", "nosuchcol"], 64),
                           (["delete_user", "nosuch"], 67), (["delete_vhost", "nosuch"], 65),
                           (["list_permissions", "-p", "nosuch"], 65),
                           (["purge_queue", "nosuch"], 69), (["delete_queue", "nosuch"], 64),
                           (["clear_policy", "nosuch"], 69),
                           (["set_vm_memory_high_watermark", "7"], 65)):
            assert rabbitmqctl(reference, *args).returncode == code, args
            ctl_.error(*args, code=code)
        assert rabbitmqctl(reference, "add_user", "guest", "x").returncode == 70
        ctl_.error("add_user", "guest", "x", code=70)
    finally:
        rabbitmqctl(reference, "delete_queue", "ctl-ref")
        ctl_("delete_queue", "ctl-ref")
