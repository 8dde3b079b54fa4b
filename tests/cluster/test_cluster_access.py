"""Access control in cluster mode, with a real etcd, real `leveret serve` nodes, pika and the
management API: vhosts, users, permissions, policies and definitions written on one node are
in force on every node at once; defaults are made once per cluster; etcd down refuses changes
with a 503 and keeps serving what the nodes have."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAccessDeniedError, ProbableAuthenticationError
from support.brokers import BrokerProcess
from support.cluster import TTL_S, ClusterNode, make_node
from support.cluster_api import api, connect, ok, wait_linked
from support.etcd import EtcdServer
from support.ports import free_port


def start_nodes(tmp_path: Path, etcd_url: str, cluster: str, nodes: list[BrokerProcess],
                names: tuple[str, ...] = ("a", "b", "c"),
                extra: list[str] | None = None, password: str = "guest") -> list[ClusterNode]:
    started = []
    for name in names:
        node = make_node(tmp_path, etcd_url, cluster, name, management=True, extra=extra)
        nodes.append(node.start())
        started.append(node)
    wait_linked([n for n in nodes if isinstance(n, ClusterNode) and n.proc is not None
                 and n.proc.poll() is None], password=password)
    return started


def can_login(node: BrokerProcess, user: str, password: str, vhost: str = "/") -> bool:
    try:
        connect(node, user, password, vhost).close()
    except (ProbableAuthenticationError, ProbableAccessDeniedError):
        return False
    return True


def test_a_user_added_on_one_node_logs_in_on_another(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    assert not can_login(b, "alice", "s3cret")
    status, _ = api(a, "PUT", "/api/users/alice", {"password": "s3cret", "tags": "management"})
    assert status == 201
    status, _ = api(a, "PUT", "/api/permissions/%2F/alice",
                    {"configure": ".*", "write": ".*", "read": ".*"})
    assert status == 201
    assert can_login(b, "alice", "s3cret")  # at once: the -ok came after every node had it
    assert not can_login(b, "alice", "wrong")
    assert ok(b, "GET", "/api/users/alice")["tags"] == ["management"]
    status, _ = api(a, "PUT", "/api/users/alice", {"password": "other", "tags": "management"})
    assert status == 204
    assert not can_login(b, "alice", "s3cret") and can_login(b, "alice", "other")
    assert api(b, "DELETE", "/api/users/alice")[0] == 204
    assert not can_login(a, "alice", "other")
    assert api(a, "DELETE", "/api/users/alice")[0] == 404


def test_a_permission_changed_on_one_node_applies_to_a_new_connection_on_another(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b, c = start_nodes(tmp_path, etcd.url, cluster, nodes)
    ok(a, "PUT", "/api/users/bob", {"password": "pw", "tags": ""})
    assert not can_login(c, "bob", "pw")  # no permission on "/" yet: access refused
    ok(b, "PUT", "/api/permissions/%2F/bob", {"configure": "^bob-.*", "write": ".*",
                                                "read": ".*"})
    connection = connect(c, "bob", "pw")
    channel = connection.channel()
    channel.queue_declare("bob-q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare("other")
    assert refused.value.reply_code == 403
    connection.close()
    assert ok(a, "GET", "/api/permissions/%2F/bob")["configure"] == "^bob-.*"
    assert api(b, "DELETE", "/api/permissions/%2F/bob")[0] == 204
    assert not can_login(c, "bob", "pw")
    assert api(b, "DELETE", "/api/permissions/%2F/bob")[0] == 404
    status, body = api(a, "PUT", "/api/permissions/nowhere/bob",
                       {"configure": ".*", "write": ".*", "read": ".*"})
    assert (status, body["reason"]) == (400, "vhost_or_user_not_found")
    status, body = api(a, "PUT", "/api/permissions/%2F/bob",
                       {"configure": "(", "write": ".*", "read": ".*"})
    assert status == 400 and "configure should be regular expression" in body["reason"]


def test_a_vhost_created_on_one_node_is_usable_on_another_and_deleted_everywhere(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    assert api(a, "PUT", "/api/vhosts/v1", {"description": "first", "tags": "x,y"})[0] == 201
    assert api(a, "PUT", "/api/vhosts/v1", {"description": "again"})[0] == 204
    view = ok(b, "GET", "/api/vhosts/v1")
    assert (view["description"], view["tags"]) == ("again", [])
    # the creating user got full permissions on it, as RabbitMQ's put_vhost gives
    assert ok(b, "GET", "/api/permissions/v1/guest")["configure"] == ".*"
    connection = connect(b, vhost="v1")
    channel = connection.channel()
    channel.queue_declare("jobs")
    channel.basic_publish("", "jobs", b"hello")
    _method, _props, body = channel.basic_get("jobs", auto_ack=True)
    assert body == b"hello"
    assert {x["name"] for x in ok(a, "GET", "/api/exchanges/v1")} >= {"amq.direct", "amq.topic"}

    assert api(a, "DELETE", "/api/vhosts/v1")[0] == 204  # B closes its connections to it
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(time_limit=5)
        connection.channel()
    assert closed.value.reply_code == 320
    assert api(b, "GET", "/api/vhosts/v1")[0] == 404
    assert api(a, "DELETE", "/api/vhosts/v1")[0] == 404
    assert not can_login(b, "guest", "guest", "v1")
    assert api(a, "PUT", "/api/vhosts/v1", {})[0] == 201  # nothing of the old one is left
    assert ok(b, "GET", "/api/queues/v1") == []


def test_a_policy_set_on_one_node_applies_to_a_queue_on_another(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    """Leveret's policies act on streams (max-age, max-length-bytes); what a user sees of any
    queue is the policy in force and its definition, from the queue's own node."""
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    connection = connect(b)
    channel = connection.channel()
    channel.queue_declare("capped-1")
    status, _ = api(a, "PUT", "/api/policies/%2F/cap", {
        "pattern": "^capped-", "definition": {"max-length-bytes": 1000000},
        "apply-to": "queues", "priority": 3})
    assert status == 201
    view = ok(b, "GET", "/api/queues/%2F/capped-1")
    assert (view["node"], view["policy"]) == ("b", "cap")
    assert view["effective_policy_definition"] == {"max-length-bytes": 1000000}
    assert ok(b, "GET", "/api/policies/%2F/cap")["priority"] == 3
    assert api(a, "PUT", "/api/policies/%2F/cap", {
        "pattern": "^other-", "definition": {"max-age": "1h"}})[0] == 204
    assert ok(b, "GET", "/api/queues/%2F/capped-1")["policy"] is None
    assert api(a, "PUT", "/api/policies/%2F/cap", {
        "pattern": "^capped-", "definition": {"max-age": "1h"}})[0] == 204
    assert ok(b, "GET", "/api/queues/%2F/capped-1")["policy"] == "cap"
    assert api(b, "DELETE", "/api/policies/%2F/cap")[0] == 204
    assert ok(a, "GET", "/api/policies") == []
    assert ok(b, "GET", "/api/queues/%2F/capped-1")["policy"] is None
    connection.close()
    assert api(b, "DELETE", "/api/policies/%2F/cap")[0] == 404
    status, body = api(a, "PUT", "/api/policies/%2F/bad", {"pattern": ".*", "definition": {}})
    assert status == 400 and "no policy provided" in body["reason"]
    status, body = api(a, "PUT", "/api/policies/nowhere/p", {"pattern": ".*",
                                                             "definition": {"max-age": "1h"}})
    assert status == 404


def test_definitions_export_and_import_across_nodes(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b, c = start_nodes(tmp_path, etcd.url, cluster, nodes)
    ok(a, "PUT", "/api/users/carol", {"password_hash": "", "tags": ["monitoring"]})
    ok(a, "PUT", "/api/vhosts/shop", {"description": "the shop"})
    ok(a, "PUT", "/api/exchanges/shop/orders", {"type": "topic", "durable": True})
    ok(a, "PUT", "/api/queues/shop/eu", {"durable": True, "arguments": {"x-max-length": 10}})
    ok(a, "POST", "/api/bindings/shop/e/orders/q/eu", {"routing_key": "eu.#"})
    ok(a, "PUT", "/api/policies/shop/age", {"pattern": "^s", "definition": {"max-age": "1D"}})

    exported = ok(b, "GET", "/api/definitions")
    assert {"name": "carol", "password_hash": "", "hashing_algorithm":
            "rabbit_password_hashing_sha256", "tags": ["monitoring"], "limits": {}} in \
        exported["users"]
    assert {v["name"]: v["description"] for v in exported["vhosts"]} == \
        {"/": "", "shop": "the shop"}
    assert {(q["vhost"], q["name"], q["durable"]) for q in exported["queues"]} == \
        {("shop", "eu", True)}
    assert [q["arguments"] for q in exported["queues"]] == [{"x-max-length": 10}]
    assert {(x["name"], x["type"]) for x in exported["exchanges"]} == {("orders", "topic")}
    assert [(x["source"], x["destination"], x["routing_key"]) for x in exported["bindings"]] \
        == [("orders", "eu", "eu.#")]
    assert [p["name"] for p in exported["policies"]] == ["age"]

    document = {
        "users": [{"name": "dave", "password": "pw", "tags": "management"}],
        "vhosts": [{"name": "lab"}],
        "permissions": [{"user": "dave", "vhost": "lab", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "exchanges": [{"name": "results", "vhost": "lab", "type": "fanout", "durable": True}],
        "queues": [{"name": "samples", "vhost": "lab", "durable": True, "arguments": {}}],
        "bindings": [{"source": "results", "vhost": "lab", "destination": "samples",
                      "destination_type": "queue", "routing_key": "", "arguments": {}}],
        "policies": [{"vhost": "lab", "name": "p", "pattern": ".*", "apply-to": "all",
                      "definition": {"max-age": "1h"}, "priority": 0}],
    }
    assert api(c, "POST", "/api/definitions", document)[0] == 204
    queue = ok(a, "GET", "/api/queues/lab/samples")  # held by the importing node
    assert (queue["node"], queue["durable"], queue["policy"]) == ("c", True, "p")
    assert [b_["destination"] for b_ in ok(a, "GET", "/api/bindings/lab/e/results/q/samples")] \
        == ["samples"]
    assert can_login(a, "dave", "pw", "lab")

    status, body = api(c, "POST", "/api/definitions", {
        "queues": [{"name": "q", "vhost": "missing", "durable": True}]})
    assert status == 400
    assert body["reason"] == 'Please create virtual host "missing" prior to importing definitions.'
    status, body = api(c, "POST", "/api/definitions/lab", {
        "exchanges": [{"name": "results", "type": "direct", "durable": True}]})
    assert status == 400 and "inequivalent arg 'type'" in body["reason"]


def write_definitions(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_definitions_file_at_the_boot_of_a_fresh_cluster(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    path = write_definitions(tmp_path / "defs.json", {
        "users": [{"name": "app", "password": "pw", "tags": ""}],
        "vhosts": [{"name": "prod"}],
        "permissions": [{"user": "app", "vhost": "prod", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "queues": [{"name": "work", "vhost": "prod", "durable": True, "arguments": {}}],
    })
    (a,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a",),
                       extra=["--definitions", str(path)])
    (b,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("b",))
    assert {v["name"] for v in ok(b, "GET", "/api/vhosts")} == {"/", "prod"}
    assert [(q["name"], q["node"]) for q in ok(b, "GET", "/api/queues/prod")] == [("work", "a")]
    assert can_login(b, "app", "pw", "prod")
    assert can_login(b, "guest", "guest")  # the defaults, made before the file was loaded

    bad = make_node(tmp_path, etcd.url, cluster, "c", management=True, extra=[
        "--definitions", str(write_definitions(tmp_path / "bad.json", {
            "queues": [{"name": "q", "vhost": "nowhere", "durable": True}]}))])
    result = bad.run_to_exit()
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert lines == [f"error: cannot load definitions file {tmp_path / 'bad.json'}: Please "
                     'create virtual host "nowhere" prior to importing definitions.']
    assert {n["name"]: n["running"] for n in ok(a, "GET", "/api/nodes")}["c"] is False


def test_the_second_node_does_not_duplicate_or_overwrite_the_defaults(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    (a,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a",))
    ok(a, "PUT", "/api/users/guest", {"password": "changed", "tags": "administrator"})
    (b,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("b",), password="changed")
    assert not can_login(b, "guest", "guest")
    assert can_login(b, "guest", "changed")
    defs = ok(b, "GET", "/api/definitions", password="changed")
    assert [u["name"] for u in defs["users"]] == ["guest"]
    assert [v["name"] for v in defs["vhosts"]] == ["/"]
    assert len(defs["permissions"]) == 1


def test_etcd_down_refuses_changes_with_503_and_keeps_serving(
        tmp_path: Path, etcd_factory: Callable[[], EtcdServer], cluster: str,
        nodes: list[BrokerProcess]) -> None:
    etcd = etcd_factory()
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    ok(a, "PUT", "/api/users/erin", {"password": "pw", "tags": "management"})
    ok(a, "PUT", "/api/permissions/%2F/erin", {"configure": ".*", "write": ".*", "read": ".*"})
    etcd.stop()

    refused = [
        api(a, "PUT", "/api/users/ghost", {"password": "pw"}),
        api(b, "PUT", "/api/vhosts/ghost", {}),
        api(a, "DELETE", "/api/users/erin"),
        api(b, "PUT", "/api/permissions/%2F/erin", {"configure": "", "write": "", "read": ""}),
        api(a, "PUT", "/api/policies/%2F/ghost", {"pattern": ".*",
                                                  "definition": {"max-age": "1h"}}),
        api(b, "POST", "/api/definitions", {"vhosts": [{"name": "ghost"}]}),
        api(a, "PUT", "/api/queues/%2F/ghost", {"durable": True}),
    ]
    for status, body in refused:
        assert status == 503, (status, body)
        assert body["error"] == "service_unavailable"
        assert "refused" in body["reason"] and ("etcd" in body["reason"])
    # what the nodes have still serves: reads, logins, messaging
    assert {u["name"] for u in ok(b, "GET", "/api/users")} == {"guest", "erin"}
    assert [v["name"] for v in ok(a, "GET", "/api/vhosts")] == ["/"]
    connection = connect(b, "erin", "pw")
    channel = connection.channel()
    channel.basic_publish("amq.fanout", "", b"still here")
    connection.close()
    time.sleep(TTL_S + 1.5)  # the lease is lost: the node is out of the cluster, and says so
    status, body = api(a, "PUT", "/api/users/ghost", {"password": "pw"})
    assert (status, body["error"]) == (503, "service_unavailable")
    assert body["reason"] == ("this node has lost its etcd lease and is not in the cluster; "
                              "topology changes are refused until it rejoins")
    assert can_login(a, "erin", "pw")

    etcd.restart()
    for node in (a, b):  # nothing of the refused changes was written
        assert {u["name"] for u in ok(node, "GET", "/api/users")} == {"guest", "erin"}
        assert [v["name"] for v in ok(node, "GET", "/api/vhosts")] == ["/"]
        assert ok(node, "GET", "/api/policies") == []
        assert ok(node, "GET", "/api/permissions/%2F/erin")["configure"] == ".*"

    def accepted() -> bool:  # the nodes rejoin (a new lease) once etcd is back
        return api(a, "PUT", "/api/users/frank", {"password": "pw"})[0] == 201
    deadline = time.monotonic() + 20
    while not accepted():
        assert time.monotonic() < deadline, "changes still refused after etcd came back"
        time.sleep(0.5)
    assert can_login(b, "frank", "pw", "/") is False  # no permissions yet: refused, known
    assert ok(b, "GET", "/api/users/frank")["name"] == "frank"


def test_a_single_node_data_directory_joining_a_cluster_serves_the_clusters_access(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    (a,) = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a",))
    ok(a, "PUT", "/api/users/guest", {"password": "cluster-pw", "tags": "administrator"})
    single = ClusterNode(tmp_path / "b")  # no --etcd: a single node, with its own API
    single.management_port = free_port()
    single.args = ["--management-port", str(single.management_port)]
    single.start()
    ok(single, "PUT", "/api/users/local-only", {"password": "pw", "tags": "management"})
    ok(single, "PUT", "/api/vhosts/local-vhost", {})
    ok(single, "PUT", "/api/permissions/local-vhost/local-only",
       {"configure": ".*", "write": ".*", "read": ".*"})
    assert single.stop() == 0

    b = make_node(tmp_path, etcd.url, cluster, "b", management=True)  # the same data dir
    nodes.append(b.start())
    wait_linked([a, b], password="cluster-pw")
    assert {u["name"] for u in ok(b, "GET", "/api/users", password="cluster-pw")} == {"guest"}
    assert [v["name"] for v in ok(b, "GET", "/api/vhosts", password="cluster-pw")] == ["/"]
    assert not can_login(b, "local-only", "pw", "local-vhost")
    assert not can_login(b, "guest", "guest") and can_login(b, "guest", "cluster-pw")
    assert "a user this node restored is not in the cluster" in b.log()


def test_a_change_etcd_refuses_is_a_500_with_etcds_reason(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = start_nodes(tmp_path, etcd.url, cluster, nodes, ("a", "b"))
    status, body = api(a, "PUT", "/api/vhosts/huge", {"description": "x" * 2_000_000})
    assert (status, body["error"]) == (500, "internal_server_error")
    assert body["reason"].startswith("etcd refused the change:")
    assert "larger than max" in body["reason"]
    assert api(b, "GET", "/api/vhosts/huge")[0] == 404
