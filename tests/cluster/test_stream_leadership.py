"""Stream leadership in a real etcd: the first leader in epoch 1, elections that only one of two
racing candidates wins (the epoch key's transaction), members changed under the same fencing,
and the election's choice of the most advanced log among a quorum."""

from __future__ import annotations

import asyncio

import pytest

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.stream_leadership import (
    StaleLeadership,
    StreamLeaderships,
    choose_leader,
)


def test_the_most_advanced_log_of_a_quorum_leads() -> None:
    members = ("a", "b", "c")
    assert choose_leader(members, {"b": (2, 10), "c": (2, 12)}) == "c"
    assert choose_leader(members, {"b": (3, 1), "c": (2, 99)}) == "b"  # the epoch first
    assert choose_leader(members, {"c": (2, 5), "b": (2, 5)}) == "b"  # ties: the smaller name
    assert choose_leader(members, {"b": (2, 10)}) is None  # one of three is no quorum
    assert choose_leader(members, {"b": (2, 10), "x": (9, 9)}) is None  # x is not a member
    assert choose_leader(("a",), {"a": (0, 0)}) == "a"


async def test_create_elect_and_fence(etcd_client: EtcdClient, cluster: str) -> None:
    store = StreamLeaderships(etcd_client, cluster)
    first = await store.create("/", "orders", ["a", "b", "c"])
    assert (first.leader, first.epoch, first.replicas) == ("a", 1, ("b", "c"))
    with pytest.raises(StaleLeadership) as again:
        await store.create("/", "orders", ["b"])
    assert again.value.current is not None and again.value.current.leader == "a"

    # a is down; b and c both saw epoch 1 and both try to win epoch 2: exactly one does
    results = await asyncio.gather(store.elect(first, "b"), store.elect(first, "c"),
                                   return_exceptions=True)
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, StaleLeadership)]
    assert len(won) == 1 and len(lost) == 1
    assert lost[0].current == won[0]
    current = await store.get("/", "orders")
    assert current == won[0] and current.epoch == 2 and current.members[0] == current.leader

    with pytest.raises(StaleLeadership):  # a stale reader cannot change the members either
        await store.set_members(first, ["a", "b"])
    changed = await store.set_members(current, [*current.members, "d"])
    assert (changed.epoch, changed.leader, changed.members[-1]) == (2, current.leader, "d")
    with pytest.raises(ValueError, match="the leader stays a member"):
        await store.set_members(changed, ["d"])
    with pytest.raises(ValueError, match="is not a member"):
        await store.elect(changed, "zz")
    await store.delete("/", "orders")
    assert await store.get("/", "orders") is None


async def test_names_are_escaped(etcd_client: EtcdClient, cluster: str) -> None:
    store = StreamLeaderships(etcd_client, cluster)
    await store.create("a/b", "c", ["n1"])
    await store.create("a", "b/c", ["n2"])
    one, two = await store.get("a/b", "c"), await store.get("a", "b/c")
    assert one is not None and two is not None and (one.leader, two.leader) == ("n1", "n2")
    with pytest.raises(ValueError, match="at least one member"):
        await store.create("a", "empty", [])
