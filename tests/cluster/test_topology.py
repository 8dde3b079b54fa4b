"""The cluster topology store and cache against a real etcd (Debian's etcd-server)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import AsyncIterator
from typing import Any

import pika
import pika.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.brokers import InProcessBroker

from leveret.broker.cluster.etcd import Compare, EtcdClient
from leveret.broker.cluster.topology import Created, Existing, TopologyStore
from leveret.broker.cluster.topology_cache import TopologyCache
from leveret.broker.cluster.topology_keys import DestinationType, TopologyKeys, escape, unescape
from leveret.broker.cluster.topology_records import (
    BindingRecord,
    ExchangeRecord,
    PermissionRecord,
    PolicyRecord,
    QueueRecord,
    Record,
    UserRecord,
    VHostRecord,
)
from leveret.broker.model.errors import NotFound, PreconditionFailed, ResourceLocked

names = st.text(max_size=12)


@pytest.fixture
def keys(key_prefix: str) -> TopologyKeys:
    return TopologyKeys(key_prefix + "topology/")


@pytest.fixture
async def store(etcd_client: EtcdClient, keys: TopologyKeys) -> TopologyStore:
    store = TopologyStore(etcd_client, keys)
    await store.put_vhost(VHostRecord("/"))
    return store


@pytest.fixture
async def cache(etcd_client: EtcdClient, keys: TopologyKeys) -> AsyncIterator[TopologyCache]:
    cache = TopologyCache(etcd_client, keys)
    yield cache
    await cache.close()


def queue(name: str, vhost: str = "/", **fields: Any) -> QueueRecord:
    fields.setdefault("node", "n1")
    return QueueRecord(vhost, name, **fields)


def binding(source: str, destination: str, key: str = "k", vhost: str = "/",
            kind: DestinationType = "queue", **arguments: Any) -> BindingRecord:
    return BindingRecord(vhost, source, kind, destination, key, arguments)


# -- keys ---------------------------------------------------------------------------------------


@given(names)
def test_escape_round_trips_and_never_holds_a_slash(name: str) -> None:
    assert unescape(escape(name)) == name
    assert "/" not in escape(name)


@settings(max_examples=200)
@given(names, names, names, names)
def test_keys_never_collide_and_prefixes_select_exactly_their_children(
        v1: str, n1: str, v2: str, n2: str) -> None:
    keys = TopologyKeys("/t/")
    same = (v1, n1) == (v2, n2)
    assert (keys.queue(v1, n1) == keys.queue(v2, n2)) == same
    assert keys.queue(v2, n2).startswith(keys.in_vhost("queues", v1)) == (v1 == v2)
    assert keys.exchange(v1, n1).startswith(keys.in_vhost("queues", v1)) is False
    from_n1 = keys.binding(v1, n1, "queue", n2, "rk", {})
    assert from_n1.startswith(keys.bindings_from(v2, n2)) == ((v1, n1) == (v2, n2))
    assert keys.permission(n1, v1).startswith(keys.permissions_of(n2)) == (n1 == n2)
    assert keys.parse(keys.queue(v1, n1)) == ("queues", [v1, n1])
    assert keys.binding_destination(from_n1) == ("queue", n2)


def test_binding_digest_covers_routing_key_and_typed_arguments() -> None:
    keys = TopologyKeys("/t/")
    base = keys.binding("/", "x", "queue", "q", "rk", {"a": 1})
    assert base == keys.binding("/", "x", "queue", "q", "rk", {"a": 1})
    assert base != keys.binding("/", "x", "queue", "q", "rk2", {"a": 1})
    assert base != keys.binding("/", "x", "queue", "q", "rk", {"a": 1.0})
    assert base != keys.binding("/", "x", "queue", "q", "rk", {"a": True})
    assert base != keys.binding("/", "x", "exchange", "q", "rk", {"a": 1})


# -- declarations ---------------------------------------------------------------------------------


async def test_eight_identical_declares_give_one_created(store: TopologyStore) -> None:
    record = queue("q", durable=True, arguments={"x-max-length": 10})
    results = await asyncio.gather(*(store.declare_queue(record) for _ in range(8)))
    assert sum(isinstance(r, Created) for r in results) == 1
    assert all(r.record == record for r in results)
    created = next(r for r in results if isinstance(r, Created))
    assert all(r.revision == created.revision for r in results)


def rabbit_text(broker: InProcessBroker, first: dict[str, Any], second: dict[str, Any]) -> str:
    """The single-node broker's 406 text for declaring `second` over `first`."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare("q", durable=True, arguments=first)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("q", durable=True, arguments=second)
        assert closed.value.reply_code == 406
        return str(closed.value.reply_text)
    finally:
        connection.close()


async def test_eight_different_declares_give_one_winner_and_rabbitmqs_406(
        store: TopologyStore, broker: InProcessBroker) -> None:
    records = [queue("q", durable=True, arguments={"x-max-length": i}) for i in range(8)]
    results = await asyncio.gather(*(store.declare_queue(r) for r in records),
                                   return_exceptions=True)
    winners = [r for r in results if isinstance(r, Created)]
    assert len(winners) == 1
    assert not any(isinstance(r, Existing) for r in results)
    winner = winners[0].record.arguments
    for record, result in zip(records, results, strict=True):
        if isinstance(result, Created):
            continue
        assert isinstance(result, PreconditionFailed)
        expected = await asyncio.to_thread(rabbit_text, broker, winner, record.arguments)
        assert f"PRECONDITION_FAILED - {result.text}" == expected


async def test_redeclare_checks_flags_and_exclusive_owner(store: TopologyStore) -> None:
    mine = queue("ex", exclusive=True, exclusive_owner="n1/c1", owner_node="n1")
    assert isinstance(await store.declare_queue(mine), Created)
    assert isinstance(await store.declare_queue(mine), Existing)
    other = queue("ex", exclusive=True, exclusive_owner="n2/c9", owner_node="n2")
    with pytest.raises(ResourceLocked, match="cannot obtain exclusive access to locked queue"):
        await store.declare_queue(other)
    await store.declare_queue(queue("d", durable=True))
    with pytest.raises(PreconditionFailed) as failed:
        await store.declare_queue(queue("d", durable=False))
    assert failed.value.text == ("inequivalent arg 'durable' for queue 'd' in vhost '/': "
                                 "received 'false' but current is 'true'")


async def test_exchange_declare_uses_the_models_equivalence(store: TopologyStore) -> None:
    record = ExchangeRecord("/", "x", "direct")
    assert isinstance(await store.declare_exchange(record), Created)
    with pytest.raises(PreconditionFailed) as failed:
        await store.declare_exchange(ExchangeRecord("/", "x", "topic"))
    assert failed.value.text == ("inequivalent arg 'type' for exchange 'x' in vhost '/': "
                                 "received 'topic' but current is 'direct'")


async def test_declare_in_a_missing_vhost_is_refused(store: TopologyStore) -> None:
    with pytest.raises(NotFound, match="no vhost 'nope'"):
        await store.declare_queue(queue("q", vhost="nope"))


async def test_typed_arguments_survive_the_round_trip(store: TopologyStore,
                                                      cache: TopologyCache) -> None:
    arguments = {
        "ts": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
        "dec": decimal.Decimal("1.25"), "raw": bytearray(b"\x00\xff"), "b": b"bytes",
        "f": 1.0, "i": 1, "t": True, "nested": {"a": [1, "two", {"deep": decimal.Decimal("3")}]},
        "none": None,
    }
    record = queue("typed", durable=True, arguments=arguments)
    await store.declare_queue(record)
    assert isinstance(await store.declare_queue(record), Existing)
    await cache.start()
    cached = cache.queue("/", "typed")
    assert cached is not None and cached.arguments == arguments
    assert type(cached.arguments["raw"]) is bytearray and type(cached.arguments["f"]) is float
    fetched = await store.get_queue("/", "typed")
    assert fetched is not None and fetched.arguments == arguments


# -- bindings and deletes ---------------------------------------------------------------------


async def test_binding_to_or_from_a_missing_entity_is_404(store: TopologyStore) -> None:
    await store.declare_queue(queue("q"))
    with pytest.raises(NotFound) as missing:
        await store.bind(binding("amq.direct", "nope"))
    assert missing.value.text == "no queue 'nope' in vhost '/'"
    with pytest.raises(NotFound) as missing:
        await store.bind(binding("nox", "q"))
    assert missing.value.text == "no exchange 'nox' in vhost '/'"
    with pytest.raises(NotFound) as missing:
        await store.bind(binding("amq.direct", "nox", kind="exchange"))
    assert missing.value.text == "no exchange 'nox' in vhost '/'"
    assert isinstance(await store.bind(binding("amq.direct", "q")), Created)
    assert isinstance(await store.bind(binding("amq.direct", "q")), Existing)


async def test_deleting_a_queue_or_exchange_removes_its_bindings(
        store: TopologyStore, etcd_client: EtcdClient, keys: TopologyKeys) -> None:
    await store.declare_queue(queue("q"))
    await store.declare_queue(queue("q2"))
    await store.declare_exchange(ExchangeRecord("/", "x", "topic"))
    for record in (binding("amq.direct", "q"), binding("x", "q", "a.*"), binding("x", "q2"),
                   binding("amq.topic", "x", kind="exchange")):
        await store.bind(record)
    assert await store.delete_queue("/", "q") is not None
    left = await etcd_client.range(keys.in_vhost("bindings", "/"), prefix=True)
    assert [keys.binding_destination(kv.key) for kv in left.kvs] == [
        ("exchange", "x"), ("queue", "q2")]
    assert await store.delete_queue("/", "q") is None
    assert await store.delete_exchange("/", "x") is not None
    left = await etcd_client.range(keys.in_vhost("bindings", "/"), prefix=True)
    assert left.kvs == []


async def test_delete_if_revision_spares_a_newer_entity(store: TopologyStore) -> None:
    first = await store.declare_queue(queue("q"))
    await store.delete_queue("/", "q")
    await store.declare_queue(queue("q"))
    assert await store.delete_queue("/", "q", if_revision=first.revision) is None
    assert await store.get_queue("/", "q") is not None


async def test_deleting_a_vhost_removes_everything_under_it(
        store: TopologyStore, etcd_client: EtcdClient, keys: TopologyKeys) -> None:
    await store.put_user(UserRecord("u", "hash", "sha256"))
    for v in ("a", "a/b", "ab"):
        await store.put_vhost(VHostRecord(v))
        await store.declare_queue(queue("q", vhost=v))
        await store.declare_exchange(ExchangeRecord(v, "x", "fanout"))
        await store.bind(binding("x", "q", vhost=v))
        await store.put_policy(PolicyRecord(v, "p", ".*", "all", 0, {"max-length": 1}))
        await store.put_permission(PermissionRecord("u", v, ".*", ".*", ".*"))
    before = await etcd_client.range(keys.everything(), prefix=True, count_only=True)
    assert await store.delete_vhost("a") is not None
    after = await etcd_client.range(keys.everything(), prefix=True)
    gone = before.count - after.count
    assert gone == 1 + 5 + 1 + 1 + 1 + 1 + 1  # vhost, 5 amq.* exchanges, x, q, binding, p, perm
    for kv in after.kvs:
        parsed = keys.parse(kv.key)
        assert parsed is not None
        kind, parts = parsed
        vhost = parts[1] if kind == "permissions" else parts[0]
        assert vhost != "a" or kind == "users"
    assert await store.delete_vhost("a") is None
    with pytest.raises(NotFound):
        await store.put_permission(PermissionRecord("u", "a", "", "", ""))


async def test_a_lease_bound_exclusive_queue_vanishes_with_the_lease(
        store: TopologyStore, etcd_client: EtcdClient) -> None:
    lease = await etcd_client.lease_grant(30)
    mine = queue("ex", exclusive=True, exclusive_owner="n1/c1", owner_node="n1")
    created = await store.declare_queue(mine, lease=lease.id)
    assert created.record.lease == lease.id
    durable = await store.declare_queue(queue("keep", durable=True), lease=lease.id)
    assert durable.record.lease == 0
    await store.bind(binding("amq.direct", "ex"))
    await etcd_client.lease_revoke(lease.id)
    assert await store.get_queue("/", "ex") is None
    assert await store.get_queue("/", "keep") is not None
    # the binding went with the queue's lease: binding again says the queue is missing
    with pytest.raises(NotFound, match="no queue 'ex'"):
        await store.bind(binding("amq.direct", "ex"))


# -- the cache ----------------------------------------------------------------------------------


async def test_the_cache_sees_every_change_in_revision_order(
        store: TopologyStore, cache: TopologyCache) -> None:
    seen: list[tuple[str, Record]] = []
    for kind in ("queues", "bindings", "exchanges"):
        cache.on_put(kind, lambda r: seen.append(("put", r)))
        cache.on_delete(kind, lambda r: seen.append(("delete", r)))
    start = await cache.start()
    loaded = len(seen)  # the amq.* exchanges of "/"
    created = await store.declare_queue(queue("q"))
    await cache.wait_for(created.revision, timeout_s=5)
    assert cache.queue("/", "q") == created.record
    bound = await store.bind(binding("amq.fanout", "q"))
    deleted = await store.delete_queue("/", "q")
    assert deleted is not None
    await cache.wait_for(deleted, timeout_s=5)
    assert cache.queue("/", "q") is None and cache.bindings("/") == []
    events = seen[loaded:]
    assert [(e, type(r).__name__) for e, r in events] == [
        ("put", "QueueRecord"), ("put", "BindingRecord"), ("delete", "QueueRecord"),
        ("delete", "BindingRecord")]
    revisions = [r.mod_revision for _, r in events[:2]]
    assert revisions == sorted(revisions) and revisions[0] > start
    assert events[1][1] == bound.record
    assert cache.revision >= deleted


async def test_a_late_cache_loads_by_range_then_follows(
        store: TopologyStore, etcd_client: EtcdClient, keys: TopologyKeys) -> None:
    await store.declare_queue(queue("early", durable=True))
    await store.put_policy(PolicyRecord("/", "p", "^e", "queues", 1, {"max-length": 5}))
    cache = TopologyCache(etcd_client, keys)
    try:
        await cache.start()
        assert cache.queue("/", "early") is not None
        assert len(cache.all("policies")) == 1
        later = await store.declare_exchange(ExchangeRecord("/", "later", "headers"))
        await cache.wait_for(later.revision, timeout_s=5)
        assert cache.exchange("/", "later") == later.record
        with pytest.raises(TimeoutError):
            await cache.wait_for(cache.revision + 1000, timeout_s=0.2)
    finally:
        await cache.close()


async def test_a_peer_cache_applies_a_declaration_before_wait_for_returns(
        store: TopologyStore, etcd_client: EtcdClient, keys: TopologyKeys) -> None:
    peers = [TopologyCache(etcd_client, keys) for _ in range(3)]
    for peer in peers:
        await peer.start()
    try:
        results = await asyncio.gather(*(store.declare_queue(queue(f"q{i}")) for i in range(5)))
        for result in results:
            for peer in peers:
                await peer.wait_for(result.revision, timeout_s=5)
                assert peer.queue("/", result.record.name) == result.record
    finally:
        for peer in peers:
            await peer.close()


async def test_a_range_compare_sees_keys_created_since_a_revision(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    """The guard that deletes use against a binding or permission added after their read."""
    scope = key_prefix + "scope/"
    empty = await etcd_client.txn([Compare.none_created_since(scope, 1)])
    assert empty.succeeded
    before = (await etcd_client.range(scope, prefix=True)).revision
    await etcd_client.put(key_prefix + "outside", b"")
    assert (await etcd_client.txn([Compare.none_created_since(scope, before)])).succeeded
    added = await etcd_client.put(scope + "k", b"")
    assert not (await etcd_client.txn([Compare.none_created_since(scope, before)])).succeeded
    assert (await etcd_client.txn([Compare.none_created_since(scope, added.revision)])).succeeded
