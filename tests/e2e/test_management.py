"""The management HTTP API against a real in-process broker: every endpoint, RabbitMQ's codes
and bodies, authentication, the streams extras, /metrics, and Debian's rabbitmqadmin."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.amqp import connect, consume, drain
from support.brokers import InProcessBroker
from support.management import Http, q

from leveret.broker.process.config import Config
from leveret.broker.server import Server, ServerError

STREAM = {"x-queue-type": "stream"}
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
RABBITMQADMIN = Path("/usr/lib/rabbitmq/lib/rabbitmq_server-3.10.8/plugins/"
                     "rabbitmq_management-3.10.8/priv/www/cli/rabbitmqadmin")


@pytest.fixture
def http(managed_broker: InProcessBroker) -> Http:
    return Http.of(managed_broker)


def publish(port: int, exchange: str, key: str, bodies: list[bytes],
            headers: list[dict[str, Any]] | None = None) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    for i, body in enumerate(bodies):
        props = pika.BasicProperties(headers=headers[i]) if headers else None
        ch.basic_publish(exchange, key, body, props)
    conn.close()


# -- authentication -----------------------------------------------------------------------------


def test_login_is_required_with_rabbitmq_answers(http: Http) -> None:
    reply = http.get("/api/overview", auth=False)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert reply.body == {"error": "not_authorised", "reason": "Login failed"}
    assert http.as_user("guest", "nope").get("/api/overview").status == 401
    assert http.as_user("ghost", "x").get("/api/vhosts").status == 401
    # /metrics needs no login, as RabbitMQ's Prometheus endpoint.
    assert http.get("/metrics", auth=False).status == 200


def test_tags_decide_what_a_user_may_do(http: Http) -> None:
    assert http.put("/api/users/plain", {"password": "p", "tags": ""}).status == 201
    assert http.put("/api/users/mon", {"password": "m", "tags": "monitoring"}).status == 201
    assert http.put("/api/users/mgr", {"password": "g", "tags": ["management"]}).status == 201
    assert http.put("/api/vhosts/other").status == 201
    assert http.put(f"/api/permissions/{q('/')}/mgr",
                    {"configure": "^mgr-", "write": ".*", "read": ".*"}).status == 201
    plain = http.as_user("plain", "p").get("/api/overview")
    assert (plain.status, plain.body["reason"]) == (401, "Not management user")
    monitor = http.as_user("mon", "m")
    assert {v["name"] for v in monitor.ok("/api/vhosts")} == {"/", "other"}
    denied = monitor.put("/api/vhosts/x")
    assert (denied.status, denied.body["reason"]) == (401, "Not administrator user")
    assert monitor.get("/api/users").status == 401
    manager = http.as_user("mgr", "g")
    assert [v["name"] for v in manager.ok("/api/vhosts")] == ["/"]
    assert manager.get("/api/queues/other").status == 401
    # Writes follow the user's configure pattern, as AMQP declares do.
    assert manager.put(f"/api/queues/{q('/')}/mgr-q", {"durable": True}).status == 201
    refused = manager.put(f"/api/queues/{q('/')}/other-q", {"durable": True})
    assert refused.status == 401
    assert refused.body["reason"] == ("access to queue 'other-q' in vhost '/' refused for "
                                      "user 'mgr'")
    # An administrator without permissions on a vhost cannot declare in it.
    assert http.put("/api/vhosts/locked").status == 201
    assert http.delete("/api/permissions/locked/guest").status == 204
    assert http.put("/api/queues/locked/q").status == 401


# -- overview, nodes --------------------------------------------------------------------------


def test_overview_and_nodes(managed_broker: InProcessBroker, http: Http) -> None:
    publish(managed_broker.port, "", "nowhere", [b"x"])
    conn = connect(managed_broker.port)
    conn.channel().queue_declare("depth", durable=True)
    publish(managed_broker.port, "", "depth", [b"1", b"2"])
    overview = http.ok("/api/overview")
    assert overview["product_name"] == "Leveret"
    assert overview["queue_totals"]["messages"] == 2
    assert overview["object_totals"]["queues"] == 1
    assert overview["object_totals"]["connections"] == 1
    assert {t["name"] for t in overview["exchange_types"]} == {
        "direct", "fanout", "topic", "headers", "x-consistent-hash",  # as RabbitMQ with its plugin
        "x-modulus-hash",  # in RabbitMQ's core since 4.3
        "x-delayed-message"}  # as RabbitMQ with the delayed-message plugin
    assert {t["name"]: t["description"] for t in overview["exchange_types"]}["x-modulus-hash"] \
        == "Modulus Hashing Exchange"
    assert overview["listeners"][0]["port"] == managed_broker.port
    nodes = http.ok("/api/nodes")
    assert len(nodes) == 1 and nodes[0]["running"] is True
    assert nodes[0]["mem_alarm"] is False and nodes[0]["disk_free"] > 0
    assert http.ok(f"/api/nodes/{q(nodes[0]['name'])}")["name"] == nodes[0]["name"]
    assert http.get("/api/nodes/rabbit@elsewhere").body == NOT_FOUND
    assert http.ok("/api/whoami") == {"name": "guest", "tags": ["administrator"]}
    assert http.ok(f"/api/aliveness-test/{q('/')}") == {"status": "ok"}
    assert http.ok("/api/healthchecks/node") == {"status": "ok"}
    assert http.ok("/api/health/checks/alarms") == {"status": "ok"}
    assert http.ok("/api/cluster-name") == {"name": nodes[0]["name"]}
    assert http.ok("/api/extensions") == []
    assert len(http.ok(f"/api/vhosts/{q('/')}/channels")) == 1
    assert http.get("/api/no/such/path").body == NOT_FOUND
    conn.close()


# -- vhosts, users, permissions ----------------------------------------------------------------


def test_vhost_lifecycle_deletes_queues_files_and_connections(
    managed_broker: InProcessBroker, http: Http
) -> None:
    created = http.put("/api/vhosts/billing", {"description": "Billing", "tags": "eu,prod"})
    assert created.status == 201
    assert http.put("/api/vhosts/billing", {"description": "Billing v2"}).status == 204
    view = http.ok("/api/vhosts/billing")
    assert view["description"] == "Billing v2" and view["metadata"]["description"] == "Billing v2"
    # The creator got full permissions, as RabbitMQ's put_vhost grants them.
    assert http.ok("/api/permissions/billing/guest")["configure"] == ".*"
    assert http.put("/api/queues/billing/ledger", {"durable": True, "arguments": STREAM}
                    ).status == 201
    stream = managed_broker.broker.vhosts["billing"].queues["ledger"]
    folder = stream.directory
    assert folder.is_dir()
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", managed_broker.port, virtual_host="billing"))
    assert http.delete("/api/vhosts/billing").status == 204
    assert http.get("/api/vhosts/billing").body == NOT_FOUND
    assert http.delete("/api/vhosts/billing").status == 404
    assert not folder.exists()
    with pytest.raises(pika.exceptions.AMQPError):
        drain(conn, lambda: False, 1.0)
        conn.channel()
    assert "billing" not in managed_broker.broker.users.users["guest"].permissions


def test_users_and_password_hashes(managed_broker: InProcessBroker, http: Http) -> None:
    assert http.put("/api/users/alice", {"password": "s3cret", "tags": "administrator"}
                    ).status == 201
    alice = http.ok("/api/users/alice")
    assert alice["tags"] == ["administrator"]
    assert alice["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert http.as_user("alice", "s3cret").get("/api/overview").status == 200
    # Updating tags only keeps the password.
    assert http.put("/api/users/alice", {"tags": ["management"]}).status == 204
    assert http.as_user("alice", "s3cret").ok("/api/whoami")["tags"] == ["management"]
    # A SHA-512 hash (as RabbitMQ can store) logs in over AMQP.
    import base64
    import hashlib
    salt = b"\x01\x02\x03\x04"
    sha512 = base64.b64encode(salt + hashlib.sha512(salt + b"bob-pw").digest()).decode()
    assert http.put("/api/users/bob", {
        "password_hash": sha512, "hashing_algorithm": "rabbit_password_hashing_sha512",
        "tags": "administrator"}).status == 201
    assert http.ok("/api/users/bob")["hashing_algorithm"] == "rabbit_password_hashing_sha512"
    assert http.put(f"/api/permissions/{q('/')}/bob", {"configure": ".*", "write": ".*",
                                                      "read": ".*"}).status == 201
    conn = connect(managed_broker.port, credentials=pika.PlainCredentials("bob", "bob-pw"))
    conn.close()
    bad = http.put("/api/users/carl", {"password_hash": "x", "hashing_algorithm": "md4"})
    assert bad.status == 400 and bad.body["error"] == "bad_request"
    assert {u["name"] for u in http.ok("/api/users")} == {"guest", "alice", "bob"}
    assert [u["name"] for u in http.ok("/api/users/without-permissions")] == ["alice"]
    assert http.delete("/api/users/alice").status == 204
    assert http.get("/api/users/alice").body == NOT_FOUND
    assert http.delete("/api/users/alice").status == 404


def test_permissions(http: Http) -> None:
    http.put("/api/users/app", {"password": "p", "tags": ""})
    path = f"/api/permissions/{q('/')}/app"
    assert http.put(path, {"configure": "", "write": "^in", "read": "^out"}).status == 201
    assert http.put(path, {"configure": "", "write": "^in", "read": ".*"}).status == 204
    assert http.ok(path) == {"user": "app", "vhost": "/", "configure": "", "write": "^in",
                             "read": ".*"}
    assert {(p["user"], p["vhost"]) for p in http.ok("/api/permissions")} == {
        ("guest", "/"), ("app", "/")}
    assert [p["user"] for p in http.ok(f"/api/vhosts/{q('/')}/permissions")] == ["guest", "app"]
    assert [p["vhost"] for p in http.ok("/api/users/app/permissions")] == ["/"]
    missing = http.put("/api/permissions/nohost/app", {"configure": ".*", "write": ".*",
                                                       "read": ".*"})
    assert (missing.status, missing.body) == (400, {"error": "bad_request",
                                                    "reason": "vhost_or_user_not_found"})
    assert http.put(path, {"configure": "(", "write": "", "read": ""}).status == 400
    assert http.delete(path).status == 204
    assert http.delete(path).status == 404


# -- policies ---------------------------------------------------------------------------------


def test_policies_and_stream_retention(managed_broker: InProcessBroker, http: Http) -> None:
    assert http.put(f"/api/queues/{q('/')}/events.audit",
                    {"durable": True, "arguments": {**STREAM, "x-max-age": "30D"}}).status == 201
    path = f"/api/policies/{q('/')}/retention"
    body = {"pattern": r"^events\.", "definition": {"max-age": "7D",
                                                   "max-length-bytes": 1000000},
            "priority": 3, "apply-to": "streams"}
    assert http.put(path, body).status == 201
    assert http.put(path, body).status == 204
    assert http.ok(path) == {"vhost": "/", "name": "retention", "pattern": r"^events\.",
                             "apply-to": "streams", "definition": body["definition"],
                             "priority": 3}
    queue = http.ok(f"/api/queues/{q('/')}/events.audit")
    assert queue["policy"] == "retention"
    assert queue["effective_policy_definition"] == body["definition"]
    stream = managed_broker.broker.vhosts["/"].queues["events.audit"]
    assert stream.max_age_ms == 7 * 86400 * 1000  # the policy wins over the argument
    assert [p["name"] for p in http.ok("/api/policies")] == ["retention"]
    assert [p["name"] for p in http.ok(f"/api/policies/{q('/')}")] == ["retention"]
    for bad in ({"pattern": "(", "definition": {"max-age": "1D"}},
                {"pattern": ".*", "definition": {}},
                {"pattern": ".*", "definition": {"max-age": "zz"}},
                {"pattern": ".*", "definition": {"max-age": "1D"}, "apply-to": "nope"}):
        reply = http.put(f"/api/policies/{q('/')}/bad", bad)
        assert reply.status == 400 and reply.body["error"] == "bad_request", bad
    assert http.delete(path).status == 204
    assert stream.max_age_ms == 30 * 86400 * 1000
    assert http.delete(path).status == 404
    assert http.get(path).body == NOT_FOUND


# -- exchanges, queues, bindings -----------------------------------------------------------------


def test_exchanges(http: Http) -> None:
    path = f"/api/exchanges/{q('/')}/shop"
    assert http.put(path, {"type": "topic", "durable": True}).status == 201
    assert http.put(path, {"type": "topic", "durable": True}).status == 204
    view = http.ok(path)
    assert {k: view[k] for k in ("name", "vhost", "type", "durable", "auto_delete",
                                 "internal", "arguments")} == {
        "name": "shop", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {}}
    inequivalent = http.put(path, {"type": "fanout", "durable": True})
    assert inequivalent.status == 400
    assert inequivalent.body["reason"] == ("inequivalent arg 'type' for exchange 'shop' in "
                                           "vhost '/': received 'fanout' but current is 'topic'")
    assert http.put(f"/api/exchanges/{q('/')}/amq.mine", {"type": "direct"}).status == 401
    unknown = http.put(f"/api/exchanges/{q('/')}/odd", {"type": "x-nope"})
    assert (unknown.status, unknown.body["reason"]) == (400, "unknown exchange type 'x-nope'")
    assert http.ok(f"/api/exchanges/{q('/')}/amq.default")["name"] == ""
    names = [x["name"] for x in http.ok(f"/api/exchanges/{q('/')}")]
    assert names[:2] == ["", "amq.direct"] and "shop" in names
    assert http.put(f"/api/queues/{q('/')}/orders", {"durable": True}).status == 201
    assert http.post(f"/api/bindings/{q('/')}/e/shop/q/orders", {"routing_key": "o.#"}
                     ).status == 201
    assert http.delete(path + "?if-unused=true").status == 400
    assert [b["destination"] for b in http.ok(path + "/bindings/source")] == ["orders"]
    assert http.ok(path + "/bindings/destination") == []
    assert http.delete(path).status == 204
    assert http.delete(path).status == 404
    assert http.get(path).body == NOT_FOUND


def test_publish_and_get_through_the_api(http: Http) -> None:
    http.put(f"/api/queues/{q('/')}/inbox", {"durable": True})
    routed = http.post(f"/api/exchanges/{q('/')}/amq.default/publish", {
        "routing_key": "inbox", "payload": "hello", "payload_encoding": "string",
        "properties": {"delivery_mode": 2, "headers": {"k": "v"}}})
    assert routed.body == {"routed": True}
    assert http.post(f"/api/exchanges/{q('/')}/amq.default/publish",
                     {"routing_key": "nowhere", "payload": ""}).body == {"routed": False}
    got = http.post(f"/api/queues/{q('/')}/inbox/get",
                    {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert got.status == 200
    assert got.body[0]["payload"] == "hello" and got.body[0]["properties"]["headers"] == {
        "k": "v"}
    assert http.ok(f"/api/queues/{q('/')}/inbox")["messages"] == 1  # requeued
    http.post(f"/api/queues/{q('/')}/inbox/get", {"count": 5, "ackmode": "ack_requeue_false"})
    assert http.ok(f"/api/queues/{q('/')}/inbox")["messages"] == 0


def test_queues(managed_broker: InProcessBroker, http: Http) -> None:
    path = f"/api/queues/{q('/')}/jobs"
    assert http.put(path, {"durable": "true", "arguments": {"x-max-length": 10}}).status == 201
    assert http.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 204
    inequivalent = http.put(path, {"durable": False, "arguments": {"x-max-length": 10}})
    assert (inequivalent.status, inequivalent.body["reason"]) == (
        400, "inequivalent arg 'durable' for queue 'jobs' in vhost '/': received 'false' but "
             "current is 'true'")
    assert http.put(f"/api/queues/{q('/')}/amq.q", {}).status == 401
    assert http.put("/api/queues/nohost/x", {}).body == {"error": "not_found",
                                                         "reason": "vhost_not_found"}
    publish(managed_broker.port, "", "jobs", [b"a", b"bb"])
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("jobs", lambda *a: None, consumer_tag="worker")
    drain(conn, lambda: http.ok(path)["messages_unacknowledged"] == 1)
    view = http.ok(path)
    assert (view["messages"], view["messages_ready"], view["messages_unacknowledged"]) == (
        2, 1, 1)
    assert view["consumers"] == 1 and view["type"] == "classic" and view["durable"] is True
    assert view["consumer_details"][0]["consumer_tag"] == "worker"
    assert view["message_stats"]["publish"] == 2
    assert [x["name"] for x in http.ok("/api/queues")] == ["jobs"]
    assert http.delete(path + "?if-unused=true").status == 400
    conn.close()
    assert http.delete(path + "/contents").status == 204
    assert http.ok(path)["messages"] == 0
    assert http.delete(path).status == 204
    assert http.get(path).body == NOT_FOUND
    assert http.delete(path).status == 404


def test_stream_queue_has_offsets_segments_and_bytes(
    managed_broker: InProcessBroker, http: Http
) -> None:
    path = f"/api/queues/{q('/')}/events"
    assert http.put(path, {"durable": True, "arguments": STREAM}).status == 201
    publish(managed_broker.port, "", "events", [b"e%d" % i for i in range(5)])
    view = http.ok(path)
    assert view["type"] == "stream" and view["messages"] == 5
    assert (view["first_offset"], view["last_offset"], view["committed_offset"]) == (0, 4, 4)
    assert view["segments"] == 1 and view["bytes"] > 0
    assert view["leader"] == view["node"] and view["members"] == [view["node"]]
    bad = http.put(f"/api/queues/{q('/')}/transient-stream",
                   {"durable": False, "arguments": STREAM})
    assert bad.status == 400 and "non-durable" in bad.body["reason"]


def test_bindings(http: Http) -> None:
    vh = q("/")
    http.put(f"/api/exchanges/{vh}/logs", {"type": "headers", "durable": True})
    http.put(f"/api/exchanges/{vh}/up", {"type": "topic", "durable": True})
    http.put(f"/api/queues/{vh}/errors", {"durable": True})
    created = http.post(f"/api/bindings/{vh}/e/logs/q/errors",
                        {"routing_key": "", "arguments": {"x-match": "any", "level": "error"}})
    assert created.status == 201 and created.headers["Location"].startswith(
        f"/api/bindings/{vh}/e/logs/q/errors/~")
    assert http.post(f"/api/bindings/{vh}/e/up/e/logs", {"routing_key": "a.#"}).status == 201
    listed = http.ok(f"/api/bindings/{vh}/e/logs/q/errors")
    assert len(listed) == 1 and listed[0]["arguments"] == {"x-match": "any", "level": "error"}
    key = listed[0]["properties_key"]
    assert http.ok(f"/api/bindings/{vh}/e/logs/q/errors/{q(key)}") == listed[0]
    all_bindings = http.ok("/api/bindings")
    assert {"source": "", "vhost": "/", "destination": "errors", "destination_type": "queue",
            "routing_key": "errors", "arguments": {}, "properties_key": "errors"} in all_bindings
    e2e = http.ok(f"/api/bindings/{vh}/e/up/e/logs")
    assert e2e[0]["properties_key"] == "a.%23"
    assert http.ok(f"/api/queues/{vh}/errors/bindings")[1]["source"] == "logs"
    assert http.post(f"/api/bindings/{vh}/e/logs/q/missing", {}).body == {
        "error": "not_found", "reason": "no queue 'missing' in vhost '/'"}
    assert http.get(f"/api/bindings/{vh}/e/logs/q/missing").status == 404
    assert http.delete(f"/api/bindings/{vh}/e/logs/q/errors/{q(key)}").status == 204
    assert http.delete(f"/api/bindings/{vh}/e/logs/q/errors/{q(key)}").status == 404
    assert http.delete(f"/api/bindings/{vh}/e/up/e/logs/{q('a.%23')}").status == 204
    assert http.ok(f"/api/bindings/{vh}/e/up/e/logs") == []


def test_list_queries_columns_sort_and_pages(http: Http) -> None:
    for name in ("b", "a", "c"):
        http.put(f"/api/queues/{q('/')}/{name}", {"durable": True})
    assert http.ok("/api/queues?columns=name,vhost&sort=name") == [
        {"name": n, "vhost": "/"} for n in ("a", "b", "c")]
    assert [x["name"] for x in http.ok("/api/queues?sort=name&sort_reverse=true")] == [
        "c", "b", "a"]
    page = http.ok("/api/queues?page=2&page_size=2&sort=name")
    assert (page["page"], page["page_count"], page["total_count"], page["item_count"]) == (
        2, 2, 3, 1)
    assert http.ok("/api/queues?name=^[ab]$&use_regex=true&columns=name&sort=name") == [
        {"name": "a"}, {"name": "b"}]
    assert http.ok("/api/overview?columns=queue_totals.messages") == {
        "queue_totals": {"messages": 0}}


# -- connections, channels, consumers ---------------------------------------------------------


def test_connections_channels_and_consumers(managed_broker: InProcessBroker, http: Http) -> None:
    conn = connect(managed_broker.port, client_properties={"connection_name": "billing-app"})
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("work", durable=True)
    ch.basic_publish("", "work", b"x")
    consumer_ch = conn.channel()
    consumer_ch.basic_qos(prefetch_count=7)
    consumer_ch.basic_consume("work", lambda *a: None, consumer_tag="w1")
    drain(conn, lambda: bool(http.ok("/api/consumers")))
    [connection] = http.ok("/api/connections")
    assert connection["user"] == "guest" and connection["vhost"] == "/"
    assert connection["channels"] == 2 and connection["protocol"] == "AMQP 0-9-1"
    assert connection["client_properties"]["connection_name"] == "billing-app"
    assert connection["port"] == managed_broker.port
    name = connection["name"]
    assert http.ok(f"/api/connections/{q(name)}")["name"] == name
    assert http.ok(f"/api/vhosts/{q('/')}/connections")[0]["name"] == name
    channels = http.ok("/api/channels")
    assert [c["number"] for c in channels] == [1, 2]
    assert channels[0]["confirm"] is True and channels[0]["message_stats"]["confirm"] == 1
    assert channels[1]["prefetch_count"] == 7 and channels[1]["consumer_count"] == 1
    assert http.ok(f"/api/channels/{q(channels[1]['name'])}")["number"] == 2
    assert len(http.ok(f"/api/connections/{q(name)}/channels")) == 2
    [consumer] = http.ok(f"/api/consumers/{q('/')}")
    assert consumer["consumer_tag"] == "w1" and consumer["queue"] == {"name": "work",
                                                                     "vhost": "/"}
    assert consumer["prefetch_count"] == 7 and consumer["ack_required"] is True
    assert consumer["channel_details"]["connection_name"] == name
    assert http.get("/api/connections/nope").body == NOT_FOUND
    closed = http.call("DELETE", f"/api/connections/{q(name)}",
                       headers={"X-Reason": "maintenance"})
    assert closed.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        drain(conn, lambda: False, 2.0)
    assert (info.value.reply_code, info.value.reply_text) == (
        320, "CONNECTION_FORCED - maintenance")


# -- streams extras ----------------------------------------------------------------------------


def test_stream_publishers_and_consumers(managed_broker: InProcessBroker, http: Http) -> None:
    http.put(f"/api/queues/{q('/')}/ledger", {"durable": True, "arguments": STREAM})
    publish(managed_broker.port, "", "ledger", [b"m%d" % i for i in range(6)],
            [{"x-stream-publisher-name": "writer-a", "x-stream-publishing-id": i + 1}
             for i in range(6)])
    assert http.ok(f"/api/stream/publishers/{q('/')}/ledger") == [{
        "queue": {"name": "ledger", "vhost": "/"}, "stream": "ledger", "vhost": "/",
        "reference": "writer-a", "last_publishing_id": 6}]
    assert http.get(f"/api/stream/publishers/{q('/')}/nope").status == 404
    conn = connect(managed_broker.port)
    consume(conn.channel(), "ledger", 4, prefetch=1, tag="reader-1",
            arguments={"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
    live = conn.channel()
    live.basic_qos(prefetch_count=2)
    live.basic_consume("ledger", lambda *a: None, consumer_tag="reader-2",
                       arguments={"x-stream-offset": 3})
    drain(conn, lambda: any(c["stream"]["offset"] >= 4 for c in http.ok("/api/consumers")))
    [consumer] = http.ok("/api/stream/consumers")
    assert consumer["subscription_id"] == "reader-2" and consumer["stream"] == "ledger"
    assert consumer["offset"] == 4 and consumer["offset_lag"] == 1
    tracking = http.ok(f"/api/leveret/streams/{q('/')}/ledger/tracking")
    assert tracking["consumers"] == [{"stream": "ledger", "vhost": "/", "reference": "reader-1",
                                      "stored_offset": 3}]
    assert tracking["publishers"][0]["last_publishing_id"] == 6
    [stream_conn] = http.ok(f"/api/stream/connections/{q('/')}")
    assert stream_conn["subscriptions"] == 1
    status = http.ok(f"/api/leveret/streams/{q('/')}/ledger/status")
    assert status["members"][0]["role"] == "writer"
    assert status["members"][0]["offset"] == 5 and status["members"][0]["readers"] == 1
    assert {"type": "offset", "reference": "reader-1", "value": 3} in status["tracking"]
    reset = f"/api/leveret/streams/{q('/')}/ledger/reset-offset"
    assert http.post(reset, {"reference": "reader-1"}).status == 204
    again = http.post(reset, {"reference": "reader-1"})
    assert again.body["reason"] == ("There is no stored offset for this reference, no need to "
                                    "reset")
    assert http.post(f"/api/leveret/streams/{q('/')}/gone/reset-offset",
                     {"reference": "r"}).body["reason"] == "The stream does not exist"
    conn.close()


def test_super_streams_over_http(managed_broker: InProcessBroker, http: Http) -> None:
    vh = q("/")
    assert http.put(f"/api/stream/super-streams/{vh}/invoices", {"partitions": 3}).status == 201
    assert http.put(f"/api/stream/super-streams/{vh}/regions", {
        "binding-keys": "amer, emea,apac", "arguments": {"max-age": "604800s"}}).status == 201
    both = http.put(f"/api/stream/super-streams/{vh}/x", {"partitions": 2, "binding-keys": "a"})
    assert both.body["reason"] == "Specify partitions or binding keys, not both"
    assert http.put(f"/api/stream/super-streams/{vh}/x", {}).body["reason"] == (
        "Must specify partitions or binding keys")
    assert http.put(f"/api/stream/super-streams/{vh}/x", {"partitions": 0}).body["reason"] == (
        "The partition number must be greater than 0")
    taken = http.put(f"/api/stream/super-streams/{vh}/invoices", {"partitions": 1})
    assert taken.body["reason"] == "there is already an exchange named invoices"
    exchange = http.ok(f"/api/exchanges/{vh}/invoices")
    assert exchange["arguments"] == {"x-super-stream": True}
    assert exchange["super_stream"]["partitions"] == ["invoices-0", "invoices-1", "invoices-2"]
    regions = http.ok(f"/api/leveret/super-streams/{vh}/regions")
    assert [p["name"] for p in regions["partitions"]] == ["regions-amer", "regions-emea",
                                                          "regions-apac"]
    partition = http.ok(f"/api/queues/{vh}/regions-emea")
    assert partition["arguments"]["x-max-age"] == "604800s"
    assert (partition["super_stream"], partition["partition_index"]) == ("regions", 1)
    assert len(http.ok("/api/leveret/super-streams")) == 2
    assert http.delete(f"/api/leveret/super-streams/{vh}/regions").status == 204
    assert http.get(f"/api/queues/{vh}/regions-amer").status == 404
    assert http.delete(f"/api/leveret/super-streams/{vh}/regions").status == 404


def test_restart_keeps_consumers_going(managed_broker: InProcessBroker, http: Http) -> None:
    http.put(f"/api/queues/{q('/')}/s", {"durable": True, "arguments": STREAM})
    publish(managed_broker.port, "", "s", [b"a", b"b"])
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[int] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append(p.headers["x-stream-offset"])
        c.basic_ack(m.delivery_tag)

    ch.basic_consume("s", on_message, arguments={"x-stream-offset": "first"})
    drain(conn, lambda: len(got) == 2)
    restarted = http.post(f"/api/leveret/streams/{q('/')}/s/restart")
    assert restarted.status == 200 and restarted.body["leader"].startswith("leveret@")
    assert http.ok(f"/api/leveret/streams/{q('/')}/s/status")["members"][0]["epoch"] == 2
    publish(managed_broker.port, "", "s", [b"c", b"d"])
    drain(conn, lambda: len(got) == 4)
    assert got == [0, 1, 2, 3]
    http.put(f"/api/queues/{q('/')}/plain", {"durable": True})
    classic = http.get(f"/api/leveret/streams/{q('/')}/plain/status")
    assert (classic.status, classic.body["reason"]) == (
        400, "Cannot get stream status of a classic queue")
    conn.close()


def test_consumer_groups(managed_broker: InProcessBroker, http: Http) -> None:
    http.put(f"/api/queues/{q('/')}/g", {"durable": True, "arguments": STREAM})
    conns = [connect(managed_broker.port) for _ in range(2)]
    for conn in conns:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume("g", lambda *a: None, consumer_tag="app",
                         arguments={"x-single-active-consumer": True})
    [group] = http.ok(f"/api/leveret/consumer-groups/{q('/')}")
    assert (group["stream"], group["reference"], group["consumers"]) == ("g", "app", 2)
    assert [m["state"] for m in group["members"]] == ["active", "inactive"]
    one = http.ok(f"/api/leveret/consumer-groups/{q('/')}/g/app")
    assert one["members"] == group["members"]
    assert http.get(f"/api/leveret/consumer-groups/{q('/')}/g/other").body["reason"] == (
        "The group does not exist")
    for conn in conns:
        conn.close()


# -- definitions over HTTP (the format is tested in test_definitions.py) ---------------------------


def test_definitions_endpoints(http: Http) -> None:
    http.put(f"/api/queues/{q('/')}/kept", {"durable": True})
    exported = http.ok("/api/definitions")
    assert [x["name"] for x in exported["queues"]] == ["kept"]
    vhost_only = http.ok(f"/api/definitions/{q('/')}")
    assert vhost_only["queues"] == [{"name": "kept", "durable": True, "auto_delete": False,
                                     "type": "classic",
                                     "arguments": {}}]
    assert http.post("/api/definitions", raw=b"{not json").status == 400
    assert http.get("/api/definitions/nohost").status == 404
    mon = http.put("/api/users/mon", {"password": "m", "tags": "monitoring"})
    assert mon.status == 201
    assert http.as_user("mon", "m").get("/api/definitions").status == 401


# -- metrics -----------------------------------------------------------------------------------


def metrics(http: Http) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics", auth=False).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_prometheus_scrape(managed_broker: InProcessBroker, http: Http) -> None:
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("jobs", durable=True)
    ch.queue_declare("log", durable=True, arguments=STREAM)
    for i in range(3):
        ch.basic_publish("", "jobs", b"j%d" % i)
    for i in range(5):
        ch.basic_publish("", "log", b"l%d" % i)
    consume(conn.channel(), "jobs", 2, prefetch=1)
    consume(conn.channel(), "log", 5, arguments={"x-stream-offset": "first"})
    reply = http.get("/metrics", auth=False)
    assert reply.headers["Content-Type"].startswith("text/plain")
    values = metrics(http)
    assert values[("leveret_messages_published_total", ())] == 8
    assert values[("leveret_messages_delivered_total", ())] >= 7
    assert values[("leveret_messages_confirmed_total", ())] == 8
    jobs = (("queue", "jobs"), ("type", "classic"), ("vhost", "/"))
    assert values[("leveret_queue_messages", jobs)] == 1
    assert values[("leveret_queue_messages_published_total", jobs)] == 3
    log = (("stream", "log"), ("vhost", "/"))
    assert values[("leveret_stream_first_offset", log)] == 0
    assert values[("leveret_stream_last_offset", log)] == 4
    assert values[("leveret_stream_committed_offset", log)] == 4
    assert values[("leveret_stream_segments", log)] == 1
    assert values[("leveret_connections", ())] == 1
    assert values[("leveret_channels", ())] >= 1
    assert values[("leveret_alarm", (("resource", "memory"),))] == 0
    assert values[("leveret_alarm", (("resource", "disk"),))] == 0
    # Counters never go back when their queue or channel goes away.
    ch.queue_delete("jobs")
    conn.close()
    after = metrics(http)
    assert after[("leveret_messages_published_total", ())] == 8
    assert after[("leveret_messages_confirmed_total", ())] == 8
    assert after[("leveret_connections", ())] == 0


# -- the server ----------------------------------------------------------------------------------


def test_management_port_taken_is_one_clear_error(tmp_path: Path) -> None:
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(Config(host="127.0.0.1", port=0, data_dir=tmp_path / "d",
                               management_port=port))

        async def start() -> str:
            try:
                await server.start()
            except ServerError as exc:
                return str(exc)
            return ""

        message = asyncio.run(start())
    assert message == (f"management port {port} on 127.0.0.1 is already in use; pass "
                       "--management-port (0 disables the management API)")


def test_management_port_zero_disables_the_api(broker: InProcessBroker) -> None:
    assert broker.server.management is None


# -- rabbitmqadmin ---------------------------------------------------------------------------------


@pytest.fixture
def rabbitmqadmin(managed_broker: InProcessBroker) -> Any:
    if not RABBITMQADMIN.exists():
        pytest.skip("Debian's rabbitmq-server (and its rabbitmqadmin) is not installed")

    def run(*args: str, ok: bool = True) -> str:
        proc = subprocess.run(
            [sys.executable, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P",
             str(managed_broker.config.management_port), *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": "/nonexistent"})
        if ok:
            assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout + proc.stderr

    return run


def test_rabbitmqadmin_declare_list_delete(managed_broker: InProcessBroker,
                                           rabbitmqadmin: Any) -> None:
    run = rabbitmqadmin
    assert "vhost declared" in run("declare", "vhost", "name=billing")
    assert "user declared" in run("declare", "user", "name=alice", "password=pw",
                                  "tags=management")
    assert "permission declared" in run("declare", "permission", "vhost=billing", "user=alice",
                                        "configure=.*", "write=.*", "read=.*")
    assert "exchange declared" in run("declare", "exchange", "name=shop", "type=topic")
    assert "queue declared" in run("declare", "queue", "name=orders", "durable=true")
    assert "queue declared" in run("declare", "queue", "name=events", "queue_type=stream")
    assert "binding declared" in run("declare", "binding", "source=shop",
                                     "destination=orders", "routing_key=order.#")
    assert "policy declared" in run("declare", "policy", "name=ttl", "pattern=^orders$",
                                    'definition={"message-ttl": 60000}', "apply-to=queues")
    assert "Message published" in run("publish", "exchange=shop", "routing_key=order.new",
                                      "payload=hello")
    vhost = managed_broker.broker.vhosts["/"]
    assert vhost.queues["events"].type == "stream"
    assert vhost.queues["orders"].message_count == 1
    conn = connect(managed_broker.port)
    queues = run("-f", "tsv", "-q", "list", "queues", "name", "messages")
    assert queues.splitlines() == ["orders\t1", "events\t0"]
    assert "shop\ttopic" in run("-f", "tsv", "-q", "list", "exchanges", "name", "type")
    assert "shop\torders\torder.#" in run("-f", "tsv", "-q", "list", "bindings")
    assert "alice" in run("list", "users")
    assert "billing" in run("list", "vhosts")
    assert "guest" in run("-f", "tsv", "-q", "list", "connections", "user")
    assert "ttl" in run("list", "policies")
    assert "alice" in run("list", "permissions")
    assert "No items" in run("list", "consumers")
    assert "No items" in run("list", "parameters")
    assert "leveret@" in run("list", "nodes")
    assert "cluster_name" in run("show", "overview")
    assert "order.new" in run("get", "queue=orders")
    assert "binding deleted" in run("delete", "binding", "source=shop",
                                    "destination_type=queue", "destination=orders",
                                    "properties_key=order.%23")
    assert "queue deleted" in run("delete", "queue", "name=orders")
    assert "exchange deleted" in run("delete", "exchange", "name=shop")
    assert "policy deleted" in run("delete", "policy", "name=ttl")
    assert "permission deleted" in run("delete", "permission", "vhost=billing", "user=alice")
    assert "user deleted" in run("delete", "user", "name=alice")
    assert "vhost deleted" in run("delete", "vhost", "name=billing")
    assert "Not found: /api/queues/%2F/orders" in run("delete", "queue", "name=orders",
                                                      ok=False)
    assert "orders" not in vhost.queues and "billing" not in managed_broker.broker.vhosts
    conn.close()


def test_rabbitmqadmin_export_and_import(managed_broker: InProcessBroker, rabbitmqadmin: Any,
                                         tmp_path: Path) -> None:
    rabbitmqadmin("declare", "queue", "name=keep", "durable=true")
    target = tmp_path / "defs.json"
    assert "Exported definitions" in rabbitmqadmin("export", str(target))
    rabbitmqadmin("delete", "queue", "name=keep")
    assert "Uploaded definitions" in rabbitmqadmin("import", str(target))
    assert "keep" in managed_broker.broker.vhosts["/"].queues
