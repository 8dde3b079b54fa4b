"""Quorum queues on a three-node cluster (real etcd, three real `leveret serve` nodes, pika):
members placed over the nodes, every member's log the same, publishing and consuming through
any node with the leader serving, and `kill -9` of the leader's node: every confirmed message
is delivered afterwards, through another node, none lost, each publisher's order kept for
first deliveries."""

from __future__ import annotations

import time
from typing import Any

import pika
from support.cluster import (
    ClusterNode,
    connect,
    in_etcd,
    leader_of,
    publish_confirmed,
    same_logs,
    wait_until,
)
from support.etcd import EtcdServer

Three = tuple[ClusterNode, ClusterNode, ClusterNode]
QUORUM = {"x-queue-type": "quorum"}


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
    deadline = time.monotonic() + 30
    while True:  # the first confirm through another node, once the new leader serves
        try:
            publish_confirmed(publisher, "orders", [b"after-0"])
            break
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
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
    conns = []
    for name, node in nodes.items():
        if name == old:
            continue
        conn = connect(node)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        got[name] = []

        def on_message(channel: Any, method: Any, _props: Any, body: bytes,
                       name: str = name) -> None:
            got[name].append((body, method.redelivered))
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
    for conn in conns:
        conn.close()
