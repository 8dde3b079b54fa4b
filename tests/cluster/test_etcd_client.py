"""The etcd client and the Lease helper against a real etcd (Debian's etcd-server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from support.etcd import EtcdServer
from support.ports import free_port

from leveret.broker.cluster.etcd import (
    Compare,
    Delete,
    DeleteResult,
    EtcdClient,
    EtcdClosed,
    EtcdError,
    EtcdUnavailable,
    Get,
    Put,
    PutResult,
    RangeResult,
    WatchEvent,
    prefix_end,
)
from leveret.broker.cluster.lease import Lease

TTL_S = 2  # etcd's minimum with default settings: keeps the lease tests quick


def test_prefix_end() -> None:
    assert prefix_end(b"a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


async def test_put_get_and_range_with_prefix(etcd_client: EtcdClient, key_prefix: str) -> None:
    p = key_prefix
    first = await etcd_client.put(p + "b", "2")
    await etcd_client.put(p + "a", b"1")
    await etcd_client.put(p + "c", "\N{RABBIT}")
    await etcd_client.put(p[:-1] + "0", "outside the prefix")

    kv = await etcd_client.get(p + "b")
    assert kv is not None
    assert (kv.key, kv.value, kv.version, kv.lease) == ((p + "b").encode(), b"2", 1, 0)
    assert kv.create_revision == kv.mod_revision == first.revision
    assert await etcd_client.get(p + "missing") is None

    found = await etcd_client.range(p, prefix=True)
    assert [kv.key for kv in found.kvs] == [(p + k).encode() for k in "abc"]
    assert found.kvs[2].value == "\N{RABBIT}".encode()
    assert found.count == 3 and not found.more

    limited = await etcd_client.range(p, prefix=True, limit=2)
    assert len(limited.kvs) == 2 and limited.count == 3 and limited.more
    counted = await etcd_client.range(p, prefix=True, count_only=True)
    assert counted.kvs == [] and counted.count == 3
    between = await etcd_client.range(p + "a", p + "c")
    assert [kv.value for kv in between.kvs] == [b"1", b"2"]

    again = await etcd_client.put(p + "b", "two", prev_kv=True)
    assert again.prev_kv is not None and again.prev_kv.value == b"2"
    then = await etcd_client.range(p + "b", revision=first.revision)
    assert then.kvs[0].value == b"2"
    now = await etcd_client.get(p + "b")
    assert now is not None and now.version == 2 and now.mod_revision == again.revision


async def test_delete_one_and_by_prefix(etcd_client: EtcdClient, key_prefix: str) -> None:
    p = key_prefix
    for name in ("x", "y/1", "y/2", "z"):
        await etcd_client.put(p + name, name)
    one = await etcd_client.delete(p + "x", prev_kv=True)
    assert one.deleted == 1 and [kv.value for kv in one.prev_kvs] == [b"x"]
    assert (await etcd_client.delete(p + "x")).deleted == 0
    assert (await etcd_client.delete(p + "y/", prefix=True)).deleted == 2
    left = await etcd_client.range(p, prefix=True)
    assert [kv.key for kv in left.kvs] == [(p + "z").encode()]


async def test_txn_create_if_absent_and_compare_and_set(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    key = key_prefix + "queue"
    absent = [Compare.create_revision(key, "==", 0)]
    created = await etcd_client.txn(absent, [Put(key, "v1")], [Get(key)])
    assert created.succeeded and isinstance(created.responses[0], PutResult)
    refused = await etcd_client.txn(absent, [Put(key, "other")], [Get(key)])
    assert not refused.succeeded
    existing = refused.responses[0]
    assert isinstance(existing, RangeResult) and existing.kvs[0].value == b"v1"

    kv = await etcd_client.get(key)
    assert kv is not None
    await etcd_client.put(key, "v2")  # someone else writes in between
    stale = await etcd_client.txn([Compare.mod_revision(key, "==", kv.mod_revision)],
                                  [Put(key, "v3")])
    assert not stale.succeeded
    assert (await etcd_client.get(key)).value == b"v2"  # type: ignore[union-attr]

    checks = [Compare.value(key, "==", "v2"), Compare.version(key, ">", 1),
              Compare.lease(key, "==", 0), Compare.value(key, "!=", "v1")]
    done = await etcd_client.txn(checks, [Delete(key, prev_kv=True), Get(key)])
    assert done.succeeded
    deleted, after = done.responses
    assert isinstance(deleted, DeleteResult) and deleted.prev_kvs[0].value == b"v2"
    assert isinstance(after, RangeResult) and after.kvs == []
    assert not (await etcd_client.txn([Compare.value(key, "==", "v2")])).succeeded


async def test_concurrent_creators_exactly_one_wins(etcd: EtcdServer, key_prefix: str) -> None:
    key = key_prefix + "declared"
    clients = [EtcdClient([etcd.url]) for _ in range(8)]
    try:
        results = await asyncio.gather(*(
            c.txn([Compare.version(key, "==", 0)], [Put(key, f"creator-{i}")])
            for i, c in enumerate(clients)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    winners = [i for i, result in enumerate(results) if result.succeeded]
    assert len(winners) == 1
    async with EtcdClient([etcd.url]) as client:
        kv = await client.get(key)
    assert kv is not None and kv.value == f"creator-{winners[0]}".encode() and kv.version == 1


async def test_lease_keepalive_keeps_a_key_past_its_ttl(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    key = key_prefix + "node"
    async with Lease(etcd_client, TTL_S) as lease:
        assert lease.ttl_s == TTL_S and lease.alive
        await etcd_client.put(key, "alive", lease=lease.id)
        await asyncio.sleep(TTL_S * 2.5)
        kv = await etcd_client.get(key)
        assert kv is not None and kv.lease == lease.id
        info = await etcd_client.lease_time_to_live(lease.id, keys=True)
        assert info.ttl > 0 and info.granted_ttl == TTL_S and info.keys == [key.encode()]
        assert lease.alive and not lease.lost.is_set()
        lease_id = lease.id
    # leaving the block revoked it: the key is gone at once, and it is no loss
    assert await etcd_client.get(key) is None
    assert (await etcd_client.lease_time_to_live(lease_id)).ttl == -1
    assert not lease.lost.is_set()


async def test_an_expired_lease_deletes_its_keys(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = key_prefix + "ephemeral"
    granted = await etcd_client.lease_grant(1)
    assert granted.ttl >= 1  # etcd raises it to its minimum
    start = time.monotonic()
    await etcd_client.put(key, "soon gone", lease=granted.id)
    while await etcd_client.get(key) is not None:
        assert time.monotonic() - start < granted.ttl + 5, "the key outlived its lease"
        await asyncio.sleep(0.1)
    assert time.monotonic() - start >= granted.ttl - 0.5
    assert await etcd_client.lease_keepalive(granted.id) == 0
    assert not await etcd_client.lease_revoke(granted.id)
    with pytest.raises(EtcdError) as refused:
        await etcd_client.put(key, "x", lease=granted.id)
    assert refused.value.code == 5 and "lease not found" in refused.value.message


async def test_a_revoked_lease_is_reported_lost(etcd_client: EtcdClient, key_prefix: str) -> None:
    key = key_prefix + "holder"
    reasons: list[str] = []
    lease = await Lease(etcd_client, TTL_S, on_lost=reasons.append).start()
    try:
        await etcd_client.put(key, "mine", lease=lease.id)
        assert await etcd_client.lease_revoke(lease.id)
        assert await etcd_client.get(key) is None
        await asyncio.wait_for(lease.lost.wait(), timeout=TTL_S)
        assert not lease.alive and lease.remaining_s() == 0
        assert reasons == [lease.lost_reason] and "gone" in reasons[0]
    finally:
        await lease.close()
    assert len(reasons) == 1


async def _collect(events: asyncio.Queue[WatchEvent], count: int) -> list[WatchEvent]:
    return [await asyncio.wait_for(events.get(), timeout=5) for _ in range(count)]


async def test_watch_sees_puts_and_deletes_from_a_revision_in_order(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    p = key_prefix
    before = await etcd_client.put(p + "a", "old")  # before the watched revision
    first = await etcd_client.put(p + "a", "1")
    await etcd_client.put(p + "b", "2")
    await etcd_client.delete(p + "a")
    await etcd_client.put(p[:-1] + "0", "not watched")

    events: asyncio.Queue[WatchEvent] = asyncio.Queue()

    async def watch() -> None:
        async for event in etcd_client.watch(p, prefix=True, start_revision=first.revision,
                                             prev_kv=True):
            events.put_nowait(event)

    task = asyncio.create_task(watch())
    try:
        past = await _collect(events, 3)
        await etcd_client.txn([], [Put(p + "c", "3"), Put(p + "d", "4")])
        await etcd_client.delete(p, prefix=True)
        live = await _collect(events, 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    seen = [(e.type, e.kv.key.decode()[len(p):], e.kv.value) for e in past + live]
    assert seen == [("PUT", "a", b"1"), ("PUT", "b", b"2"), ("DELETE", "a", b""),
                    ("PUT", "c", b"3"), ("PUT", "d", b"4"),
                    ("DELETE", "b", b""), ("DELETE", "c", b""), ("DELETE", "d", b"")]
    revisions = [e.kv.mod_revision for e in past + live]
    assert revisions == sorted(revisions) and revisions[0] == first.revision > before.revision
    assert revisions[3] == revisions[4]  # one txn, one revision
    assert revisions[5] == revisions[6] == revisions[7]  # one delete of the prefix
    assert past[2].prev_kv is not None and past[2].prev_kv.value == b"1"
    assert events.empty()


async def test_watch_from_now_sees_only_new_events(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    await etcd_client.put(key_prefix + "k", "before")
    stream = etcd_client.watch(key_prefix + "k")
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.3)  # the watch is created (no event yet)
    assert not waiting.done()
    await etcd_client.put(key_prefix + "k", "after")
    event = await asyncio.wait_for(waiting, timeout=5)
    assert event.kv.value == b"after"
    await stream.aclose()


async def test_a_watch_resumes_across_an_etcd_restart_without_loss_or_repeats(
        etcd_factory: Callable[[], EtcdServer], key_prefix: str) -> None:
    server = etcd_factory()
    p = key_prefix
    async with EtcdClient([server.url], timeout_s=10) as client:
        first = await client.put(p + "a", "1")
        events: asyncio.Queue[WatchEvent] = asyncio.Queue()

        async def watch() -> None:
            async for event in client.watch(p, prefix=True, start_revision=first.revision):
                events.put_nowait(event)

        task = asyncio.create_task(watch())
        try:
            assert [e.kv.value for e in await _collect(events, 1)] == [b"1"]
            await client.put(p + "b", "2")
            assert [e.kv.value for e in await _collect(events, 1)] == [b"2"]
            server.restart()  # the stream breaks; etcd comes back with the same data
            await client.put(p + "c", "3")
            await client.delete(p + "a")
            after = await _collect(events, 2)
            await asyncio.sleep(0.3)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert [(e.type, e.kv.key[len(p):]) for e in after] == [("PUT", b"c"), ("DELETE", b"a")]
    assert events.empty()


async def test_election_campaign_leader_proclaim_resign_and_fencing(
        etcd_client: EtcdClient, key_prefix: str) -> None:
    name = key_prefix + "leader"
    assert await etcd_client.leader(name) is None
    async with Lease(etcd_client, 10) as a, Lease(etcd_client, 10) as b:
        led_by_a = await etcd_client.campaign(name, a.id, "node-a")
        assert led_by_a.lease == a.id and led_by_a.key.startswith(name.encode() + b"/")
        b_campaign = asyncio.create_task(etcd_client.campaign(name, b.id, "node-b"))
        await asyncio.sleep(0.5)
        assert not b_campaign.done()  # b waits behind a
        current = await etcd_client.leader(name)
        assert current is not None and current.value == b"node-a"

        await etcd_client.proclaim(led_by_a, "node-a:5672")
        assert (await etcd_client.leader(name)).value == b"node-a:5672"  # type: ignore[union-attr]
        fenced = [Compare.create_revision(led_by_a.key, "==", led_by_a.rev)]
        assert (await etcd_client.txn(fenced, [Put(key_prefix + "isr", "a")])).succeeded

        await etcd_client.resign(led_by_a)
        led_by_b = await asyncio.wait_for(b_campaign, timeout=5)
        assert led_by_b.lease == b.id
        assert (await etcd_client.leader(name)).value == b"node-b"  # type: ignore[union-attr]
        # a deposed leader's fenced write is refused
        assert not (await etcd_client.txn(fenced, [Put(key_prefix + "isr", "a")])).succeeded
        with pytest.raises(EtcdError):
            await etcd_client.proclaim(led_by_a, "stale")


async def test_a_cancelled_campaign_withdraws(etcd_client: EtcdClient, key_prefix: str) -> None:
    name = key_prefix + "leader"
    async with Lease(etcd_client, 10) as a, Lease(etcd_client, 10) as b:
        led = await etcd_client.campaign(name, a.id, "a")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(etcd_client.campaign(name, b.id, "b"), timeout=0.5)
        await asyncio.sleep(0.3)
        candidates = await etcd_client.range(name + "/", prefix=True)
        assert [kv.lease for kv in candidates.kvs] == [a.id]
        await etcd_client.resign(led)
        assert await etcd_client.leader(name) is None


async def test_fails_over_from_a_dead_endpoint(etcd: EtcdServer, key_prefix: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with EtcdClient(f"{dead},{etcd.url}", timeout_s=2) as client:
        assert client.endpoints == [dead, etcd.url]
        await client.put(key_prefix + "k", "v")
        assert (await client.get(key_prefix + "k")).value == b"v"  # type: ignore[union-attr]
        outcome = await client.txn([Compare.version(key_prefix + "k", "==", 1)], [])
        assert outcome.succeeded  # a refused connection was never sent: safe to fail over
        events = client.watch(key_prefix + "k")
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.3)
        await client.put(key_prefix + "k", "w")
        assert (await asyncio.wait_for(waiting, timeout=5)).kv.value == b"w"
        await events.aclose()
    with pytest.raises(EtcdClosed):
        await client.get(key_prefix + "k")


async def test_fails_over_from_a_paused_endpoint(
        etcd: EtcdServer, etcd_factory: Callable[[], EtcdServer], key_prefix: str) -> None:
    paused = etcd_factory()
    paused.pause()
    async with EtcdClient([paused.url, etcd.url], timeout_s=1) as client:
        started = time.monotonic()
        await client.put(key_prefix + "k", "v")  # times out on the paused one, then the next
        assert 0.9 < time.monotonic() - started < 5
        assert (await client.get(key_prefix + "k")).value == b"v"  # type: ignore[union-attr]
    async with EtcdClient([paused.url, etcd.url], timeout_s=1) as client:
        # a txn that was sent and not answered may have been applied: never sent twice
        with pytest.raises(EtcdUnavailable) as unknown:
            await client.txn([], [Put(key_prefix + "k", "maybe")])
        assert unknown.value.maybe_applied
    paused.resume()


async def test_unavailable_when_etcd_is_stopped(
        etcd_factory: Callable[[], EtcdServer], key_prefix: str) -> None:
    server = etcd_factory()
    async with EtcdClient([server.url], timeout_s=2) as client:
        await client.put(key_prefix + "k", "v")
        watch = client.watch(key_prefix + "k")
        waiting = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)
        server.kill()
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: client.get(key_prefix + "k"), lambda: client.put(key_prefix + "k", "w"),
            lambda: client.txn([], []), lambda: client.lease_grant(5)]
        for attempt in attempts:
            with pytest.raises(EtcdUnavailable) as down:
                await attempt()
            assert server.url in str(down.value) and not down.value.maybe_applied
        with pytest.raises(EtcdUnavailable):
            await asyncio.wait_for(waiting, timeout=5)


async def test_lease_lost_when_etcd_is_paused_past_the_ttl(
        etcd_factory: Callable[[], EtcdServer], key_prefix: str) -> None:
    server = etcd_factory()
    lost_at: list[float] = []
    async with EtcdClient([server.url], timeout_s=1) as client:
        loop = asyncio.get_running_loop()
        lease = await Lease(client, TTL_S, on_lost=lambda _: lost_at.append(loop.time())).start()
        await client.put(key_prefix + "node", "a", lease=lease.id)
        await asyncio.sleep(TTL_S)  # a few keepalives answered
        assert lease.alive
        server.pause()
        paused_at = loop.time()
        try:
            await asyncio.wait_for(lease.lost.wait(), timeout=TTL_S + 2)
        finally:
            server.resume()
        renewed_at = lease.renewed_at
        # lost before etcd could expire the lease (so before anyone could take over) ...
        assert lost_at and lost_at[0] < renewed_at + TTL_S
        assert lost_at[0] - paused_at < TTL_S
        # ... but not before the margin: the lease was kept while etcd could still answer
        assert lost_at[0] >= renewed_at + TTL_S - lease.margin_s - 0.05
        assert lease.lost_reason is not None and "no keepalive" in lease.lost_reason
        assert not lease.alive
        await lease.close()
        # etcd, resumed, expires the lease and its key: the node must rejoin with a new lease
        deadline = time.monotonic() + TTL_S + 5
        while await client.get(key_prefix + "node") is not None:
            assert time.monotonic() < deadline, "the lost lease's key was never deleted"
            await asyncio.sleep(0.1)
        assert (await client.lease_time_to_live(lease.id)).ttl == -1
