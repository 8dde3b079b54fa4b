"""Single active consumer across nodes over the stream protocol (real etcd, three real `leveret
serve` nodes, rstream, aio-pika): a replicated stream's group is one for the whole cluster, on
its leader, whichever node each member reads from. Two rstream members with the same name on
two replicas' nodes: one receives; when it goes, the other hears ConsumerUpdate and resumes
after the offset the first stored. A 0.9.1 member and a stream-protocol one on two nodes: one
active at a time. The leader's node killed: the members join the new leader's group, and one
of them receives what comes next."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aio_pika
import pytest
from streamproto.raw import RawStream, s
from support.brokers import BrokerProcess
from support.cluster import (
    SECRET,
    ClusterNode,
    api_get,
    connect,
    declare,
    leader_of,
    linked,
    make_node,
    publish_confirmed,
    wait_until,
)
from support.cluster_api import api, ok
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

from leveret.broker.cluster.link import Handlers, Link, LinkConfig
from leveret.broker.cluster.link import connect as link_connect

rstream = pytest.importorskip("rstream")
Three = tuple[ClusterNode, ClusterNode, ClusterNode]
LOCAL = {"x-queue-leader-locator": "client-local"}


@pytest.fixture
def abc_streams(tmp_path: Path, etcd: EtcdServer, cluster: str,
                nodes: list[BrokerProcess]) -> Iterator[Three]:
    """Nodes a, b and c with stream ports and management, each linked to the other two."""
    three = []
    for name in ("a", "b", "c"):
        node = make_node(tmp_path, etcd.url, cluster, name, management=True)
        node.stream_port = free_port()  # type: ignore[attr-defined]
        node.args += ["--stream-port", str(node.stream_port),  # type: ignore[attr-defined]
                      "--stream-advertised-host", "127.0.0.1"]
        three.append(node)
    for node in three:
        nodes.append(node.start())
    for node in three:
        wait_for_port(node.stream_port, 30)  # type: ignore[attr-defined]
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    yield three[0], three[1], three[2]


def port(node: ClusterNode) -> int:
    return node.stream_port  # type: ignore[attr-defined,no-any-return]


def group_states(node: ClusterNode, stream: str, reference: str) -> list[str]:
    """The members' states of the group on `node` ([] when it has none)."""
    status, group = api(node, "GET", f"/api/leveret/consumer-groups/%2F/{stream}/{reference}")
    return [m["state"] for m in group["members"]] if status == 200 else []


def stored_on(node: ClusterNode, stream: str, reference: str) -> int:
    rows = [c["stored_offset"] for c in
            api_get(node, f"/api/leveret/streams/%2F/{stream}/tracking")["consumers"]
            if c["reference"] == reference]
    return rows[0] if rows else -1


async def until(check: Any, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


class Member:
    """An rstream Consumer reading on `node` (rstream picks a replica at random: this one is
    told which), subscribed to `stream` as a member of the group `name`. Its ConsumerUpdate
    listener resumes after the offset stored for the group, as rstream's examples do; each
    message's offset is stored as it arrives."""

    def __init__(self, node: ClusterNode, stream: str, name: str) -> None:
        self.node, self.stream, self.name = node, stream, name
        self.got: list[bytes] = []
        self.updates: list[bool] = []
        self.consumer = rstream.Consumer("127.0.0.1", port=port(node), username="guest",
                                         password="guest")

    async def subscribe(self, monkeypatch: pytest.MonkeyPatch) -> None:
        wanted = port(self.node)
        monkeypatch.setattr(  # the replica on this member's node
            "rstream.consumer.random",
            SimpleNamespace(choice=lambda rs: next(r for r in rs if r.port == wanted)))
        await self.consumer.start()
        await self.consumer.subscribe(
            self.stream, self.on_message, decoder=rstream.amqp_decoder,
            offset_specification=rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST),
            properties={"single-active-consumer": "true", "name": self.name},
            consumer_update_listener=self.on_update)
        monkeypatch.undo()

    async def on_message(self, message: Any, context: Any) -> None:
        self.got.append(bytes(message.body))
        await context.consumer.store_offset(self.stream, self.name, context.offset)

    async def on_update(self, active: bool, context: Any) -> Any:
        self.updates.append(active)
        if not active:
            return rstream.OffsetSpecification(rstream.OffsetType.NEXT, 0)
        try:
            offset = await context.consumer.query_offset(self.stream, self.name)
        except rstream.OffsetNotFound:
            return rstream.OffsetSpecification(rstream.OffsetType.FIRST, 0)
        return rstream.OffsetSpecification(rstream.OffsetType.OFFSET, offset + 1)

    async def close(self) -> None:
        await self.consumer.close()


@pytest.fixture
async def members() -> AsyncIterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        with contextlib.suppress(Exception):  # (a member whose node was killed)
            await asyncio.wait_for(member.close(), 10)


async def test_two_members_on_two_replicas_nodes_are_one_group(
        abc_streams: Three, members: list[Member], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = abc_streams
    declare(a, "sac.one", **LOCAL)  # a leads; b and c hold replicas
    bodies = [f"m{i}".encode() for i in range(10)]
    await asyncio.to_thread(publish_confirmed, a, "sac.one", bodies)
    on_b, on_c = Member(b, "sac.one", "grp"), Member(c, "sac.one", "grp")
    members.extend((on_b, on_c))
    await on_b.subscribe(monkeypatch)
    await until(lambda: len(on_b.got) == 10)
    await on_c.subscribe(monkeypatch)
    await until(lambda: group_states(a, "sac.one", "grp") == ["active", "inactive"])
    await asyncio.sleep(1)
    assert on_b.got == bodies and on_b.updates == [True]
    assert on_c.got == [] and on_c.updates == []  # two nodes, one group: c waits
    for node in (b, c):  # the group is the leader's: none on the replicas' nodes
        assert api_get(node, "/api/leveret/consumer-groups/%2F") == []
    shown = api_get(a, "/api/leveret/consumer-groups/%2F/sac.one/grp")["members"]
    assert [(m["node"], m["connection_name"].endswith(f" -> 127.0.0.1:{port(n)}"))
            for m, n in zip(shown, (b, c), strict=True)] == [("b", True), ("c", True)]
    await until(lambda: all(stored_on(n, "sac.one", "grp") == 9 for n in (a, b, c)))

    await on_b.close()  # the active one goes: c is told, and resumes after offset 9
    members.remove(on_b)
    await until(lambda: on_c.updates == [True])
    await until(lambda: group_states(a, "sac.one", "grp") == ["active"])
    await asyncio.to_thread(publish_confirmed, a, "sac.one", [b"after"])
    await until(lambda: on_c.got == [b"after"])


async def test_an_amqp_member_and_a_stream_member_on_two_nodes_take_turns(
        abc_streams: Three, members: list[Member], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = abc_streams
    declare(a, "sac.mixed", **LOCAL)
    on_c = Member(c, "sac.mixed", "mixed")
    members.append(on_c)
    await on_c.subscribe(monkeypatch)
    await until(lambda: on_c.updates == [True])

    amqp_got: list[bytes] = []
    connection = await aio_pika.connect(b.url)  # b's 0.9.1 member joins the leader's group
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=10)
    queue = await channel.get_queue("sac.mixed", ensure=False)

    async def on_amqp(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        amqp_got.append(message.body)
        await message.ack()

    tag = await queue.consume(on_amqp, consumer_tag="mixed", arguments={
        "x-single-active-consumer": True, "x-stream-offset": "next"})
    await until(lambda: group_states(a, "sac.mixed", "mixed") == ["active", "inactive"])
    await asyncio.to_thread(publish_confirmed, a, "sac.mixed", [b"one", b"two"])
    await until(lambda: len(on_c.got) == 2)
    await asyncio.sleep(1)
    assert on_c.got == [b"one", b"two"] and amqp_got == []

    await on_c.close()  # the stream member goes: the 0.9.1 member on b takes over
    members.remove(on_c)
    await until(lambda: group_states(a, "sac.mixed", "mixed") == ["active"])
    await asyncio.to_thread(publish_confirmed, a, "sac.mixed", [b"three"])
    await until(lambda: amqp_got == [b"three"])

    # and the other way round: a stream member joining behind the active 0.9.1 one waits
    again = Member(c, "sac.mixed", "mixed")
    members.append(again)
    await again.subscribe(monkeypatch)
    await until(lambda: group_states(a, "sac.mixed", "mixed") == ["active", "inactive"])
    await asyncio.to_thread(publish_confirmed, a, "sac.mixed", [b"four"])
    await until(lambda: amqp_got == [b"three", b"four"])
    await asyncio.sleep(1)
    assert again.got == [] and again.updates == []
    await queue.cancel(tag)
    await until(lambda: again.updates == [True])
    await connection.close()


async def test_members_join_the_new_leaders_group_after_a_failover(
        abc_streams: Three, etcd: EtcdServer, cluster: str, members: list[Member],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = abc_streams
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "sac.fail", **LOCAL)
    on_b, on_c = Member(b, "sac.fail", "fo"), Member(c, "sac.fail", "fo")
    members.extend((on_b, on_c))
    await on_b.subscribe(monkeypatch)
    await until(lambda: on_b.updates == [True])
    await on_c.subscribe(monkeypatch)
    await until(lambda: group_states(a, "sac.fail", "fo") == ["active", "inactive"])

    a.kill()  # the group's node goes: b and c step down, and join the new leader's group
    await asyncio.to_thread(  # (leader_of runs its own event loop)
        wait_until, lambda: leader_of(etcd, cluster, "sac.fail") != "a", 60)
    leader = nodes[await asyncio.to_thread(leader_of, etcd, cluster, "sac.fail")]
    await until(lambda: sorted(group_states(leader, "sac.fail", "fo"))
                == ["active", "inactive"], timeout=30)
    await asyncio.to_thread(publish_confirmed, leader, "sac.fail", [b"after"])
    await until(lambda: on_b.got + on_c.got == [b"after"])
    await asyncio.sleep(1)
    assert on_b.got + on_c.got == [b"after"]  # one of them, once


async def test_a_dead_members_node_leaves_the_group(
        abc_streams: Three, members: list[Member], monkeypatch: pytest.MonkeyPatch) -> None:
    """`kill -9` of the active member's node: the leader does not keep it active (its link
    closed), and the other member takes over."""
    a, b, c = abc_streams
    declare(a, "sac.dead", **LOCAL)
    on_b, on_c = Member(b, "sac.dead", "dead"), Member(c, "sac.dead", "dead")
    members.extend((on_b, on_c))
    await on_b.subscribe(monkeypatch)
    await until(lambda: on_b.updates == [True])
    await on_c.subscribe(monkeypatch)
    await until(lambda: group_states(a, "sac.dead", "dead") == ["active", "inactive"])
    b.kill()
    await until(lambda: group_states(a, "sac.dead", "dead") == ["active"])
    await until(lambda: on_c.updates == [True])
    await asyncio.to_thread(publish_confirmed, a, "sac.dead", [b"to-c"])
    await until(lambda: on_c.got == [b"to-c"])


async def test_restarting_the_leaders_log_keeps_the_group(
        abc_streams: Three, members: list[Member], monkeypatch: pytest.MonkeyPatch) -> None:
    """restart_stream on the leader re-attaches its log: the members on other nodes are told
    to join again, and the group is whole again with one active member."""
    a, b, c = abc_streams
    declare(a, "sac.restart", **LOCAL)
    on_b, on_c = Member(b, "sac.restart", "rs"), Member(c, "sac.restart", "rs")
    members.extend((on_b, on_c))
    await on_b.subscribe(monkeypatch)
    await until(lambda: on_b.updates == [True])
    await on_c.subscribe(monkeypatch)
    await until(lambda: group_states(a, "sac.restart", "rs") == ["active", "inactive"])
    assert ok(a, "POST", "/api/leveret/streams/%2F/sac.restart/restart", {}) == {"leader": "a"}
    await until(lambda: sorted(group_states(a, "sac.restart", "rs")) == ["active", "inactive"]
                and [m.updates[-1:] for m in (on_b, on_c)].count([True]) == 1)
    await asyncio.to_thread(publish_confirmed, a, "sac.restart", [b"after"])
    await until(lambda: on_b.got + on_c.got == [b"after"])
    await asyncio.sleep(1)
    assert on_b.got + on_c.got == [b"after"]


def all_groups(nodes: Three, reference: str) -> dict[str, list[str]]:
    """Every node's groups named `reference`, by stream: a group is where its stream leads."""
    found: dict[str, list[str]] = {}
    for node in nodes:
        for group in api_get(node, "/api/leveret/consumer-groups/%2F"):
            if group["reference"] == reference and group["members"]:
                assert group["stream"] not in found, "one group per stream in the cluster"
                found[group["stream"]] = [m["state"] for m in group["members"]]
    return found


async def test_super_stream_members_on_different_nodes_spread_over_the_partitions(
        abc_streams: Three, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two super-stream consumers of one group, each partition read on a different node by
    each (partitions lead on a, b and c): partition i's active member is member i mod 2 of
    its group, cluster-wide, so each partition is read by exactly one of them."""
    a = abc_streams[0]
    ok(a, "PUT", "/api/stream/super-streams/%2F/inv", {"partitions": 3})
    got: dict[str, list[tuple[str, bytes]]] = {"low": [], "high": []}
    told: dict[str, dict[str, bool]] = {"low": {}, "high": {}}  # what ConsumerUpdate said
    consumers = []
    for who, pick in (("low", min), ("high", max)):
        consumer = rstream.SuperStreamConsumer(
            "127.0.0.1", port=port(a), username="guest", password="guest", super_stream="inv")

        async def on_message(message: Any, context: Any, who: str = who) -> None:
            got[who].append((context.stream, bytes(message.body)))

        async def on_update(active: bool, context: Any, who: str = who) -> Any:
            told[who][context.stream] = active
            return rstream.OffsetSpecification(rstream.OffsetType.FIRST, 0)

        monkeypatch.setattr(  # each partition on one of its two replicas: low or high port
            "rstream.consumer.random",
            SimpleNamespace(choice=lambda rs, pick=pick: pick(rs, key=lambda r: r.port)))
        await consumer.start()
        await consumer.subscribe(
            on_message, decoder=rstream.amqp_decoder,
            properties={"single-active-consumer": "true", "name": "app",
                        "super-stream": "inv"},
            consumer_update_listener=on_update)
        monkeypatch.undo()
        consumers.append(consumer)
        if who == "low":  # joined everywhere before the other one
            await until(lambda: sorted(all_groups(abc_streams, "app"))
                        == ["inv-0", "inv-1", "inv-2"])
    try:
        await until(lambda: all_groups(abc_streams, "app") == {
            "inv-0": ["active", "inactive"], "inv-1": ["inactive", "active"],
            "inv-2": ["active", "inactive"]})
        await until(lambda: told == {"low": {"inv-0": True, "inv-1": False, "inv-2": True},
                                     "high": {"inv-1": True}})
        for key in ("0", "1", "2"):
            await asyncio.to_thread(publish_confirmed_to, a, "inv", key)
        await until(lambda: len(got["low"]) + len(got["high"]) == 3)
        await asyncio.sleep(1)
        assert sorted(got["low"]) == [("inv-0", b"0"), ("inv-2", b"2")]
        assert got["high"] == [("inv-1", b"1")]
    finally:
        for consumer in consumers:
            await consumer.close()


def publish_confirmed_to(node: ClusterNode, exchange: str, key: str) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(exchange, key, key.encode(), mandatory=True)
    conn.close()


class OtherNode:
    """Another node ("0-test") as the leader sees it over a real link: it queues what the
    leader tells its members (`sac.state`) and answers pings (a node drops a link that does
    not)."""

    def __init__(self, cluster: str) -> None:
        self.told: asyncio.Queue[Any] = asyncio.Queue()
        self.handlers = Handlers()
        self.handlers.on_message("sac.state", self._state)
        self.handlers.on_request("node.ping", self._ping)
        self.config = LinkConfig(cluster=cluster, node="0-test", secret=SECRET.encode())

    async def dial(self, node: ClusterNode) -> Link:
        return await link_connect("127.0.0.1", node.cluster_port, self.config, self.handlers)

    async def _state(self, _link: Link, body: Any) -> None:
        await self.told.put(body)

    async def _ping(self, _link: Link, _body: Any) -> dict[str, Any]:
        return {"name": "0-test", "version": "test", "revision": 0}


async def test_the_sac_messages_on_the_link(abc_streams: Three, cluster: str) -> None:
    """The leader's side of the protocol as another node speaks it, over a real link: a join
    is a member at the end of the group, told when it is active (with the stored offset); a
    node that does not lead the stream says `retry`; a leave hands over; malformed bodies are
    ignored and the link stays up; the link's close removes every member it registered."""
    a, b, _c = abc_streams
    declare(a, "sac.link", **LOCAL)
    await asyncio.to_thread(publish_confirmed, a, "sac.link", [b"x", b"y"])
    other = OtherNode(cluster)
    told = other.told
    on_b = await other.dial(b)
    on_b.post("sac.join", {"vhost": "/", "stream": "sac.link", "member": 7, "reference": "r"})
    assert await asyncio.wait_for(told.get(), 10) == {"member": 7, "retry": True}
    await on_b.close()

    on_a = await other.dial(a)
    for junk in ("junk", {"member": "1"}, {"vhost": "/", "stream": "sac.link", "member": 1}):
        on_a.post("sac.join", junk)
        on_a.post("sac.leave", junk)
    on_a.post("sac.join", {"vhost": "/", "stream": "sac.link", "member": 1, "reference": "r",
                           "connection": "10.0.0.9:5000 -> 10.0.0.1:5552"})
    assert await asyncio.wait_for(told.get(), 10) == {"member": 1, "active": True,
                                                      "stored": None}
    on_a.post("sac.join", {"vhost": "/", "stream": "sac.link", "member": 2, "reference": "r"})
    await until(lambda: group_states(a, "sac.link", "r") == ["active", "inactive"])
    group = api_get(a, "/api/leveret/consumer-groups/%2F/sac.link/r")
    assert [(m["connection_name"], m["node"]) for m in group["members"]] == [
        ("10.0.0.9:5000 -> 10.0.0.1:5552", "0-test"), ("", "0-test")]  # on another node

    await asyncio.to_thread(store_offset_on, a, "sac.link", "r", 1)
    await until(lambda: stored_on(a, "sac.link", "r") == 1)
    on_a.post("sac.leave", {"vhost": "/", "stream": "sac.link", "member": 1})
    assert await asyncio.wait_for(told.get(), 10) == {"member": 2, "active": True, "stored": 1}
    assert group_states(a, "sac.link", "r") == ["active"]

    await on_a.close()  # its node's link goes: so do its members
    await until(lambda: all_groups(abc_streams, "r") == {})
    assert told.empty()


def store_offset_on(node: ClusterNode, stream: str, reference: str, offset: int) -> None:
    client = RawStream(port(node))
    assert client.handshake() == 1
    client.send(0x0A, 1, s(reference) + s(stream) + struct.pack(">Q", offset))  # no answer
    client.request(0x0B, s(reference) + s(stream))  # QueryOffset: after the store
    client.response(0x0B)
    client.close()


async def test_a_stepping_down_remote_member_is_waited_for(
        abc_streams: Three, cluster: str, etcd: EtcdServer) -> None:
    """A super stream's partition 1 rebalances when a second member joins: its first member
    is told it is inactive, and (as RabbitMQ's coordinator does) the second one is made active
    only once the first member's node says `sac.stepped`, when its client has answered."""
    a = abc_streams[0]
    ok(a, "PUT", "/api/stream/super-streams/%2F/steps", {"partitions": 2})
    leader = {node.node_name: node for node in abc_streams}[
        await asyncio.to_thread(leader_of, etcd, cluster, "steps-1")]
    other = OtherNode(cluster)
    told = other.told
    link = await other.dial(leader)
    try:
        where = {"vhost": "/", "stream": "steps-1"}
        link.post("sac.join", {**where, "member": 1, "reference": "g"})
        assert await asyncio.wait_for(told.get(), 10) == {"member": 1, "active": True,
                                                          "stored": None}
        link.post("sac.join", {**where, "member": 2, "reference": "g"})  # index 1 mod 2
        assert await asyncio.wait_for(told.get(), 10) == {"member": 1, "active": False}
        with pytest.raises(TimeoutError):  # member 1 has not said it stepped down
            await asyncio.wait_for(told.get(), 1.0)
        link.post("sac.stepped", {**where, "member": 3})  # not a member: ignored
        link.post("sac.stepped", "junk")
        link.post("sac.stepped", {**where, "member": 1})
        assert await asyncio.wait_for(told.get(), 10) == {"member": 2, "active": True,
                                                          "stored": None}
        assert group_states(leader, "steps-1", "g") == ["inactive", "active"]
    finally:
        await link.close()
