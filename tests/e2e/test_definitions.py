"""Definitions: RabbitMQ's JSON format out and in, through the API and at boot.

tests/fixtures/rabbitmq-3.10-definitions.json is a real export from RabbitMQ 3.10.8; see
tests/fixtures/README.md for how it was made (users alice/alice-secret, bob/bob-secret with a
SHA-512 hash, monitor/monitor-secret, app/app-secret, x created without one; super streams
invoices and regions).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika
import pytest
from support.amqp import connect, consume
from support.brokers import BrokerProcess, InProcessBroker
from support.management import Http, q
from support.ports import free_port

FIXTURE = Path(__file__).parent.parent / "fixtures" / "rabbitmq-3.10-definitions.json"
STREAM = {"x-queue-type": "stream"}


def rabbitmq_export() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def login(port: int, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return connect(port, credentials=pika.PlainCredentials(user, password), virtual_host=vhost)


def load_fixture(broker: InProcessBroker) -> None:
    reply = Http.of(broker).post("/api/definitions", rabbitmq_export())
    assert reply.status == 204, reply.text


def test_a_rabbitmq_export_loads(managed_broker: InProcessBroker) -> None:
    load_fixture(managed_broker)
    broker = managed_broker.broker
    assert set(broker.vhosts) == {"/", "billing"}
    users = broker.users.users
    assert set(users) == {"guest", "alice", "monitor", "app", "bob", "x"}
    assert users["alice"].tags == ["management", "policymaker"]
    assert users["alice"].permissions["/"].configure == r"^alice\."
    assert users["app"].permissions["billing"].write == "^invoices"
    # Hashes from RabbitMQ log in: SHA-256 (alice) and SHA-512 (bob).
    login(managed_broker.port, "bob", "bob-secret").close()
    conn = login(managed_broker.port, "app", "app-secret", "billing")
    conn.close()
    http = Http.of(managed_broker)
    assert http.as_user("alice", "alice-secret").get("/api/overview").status == 200
    root, billing = broker.vhosts["/"], broker.vhosts["billing"]
    assert root.exchanges["events"].arguments == {"alternate-exchange": "events.unrouted"}
    assert root.exchanges["internal.audit"].internal is True
    assert root.exchanges["tmp.autodelete"].auto_delete is True
    assert root.queues["events.audit"].type == "stream"
    assert root.queues["orders.created"].arguments["x-overflow"] == "reject-publish"
    payments = root.queues["payments"]  # a quorum queue, declared with its arguments
    assert payments.type == "quorum" and payments.arguments == {"x-delivery-limit": 5,
                                                                "x-queue-type": "quorum"}
    assert billing.queues["invoices.pending"].arguments == {"x-single-active-consumer": True}
    assert set(root.policies) == {"events-retention", "dlx"}
    assert billing.policies["mirror"].definition == {"ha-mode": "all",
                                                     "ha-sync-mode": "automatic"}
    assert root.queues["events.audit"].max_age_ms == 7 * 86400 * 1000  # the policy applies
    headers = [b for b in root.exchanges["events"].bindings.values()]
    assert headers[0].arguments == {"level": "high", "type": "audit", "x-match": "any"}
    assert {b.destination.name for b in root.exchanges["orders"].bindings.values()} == {
        "orders.created", "internal.audit"}
    # The super streams route to their partitions, in partition order.
    assert [q_.name for q_ in root.exchanges["invoices"].partitions()] == [
        "invoices-0", "invoices-1", "invoices-2"]
    assert [q_.name for q_ in root.exchanges["regions"].partitions()] == [
        "regions-amer", "regions-emea", "regions-apac"]
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("invoices", "2", b"invoice")
    ch.basic_publish("regions", "emea", b"region")
    assert ch.queue_declare("invoices-2", passive=True).method.message_count == 1
    assert ch.queue_declare("regions-emea", passive=True).method.message_count == 1
    conn.close()
    # Loading the same file again changes nothing.
    load_fixture(managed_broker)
    assert len(root.queues) == len([x for x in rabbitmq_export()["queues"]
                                    if x["vhost"] == "/"])


def test_export_round_trip(managed_broker: InProcessBroker, tmp_path: Path) -> None:
    load_fixture(managed_broker)
    http = Http.of(managed_broker)
    exported = http.ok("/api/definitions")
    assert exported["product_name"] == "Leveret"
    bob = next(u for u in exported["users"] if u["name"] == "bob")
    assert bob["hashing_algorithm"] == "rabbit_password_hashing_sha512"
    billing = next(v for v in exported["vhosts"] if v["name"] == "billing")
    assert billing["name"] == "billing"
    names = {(x["vhost"], x["name"]) for x in exported["queues"]}
    assert ("/", "events.audit") in names and ("/", "payments") in names
    # a quorum queue as RabbitMQ exports it: its arguments, its type among them
    payments = next(x for x in exported["queues"] if x["name"] == "payments")
    assert payments == {"name": "payments", "vhost": "/", "durable": True, "auto_delete": False,
                        "type": "quorum", "arguments": {"x-delivery-limit": 5,
                                                        "x-queue-type": "quorum"}}
    assert not any(x["name"].startswith("amq.") or x["name"] == ""
                   for x in exported["exchanges"])
    # A second broker loads Leveret's own export into the same state.
    other = InProcessBroker(tmp_path / "other", management_port=free_port()).start()
    try:
        other_http = Http.of(other)
        assert other_http.post("/api/definitions", exported).status == 204
        again = other_http.ok("/api/definitions")
        for key in ("users", "permissions", "policies", "queues", "exchanges", "bindings"):
            assert sorted(map(json.dumps, again[key])) == sorted(map(json.dumps, exported[key])), \
                key
        login(other.port, "bob", "bob-secret").close()
    finally:
        other.stop()


def test_per_vhost_export_and_import(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    load_fixture(managed_broker)
    billing = http.ok("/api/definitions/billing")
    assert set(billing) >= {"queues", "exchanges", "bindings", "policies"}
    assert billing["queues"] == [{"name": "invoices.pending", "durable": True,
                                  "auto_delete": False, "type": "classic",
                                  "arguments": {"x-single-active-consumer": True}}]
    assert http.put("/api/vhosts/staging").status == 201
    assert http.post("/api/definitions/staging", billing).status == 204
    staging = managed_broker.broker.vhosts["staging"]
    assert "invoices.pending" in staging.queues and "invoices.in" in staging.exchanges
    assert http.post("/api/definitions/nowhere", billing).status == 404


def test_import_errors_are_400s(managed_broker: InProcessBroker) -> None:
    http = Http.of(managed_broker)
    http.put(f"/api/queues/{q('/')}/jobs", {"durable": True})
    clash = http.post("/api/definitions", {"queues": [
        {"name": "jobs", "vhost": "/", "durable": False, "auto_delete": False,
         "arguments": {}}]})
    assert clash.status == 400
    assert "inequivalent arg 'durable'" in clash.body["reason"]
    missing = http.post("/api/definitions", {"queues": [
        {"name": "x", "vhost": "ghost", "durable": True, "arguments": {}}]})
    assert missing.body["reason"] == ('Please create virtual host "ghost" prior to importing '
                                      "definitions.")
    assert http.post("/api/definitions", raw=b"[1, 2]").status == 400


def test_imported_state_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = InProcessBroker(data, management_port=free_port()).start()
    load_fixture(first)
    first.stop()
    second = InProcessBroker(data).start()
    try:
        assert second.broker.vhosts["/"].queues["events.audit"].type == "stream"
        assert second.broker.vhosts["billing"].policies["mirror"].priority == 1
        login(second.port, "bob", "bob-secret").close()
    finally:
        second.stop()


def test_definitions_at_boot_in_process(tmp_path: Path) -> None:
    server = InProcessBroker(tmp_path / "data", definitions=FIXTURE).start()
    try:
        assert "billing" in server.broker.vhosts
        conn = login(server.port, "alice", "alice-secret")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "events.audit", b"boot")
        got = consume(conn.channel(), "events.audit", 1, arguments={"x-stream-offset": "first"})
        assert [b for _m, _p, b in got] == [b"boot"]
        conn.close()
    finally:
        server.stop()


def test_leveret_serve_definitions_flag(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", args=["--definitions", str(FIXTURE)])
    (tmp_path / "data").mkdir()
    proc.start()
    try:
        login(proc.port, "alice", "alice-secret").close()
    finally:
        assert proc.stop() == 0


def test_a_bad_definitions_file_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path, text in ((bad, f"definitions file {bad} is not valid JSON"),
                       (tmp_path / "missing.json", "definitions file not found")):
        result = subprocess.run(
            [sys.executable, "-m", "leveret.cli", "serve", "--port", str(free_port()),
             "--host", "127.0.0.1", "--management-port", "0", "--data-dir",
             str(tmp_path / "d"), "--definitions", str(path)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and text in errors[0], result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("tags", ["administrator,management", ["administrator", "management"]])
def test_tags_as_string_or_list_and_plain_passwords(managed_broker: InProcessBroker,
                                                    tags: Any) -> None:
    http = Http.of(managed_broker)
    assert http.post("/api/definitions", {
        "users": [{"name": "carol", "password": "c-pw", "tags": tags}],
        "permissions": [{"user": "carol", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "topic_permissions": [{"user": "carol", "vhost": "/", "exchange": "amq.topic",
                               "write": ".*", "read": ".*"}],
        "global_parameters": [{"name": "cluster_name", "value": "x"}],
    }).status == 204
    assert managed_broker.broker.users.users["carol"].tags == ["administrator", "management"]
    login(managed_broker.port, "carol", "c-pw").close()


def _keys(entries: list[dict[str, object]]) -> set[str]:
    """Every key the entries of one section use."""
    return {key for entry in entries for key in entry}


def test_the_export_has_rabbitmqs_format(reference, managed_broker: InProcessBroker) -> None:  # type: ignore[no-untyped-def]
    """The same topology on both brokers exports with every key RabbitMQ 3.10's export has, in
    every section (Leveret adds the newer top-level vhost description and tags, as 4.x does;
    values such as versions and hashes differ, keys do not)."""
    import json
    import urllib.request
    import uuid

    import pika

    name = f"defs-{uuid.uuid4().hex[:8]}"
    for port in (reference.port, managed_broker.port):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.exchange_declare(name, "topic", durable=True, arguments={"alternate-exchange": "ae"})
        ch.queue_declare(name, durable=True, arguments={"x-max-length": 10})
        ch.queue_bind(name, name, "a.#")
        conn.close()
    exported = json.loads(reference.ctl("export_definitions", "-"))
    port = managed_broker.config.management_port
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/definitions")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    ours = json.loads(urllib.request.urlopen(request, timeout=10).read())
    assert set(exported) <= set(ours)
    for section in ("users", "vhosts", "permissions", "queues", "exchanges", "bindings"):
        assert _keys(exported[section]) <= _keys(ours[section]), section
    theirs_queue = next(q for q in exported["queues"] if q["name"] == name)
    our_queue = next(q for q in ours["queues"] if q["name"] == name)
    for key in ("name", "vhost", "durable", "auto_delete", "arguments"):
        assert our_queue[key] == theirs_queue[key], key
    for entries in (exported["bindings"], ours["bindings"]):
        (binding,) = [b for b in entries if b["source"] == name]
        assert (binding["destination"], binding["routing_key"]) == (name, "a.#")
    for conn_port in (reference.port, managed_broker.port):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", conn_port))
        conn.channel().queue_delete(name)
        conn.channel().exchange_delete(name)
        conn.close()
