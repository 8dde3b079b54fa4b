"""The SQLite metadata store (broker/metadata/store.py) in a temporary directory: what is
written is read back after the store is closed and opened again, argument tables keep their
AMQP types, deletes take what belongs to them, and a database that cannot be used says which
file it is."""

from __future__ import annotations

import datetime
import decimal
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leveret.broker.metadata.store import (
    SCHEMA_VERSION,
    Metastore,
    MetastoreError,
    dump_table,
    load_table,
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "metadata.sqlite3"


@pytest.fixture
def store(path: Path) -> Iterator[Metastore]:
    opened = Metastore(path)
    yield opened
    opened.close()


def reopened(store: Metastore) -> Metastore:
    store.close()
    return Metastore(store.path)


def rows(store: Metastore, table: str) -> list[dict[str, Any]]:
    return [dict(row) for row in store.rows(table)]


def test_a_new_database_is_fresh_and_an_existing_one_is_not(path: Path) -> None:
    first = Metastore(path)
    assert first.fresh and rows(first, "vhosts") == []
    first.close()
    again = Metastore(path)
    assert not again.fresh
    again.close()


def test_vhosts_users_and_permissions_come_back(store: Metastore) -> None:
    store.put_vhost("/")
    store.put_vhost("billing", "Billing", ["eu", "prod"])
    store.put_user("alice", "aGFzaA==", "rabbit_password_hashing_sha256", ["administrator"])
    store.put_permission("alice", "billing", "", "^in", ".*")
    store = reopened(store)
    try:
        vhosts = {r["name"]: (r["description"], json.loads(r["tags"]))
                  for r in rows(store, "vhosts")}
        assert vhosts == {"/": ("", []), "billing": ("Billing", ["eu", "prod"])}
        (alice,) = rows(store, "users")
        assert (alice["name"], alice["password_hash"], alice["hashing_algorithm"],
                json.loads(alice["tags"])) == (
            "alice", "aGFzaA==", "rabbit_password_hashing_sha256", ["administrator"])
        assert rows(store, "permissions") == [{"user": "alice", "vhost": "billing",
                                               "configure": "", "write": "^in", "read": ".*"}]
    finally:
        store.close()


def test_writing_again_replaces(store: Metastore) -> None:
    store.put_vhost("billing", "one")
    store.put_vhost("billing", "two", ["x"])
    store.put_permission("alice", "/", ".*", ".*", ".*")
    store.put_permission("alice", "/", "", "", "")
    store.put_policy("/", "p", ".*", "all", 0, {"max-length": 1})
    store.put_policy("/", "p", "^q", "queues", 5, {"max-length": 2})
    assert [r["description"] for r in rows(store, "vhosts")] == ["two"]
    assert [r["configure"] for r in rows(store, "permissions")] == [""]
    (policy,) = rows(store, "policies")
    assert (policy["pattern"], policy["apply_to"], policy["priority"],
            json.loads(policy["definition"])) == ("^q", "queues", 5, {"max-length": 2})


def test_durable_exchanges_queues_and_bindings_come_back(store: Metastore) -> None:
    store.put_exchange("/", "events", "headers", False, True, {"alternate-exchange": "ae"})
    store.put_queue("/", "jobs", "classic", True, {"x-max-length": 10}, "0a1b2c")
    store.put_queue("/", "log", "stream", False, {"x-max-age": "7D"}, None)
    store.put_binding("/", "events", "queue", "jobs", "", {"x-match": "any", "level": "high"})
    store = reopened(store)
    try:
        (exchange,) = rows(store, "exchanges")
        assert (exchange["name"], exchange["type"], bool(exchange["auto_delete"]),
                bool(exchange["internal"]), load_table(exchange["arguments"])) == (
            "events", "headers", False, True, {"alternate-exchange": "ae"})
        queues = {r["name"]: r for r in rows(store, "queues")}
        assert (queues["jobs"]["type"], bool(queues["jobs"]["auto_delete"]),
                load_table(queues["jobs"]["arguments"]), queues["jobs"]["storage_id"]) == (
            "classic", True, {"x-max-length": 10}, "0a1b2c")
        assert queues["log"]["storage_id"] is None
        (binding,) = rows(store, "bindings")
        assert (binding["source"], binding["destination_type"], binding["destination"],
                binding["routing_key"], load_table(binding["arguments"])) == (
            "events", "queue", "jobs", "", {"x-match": "any", "level": "high"})
    finally:
        store.close()


def test_bindings_that_differ_by_their_arguments_are_two(store: Metastore) -> None:
    store.put_binding("/", "h", "queue", "q", "", {"x-match": "any", "a": 1})
    store.put_binding("/", "h", "queue", "q", "", {"a": 1, "x-match": "any"})  # the same
    store.put_binding("/", "h", "queue", "q", "", {"x-match": "all", "a": 1})
    assert len(rows(store, "bindings")) == 2
    store.delete_binding("/", "h", "queue", "q", "", {"a": 1, "x-match": "any"})
    assert [load_table(r["arguments"]) for r in rows(store, "bindings")] == [
        {"x-match": "all", "a": 1}]


def test_a_field_table_keeps_its_amqp_types() -> None:
    table: dict[str, Any] = {
        "long": 7, "float": 0.5, "bool": True, "void": None, "text": "t",
        "bytes": b"\x00\xff", "bytearray": bytearray(b"\x01\x02"),
        "decimal": decimal.Decimal("3.14"),
        "timestamp": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
        "array": [1, "two", b"3", [decimal.Decimal("4")]],
        "table": {"inner": {"deeper": datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)}},
        "looks-typed": {"$bytes": "AA=="},  # a table whose key looks like a type tag
    }
    back = load_table(dump_table(table))
    assert back == table
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in table.items()}
    assert type(back["array"][2]) is bytes and type(back["bytearray"]) is bytearray


def test_a_value_no_field_table_holds_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot store a field value of type set"):
        dump_table({"x": {1}})


def test_deleting_a_vhost_deletes_what_is_in_it_and_nothing_else(store: Metastore) -> None:
    for vhost in ("/", "billing"):
        store.put_vhost(vhost)
        store.put_exchange(vhost, "x", "direct", False, False, {})
        store.put_queue(vhost, "q", "classic", False, {}, None)
        store.put_binding(vhost, "x", "queue", "q", "k", {})
        store.put_policy(vhost, "p", ".*", "all", 0, {"max-length": 1})
        store.put_permission("alice", vhost, ".*", ".*", ".*")
    store.delete_vhost("billing")
    for table in ("exchanges", "queues", "bindings", "policies", "permissions"):
        assert [r["vhost"] for r in rows(store, table)] == ["/"], table
    assert [r["name"] for r in rows(store, "vhosts")] == ["/"]


def test_deleting_a_user_deletes_its_permissions(store: Metastore) -> None:
    store.put_user("alice", "", "rabbit_password_hashing_sha256", [])
    store.put_user("bob", "", "rabbit_password_hashing_sha256", [])
    for user in ("alice", "bob"):
        store.put_permission(user, "/", ".*", ".*", ".*")
    store.delete_user("alice")
    assert [r["name"] for r in rows(store, "users")] == ["bob"]
    assert [r["user"] for r in rows(store, "permissions")] == ["bob"]


def test_single_deletes_take_one_row(store: Metastore) -> None:
    store.put_exchange("/", "x", "direct", False, False, {})
    store.put_exchange("/", "y", "direct", False, False, {})
    store.put_queue("/", "q", "classic", False, {}, None)
    store.put_queue("other", "q", "classic", False, {}, None)
    store.put_policy("/", "p", ".*", "all", 0, {"a": 1})
    store.put_permission("alice", "/", ".*", ".*", ".*")
    store.put_permission("alice", "other", ".*", ".*", ".*")
    store.delete_exchange("/", "x")
    store.delete_queue("/", "q")
    store.delete_policy("/", "p")
    store.delete_permission("alice", "/")
    assert [r["name"] for r in rows(store, "exchanges")] == ["y"]
    assert [r["vhost"] for r in rows(store, "queues")] == ["other"]
    assert rows(store, "policies") == []
    assert [r["vhost"] for r in rows(store, "permissions")] == ["other"]


def test_another_schema_version_is_refused_with_both_versions(path: Path) -> None:
    Metastore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(MetastoreError) as raised:
        Metastore(path)
    assert str(raised.value) == (f"the metadata database {path} has schema version 99; this "
                                 f"Leveret reads version {SCHEMA_VERSION}")


def test_a_vhosts_default_queue_type_comes_back(store: Metastore) -> None:
    store.put_vhost("/")
    store.put_vhost("orders", "Orders", [], "quorum")
    again = reopened(store)
    try:
        assert {r["name"]: r["default_queue_type"] for r in rows(again, "vhosts")} == {
            "/": None, "orders": "quorum"}
    finally:
        again.close()


def test_a_version_1_database_gets_the_default_queue_type_column(path: Path) -> None:
    db = sqlite3.connect(path)  # the version 1 schema, with a vhost
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1');
        CREATE TABLE vhosts (name TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '',
            tags TEXT NOT NULL DEFAULT '[]');
        INSERT INTO vhosts VALUES ('/', 'Default', '["a"]');
    """)
    db.close()
    store = Metastore(path)
    try:
        assert not store.fresh
        assert rows(store, "vhosts") == [{"name": "/", "description": "Default", "tags": '["a"]',
                                          "default_queue_type": None}]
        store.put_vhost("q", default_queue_type="quorum")
        assert store.db.execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION),)
    finally:
        store.close()
    assert SCHEMA_VERSION == 2
    Metastore(path).close()  # opened again: already version 2


def test_a_database_that_cannot_be_opened_names_its_file(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(MetastoreError) as raised:
        Metastore(folder)
    assert str(raised.value).startswith(f"cannot open the metadata database {folder}: ")


def test_a_write_that_fails_names_its_file(store: Metastore) -> None:
    store.db.execute("DROP TABLE queues")
    with pytest.raises(MetastoreError) as raised:
        store.put_queue("/", "q", "classic", False, {}, None)
    assert str(raised.value).startswith(f"cannot write the metadata database {store.path}: ")
