"""Definitions export and import (broker/access/definitions.py) on a node composed without
listeners: a real RabbitMQ 3.10 export loads (tests/fixtures/README.md), what is exported has
RabbitMQ's shape and loads into another node as the same state, and a document that cannot
load says why in one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from leveret.broker.access.definitions import (
    DefinitionsError,
    export_all,
    export_vhost,
    import_definitions,
    load_file,
)
from leveret.broker.broker import Broker
from leveret.broker.process.config import Config

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "rabbitmq-3.10-definitions.json"


def rabbitmq_export() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def other_broker(tmp_path: Path) -> Broker:
    (tmp_path / "other").mkdir()
    return Broker(Config(data_dir=tmp_path / "other", port=0, node_name="other"),
                  asyncio.get_running_loop())


async def test_a_rabbitmq_export_loads(local_broker: Broker) -> None:
    await import_definitions(local_broker, rabbitmq_export())
    users = local_broker.users
    assert set(local_broker.vhosts) == {"/", "billing"}
    assert set(users.users) == {"guest", "alice", "monitor", "app", "bob", "x"}
    assert users.authenticate("alice", "alice-secret") is not None  # SHA-256, from RabbitMQ
    assert users.authenticate("bob", "bob-secret") is not None  # SHA-512
    assert users.users["alice"].tags == ["management", "policymaker"]
    assert users.users["app"].permissions["billing"].write == "^invoices"
    root = local_broker.vhosts["/"]
    assert root.queues["events.audit"].type == "stream"
    assert root.queues["payments"].type == "quorum"  # RabbitMQ's quorum queue loads as one
    assert root.exchanges["internal.audit"].internal
    assert {b.destination.name for b in root.exchanges["orders"].bindings.values()} == {
        "orders.created", "internal.audit"}
    assert set(root.policies) == {"events-retention", "dlx"}


async def test_loading_the_same_export_twice_changes_nothing(local_broker: Broker) -> None:
    await import_definitions(local_broker, rabbitmq_export())
    first = export_all(local_broker)
    await import_definitions(local_broker, rabbitmq_export())
    again = export_all(local_broker)
    for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"):
        assert sorted(map(json.dumps, again[key])) == sorted(map(json.dumps, first[key])), key


async def test_the_export_leaves_out_what_does_not_survive_or_is_predeclared(
        local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    vhost.declare_exchange("x", "topic", durable=True)
    vhost.declare_queue("kept", owner=None, durable=True, arguments={"x-max-length": 10})
    connection = object()
    vhost.declare_queue("mine", owner=connection, exclusive=True)
    vhost.bind("x", "queue", "kept", "a.#", {})
    vhost.bind("x", "queue", "mine", "b.#", {}, owner=connection)
    exported = export_all(local_broker)
    assert [q["name"] for q in exported["queues"]] == ["kept"]
    assert exported["queues"][0] == {"name": "kept", "vhost": "/", "durable": True,
                                     "auto_delete": False, "type": "classic",
                                     "arguments": {"x-max-length": 10}}
    assert [x["name"] for x in exported["exchanges"]] == ["x"]  # not "" nor amq.*
    assert [(b["source"], b["destination"], b["routing_key"]) for b in exported["bindings"]] == [
        ("x", "kept", "a.#")]
    guest = next(u for u in exported["users"] if u["name"] == "guest")
    assert guest["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert local_broker.users.authenticate("guest", "guest") is not None
    assert exported["permissions"] == [{"user": "guest", "vhost": "/", "configure": ".*",
                                        "write": ".*", "read": ".*"}]


async def test_a_vhosts_export_has_no_vhost_keys_and_loads_into_another_vhost(
        local_broker: Broker) -> None:
    await import_definitions(local_broker, rabbitmq_export())
    billing = export_vhost(local_broker, "billing")
    assert {"users", "vhosts", "permissions"}.isdisjoint(billing)
    for key in ("queues", "exchanges", "bindings", "policies"):
        assert billing[key] and not [item for item in billing[key] if "vhost" in item], key
    local_broker.add_vhost("staging")
    await import_definitions(local_broker, billing, vhost="staging")
    staging = export_vhost(local_broker, "staging")
    for key in ("queues", "exchanges", "bindings", "policies"):
        assert sorted(map(json.dumps, staging[key])) == sorted(map(json.dumps, billing[key])), key


async def test_an_export_loads_into_another_node_as_the_same_state(local_broker: Broker,
                                                                    tmp_path: Path) -> None:
    await import_definitions(local_broker, rabbitmq_export())
    exported = export_all(local_broker)
    other = other_broker(tmp_path)
    try:
        await import_definitions(other, json.loads(json.dumps(exported)))
        again = export_all(other)
        for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges",
                    "bindings"):
            assert sorted(map(json.dumps, again[key])) == sorted(map(json.dumps, exported[key])), \
                key
        assert other.users.authenticate("bob", "bob-secret") is not None
    finally:
        other.close()


async def test_imported_state_is_in_the_metadata_store(local_broker: Broker) -> None:
    await import_definitions(local_broker, rabbitmq_export())
    config = local_broker.config
    local_broker.close()
    reopened = Broker(config, asyncio.get_running_loop())
    try:
        assert reopened.users.authenticate("bob", "bob-secret") is not None
        assert reopened.vhosts["/"].queues["events.audit"].type == "stream"
        assert reopened.vhosts["billing"].policies["mirror"].priority == 1
    finally:
        reopened.close()


@pytest.mark.parametrize("tags", ["administrator,management", ["administrator", "management"]])
async def test_tags_as_a_string_or_a_list_and_plain_passwords(local_broker: Broker,
                                                              tags: Any) -> None:
    await import_definitions(local_broker, {
        "users": [{"name": "carol", "password": "c-pw", "tags": tags}],
        "permissions": [{"user": "carol", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"},
                        {"user": "ghost", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "topic_permissions": [{"user": "carol", "vhost": "/", "exchange": "amq.topic",
                               "write": ".*", "read": ".*"}],
        "global_parameters": [{"name": "cluster_name", "value": "x"}],
    })
    carol = local_broker.users.authenticate("carol", "c-pw")
    assert carol is not None and carol.tags == ["administrator", "management"]
    assert "/" in carol.permissions and "ghost" not in local_broker.users.users


@pytest.mark.parametrize(("data", "vhost", "text"), [
    ([1, 2], None, "definitions must be a JSON object"),
    ({"queues": {"name": "q"}}, None, '"queues" must be a list'),
    ({"users": [{"password": "pw"}]}, None, "a user without a name"),
    ({"vhosts": [{"description": "x"}]}, None, "a vhost without a name"),
    ({"queues": [{"name": "q", "durable": True}]}, None, "'q' names no vhost"),
    ({"queues": [{"name": "q", "vhost": "ghost", "durable": True}]}, None,
     'Please create virtual host "ghost" prior to importing definitions.'),
    ({"queues": []}, "ghost", 'Please create virtual host "ghost" prior to importing '
                              "definitions."),
    ({"queues": [{"name": "q", "vhost": "/", "durable": False,
                  "arguments": {"x-queue-type": "stream"}}]}, None,
     "invalid property 'non-durable' for queue 'q' in vhost '/'"),
])
async def test_a_document_that_cannot_load_says_why(local_broker: Broker, data: Any,
                                                    vhost: str | None, text: str) -> None:
    with pytest.raises(DefinitionsError) as raised:
        await import_definitions(local_broker, data, vhost)
    assert str(raised.value) == text


async def test_a_clash_with_what_exists_is_the_models_406_text(local_broker: Broker) -> None:
    local_broker.vhosts["/"].declare_queue("jobs", owner=None, durable=True)
    with pytest.raises(DefinitionsError) as raised:
        await import_definitions(local_broker, {"queues": [
            {"name": "jobs", "vhost": "/", "durable": False, "auto_delete": False,
             "arguments": {}}]})
    assert str(raised.value).startswith("inequivalent arg 'durable' for queue 'jobs'")


async def test_what_leveret_does_not_hold_is_skipped_not_refused(local_broker: Broker) -> None:
    await import_definitions(local_broker, {
        "exchanges": [{"name": "amq.direct", "vhost": "/", "type": "direct"},
                      {"name": "fed", "vhost": "/", "type": "x-federation-upstream"}],
        "queues": [{"name": "amq.q", "vhost": "/", "durable": True},
                   {"name": "qq", "vhost": "/", "durable": True,
                    "arguments": {"x-queue-type": "quorum"}}],
        "bindings": [{"source": "nowhere", "vhost": "/", "destination": "qq",
                      "destination_type": "queue", "routing_key": "k"}],
    })
    vhost = local_broker.vhosts["/"]
    assert "fed" not in vhost.exchanges
    assert "amq.q" not in vhost.queues  # a reserved name: skipped
    assert vhost.queues["qq"].type == "quorum"  # quorum queues are held now


async def test_a_file_that_cannot_load_names_itself(local_broker: Broker,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"users": [{"password": "pw"}]}')
    missing = tmp_path / "missing.json"
    for path, text in ((bad, f"definitions file {bad} is not valid JSON: "),
                       (missing, f"definitions file not found: {missing}"),
                       (wrong, f"cannot load definitions file {wrong}: a user without a name")):
        with pytest.raises(DefinitionsError) as raised:
            await load_file(local_broker, path)
        assert str(raised.value).startswith(text)
        assert "\n" not in str(raised.value)
