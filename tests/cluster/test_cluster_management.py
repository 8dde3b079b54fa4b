"""The management API over a cluster, with a real etcd, real `leveret serve` nodes, pika and
Debian's rabbitmqadmin: any node shows every queue (with its node and its holder's counts, or
`down`), every connection and channel, its own name from --node-name; /metrics stays per node
with a `node` label."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.request import Request, urlopen

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, leveret, make_node, one_line, status
from support.cluster_api import api, connect, ok, wait_linked
from support.etcd import EtcdServer

RABBITMQADMIN = Path("/usr/lib/rabbitmq/lib/rabbitmq_server-3.10.8/plugins/"
                     "rabbitmq_management-3.10.8/priv/www/cli/rabbitmqadmin")


def start_nodes(tmp_path: Path, etcd_url: str, cluster: str, nodes: list[BrokerProcess],
                names: tuple[str, ...]) -> list[ClusterNode]:
    started = []
    for name in names:
        node = make_node(tmp_path, etcd_url, cluster, name, management=True)
        nodes.append(node.start())
        started.append(node)
    wait_linked([n for n in nodes if isinstance(n, ClusterNode) and n.proc is not None
                 and n.proc.poll() is None])
    return started


def fill(node: BrokerProcess, queue: str, count: int) -> None:
    """Declare `queue` on `node` (which holds it) through the API and publish to it there."""
    ok(node, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})
    for i in range(count):
        assert ok(node, "POST", "/api/exchanges/%2F/amq.default/publish", {
            "routing_key": queue, "payload": str(i), "payload_encoding": "string",
            "properties": {"delivery_mode": 2}})["routed"] is True


def test_any_node_lists_every_queue_with_its_node_and_counts(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    fill(a, "on-a", 3)
    fill(b, "on-b", 1)
    for node in (a, b):
        listed = {q["name"]: q for q in ok(node, "GET", "/api/queues")}
        assert {name: (q["node"], q["state"], q["messages"], q["messages_ready"])
                for name, q in listed.items()} == {"on-a": ("a", "running", 3, 3),
                                                    "on-b": ("b", "running", 1, 1)}
    one = ok(b, "GET", "/api/queues/%2F/on-a")
    assert (one["node"], one["messages"], one["durable"]) == ("a", 3, True)
    assert [q["name"] for q in ok(b, "GET", "/api/queues/%2F?columns=name,node")] == \
        ["on-a", "on-b"]

    a.kill()  # its durable queue's record stays; B shows it down, as RabbitMQ does
    deadline = time.monotonic() + 15
    while True:
        down = {q["name"]: q for q in ok(b, "GET", "/api/queues")}["on-a"]
        if down["state"] == "down" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (down["node"], down["state"]) == ("a", "down")
    assert "messages" not in down
    assert {q["name"]: q["messages"] for q in ok(b, "GET", "/api/queues")
            if "messages" in q} == {"on-b": 1}
    a.restart()
    wait_linked([a, b])
    assert ok(b, "GET", "/api/queues/%2F/on-a")["messages"] == 3  # durable: kept on A's disk


def test_any_node_lists_every_connection_and_channel_with_its_node(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    on_b = connect(b)
    on_b.channel()
    on_b.channel()
    on_a = connect(a)
    for node in (a, b):
        connections = ok(node, "GET", "/api/connections")
        assert sorted(c["node"] for c in connections) == ["a", "b"]
        channels = ok(node, "GET", "/api/channels")
        assert sorted(c["node"] for c in channels) == ["b", "b"]
        assert ok(node, "GET", "/api/vhosts/%2F/connections") == connections
    remote = next(c for c in ok(a, "GET", "/api/connections") if c["node"] == "b")
    assert remote["user"] == "guest" and remote["channels"] == 2 and remote["vhost"] == "/"
    name = remote["name"].replace(" ", "%20").replace(">", "%3E")
    assert ok(a, "GET", f"/api/connections/{name}")["node"] == "b"
    on_b.close()
    assert [c["node"] for c in ok(a, "GET", "/api/connections")] == ["a"]
    on_a.close()

    # a user who may see only its own connections sees only those, on every node
    ok(a, "PUT", "/api/users/mona", {"password": "pw", "tags": "management"})
    ok(a, "PUT", "/api/permissions/%2F/mona", {"configure": ".*", "write": ".*", "read": ".*"})
    mine = connect(b, "mona", "pw")
    theirs = connect(b)
    assert [c["user"] for c in ok(a, "GET", "/api/connections", user="mona", password="pw")] \
        == ["mona"]
    mine.close()
    theirs.close()

    on_b = connect(b)  # a node that does not answer: its connections are left out
    assert sorted(c["node"] for c in ok(a, "GET", "/api/connections")) == ["b"]
    b.kill()
    assert ok(a, "GET", "/api/connections") == []
    assert ok(a, "GET", "/api/channels") == []


def test_overview_names_and_metrics_per_node(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    fill(a, "held-on-a", 2)
    overview = ok(b, "GET", "/api/overview")
    assert (overview["cluster_name"], overview["node"]) == (cluster, "b")
    assert {entry["node"] for entry in overview["listeners"]} == {"b"}
    assert [(entry["protocol"], entry["port"]) for entry in overview["listeners"]] == [
        ("amqp", b.port), ("clustering", b.cluster_port), ("http", b.management_port)]
    assert ok(b, "GET", "/api/vhosts/%2F")["cluster_state"] == {"a": "running", "b": "running"}
    with urlopen(f"http://127.0.0.1:{a.management_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples and all(s.labels.get("node") == "a" for s in samples)
    queued = {s.labels["queue"]: s.value for s in samples
              if s.name == "leveret_queue_messages"}
    assert queued == {"held-on-a": 2}
    with urlopen(f"http://127.0.0.1:{b.management_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    on_b = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert all(s.labels.get("node") == "b" for s in on_b)
    assert not [s for s in on_b if s.name == "leveret_queue_messages"]  # held by A: not B's


def test_rabbitmqadmin_against_any_node(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    if not RABBITMQADMIN.exists():
        pytest.skip("Debian's rabbitmq-server (and its rabbitmqadmin) is not installed")
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))

    def run(node: ClusterNode, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P",
             str(node.management_port), *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": "/nonexistent"})
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout

    assert "queue declared" in run(a, "declare", "queue", "name=orders", "durable=true")
    assert "Message published" in run(a, "publish", "routing_key=orders", "payload=hi")
    assert "user declared" in run(b, "declare", "user", "name=ops", "password=pw",
                                  "tags=administrator")
    on_b = connect(b)
    for node in (a, b):
        assert run(node, "-f", "tsv", "-q", "list", "queues", "name", "node", "messages") \
            .splitlines() == ["orders\ta\t1"]
        assert run(node, "-f", "tsv", "-q", "list", "connections", "node", "user") \
            .splitlines() == ["b\tguest"]
        assert "ops" in run(node, "-f", "tsv", "-q", "list", "users", "name")
    on_b.close()
    assert api(b, "GET", "/api/users/ops")[0] == 200


def test_cluster_status_lists_nodes_states_versions_alarms_and_listeners(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    (a,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a",))
    b = make_node(tmp_path, etcd.url, cluster, "b", management=True,
                  env={"LEVERET_DISK_FREE_LIMIT_BYTES": str(1 << 62)})  # a disk alarm at once
    nodes.append(b.start())
    deadline = time.monotonic() + 15
    while not (data := status(etcd.url, cluster))["alarms"]:
        assert time.monotonic() < deadline, "b's disk alarm never reached etcd"
        time.sleep(0.3)
    assert data["running_nodes"] == ["a", "b"] and data["alarms"] == [
        {"node": "b", "alarms": ["disk"]}]
    assert data["versions"] == {"a": "0.1.0", "b": "0.1.0"}
    assert data["partitions"] == {} and data["ram_nodes"] == []
    assert {(entry["protocol"], entry["port"]) for entry in data["listeners"]["a"]} == {
        ("amqp", a.port), ("clustering", a.cluster_port), ("http", a.management_port)}
    table = leveret("cluster-status", "--etcd", etcd.url, "--cluster-name", cluster)
    assert table.returncode == 0 and "Alarms: b: disk" in table.stdout
    assert ok(a, "GET", "/api/nodes/b")["disk_free_alarm"] is True

    assert b.stop() == 0
    data = status(etcd.url, cluster)
    assert (data["running_nodes"], data["disk_nodes"], data["alarms"]) == (["a"], ["a", "b"], [])
    assert {n["name"]: n["state"] for n in data["nodes"]} == {"a": "running", "b": "down"}
    assert list(data["listeners"]) == ["a"]


def test_cluster_status_against_a_silent_etcd_is_one_line(
        etcd_factory: Callable[[], EtcdServer]) -> None:
    etcd = etcd_factory()
    etcd.pause()  # accepts connections, answers nothing
    try:
        started = time.monotonic()
        line = one_line(leveret("cluster-status", "--etcd", etcd.url))
        assert line.startswith(f"error: cannot reach etcd at {etcd.url}; is it running?")
        assert time.monotonic() - started < 30
    finally:
        etcd.resume()


def test_deletes_through_any_node_apply_everywhere(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    fill(a, "held", 2)
    ok(a, "PUT", "/api/exchanges/%2F/events", {"type": "fanout", "durable": True})
    ok(a, "POST", "/api/bindings/%2F/e/events/q/held", {"routing_key": "k"})
    binding = ok(b, "GET", "/api/bindings/%2F/e/events/q/held")
    assert [x["routing_key"] for x in binding] == ["k"]

    status, body = api(b, "DELETE", "/api/queues/%2F/held?if-empty=true")  # A's counts decide
    assert (status, body["reason"]) == (400, "queue 'held' in vhost '/' not empty")
    status, body = api(b, "DELETE", "/api/exchanges/%2F/events?if-unused=true")
    assert (status, body["reason"]) == (400, "exchange 'events' in vhost '/' in use")
    status, body = api(b, "DELETE", "/api/exchanges/%2F/amq.direct")
    assert status == 401 and "deletion of system exchange 'amq.direct'" in body["reason"]

    props = binding[0]["properties_key"]
    assert api(b, "DELETE", f"/api/bindings/%2F/e/events/q/held/{props}")[0] == 204
    assert ok(a, "GET", "/api/bindings/%2F/e/events/q/held") == []
    assert api(b, "DELETE", "/api/exchanges/%2F/events?if-unused=true")[0] == 204
    assert api(a, "GET", "/api/exchanges/%2F/events")[0] == 404
    assert api(b, "DELETE", "/api/queues/%2F/held")[0] == 204
    for node in (a, b):
        assert api(node, "GET", "/api/queues/%2F/held")[0] == 404
    assert api(b, "DELETE", "/api/queues/%2F/held")[0] == 404

    fill(a, "orphan", 1)
    a.kill()
    deadline = time.monotonic() + 15
    while ok(b, "GET", "/api/queues/%2F/orphan")["state"] != "down":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    status, body = api(b, "DELETE", "/api/queues/%2F/orphan?if-empty=true")
    assert (status, body["error"]) == (503, "service_unavailable")
    assert body["reason"] == "queue 'orphan' in vhost '/': its node a does not answer"


def test_declarations_through_the_api_are_refused_as_on_a_single_node(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    ok(a, "PUT", "/api/users/lim", {"password": "pw", "tags": "management"})
    ok(a, "PUT", "/api/permissions/%2F/lim", {"configure": "^lim-", "write": ".*", "read": ".*"})
    cases = [
        (("PUT", "/api/exchanges/%2F/x", {"type": "nonsense"}), "guest",
         (400, "unknown exchange type 'nonsense'")),
        (("PUT", "/api/exchanges/%2F/x", {}), "guest", (400, "exchange type is missing")),
        (("PUT", "/api/exchanges/%2F/amq.mine", {"type": "direct"}), "guest",
         (401, "exchange name 'amq.mine' contains reserved prefix 'amq.*'")),
        (("PUT", "/api/queues/%2F/amq.mine", {}), "guest",
         (401, "queue name 'amq.mine' contains reserved prefix 'amq.*'")),
        (("PUT", "/api/queues/%2F/other", {}), "lim",
         (401, "access to queue 'other' in vhost '/' refused for user 'lim'")),
        (("POST", "/api/bindings/%2F/e/amq.direct/q/nowhere", {"routing_key": "k"}), "guest",
         (404, "no queue 'nowhere' in vhost '/'")),
        (("PUT", "/api/queues/%2F/bad-args", {"arguments": {"x-max-length": "ten"}}), "guest",
         (400, "invalid arg 'x-max-length' for queue 'bad-args' in vhost '/': "
               '"expected integer, got longstr"')),
        (("PUT", "/api/queues/%2F/bad-type", {"arguments": {"x-queue-type": "quorum",
                                                             "x-max-priority": 5}}), "guest",
         (400, "invalid arg 'x-max-priority' for queue 'bad-type' in vhost '/' of queue type "
               "rabbit_quorum_queue")),
    ]
    for (method, path, body), user, expected in cases:
        status, answer = api(b, method, path, body, user=user,
                             password="pw" if user == "lim" else "guest")
        assert (status, answer["reason"]) == expected, (method, path)
    assert api(b, "PUT", "/api/queues/%2F/lim-q", {}, user="lim", password="pw")[0] == 201
    assert api(a, "PUT", "/api/queues/%2F/lim-q", {"durable": False})[0] == 204  # the same
    status, answer = api(a, "PUT", "/api/queues/%2F/lim-q", {"durable": True})
    assert status == 400 and "inequivalent arg 'durable'" in answer["reason"]
    assert [q["node"] for q in ok(a, "GET", "/api/queues")] == ["b"]  # nothing refused is there
    assert [x["name"] for x in ok(a, "GET", "/api/exchanges/%2F") if x["name"] == "x"] == []


def test_get_and_purge_through_a_node_that_does_not_hold_the_queue(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    fill(a, "remote", 3)
    got = ok(b, "POST", "/api/queues/%2F/remote/get", {"count": 2, "ackmode":
                                                       "ack_requeue_false", "encoding": "auto"})
    assert [(m["payload"], m["message_count"]) for m in got] == [("0", 2), ("1", 1)]
    peek = ok(b, "POST", "/api/queues/%2F/remote/get", {"count": 5,
                                                        "ackmode": "ack_requeue_true"})
    assert [m["payload"] for m in peek] == ["2"]
    assert ok(a, "GET", "/api/queues/%2F/remote")["messages"] == 1
    status, body = api(b, "POST", "/api/queues/%2F/remote/get", {"ackmode": "nonsense"})
    assert status == 400 and body["reason"].startswith("ackmode must be one of")
    assert api(b, "DELETE", "/api/queues/%2F/remote/contents")[0] == 204
    assert ok(a, "GET", "/api/queues/%2F/remote")["messages"] == 0

    a.kill()
    deadline = time.monotonic() + 15
    while (status_body := api(b, "DELETE", "/api/queues/%2F/remote/contents"))[0] != 503:
        assert time.monotonic() < deadline, status_body
        time.sleep(0.3)
    assert status_body[1] == {"error": "service_unavailable",
                              "reason": "queue 'remote' in vhost '/': its node a does not answer"}
    status, body = api(b, "POST", "/api/queues/%2F/remote/get", {"count": 1})
    assert (status, body["error"]) == (503, "service_unavailable")


def test_consumers_overview_totals_and_closing_another_nodes_connection(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    fill(a, "totals-a", 2)
    fill(b, "totals-b", 3)
    on_b = connect(b)
    channel = on_b.channel()
    channel.basic_consume("totals-b", lambda *args: None, consumer_tag="tag-on-b")
    on_b.process_data_events(time_limit=0.3)
    listed = ok(a, "GET", "/api/consumers")
    assert [(c["consumer_tag"], c["channel_details"]["node"], c["queue"]["name"])
            for c in listed] == [("tag-on-b", "b", "totals-b")]
    assert ok(a, "GET", "/api/consumers/%2F") == listed
    overview = ok(a, "GET", "/api/overview")
    assert overview["object_totals"]["connections"] == 1
    assert overview["object_totals"]["channels"] == 1
    assert overview["object_totals"]["consumers"] == 1
    assert overview["object_totals"]["queues"] == 2
    assert overview["queue_totals"]["messages"] == 5  # A's 2 and B's 3 (unacked included)

    name = next(c["name"] for c in ok(a, "GET", "/api/connections"))
    quoted = name.replace(" ", "%20").replace(">", "%3E")
    ok(a, "PUT", "/api/users/nosy", {"password": "pw", "tags": "management"})
    ok(a, "PUT", "/api/permissions/%2F/nosy", {"configure": ".*", "write": ".*", "read": ".*"})
    status, _ = api(a, "DELETE", f"/api/connections/{quoted}", user="nosy", password="pw")
    assert status == 404  # a management user does not see another user's connection
    ok(a, "PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})
    status, body = api(a, "DELETE", f"/api/connections/{quoted}", user="watcher", password="pw")
    assert (status, body["reason"]) == (401, "Not administrator user")  # sees it, may not close
    request_reason = {"X-Reason": "go away"}
    status, _ = api_with_headers(a, "DELETE", f"/api/connections/{quoted}", request_reason)
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        on_b.process_data_events(time_limit=5)
    assert (closed.value.reply_code, closed.value.reply_text) == \
        (320, "CONNECTION_FORCED - go away")
    # gone once b has closed the socket (a round trip later when a wire worker holds it)
    deadline = time.monotonic() + 5
    while api(a, "GET", f"/api/connections/{quoted}")[0] != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert api(a, "DELETE", f"/api/connections/{quoted}")[0] == 404


def api_with_headers(node: ClusterNode, method: str, path: str,
                     headers: dict[str, str]) -> tuple[int, object]:
    request = Request(f"http://127.0.0.1:{node.management_port}{path}", method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    for key, value in headers.items():
        request.add_header(key, value)
    with urlopen(request, timeout=15) as response:
        return response.status, None
