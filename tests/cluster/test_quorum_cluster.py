"""Quorum queues on a three-node cluster (real etcd, three real `leveret serve` nodes, pika):
members placed over the nodes, every member's log the same, publishing and consuming through
any node with the leader serving, and `kill -9` of the leader's node: every confirmed message
is delivered afterwards, through another node, none lost, each publisher's order kept for
first deliveries; and a consumer forwarded through a replica that closes mid-stream leaves the
node-to-node tunnel open. The nodes fsync their queue logs before confirming
(LEVERET_QUEUE_FSYNC=always, as RabbitMQ's quorum queues do): the leader's and the replicas'
fsyncs run on the syncer's threads, and a confirm waits for a majority's."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import aio_pika
import pika
import pytest
from support.cluster import (
    ClusterNode,
    connect,
    in_etcd,
    leader_of,
    linked,
    paused,
    publish_confirmed,
    publish_until_confirmed,
    same_logs,
    wait_until,
)
from support.etcd import EtcdServer

Three = tuple[ClusterNode, ClusterNode, ClusterNode]
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def node_env() -> dict[str, str]:
    return {"LEVERET_QUEUE_FSYNC": "always"}


def declare(node: ClusterNode, name: str, **arguments: Any) -> None:
    conn = connect(node)
    conn.channel().queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    conn.close()


def drain(node: ClusterNode, name: str, want: int,
          timeout: float = 60) -> list[tuple[bytes, bool]]:
    """Consume `want` messages through `node` with acks: (body, redelivered) in order; what
    else was delivered meanwhile goes back unacked when the connection closes."""
    conn = connect(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[tuple[bytes, bool]] = []

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        if len(got) < want:
            got.append((body, method.redelivered))
            channel.basic_ack(method.delivery_tag)

    ch.basic_consume(name, on_message)
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.close()
    return got


def ready(node: ClusterNode, name: str) -> int:
    conn = connect(node)
    try:
        return int(conn.channel().queue_declare(name, passive=True).method.message_count)
    finally:
        conn.close()


def test_a_quorum_queue_has_three_members_and_serves_every_node(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    declare(a, "qq")
    record, leadership = in_etcd(etcd, cluster, "qq")
    assert record is not None and record.type == "quorum"
    assert sorted(record.members) == ["a", "b", "c"] and record.node == "a"
    assert leadership is not None and leadership.leader == "a"
    publish_confirmed(b, "qq", [b"m%d" % i for i in range(50)])  # through a member
    publish_confirmed(a, "qq", [b"n%d" % i for i in range(50)])  # at the leader
    assert ready(c, "qq") == 100  # a passive declare on a member asks the leader
    got = drain(c, "qq", 60)
    assert [body for body, _ in got] == (
        [b"m%d" % i for i in range(50)] + [b"n%d" % i for i in range(10)])
    conn = connect(b)
    method, _props, body = conn.channel().basic_get("qq", auto_ack=True)
    conn.close()
    assert body == b"n10" and method.message_count == 39
    assert record.storage_id is not None
    wait_until(lambda: same_logs((a, b, c), record.storage_id or ""), timeout=20)


def test_kill_the_leader_loses_no_confirmed_message(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "orders")
    publish_confirmed(b, "orders", [b"before-%d" % i for i in range(200)])
    # half of them taken and acked, a few taken and left unacked when the leader dies
    assert len(drain(c, "orders", 100)) == 100
    holder = connect(b)
    hold = holder.channel()
    held = [hold.basic_get("orders")[2] for _ in range(5)]
    assert held == [b"before-%d" % i for i in range(100, 105)]
    old = leader_of(etcd, cluster, "orders")
    nodes[old].kill()
    wait_until(lambda: leader_of(etcd, cluster, "orders") != old, timeout=60)
    alive = [node for name, node in nodes.items() if name != old]
    publisher, consumer = alive[0], alive[-1]
    # the first confirm through another node, once the new leader serves
    publish_until_confirmed(publisher, "orders", b"after-0", timeout=30)
    publish_confirmed(publisher, "orders", [b"after-%d" % i for i in range(1, 50)])
    if holder.is_open:
        try:
            holder.close()
        except pika.exceptions.AMQPError:
            pass
    got = drain(consumer, "orders", 150)
    bodies = [body for body, _ in got]
    assert bodies == ([b"before-%d" % i for i in range(100, 200)]
                      + [b"after-%d" % i for i in range(50)])
    assert all(redelivered for body, redelivered in got[:5])  # the five held ones came back


def test_consumers_on_other_nodes_keep_their_subscriptions_across_a_failover(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Consumers on both other nodes, one holding an unacked delivery, while the leader's node
    is killed: neither is cancelled; the held delivery comes back redelivered; what is
    published afterwards reaches them."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "jobs")
    old = leader_of(etcd, cluster, "jobs")
    others = [node for name, node in nodes.items() if name != old]
    got: dict[str, list[tuple[bytes, bool]]] = {}
    cancelled: list[str] = []
    held: list[int] = []
    headers: dict[tuple[bytes, bool], dict[str, Any]] = {}
    conns = []
    for name, node in nodes.items():
        if name == old:
            continue
        conn = connect(node)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        got[name] = []

        def on_message(channel: Any, method: Any, props: Any, body: bytes,
                       name: str = name) -> None:
            got[name].append((body, method.redelivered))
            headers[body, method.redelivered] = props.headers or {}
            if body == b"hold" and not held:
                held.append(method.delivery_tag)  # left unacked across the failover
            else:
                channel.basic_ack(method.delivery_tag)

        ch.basic_consume("jobs", on_message)
        ch.add_on_cancel_callback(lambda _frame, name=name: cancelled.append(name))
        conns.append(conn)

    def pump(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for conn in conns:
                conn.process_data_events(0.02)

    publish_confirmed(others[0], "jobs", [b"hold"])
    deadline = time.monotonic() + 20
    while not held and time.monotonic() < deadline:
        pump(0.1)
    assert held
    nodes[old].kill()
    wait_until(lambda: leader_of(etcd, cluster, "jobs") != old, timeout=60)
    deadline = time.monotonic() + 30
    while True:
        try:
            publish_confirmed(others[0], "jobs", [b"after-0"])
            break
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    publish_confirmed(others[1], "jobs", [b"after-%d" % i for i in range(1, 20)])
    after = {b"after-%d" % i for i in range(20)}

    def done() -> bool:
        rows = [row for taken in got.values() for row in taken]
        return after <= {body for body, _ in rows} and (b"hold", True) in rows

    deadline = time.monotonic() + 30
    while not done() and time.monotonic() < deadline:
        pump(0.1)
    assert not cancelled, got
    bodies = [body for rows in got.values() for body, _ in rows]
    assert {b"after-%d" % i for i in range(20)} <= set(bodies)
    assert any(body == b"hold" and redelivered
               for rows in got.values() for body, redelivered in rows), got
    assert all(rows for rows in got.values())  # both consumers still take messages
    # counted as RabbitMQ 4.3 counts a consumer lost with a node: acquired, not a failure
    assert headers[b"hold", True].get("x-acquired-count") == 1, headers[b"hold", True]
    assert "x-delivery-count" not in headers[b"hold", True]
    for conn in conns:
        conn.close()


def test_nothing_is_sent_to_a_consumer_before_a_majority_records_the_delivery(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """A delivery is sent once a majority of the members holds its DELIVERED record: with both
    replicas paused, a consumer on the leader's node is sent nothing. So when the leader then
    dies, the message a new leader delivers was never seen before: a delivery the others had
    not recorded would come back unflagged, and RabbitMQ promises that `redelivered` false
    means a message was not delivered before."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "q.record", **{"x-queue-leader-locator": "client-local"})
    publish_confirmed(a, "q.record", [b"once"])
    leader = leader_of(etcd, cluster, "q.record")
    replicas = [node for name, node in nodes.items() if name != leader]
    conn = connect(nodes[leader])
    got: list[bytes] = []
    with paused(*replicas):
        conn.channel().basic_consume("q.record", lambda _c, _m, _p, body: got.append(body))
        end = time.monotonic() + 3
        while time.monotonic() < end:
            conn.process_data_events(0.1)
        assert got == [], "sent before a majority recorded its delivery"
        nodes[leader].kill()
    wait_until(lambda: leader_of(etcd, cluster, "q.record") not in (leader, None), timeout=60)
    assert [body for body, _ in drain(replicas[0], "q.record", 1)] == [b"once"]


def drain_all(node: ClusterNode, name: str, timeout: float = 30) -> list[bytes]:
    """Every message of the queue through `node`, by basic.get with acks, until empty."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = connect(node)
            break
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(name)
        if method is None:
            break
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    conn.close()
    return got


def kill_the_leader(abc: Three, etcd: EtcdServer, cluster: str, rounds: int) -> None:
    """`rounds` times: 50 confirmed publishes through a node that does not lead, a few taken
    and acked, `kill -9` of the leader, a publish retried until a new leader confirms it, the
    killed node restarted. Then every confirmed message has been delivered at least once,
    the first deliveries in publish order, through any node."""
    nodes = dict(zip("abc", abc, strict=True))
    declare(nodes["a"], "q.rounds")
    confirmed: list[bytes] = []
    acked: list[bytes] = []
    probes = [f"probe{round_}".encode() for round_ in range(rounds)]
    for round_ in range(rounds):
        leader = leader_of(etcd, cluster, "q.rounds")
        other = next(n for n in "abc" if n != leader)
        batch = [f"r{round_}-{i}".encode() for i in range(50)]
        publish_confirmed(nodes[other], "q.rounds", batch)
        confirmed += batch
        acked += [body for body, _ in drain(nodes[other], "q.rounds", 10)]
        nodes[leader].kill()
        wait_until(lambda old=leader: leader_of(etcd, cluster, "q.rounds") != old, timeout=60)
        publish_until_confirmed(nodes[other], "q.rounds", probes[round_])
        nodes[leader].restart()
        wait_until(lambda old=leader: linked(nodes[old], 2), timeout=60)
    final = leader_of(etcd, cluster, "q.rounds")
    got = drain_all(nodes[final], "q.rounds")
    # (a later round's drain may take an earlier round's probe)
    delivered = [body for body in acked + got if not body.startswith(b"probe")]
    first = list(dict.fromkeys(delivered))
    # every confirmed message delivered, first deliveries in publish order; an ack that a
    # killed leader had not yet committed brings its message back (at least once)
    assert first == confirmed, (final, len(delivered) - len(first))
    assert dict.fromkeys(body for body in acked + got if body.startswith(b"probe")
                         ) == dict.fromkeys(probes)


def test_three_rounds_of_killing_the_leader_lose_no_confirmed_message(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    kill_the_leader(abc, etcd, cluster, 3)


@pytest.mark.slow
def test_twenty_rounds_of_killing_the_leader_lose_no_confirmed_message(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    kill_the_leader(abc, etcd, cluster, 20)


def test_without_a_quorum_nothing_is_confirmed_and_it_resumes_when_one_is_back(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    declare(a, "q.quorum")
    publish_confirmed(a, "q.quorum", [b"before"])
    b.kill()
    c.kill()

    async def run() -> None:
        connection = await aio_pika.connect(a.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            pending = asyncio.ensure_future(channel.default_exchange.publish(
                aio_pika.Message(b"during"), routing_key="q.quorum", timeout=None))
            # one member of three holds it: the publisher sees nothing (no ack, no nack),
            # as RabbitMQ's quorum queue keeps it pending; the connection stays open
            await asyncio.sleep(4)
            assert not pending.done()
            assert not connection.is_closed
            await asyncio.to_thread(b.restart)
            confirm = await asyncio.wait_for(pending, 60)  # a and b: a quorum again
            assert type(confirm).__name__ == "Ack"

    asyncio.run(run())
    assert drain_all(b, "q.quorum") == [b"before", b"during"]


def test_a_restarted_replica_takes_only_what_it_lacks(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """A replica killed and restarted keeps its log (the same segment file, its bytes a
    prefix of the leader's) and takes only the chunks written meanwhile."""
    a, b, c = abc
    declare(a, "q.delta")
    record, _ = in_etcd(etcd, cluster, "q.delta")
    assert record is not None and record.storage_id is not None
    publish_confirmed(a, "q.delta", [b"old-%d" % i for i in range(300)])
    wait_until(lambda: same_logs((a, c), record.storage_id or ""), timeout=20)
    folder = c.data_dir / "queues" / record.storage_id
    first = sorted(folder.glob("*.segment"))[0]
    before_inode, before = first.stat().st_ino, first.read_bytes()
    c.kill()
    publish_confirmed(b, "q.delta", [b"new-%d" % i for i in range(300)])
    c.restart()
    wait_until(lambda: same_logs((a, c), record.storage_id or ""), timeout=60)
    assert first.stat().st_ino == before_inode
    assert first.read_bytes()[:len(before)] == before
    assert drain_all(c, "q.delta") == (
        [b"old-%d" % i for i in range(300)] + [b"new-%d" % i for i in range(300)])


def test_leader_and_a_replica_down_nothing_until_one_is_back_then_a_new_leader(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Two of three members down: nobody is elected, a publish through the third waits (it is
    not confirmed), and once one member is back a leader is elected and the publish that
    waited is confirmed; nothing confirmed is lost."""
    a, b, c = abc
    declare(a, "q.two-down")
    publish_confirmed(c, "q.two-down", [b"first"])
    a.kill()
    b.kill()
    outcome: list[BaseException | None] = []
    waiting = threading.Thread(target=lambda: outcome.append(
        _raised(lambda: publish_confirmed(c, "q.two-down", [b"waited"]))))
    waiting.start()
    time.sleep(4)  # both leases gone: c alone is no quorum, so nobody is elected
    assert leader_of(etcd, cluster, "q.two-down") == "a"
    assert waiting.is_alive() and not outcome  # neither confirmed nor refused: it waits
    b.restart()
    wait_until(lambda: leader_of(etcd, cluster, "q.two-down") in ("b", "c"), timeout=60)
    waiting.join(60)
    assert outcome == [None]  # confirmed by the new leader, within the 30 s a publish waits
    publish_until_confirmed(c, "q.two-down", b"second")
    assert drain_all(b, "q.two-down") == [b"first", b"waited", b"second"]


def _raised(action: Any) -> BaseException | None:
    """What `action()` raised, or None."""
    try:
        action()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc
    return None


@pytest.mark.slow
def test_with_no_member_to_elect_a_waiting_publish_is_nacked_after_30_s(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    declare(a, "q.none-to-elect")
    publish_confirmed(c, "q.none-to-elect", [b"first"])
    a.kill()
    b.kill()
    started = time.monotonic()
    with pytest.raises(pika.exceptions.NackError):  # no leader for 30 s: nack'ed
        publish_confirmed(c, "q.none-to-elect", [b"refused"])
    assert time.monotonic() - started > 25
    b.restart()
    wait_until(lambda: leader_of(etcd, cluster, "q.none-to-elect") in ("b", "c"), timeout=60)
    publish_until_confirmed(c, "q.none-to-elect", b"second")
    assert drain_all(b, "q.none-to-elect") == [b"first", b"second"]


def test_every_member_deletes_what_is_settled(abc: Three, etcd: EtcdServer,
                                              cluster: str) -> None:
    """Disk use follows the live messages on every member: once 24 MB were published and
    consumed, the leader and both replicas delete the segments that held them."""
    a, b, c = abc
    declare(a, "q.disk")
    record, _ = in_etcd(etcd, cluster, "q.disk")
    assert record is not None and record.storage_id is not None

    async def publish() -> None:
        connection = await aio_pika.connect(b.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            body = b"x" * 1024
            for start in range(0, 24_000, 1000):
                await asyncio.gather(*(channel.default_exchange.publish(
                    aio_pika.Message(body), routing_key="q.disk") for _ in range(1000)))
                del start

    asyncio.run(publish())

    def folder_bytes(node: ClusterNode) -> int:
        folder = node.data_dir / "queues" / (record.storage_id or "")
        return sum(p.stat().st_size for p in folder.glob("*.segment"))

    def first_segment(node: ClusterNode) -> str:
        folder = node.data_dir / "queues" / (record.storage_id or "")
        return sorted(p.name for p in folder.glob("*.segment"))[0]

    assert all(folder_bytes(node) > 20_000_000 for node in abc)
    assert all(first_segment(node) == "00000000000000000000.segment" for node in abc)
    assert len(drain(c, "q.disk", 24_000)) == 24_000
    publish_confirmed(a, "q.disk", [b"last"])
    # the first 16 MB segment goes on every member; the one being written stays
    wait_until(lambda: all(first_segment(node) != "00000000000000000000.segment"
                           and folder_bytes(node) < 16_000_000 for node in abc), timeout=30)
    assert drain_all(b, "q.disk") == [b"last"]


def test_held_dead_letters_survive_a_failover(abc: Three, etcd: EtcdServer,
                                              cluster: str) -> None:
    """At-least-once dead lettering across a leader change: dead letters no queue took yet
    stay held (recorded in the log), and the new leader sends them once a route exists."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    conn = connect(a)
    ch = conn.channel()
    ch.exchange_declare("q.dlx", "fanout", durable=True)
    conn.close()
    declare(a, "q.held", **{"x-dead-letter-exchange": "q.dlx", "x-overflow": "reject-publish",
                            "x-dead-letter-strategy": "at-least-once"})
    publish_confirmed(b, "q.held", [b"d1", b"d2"])
    conn = connect(b)
    ch = conn.channel()
    for _ in range(2):
        method, _props, _body = ch.basic_get("q.held")
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.basic_get("q.held")[0] is None  # held, not ready
    conn.close()
    old = leader_of(etcd, cluster, "q.held")
    record, _ = in_etcd(etcd, cluster, "q.held")
    assert record is not None and record.storage_id is not None
    # a reject is confirmed to no one: wait until the replicas hold what it wrote
    wait_until(lambda: same_logs((a, b, c), record.storage_id or ""), timeout=20)
    nodes[old].kill()
    wait_until(lambda: leader_of(etcd, cluster, "q.held") != old, timeout=60)
    alive = next(node for name, node in nodes.items() if name != old)
    publish_until_confirmed(alive, "q.held", b"probe")
    conn = connect(alive)
    ch = conn.channel()
    ch.queue_declare("q.target", durable=True, arguments=QUORUM)
    ch.queue_bind("q.target", "q.dlx")
    conn.close()

    def arrived() -> bool:
        try:
            return ready(alive, "q.target") == 2
        except pika.exceptions.AMQPError:
            return False

    wait_until(arrived, timeout=20)
    assert sorted(drain_all(alive, "q.target")) == [b"d1", b"d2"]
    assert drain_all(alive, "q.held") == [b"probe"]


def test_a_forwarded_consumer_closing_mid_stream_leaves_the_tunnel_open(abc: Three) -> None:
    """Through c (a replica; a leads), a consumer acks as fast as it is given messages and
    closes its connection mid-stream, forty times: the tunnel from c to a never breaks."""
    a, _b, c = abc
    declare(a, "churn")
    publish_confirmed(c, "churn", [b"m%d" % i for i in range(3000)])
    refused: list[str] = []
    for attempt in range(40):
        conn = connect(c)
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            ch.basic_consume("churn",
                             lambda chan, method, _p, _b: chan.basic_ack(method.delivery_tag))
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:
                conn.process_data_events(0.01)
            conn.close()  # acks and deliveries in flight
        except pika.exceptions.AMQPError as exc:  # the tunnel it went through had broken
            refused.append(f"attempt {attempt}: {exc!r}")
        if refused or tunnel_broken(a, c):
            break
    time.sleep(0.5)
    assert not tunnel_broken(a, c) and not refused, (tunnel_broken(a, c)[:2], refused[:2])


def tunnel_broken(*nodes: ClusterNode) -> list[str]:
    """The nodes' log lines that say a tunnel was closed for a frame on a closed channel."""
    return [line for node in nodes for line in node.log().splitlines()
            if "expected 'channel.open'" in line]


def test_passive_declare_and_purge_through_a_member_wait_for_the_new_leader(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Right after `kill -9` of the leader, before a new one is elected, a passive declare and
    a purge through a surviving member wait for the new leader and answer with its counts, as
    RabbitMQ's do: never 404, never counts of a member that holds no state."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "q.elect")
    publish_confirmed(b, "q.elect", [b"m%d" % i for i in range(7)])
    old = leader_of(etcd, cluster, "q.elect")
    survivor = next(node for name, node in nodes.items() if name != old)
    conn = connect(survivor)
    ch = conn.channel()
    nodes[old].kill()
    declared = ch.queue_declare("q.elect", passive=True)
    assert leader_of(etcd, cluster, "q.elect") not in (old, None)
    assert declared.method.message_count == 7
    assert ch.queue_purge("q.elect").method.message_count == 7
    assert ch.queue_declare("q.elect", passive=True).method.message_count == 0
    conn.close()


@pytest.mark.slow
def test_a_passive_declare_with_no_leader_to_elect_gives_up_with_404(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Two of three members down: no leader can be elected, and a passive declare through the
    one left waits ELECTION_WAIT_S (30 s) for one, then answers 404; the connection stays."""
    a, b, c = abc
    declare(a, "q.none", **{"x-queue-leader-locator": "client-local"})
    nodes = {"a": a, "b": b, "c": c}
    leader = leader_of(etcd, cluster, "q.none")
    others = [node for name, node in nodes.items() if name != leader]
    nodes[leader].kill()
    others[0].kill()
    conn = connect(others[1])
    ch = conn.channel()
    started = time.monotonic()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare("q.none", passive=True)
    assert refused.value.reply_code == 404
    assert "has no leader" in refused.value.reply_text
    assert time.monotonic() - started >= 29
    assert conn.is_open
    conn.close()


def test_a_delivery_waiting_for_its_record_goes_to_the_next_consumer_if_its_own_leaves(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """The consumer whose delivery waits for a majority's record closes its connection before
    the record is committed: the message was never sent, so it stays in the queue (not counted
    as returned) and the next consumer gets it as new."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "q.left", **{"x-queue-leader-locator": "client-local"})
    publish_confirmed(a, "q.left", [b"kept"])
    leader = leader_of(etcd, cluster, "q.left")
    replicas = [node for name, node in nodes.items() if name != leader]
    conn = connect(nodes[leader])
    got: list[bytes] = []
    with paused(*replicas):
        conn.channel().basic_consume("q.left", lambda _c, _m, _p, body: got.append(body))
        conn.process_data_events(1)
        conn.close()
    assert got == []
    fresh = connect(nodes[leader])
    method, props, body = fresh.channel().basic_get("q.left", auto_ack=True)
    deadline = time.monotonic() + 30
    while method is None and time.monotonic() < deadline:  # the replicas catch up first
        time.sleep(0.2)
        method, props, body = fresh.channel().basic_get("q.left", auto_ack=True)
    assert body == b"kept" and not method.redelivered
    assert "x-acquired-count" not in (props.headers or {})
    fresh.close()
