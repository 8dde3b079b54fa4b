"""Replicated streams in a real cluster (real etcd, three real `leveret serve` nodes, pika and
aio-pika): a stream's members and leader at declaration (x-initial-cluster-size,
x-queue-leader-locator), its record and leadership key in etcd; confirmed publishes (on the
leader and forwarded from a replica's node) are on every member's log, byte for byte; a
consumer on a replica's node reads them from its local replica; with two of three members
killed (kill -9) a publish is not confirmed, and once one is back it is; when the leader is
killed a member with the most advanced log leads in the next epoch, nothing confirmed is lost
(three rounds), and the old leader comes back as a replica with the same bytes."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from support.brokers import BrokerProcess
from support.cluster import (
    STREAM,
    ClusterNode,
    connect,
    consume,
    declare,
    in_etcd,
    leader_of,
    linked,
    make_node,
    publish_confirmed,
    publish_until_confirmed,
    same_logs,
    segments,
    states,
    wait_until,
)
from support.cluster_api import ok
from support.etcd import EtcdServer

from leveret.storage import chunk as chunk_format


def test_members_and_leader_at_declaration(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(a, "s.all")
    record, leadership = in_etcd(etcd, cluster, "s.all")
    assert record is not None and leadership is not None
    assert record.node == "a" and record.members[0] == "a"
    assert sorted(record.members) == ["a", "b", "c"]
    assert (leadership.leader, leadership.members, leadership.epoch) == ("a", record.members, 1)

    declare(b, "s.two", **{"x-initial-cluster-size": 2})
    record, leadership = in_etcd(etcd, cluster, "s.two")
    assert record is not None and leadership is not None
    assert record.node == "b" and len(record.members) == 2 and record.members[0] == "b"
    assert leadership.members == record.members

    declare(c, "s.capped", **{"x-initial-cluster-size": 7})
    record, _ = in_etcd(etcd, cluster, "s.capped")
    assert record is not None and len(record.members) == 3 and record.node == "c"

    # a, b and c lead one stream each: balanced picks the lowest name among the fewest
    declare(c, "s.balanced", **{"x-queue-leader-locator": "balanced"})
    record, _ = in_etcd(etcd, cluster, "s.balanced")
    assert record is not None and record.node == "a"
    declare(c, "s.balanced2", **{"x-queue-leader-locator": "balanced"})
    record, _ = in_etcd(etcd, cluster, "s.balanced2")
    assert record is not None and record.node == "b"

    # one member: a stream as on one node, no leadership key
    declare(a, "s.one", **{"x-initial-cluster-size": 1})
    record, leadership = in_etcd(etcd, cluster, "s.one")
    assert record is not None and record.members == () and leadership is None
    assert record.node == "a"

    # a bad size or locator is refused with RabbitMQ's text, as on one node
    conn = connect(b)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().queue_declare("s.bad", durable=True,
                                     arguments={**STREAM, "x-initial-cluster-size": 0})
    assert refused.value.reply_code == 406
    conn.close()

    # a stream declared through the management API is placed the same way
    ok(b, "PUT", "/api/queues/%2F/s.api",
       {"durable": True, "arguments": {**STREAM, "x-initial-cluster-size": 2}})
    record, leadership = in_etcd(etcd, cluster, "s.api")
    assert record is not None and leadership is not None
    assert record.node == "b" and len(record.members) == 2 and record.members[0] == "b"
    wait_until(lambda: all(n.data_dir.joinpath("queues", record.storage_id or "-").is_dir()
                           for n in (a, b, c) if n.node_name in record.members), timeout=30)

    # deleting the stream deletes its leadership key in the same txn
    conn = connect(b)
    conn.channel().queue_delete("s.all")
    conn.close()
    assert in_etcd(etcd, cluster, "s.all") == (None, None)


def test_confirmed_publishes_are_on_every_member_and_a_replica_serves_consumers(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(a, "s.rep")
    record, _ = in_etcd(etcd, cluster, "s.rep")
    assert record is not None and record.storage_id is not None and record.node == "a"
    publish_confirmed(a, "s.rep", [f"a{i}".encode() for i in range(300)])
    publish_confirmed(b, "s.rep", [f"b{i}".encode() for i in range(200)])  # forwarded to a

    # every member holds the same chunks, byte for byte
    wait_until(lambda: same_logs((a, b, c), record.storage_id or ""), timeout=60)

    expected = [f"a{i}".encode() for i in range(300)] + [f"b{i}".encode() for i in range(200)]
    assert consume(c, "s.rep", 500) == expected  # a replica's node reads its own copy
    assert consume(b, "s.rep", 500) == expected
    assert consume(a, "s.rep", 500) == expected

    # stream_status on the leader: one row per member; on a replica, its own row
    def status_rows(node: ClusterNode) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = ok(node, "GET", "/api/leveret/streams/%2F/s.rep/status")[
            "members"]
        return rows

    def all_acked() -> bool:
        rows = status_rows(a)
        return all(r["offset"] == 499 and r["committed_offset"] == 499 for r in rows)

    wait_until(all_acked, timeout=30)
    rows = status_rows(a)
    assert sorted((r["role"], r["node"], r["epoch"], r["lag"]) for r in rows) == [
        ("replica", "b", 1, 0), ("replica", "c", 1, 0), ("writer", "a", 1, 0)]
    own = next(r for r in status_rows(c) if r["node"] == "c")  # every node: every member
    assert (own["role"], own["node"], own["offset"], own["committed_offset"]) == (
        "replica", "c", 499, 499)

    # a consumer on a replica's node that waits for new data gets it once it is committed
    conn = connect(c)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[bytes] = []
    ch.basic_consume("s.rep", lambda chan, m, p, body: (got.append(body),
                                                         chan.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "next"})
    conn.process_data_events(0.5)
    publish_confirmed(a, "s.rep", [b"late"])
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.close()
    assert got == [b"late"]

    # a tracking consumer on a replica's node: its offset is stored by the leader, in the log,
    # so it reaches every member; it resumes after it on another replica's node
    conn = connect(c)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    seen: list[bytes] = []

    def take(chan: Any, m: Any, _p: Any, body: bytes) -> None:
        if len(seen) < 10:
            seen.append(body)
            chan.basic_ack(m.delivery_tag)

    ch.basic_consume("s.rep", take, consumer_tag="tracker",
                     arguments={"x-stream-automatic-offset-tracking": True,
                                "x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while len(seen) < 10 and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.close()  # the cancel stores the offset of the last ack
    assert seen == expected[:10]

    def tracked(node: ClusterNode) -> bool:
        rows = ok(node, "GET", "/api/leveret/streams/%2F/s.rep/status")["tracking"]
        return {"type": "offset", "reference": "tracker", "value": 9} in rows

    wait_until(lambda: all(tracked(n) for n in (a, b, c)), timeout=30)
    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    resumed: list[bytes] = []
    ch.basic_consume("s.rep", lambda chan, m, p, body: resumed.append(body),
                     consumer_tag="tracker")  # no x-stream-offset: after the stored one
    deadline = time.monotonic() + 30
    while not resumed and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.close()
    assert resumed[0] == expected[10]
    wait_until(lambda: same_logs((a, b, c), record.storage_id or ""), timeout=60)

    # restart_stream on the leader's node and on a replica's: shipping and replicating go on
    ok(a, "POST", "/api/leveret/streams/%2F/s.rep/restart")
    ok(c, "POST", "/api/leveret/streams/%2F/s.rep/restart")
    publish_confirmed(b, "s.rep", [b"restarted"])
    wait_until(lambda: same_logs((a, b, c), record.storage_id or ""), timeout=60)
    expected.append(b"restarted")

    # c reads its own replica, not the leader's log: with a gone, c still serves it all
    a.kill()
    assert consume(c, "s.rep", 502) == [*expected[:500], b"late", b"restarted"]


def test_without_a_quorum_nothing_is_confirmed_and_it_resumes_when_one_is_back(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(a, "s.quorum")
    record, _ = in_etcd(etcd, cluster, "s.quorum")
    assert record is not None and record.node == "a" and len(record.members) == 3
    publish_confirmed(a, "s.quorum", [b"before"])
    b.kill()
    c.kill()

    async def run() -> None:
        connection = await aio_pika.connect(a.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            pending = asyncio.ensure_future(channel.default_exchange.publish(
                aio_pika.Message(b"during"), routing_key="s.quorum", timeout=None))
            # the leader has written it but only one member of three holds it: what the
            # publisher sees is nothing at all (no ack, no nack); the connection stays open
            await asyncio.sleep(5)
            assert not pending.done()
            assert not connection.is_closed
            await asyncio.to_thread(b.restart)
            confirm = await asyncio.wait_for(pending, 60)  # a and b: a quorum again
            assert type(confirm).__name__ == "Ack"

    asyncio.run(run())
    assert consume(a, "s.quorum", 2) == [b"before", b"during"]
    assert consume(b, "s.quorum", 2) == [b"before", b"during"]


def test_the_leader_killed_a_replica_leads_and_the_old_leader_catches_up(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(a, "s.fail")
    record, _ = in_etcd(etcd, cluster, "s.fail")
    assert record is not None and record.node == "a" and record.storage_id is not None
    before = [f"x{i}".encode() for i in range(200)]
    publish_confirmed(b, "s.fail", before)
    a.kill()

    def moved() -> bool:
        found, _ = in_etcd(etcd, cluster, "s.fail")
        return found is not None and found.node != "a"

    wait_until(moved, timeout=60)
    record, leadership = in_etcd(etcd, cluster, "s.fail")
    assert record is not None and leadership is not None
    leader = record.node
    assert leader in ("b", "c") and record.members[0] == leader
    assert sorted(record.members) == ["a", "b", "c"]
    assert (leadership.leader, leadership.epoch, leadership.members) == (leader, 2,
                                                                          record.members)

    # publishing through either surviving node is confirmed once the new leader has it (a
    # publish that reached the old leader's node is nack'ed, never confirmed and lost)
    publish_until_confirmed(c, "s.fail", b"probe")
    after = [f"y{i}".encode() for i in range(100)]
    publish_confirmed(b, "s.fail", after[:50])
    publish_confirmed(c, "s.fail", after[50:])
    for node in (b, c):
        got = consume(node, "s.fail", 301)
        assert [m for m in got if m != b"probe"] == before + after
        assert got.count(b"probe") == 1

    # the old leader comes back as a replica of the new one and ends with the same bytes
    a.restart()
    nodes = {"a": a, "b": b, "c": c}
    wait_until(lambda: same_logs((nodes[leader], a), record.storage_id or ""), timeout=90)
    got = consume(a, "s.fail", 301)
    assert [m for m in got if m != b"probe"] == before + after


def test_a_killed_leader_is_replaced_before_its_lease_expires(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    """With a 60 s lease, `kill -9` of the leader's node: the two other members have lost
    their links to it, so they elect a new leader while etcd still lists the dead node as
    running, and a publish through a survivor is confirmed by the new leader."""
    three = [make_node(tmp_path, etcd.url, cluster, name,
                       env={"LEVERET_CLUSTER_LEASE_TTL_S": "60"}, management=True)
             for name in ("a", "b", "c")]
    for node in three:
        nodes.append(node.start())
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    a, b, c = three
    declare(a, "s.quick")
    publish_confirmed(b, "s.quick", [b"before"])
    a.kill()

    def moved() -> bool:
        found, _ = in_etcd(etcd, cluster, "s.quick")
        return found is not None and found.node != "a"

    wait_until(moved, timeout=30)
    assert states(etcd.url, cluster)["a"] == "running"  # its lease has not expired
    publish_until_confirmed(c, "s.quick", b"after")
    assert consume(b, "s.quick", 2) == [b"before", b"after"]
    assert states(etcd.url, cluster)["a"] == "running"


def kill_the_leader(abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
                    cluster: str, rounds: int) -> None:
    """`rounds` times: 50 confirmed publishes through a node that does not lead, `kill -9` of
    the leader, a publish retried until a new leader confirms it, the killed node restarted.
    Then every member holds every confirmed message in order, once, byte for byte."""
    nodes = dict(zip("abc", abc, strict=True))
    declare(nodes["a"], "s.rounds")
    record, _ = in_etcd(etcd, cluster, "s.rounds")
    assert record is not None and record.storage_id is not None
    confirmed: list[bytes] = []
    probes = [f"probe{round_}".encode() for round_ in range(rounds)]
    for round_ in range(rounds):
        leader = leader_of(etcd, cluster, "s.rounds")
        other = next(n for n in "abc" if n != leader)
        batch = [f"r{round_}-{i}".encode() for i in range(50)]
        publish_confirmed(nodes[other], "s.rounds", batch)
        confirmed += batch
        nodes[leader].kill()
        wait_until(lambda old=leader: leader_of(etcd, cluster, "s.rounds") != old, timeout=60)
        publish_until_confirmed(nodes[other], "s.rounds", probes[round_])
        nodes[leader].restart()
        wait_until(lambda old=leader: linked(nodes[old], 2), timeout=60)
    final = leader_of(etcd, cluster, "s.rounds")
    _, leadership = in_etcd(etcd, cluster, "s.rounds")
    assert leadership is not None and leadership.epoch == rounds + 1
    wait_until(lambda: same_logs(tuple(nodes.values()), record.storage_id or ""), timeout=90)
    for name, node in nodes.items():
        got = consume(node, "s.rounds", 51 * rounds)
        assert [m for m in got if not m.startswith(b"probe")] == confirmed, (name, final)
        assert [m for m in got if m.startswith(b"probe")] == probes


def test_three_rounds_of_killing_the_leader_lose_no_confirmed_message(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    kill_the_leader(abc, etcd, cluster, 3)


@pytest.mark.slow
def test_twenty_rounds_of_killing_the_leader_lose_no_confirmed_message(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    kill_the_leader(abc, etcd, cluster, 20)


def test_leader_and_a_replica_down_nothing_until_one_is_back_then_a_new_leader(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    a, b, c = abc
    declare(a, "s.two-down")
    publish_confirmed(c, "s.two-down", [b"first"])
    a.kill()
    b.kill()
    time.sleep(4)  # both leases gone: c alone is no quorum, so nobody is elected
    assert leader_of(etcd, cluster, "s.two-down") == "a"
    with pytest.raises(pika.exceptions.NackError):  # the leader's node is down: nack'ed
        publish_confirmed(c, "s.two-down", [b"refused"])
    b.restart()
    wait_until(lambda: leader_of(etcd, cluster, "s.two-down") in ("b", "c"), timeout=60)
    publish_until_confirmed(c, "s.two-down", b"second")
    assert consume(c, "s.two-down", 2) == [b"first", b"second"]
    assert consume(b, "s.two-down", 2) == [b"first", b"second"]


def test_a_leader_paused_past_its_lease_confirms_nothing_more_and_converges(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    """SIGSTOP of the leader past its lease: b or c leads in epoch 2. Publishes a client of a
    sent while a was stopped are, once a wakes, either nack'ed or confirmed, and every
    confirmed one is on every member; a's log converges to the new leader's."""
    a, b, c = abc
    declare(a, "s.paused")
    record, _ = in_etcd(etcd, cluster, "s.paused")
    assert record is not None and record.storage_id is not None
    publish_confirmed(a, "s.paused", [b"before"])

    async def run() -> list[tuple[bytes, str]]:
        connection = await aio_pika.connect(a.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            a.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            try:
                bodies = [f"paused{i}".encode() for i in range(5)]
                pending = [asyncio.ensure_future(channel.default_exchange.publish(
                    aio_pika.Message(body), routing_key="s.paused", timeout=None))
                    for body in bodies]
                await asyncio.to_thread(
                    wait_until, lambda: leader_of(etcd, cluster, "s.paused") != "a", 60)
            finally:
                a.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            outcomes = await asyncio.gather(*(asyncio.wait_for(p, 90) for p in pending),
                                            return_exceptions=True)
            return [(body, type(o).__name__) for body, o in zip(bodies, outcomes,
                                                                strict=True)]

    outcomes = asyncio.run(run())
    # Ack, or DeliveryError: aio-pika's basic.nack (in practice every one: a wakes without a
    # lease and without links, appends them in epoch 1, and nacks them when it learns it is
    # deposed; the new leader's sync cuts them from its log)
    assert all(kind in ("Ack", "DeliveryError") for _, kind in outcomes), outcomes
    leader = leader_of(etcd, cluster, "s.paused")
    assert leader in ("b", "c")
    nodes = {"a": a, "b": b, "c": c}
    wait_until(lambda: same_logs((nodes[leader], a), record.storage_id or ""), timeout=90)
    publish_until_confirmed(a, "s.paused", b"after")  # through a, now a replica: forwarded
    confirmed = [body for body, kind in outcomes if kind == "Ack"]
    for node in (a, b, c):
        got = consume(node, "s.paused", 2 + len(confirmed))
        assert got[0] == b"before" and got[-1] == b"after"
        assert all(body in got for body in confirmed)


def epochs(node: ClusterNode, storage_id: str) -> list[int]:
    """The epoch of each chunk in the node's copy of the stream, in log order."""
    found = []
    for data in segments(node, storage_id).values():
        pos = 8  # the segment header
        while pos < len(data):
            header = chunk_format.decode_header(data[pos:])
            found.append(header.epoch)
            pos += header.total_size
    return found


def test_publishing_without_pause_through_the_failover_keeps_the_stream_committing(
        abc: tuple[ClusterNode, ClusterNode, ClusterNode], etcd: EtcdServer,
        cluster: str) -> None:
    """A client of b publishes one message after another, retrying at once on a nack, while
    the leader a is killed: publishes that reach b as it becomes the leader wait for its new
    epoch (a chunk in the old one would be refused by c and stall the stream), the stream
    goes on committing, and the members' logs never go back to an older epoch."""
    a, b, c = abc
    declare(a, "s.busy")
    record, _ = in_etcd(etcd, cluster, "s.busy")
    assert record is not None and record.storage_id is not None
    confirmed: list[bytes] = []
    killed = threading.Event()
    after_kill = 0
    stop = threading.Event()

    def publish() -> None:
        nonlocal after_kill
        i = 0
        while not stop.is_set():
            try:
                conn = connect(b)
                ch = conn.channel()
                ch.confirm_delivery()
                while not stop.is_set():
                    body = b"m%d" % i
                    i += 1
                    try:
                        ch.basic_publish("", "s.busy", body)
                    except pika.exceptions.NackError:
                        continue
                    confirmed.append(body)
                    after_kill += killed.is_set()
            except pika.exceptions.AMQPError:
                time.sleep(0.05)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        wait_until(lambda: len(confirmed) >= 50, timeout=30)
        a.kill()
        killed.set()
        wait_until(lambda: after_kill >= 50, timeout=60)
    finally:
        stop.set()
        publisher.join(10)
    for node in (b, c):
        found = epochs(node, record.storage_id)
        assert found == sorted(found), (node.node_name, found)
        got = consume(node, "s.busy", len(confirmed))
        assert [m for m in got if m in set(confirmed)] == confirmed
