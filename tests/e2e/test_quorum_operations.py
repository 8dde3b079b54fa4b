"""A quorum queue on one node, as the operator sees it: its fields in the management API
(RabbitMQ's names, and against RabbitMQ 3.10.8's where they agree), its figures in RabbitMQ's
Prometheus names, and the HTTP paths `leveret-queues` calls (RabbitMQ's where RabbitMQ has
them). The CLI itself, and all of this on a three-node cluster: tests/cli/test_queues_cli.py."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.amqp import connect
from support.brokers import BrokerProcess, InProcessBroker
from support.management import Http, q
from support.ports import free_port
from support.reference import Reference

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def http(managed_broker: InProcessBroker) -> Http:
    return Http.of(managed_broker)


def declare(port: int | str, name: str, **arguments: Any) -> None:
    conn = connect(port) if isinstance(port, int) else pika.BlockingConnection(
        pika.URLParameters(port))
    conn.channel().queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    conn.close()


def publish(port: int, name: str, bodies: list[bytes], **props: Any) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(**props))
    conn.close()


# -- the management API's fields ----------------------------------------------------------------


def test_a_quorum_queue_shows_its_leader_members_and_limits(
        managed_broker: InProcessBroker, http: Http) -> None:
    port, node = managed_broker.port, managed_broker.config.node_name
    declare(port, "qq", **{"x-delivery-limit": 5})
    declare(port, "plain")
    publish(port, "qq", [b"hello", b"world"])
    view = http.ok(f"/api/queues/{q('/')}/qq")
    assert view["type"] == "quorum" and view["durable"] is True
    assert view["node"] == view["leader"] == node
    assert view["members"] == view["online"] == [node]
    assert view["state"] == "running"
    assert view["delivery_limit"] == 5
    assert (view["messages"], view["messages_ready"], view["message_bytes"]) == (2, 2, 10)
    assert (view["messages_dlx"], view["message_bytes_dlx"]) == (0, 0)
    assert view["arguments"] == {"x-delivery-limit": 5, "x-queue-type": "quorum"}
    # the default limit (20), and a policy's lower one wins over the argument's, as RabbitMQ's
    assert http.ok(f"/api/queues/{q('/')}/plain")["delivery_limit"] == 20
    assert http.put(f"/api/policies/{q('/')}/limit", {
        "pattern": "^(qq|plain)$", "apply-to": "quorum_queues",
        "definition": {"delivery-limit": 3}}).status in (201, 204)
    assert http.ok(f"/api/queues/{q('/')}/qq")["delivery_limit"] == 3
    assert http.ok(f"/api/queues/{q('/')}/plain")["delivery_limit"] == 3
    listed = {x["name"]: x for x in http.ok("/api/queues")}
    assert listed["qq"]["leader"] == node and listed["qq"]["members"] == [node]


def test_held_dead_letters_are_messages_dlx(managed_broker: InProcessBroker, http: Http) -> None:
    """At least once, a dead letter whose target has not confirmed it stays in the queue:
    RabbitMQ's `messages_dlx` and `message_bytes_dlx` count it."""
    port = managed_broker.port
    conn = connect(port)
    ch = conn.channel()
    ch.exchange_declare("nowhere", "fanout")  # routes to no queue: never confirmed
    conn.close()
    declare(port, "held", **{"x-dead-letter-exchange": "nowhere",
                             "x-dead-letter-strategy": "at-least-once",
                             "x-overflow": "reject-publish"})
    publish(port, "held", [b"poison"])
    conn = connect(port)
    ch = conn.channel()
    method, _props, _body = ch.basic_get("held")
    ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    view = http.ok(f"/api/queues/{q('/')}/held")
    assert (view["messages_dlx"], view["message_bytes_dlx"]) == (1, 6)
    assert view["messages"] == 0
    unlimited = {"x-delivery-limit": -1}
    declare(port, "unlimited", **unlimited)
    assert http.ok(f"/api/queues/{q('/')}/unlimited")["delivery_limit"] == "unlimited"


# -- RabbitMQ's Prometheus names ----------------------------------------------------------------


def scrape(http: Http, path: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = http.get(path, auth=False)
    assert reply.status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(reply.text) for s in f.samples}


def test_delivery_limit_and_raft_figures_in_rabbitmq_names(
        managed_broker: InProcessBroker, http: Http) -> None:
    port = managed_broker.port
    declare(port, "poison", **{"x-delivery-limit": 0})
    publish(port, "poison", [b"p1", b"p2"])
    conn = connect(port)
    ch = conn.channel()
    for _ in range(2):  # rejected with requeue past a limit of 0: dropped (no DLX)
        method, _props, _body = ch.basic_get("poison")
        ch.basic_reject(method.delivery_tag, requeue=True)
    conn.close()
    key = ("rabbitmq_global_messages_dead_lettered_delivery_limit_total",
           (("dead_letter_strategy", "disabled"), ("queue_type", "rabbit_quorum_queue")))
    assert scrape(http, "/metrics")[key] == 2
    per_object = scrape(http, "/metrics/per-object")
    assert per_object[key] == 2
    labels = (("queue", "poison"), ("vhost", "/"))
    status = http.ok(f"/api/queues/quorum/{q('/')}/poison/status")[0]
    assert per_object[("rabbitmq_raft_commit_index", labels)] == status["Commit Index"]
    assert per_object[("rabbitmq_raft_last_written_index", labels)] == status["Last Written"]
    assert per_object[("rabbitmq_raft_last_applied", labels)] == status["Last Applied"]
    assert per_object[("rabbitmq_raft_term", labels)] == status["Term"]
    assert per_object[("rabbitmq_raft_snapshot_index", labels)] == status["Snapshot Index"]
    assert ("rabbitmq_raft_term", labels) not in scrape(http, "/metrics")  # per object only
    assert per_object[("rabbitmq_queue_info", (
        ("membership", "leader"), ("queue", "poison"), ("queue_type", "rabbit_quorum_queue"),
        ("vhost", "/")))] == 1


# -- the paths leveret-queues calls ---------------------------------------------------------------


def test_quorum_status_peek_and_health_on_one_node(
        managed_broker: InProcessBroker, http: Http) -> None:
    port, node = managed_broker.port, managed_broker.config.node_name
    declare(port, "qq")
    publish(port, "qq", [b"first", b"second"], headers={"k": "v"}, message_id="m")
    publish(port, "qq", [b"urgent"], priority=9)  # strict priorities: it goes first
    [row] = http.ok(f"/api/queues/quorum/{q('/')}/qq/status")
    assert row["Node Name"] == node and row["Raft State"] == "leader"
    assert row["Membership"] == "voter"
    assert row["Last Log Index"] == row["Commit Index"] == row["Last Applied"] >= 2
    assert row["Snapshot Index"] == -1  # no snapshot yet
    peeked = http.ok(f"/api/leveret/queues/{q('/')}/qq/peek/2")
    assert peeked["node"] == node
    assert peeked["message"] == [["message_id", "m"], ["routing_keys", ["qq"]],
                                 ["exchange", ""], ["payload (max 64 bytes)", "first"],
                                 ["header.k", "v"], ["header.x-delivery-count", 0]]
    assert http.ok(f"/api/leveret/queues/{q('/')}/qq/peek/1")["message"][0] == ["priority", 9]
    conn = connect(port)  # a requeued message goes before every priority (RabbitMQ 4.3)
    ch = conn.channel()
    assert ch.basic_get("qq", auto_ack=True)[2] == b"urgent"
    method, _props, body = ch.basic_get("qq")
    assert body == b"first"
    ch.basic_nack(method.delivery_tag, requeue=True)
    conn.close()
    publish(port, "qq", [b"urgent"], priority=9)
    payloads = [dict(map(tuple, http.ok(f"/api/leveret/queues/{q('/')}/qq/peek/{i}")["message"]))
                ["payload (max 64 bytes)"] for i in (1, 2, 3)]
    assert payloads == ["first", "urgent", "second"]
    assert http.get(f"/api/leveret/queues/{q('/')}/qq/peek/4").body["reason"] == \
        "Target queue does not have a message at that position"
    conn = connect(port)  # peek takes nothing
    assert conn.channel().queue_declare("qq", passive=True).method.message_count == 3
    conn.close()
    assert http.ok("/api/health/checks/node-is-quorum-critical") == {
        "status": "ok", "reason": "single node cluster", "node": node}
    assert http.get(f"/api/queues/quorum/{q('/')}/nope/status").status == 404


def test_the_snapshot_index_is_what_the_last_snapshot_covers(tmp_path: Any) -> None:
    """A real `leveret serve`: no snapshot, -1; a SIGTERM writes one covering every record, so
    after the restart the Snapshot Index is the Last Log Index; records written since are
    not covered (broker/model/snapshot.py: a snapshot covers the offsets below its S)."""
    management = free_port()
    broker = BrokerProcess(tmp_path / "data", args=["--management-port", str(management)])
    http = Http(management)
    status = f"/api/queues/quorum/{q('/')}/qq/status"

    def status_row() -> dict[str, Any]:
        deadline = time.monotonic() + 15
        while True:  # (the management listener opens after the AMQP one)
            try:
                [row] = http.ok(status)
                return row  # type: ignore[no-any-return]
            except urllib.error.URLError:
                assert time.monotonic() < deadline
                time.sleep(0.1)

    broker.start()
    try:
        declare(broker.url, "qq")
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for body in (b"a", b"b", b"c"):
                ch.basic_publish("", "qq", body)
            ch.basic_ack(ch.basic_get("qq")[0].delivery_tag)  # (an ack record too)
        row = status_row()
        assert row["Snapshot Index"] == -1 and row["Last Log Index"] >= 3
        assert broker.stop() == 0
        broker.start()
        row = status_row()
        covered = row["Last Log Index"]
        assert row["Snapshot Index"] == covered >= 3
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "qq", b"d")
        row = status_row()
        assert row["Snapshot Index"] == covered < row["Last Log Index"]
    finally:
        broker.kill()


def test_a_long_queue_is_peeked_past_its_page_in_memory(
        managed_broker: InProcessBroker, http: Http) -> None:
    """Most of a long quorum queue waits in its log, not in memory: a peek reads it there."""
    port = managed_broker.port
    declare(port, "long")
    publish(port, "long", [b"m%d" % i for i in range(3000)])
    for position in (1, 1500, 3000):
        fields = dict(map(tuple, http.ok(f"/api/leveret/queues/{q('/')}/long/peek/{position}")
                          ["message"]))
        assert fields["payload (max 64 bytes)"] == f"m{position - 1}"
    assert http.get(f"/api/leveret/queues/{q('/')}/long/peek/3001").status == 400


def test_member_changes_on_one_node_say_why(managed_broker: InProcessBroker, http: Http) -> None:
    node = managed_broker.config.node_name
    declare(managed_broker.port, "qq")
    base = f"/api/queues/quorum/{q('/')}/qq/replicas"
    assert http.post(base + "/add", {"node": node}).status == 204  # already a member: done
    reply = http.post(base + "/add", {"node": "elsewhere"})
    assert (reply.status, reply.body["reason"]) == (
        400, "node_not_running: node 'elsewhere' is not a running node of this cluster")
    reply = http.call("DELETE", base + "/delete", {"node": node})
    assert (reply.status, reply.body["reason"]) == (
        400, "last_node: the last node cannot be removed")
    assert http.call("DELETE", base + "/delete", {"node": "elsewhere"}).status == 202
    assert http.post(base + "/add", {"node": node, "membership": "x"}).body["reason"] == \
        "voter status 'x' is not recognised."
    assert http.as_user("nobody", "x").post(base + "/add", {"node": node}).status == 401


# -- against RabbitMQ 3.10.8 --------------------------------------------------------------------


@pytest.fixture
def rabbitmq_api(stream_reference: Reference) -> tuple[str, Http]:
    """The shared reference RabbitMQ's AMQP URL and its management API."""
    return stream_reference.url, Http(stream_reference.management_port)


SHARED = ("type", "durable", "auto_delete", "exclusive", "arguments", "state", "messages",
          "messages_ready", "messages_unacknowledged", "message_bytes", "messages_dlx",
          "message_bytes_dlx", "messages_ram", "message_bytes_ram", "consumers", "policy")


@pytest.mark.reference
def test_management_fields_as_rabbitmq_3_10(managed_broker: InProcessBroker,
                                            rabbitmq_api: tuple[str, Http]) -> None:
    """The same quorum queue with the same two messages, in both APIs: the shared fields agree,
    and `node`, `leader`, `members` and `online` name each broker's one node."""
    url, rabbit = rabbitmq_api
    name = f"qq-{time.monotonic_ns()}"
    views = []
    for http, target in ((rabbit, url), (Http.of(managed_broker), managed_broker.port)):
        declare(target, name, **{"x-delivery-limit": 5})
        conn = connect(target) if isinstance(target, int) else pika.BlockingConnection(
            pika.URLParameters(target))
        ch = conn.channel()
        ch.confirm_delivery()
        for body in (b"hello", b"world"):
            ch.basic_publish("", name, body)
        conn.close()
        deadline = time.monotonic() + 30  # RabbitMQ's figures come with its stats
        while "messages" not in (view := http.ok(f"/api/queues/{q('/')}/{name}")) \
                or view["messages"] != 2:
            assert time.monotonic() < deadline, view
            time.sleep(0.5)
        views.append(view)
    assert rabbit.call("DELETE", f"/api/queues/{q('/')}/{name}").status == 204
    theirs, ours = views
    assert {k: ours.get(k) for k in SHARED} == {k: theirs.get(k) for k in SHARED}
    for view in views:
        assert view["leader"] == view["node"]
        assert view["members"] == view["online"] == [view["node"]]
    assert "delivery_limit" not in theirs and ours["delivery_limit"] == 5  # RabbitMQ 4.x's
