"""The metadata recorder and restore (broker/metadata/recorder.py), without a broker process:
what the model records as it changes durable things, and what a node restored from that store
holds (a `Node` standing for `broker.Broker`, or the broker itself reopened)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp import properties
from leveret.amqp.content import Message
from leveret.broker.access.auth import Permission, Users, hash_password
from leveret.broker.broker import Broker
from leveret.broker.metadata.recorder import MetadataRecorder, restore
from leveret.broker.metadata.store import Metastore
from leveret.broker.model.errors import InternalError
from leveret.broker.model.policy import Policy
from leveret.broker.model.vhost import VHost


class CountingStore(Metastore):
    """A Metastore that counts its writes."""

    writes = 0

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.writes += 1
        super()._write(sql, params)


class Node:
    """What restore rebuilds (its `Broker` Protocol): users and vhosts that record into
    `store`, as broker.Broker's do."""

    def __init__(self, store: Metastore) -> None:
        self.users = Users()
        self.vhosts: dict[str, VHost] = {}
        self.recorder = MetadataRecorder(store)

    def add_vhost(self, name: str, persist: bool = True,
                  default_queue_type: str | None = None) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name, ManualScheduler(inline_soon=True),
                                              observer=self.recorder,
                                              default_queue_type=default_queue_type or "classic")
        return vhost


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CountingStore]:
    opened = CountingStore(tmp_path / "metadata.sqlite3")
    yield opened
    opened.close()


def restored(store: Metastore) -> Node:
    node = Node(store)
    restore(node, store)
    return node


def names(store: Metastore, table: str) -> list[str]:
    return sorted(row["name"] for row in store.rows(table))


def test_durable_things_are_recorded_and_transient_ones_are_not(store: Metastore) -> None:
    vhost = Node(store).add_vhost("/")
    vhost.declare_exchange("kept-x", "topic", durable=True)
    vhost.declare_exchange("gone-x", "topic", durable=False)
    vhost.declare_queue("kept", owner=None, durable=True)
    vhost.declare_queue("gone", owner=None, durable=False)
    vhost.bind("kept-x", "queue", "kept", "a.#")
    vhost.bind("kept-x", "queue", "gone", "b.#")  # to a transient queue
    vhost.bind("gone-x", "queue", "kept", "c.#")  # from a transient exchange
    assert names(store, "exchanges") == ["kept-x"]
    assert names(store, "queues") == ["kept"]
    assert [row["routing_key"] for row in store.rows("bindings")] == ["a.#"]


def test_deletes_are_recorded(store: Metastore) -> None:
    vhost = Node(store).add_vhost("/")
    vhost.declare_exchange("x", "direct", durable=True)
    queue = vhost.declare_queue("q", owner=None, durable=True)
    vhost.bind("x", "queue", "q", "k")
    vhost.unbind("x", "queue", "q", "k")
    assert store.rows("bindings") == []
    vhost.bind("x", "queue", "q", "k")
    vhost.delete_queue(queue)  # its bindings go with it
    vhost.delete_exchange("x")
    for table in ("exchanges", "queues", "bindings"):
        assert store.rows(table) == [], table


def test_everything_recorded_is_restored(store: Metastore) -> None:
    node = Node(store)
    vhost = node.add_vhost("/")
    store.put_vhost("/")
    vhost.declare_exchange("events", "headers", durable=True, internal=True,
                           arguments={"alternate-exchange": "ae"})
    vhost.declare_queue("jobs", owner=None, durable=True, auto_delete=True,
                        arguments={"x-max-length": 10, "x-dead-letter-exchange": "dlx"})
    vhost.bind("events", "queue", "jobs", "", {"x-match": "any", "level": "high"})
    vhost.set_policy(Policy("cap", "^jobs$", {"max-length": 5}, "queues", 3))
    store.put_user("alice", hash_password("a-pw"), "rabbit_password_hashing_sha256",
                   ["management"])
    store.put_permission("alice", "/", "^alice", ".*", "")

    again = restored(store)
    alice = again.users.authenticate("alice", "a-pw")
    assert alice is not None and alice.tags == ["management"]
    assert alice.permissions == {"/": Permission("^alice", ".*", "")}
    root = again.vhosts["/"]
    events = root.exchanges["events"]
    assert (events.type, events.durable, events.internal, events.arguments) == (
        "headers", True, True, {"alternate-exchange": "ae"})
    jobs = root.queues["jobs"]
    assert (jobs.durable, jobs.auto_delete, jobs.arguments) == (
        True, True, {"x-max-length": 10, "x-dead-letter-exchange": "dlx"})
    (binding,) = events.bindings.values()
    assert (binding.destination is jobs, binding.arguments) == (
        True, {"x-match": "any", "level": "high"})
    assert root.policies == {"cap": Policy("cap", "^jobs$", {"max-length": 5}, "queues", 3)}


def test_restoring_writes_nothing_and_recording_resumes_after(store: CountingStore) -> None:
    vhost = Node(store).add_vhost("/")
    store.put_vhost("/")
    vhost.declare_exchange("x", "direct", durable=True)
    vhost.declare_queue("q", owner=None, durable=True)
    vhost.bind("x", "queue", "q", "k")
    before = store.writes
    again = restored(store)
    assert store.writes == before
    again.vhosts["/"].declare_queue("later", owner=None, durable=True)
    assert names(store, "queues") == ["later", "q"]


def test_what_no_longer_loads_is_skipped_and_the_rest_restored(store: Metastore) -> None:
    store.put_vhost("/")
    store.put_queue("/", "q", "classic", False, {}, None)
    store.put_binding("/", "missing-x", "queue", "q", "k", {})  # a source that is not there
    store.put_queue("ghost", "q", "classic", False, {}, None)  # a vhost that is not there
    store.put_permission("nobody", "/", ".*", ".*", ".*")  # a user who is not there
    store.put_policy("ghost", "p", ".*", "all", 0, {"max-length": 1})
    again = restored(store)
    assert set(again.vhosts) == {"/"}
    assert set(again.vhosts["/"].queues) == {"q"}
    assert "nobody" not in again.users.users


def test_a_failed_write_is_an_internal_error_and_the_declaration_is_undone(
        store: Metastore) -> None:
    vhost = Node(store).add_vhost("/")
    store.db.execute("DROP TABLE queues")
    with pytest.raises(InternalError) as raised:
        vhost.declare_queue("q", owner=None, durable=True)
    assert raised.value.text.startswith(f"cannot write the metadata database {store.path}: ")
    assert "q" not in vhost.queues


async def test_a_broker_restarted_on_its_data_directory_has_its_durable_state(
        local_broker: Broker) -> None:
    vhost = local_broker.vhosts["/"]
    local_broker.add_vhost("billing")
    local_broker.add_user("alice", "a-pw", tags=["monitoring"])
    local_broker.set_permissions("alice", "billing", Permission("", "^in", ".*"))
    vhost.declare_queue("stream", owner=None, durable=True,
                        arguments={"x-queue-type": "stream", "x-max-age": "1D"})
    queue = vhost.declare_queue("jobs", owner=None, durable=True)
    vhost.declare_queue("gone", owner=None, durable=False)
    queue.publish(Message.build("", "jobs", b"kept", properties.Properties(delivery_mode=2)),
                  None)
    config = local_broker.config
    local_broker.close()
    reopened = Broker(config, asyncio.get_running_loop())
    try:
        assert set(reopened.vhosts) == {"/", "billing"}
        alice = reopened.users.authenticate("alice", "a-pw")
        assert alice is not None and alice.permissions["billing"] == Permission("", "^in", ".*")
        assert reopened.users.authenticate("guest", "guest") is not None
        root = reopened.vhosts["/"]
        assert set(root.queues) == {"stream", "jobs"}
        assert root.queues["stream"].type == "stream"
        assert root.queues["jobs"].message_count == 1  # its storage folder was found again
    finally:
        reopened.close()
