"""What clients keep across the failover of a replicated stream (real etcd, three real `leveret
serve` nodes, pika, `kill -9` of the leader's node, clients connected to another node): a
deduplicating publisher that re-sends what was not confirmed ends with every message once, in
order, and its last publishing id never goes back; a stored consumer offset is on every member
afterwards, and a new consumer resumes after it; a single-active-consumer group is one across
the nodes (it lives on the leader), and after a failover re-forms with one active consumer
that resumes after the stored offset."""

from __future__ import annotations

import threading
import time
from typing import Any

import pika
from support.cluster import (
    ClusterNode,
    connect,
    consume,
    declare,
    in_etcd,
    leader_of,
    linked,
    publish_confirmed,
    same_logs,
    wait_until,
)
from support.cluster_api import ok
from support.etcd import EtcdServer

Three = tuple[ClusterNode, ClusterNode, ClusterNode]


def tracking(node: ClusterNode, stream: str) -> dict[str, Any]:
    """The stream's publishers and stored offsets on `node` (its own member's log)."""
    data: dict[str, Any] = ok(node, "GET", f"/api/leveret/streams/%2F/{stream}/tracking")
    return data


def last_id(node: ClusterNode, stream: str, publisher: str) -> int:
    rows = [p["last_publishing_id"] for p in tracking(node, stream)["publishers"]
            if p["reference"] == publisher]
    return rows[0] if rows else 0


def stored(node: ClusterNode, stream: str, consumer: str) -> int:
    rows = [c["stored_offset"] for c in tracking(node, stream)["consumers"]
            if c["reference"] == consumer]
    return rows[0] if rows else -1


def kill_leader_and_wait(nodes: dict[str, ClusterNode], etcd: EtcdServer, cluster: str,
                         stream: str) -> str:
    """`kill -9` of the stream's leader's node; the name of the member elected after it."""
    old = leader_of(etcd, cluster, stream)
    nodes[old].kill()
    wait_until(lambda: leader_of(etcd, cluster, stream) != old, timeout=60)
    return leader_of(etcd, cluster, stream)


class DedupPublisher(threading.Thread):
    """A deduplicating publisher as a real client writes one: each message carries its name and
    the next publishing id; it waits for the confirm, and on a nack or a lost connection it
    reconnects and sends the same message (same id) again until it is confirmed."""

    def __init__(self, node: ClusterNode, stream: str, name: str, count: int) -> None:
        super().__init__(daemon=True)
        self.node, self.stream, self.name, self.count = node, stream, name, count
        self.confirmed = 0  # the highest id confirmed so far
        self.resends = 0
        self.error: BaseException | None = None

    def send(self, channel: Any, publishing_id: int) -> None:
        channel.basic_publish("", self.stream, f"m{publishing_id}".encode(),
                              pika.BasicProperties(headers={
                                  "x-stream-publisher-name": self.name,
                                  "x-stream-publishing-id": publishing_id}))

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 180
            conn: pika.BlockingConnection | None = None
            while self.confirmed < self.count:
                assert time.monotonic() < deadline, "the publisher never got its confirms"
                try:
                    if conn is None or conn.is_closed:
                        conn = connect(self.node)
                        channel = conn.channel()
                        channel.confirm_delivery()
                    self.send(channel, self.confirmed + 1)  # returns once acked
                    self.confirmed += 1
                except (pika.exceptions.NackError, pika.exceptions.AMQPError):
                    self.resends += 1
                    if conn is not None and conn.is_open:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
            if conn is not None and conn.is_open:
                conn.close()
        except (AssertionError, OSError) as exc:  # reported by the test
            self.error = exc


def test_a_deduplicating_publisher_keeps_every_message_once_across_a_failover(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "s.dedup")
    assert leader_of(etcd, cluster, "s.dedup") == "a"
    publisher = DedupPublisher(c, "s.dedup", "app-1", 300)
    publisher.start()
    wait_until(lambda: publisher.confirmed >= 100 or not publisher.is_alive(), timeout=120)
    # the ids stored so far are on every member, inside the log
    before = {name: last_id(node, "s.dedup", "app-1") for name, node in nodes.items()}
    leader = kill_leader_and_wait(nodes, etcd, cluster, "s.dedup")
    assert leader in ("b", "c")
    during = {name: last_id(nodes[name], "s.dedup", "app-1") for name in ("b", "c")}
    assert all(during[name] >= before[name] for name in during), (before, during)
    publisher.join(200)
    assert publisher.error is None, publisher.error
    assert publisher.confirmed == 300
    print("re-sent after a nack or a lost connection:", publisher.resends)

    # a client that lost its last confirms sends them again: they are confirmed, not stored
    conn = connect(b)
    channel = conn.channel()
    channel.confirm_delivery()
    for publishing_id in range(291, 301):
        publisher.send(channel, publishing_id)
    publisher.send(channel, 301)
    conn.close()

    expected = [f"m{i}".encode() for i in range(1, 302)]
    for name in ("b", "c"):
        wait_until(lambda n=nodes[name]: last_id(n, "s.dedup", "app-1") == 301, timeout=30)
        assert consume(nodes[name], "s.dedup", 301) == expected, name
    # the old leader comes back as a replica: the same ids and messages, never fewer
    a.restart()
    wait_until(lambda: linked(a, 2), timeout=60)
    wait_until(lambda: last_id(a, "s.dedup", "app-1") == 301, timeout=60)
    assert consume(a, "s.dedup", 301) == expected


def test_a_stored_offset_survives_a_failover_on_every_member(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "s.offsets")
    record, _ = in_etcd(etcd, cluster, "s.offsets")
    assert record is not None and record.storage_id is not None
    bodies = [f"o{i}".encode() for i in range(300)]
    publish_confirmed(b, "s.offsets", bodies)

    def read_and_ack(node: ClusterNode, count: int, **arguments: Any) -> list[bytes]:
        """A tracking consumer (tag `reader`) that acks `count` messages, then cancels."""
        conn = connect(node)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=count)
        seen: list[bytes] = []

        def take(chan: Any, m: Any, _p: Any, body: bytes) -> None:
            if len(seen) < count:
                seen.append(body)
                chan.basic_ack(m.delivery_tag)

        ch.basic_consume("s.offsets", take, consumer_tag="reader",
                         arguments={"x-stream-automatic-offset-tracking": True, **arguments})
        deadline = time.monotonic() + 30
        while len(seen) < count and time.monotonic() < deadline:
            conn.process_data_events(0.2)
        conn.close()  # the cancel stores the offset of the last ack
        return seen

    assert read_and_ack(c, 100, **{"x-stream-offset": "first"}) == bodies[:100]
    wait_until(lambda: all(stored(n, "s.offsets", "reader") == 99 for n in (a, b, c)),
               timeout=30)
    leader = kill_leader_and_wait(nodes, etcd, cluster, "s.offsets")
    survivors = ("b", "c")
    # (a replica that truncates its tail at the election reads its tracking again from the
    # new leader's chunks: the stored offset is back once that is shipped)
    wait_until(lambda: all(stored(nodes[n], "s.offsets", "reader") >= 99
                           for n in survivors), timeout=30)

    # a new consumer with the same name, on the other surviving node, resumes after it and
    # stores its own offset through the new leader
    assert read_and_ack(b, 50) == bodies[100:150]
    wait_until(lambda: all(stored(nodes[n], "s.offsets", "reader") == 149 for n in survivors),
               timeout=30)
    # the old leader comes back as a replica and gets it too
    a.restart()
    wait_until(lambda: linked(a, 2), timeout=60)
    wait_until(lambda: stored(a, "s.offsets", "reader") == 149, timeout=60)
    wait_until(lambda: same_logs((nodes[leader], a), record.storage_id or ""), timeout=90)
    assert read_and_ack(a, 10) == bodies[150:160]


def group_states(node: ClusterNode, stream: str, reference: str) -> list[str]:
    group = ok(node, "GET", f"/api/leveret/consumer-groups/%2F/{stream}/{reference}")
    return [m["state"] for m in group["members"]]


def test_a_single_active_consumer_group_is_one_across_the_nodes_and_after_a_failover(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Two members of one group on two nodes that hold replicas: the group is one, on the
    leader, so only one of them gets messages. The leader dies: both are cancelled
    (basic.cancel), they subscribe again, the group forms on the new leader, exactly one is
    active and it resumes right after the stored offset; when it goes, the other one does."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "s.sac")
    bodies = [f"s{i}".encode() for i in range(200)]
    publish_confirmed(c, "s.sac", bodies)
    args = {"x-single-active-consumer": True, "x-stream-automatic-offset-tracking": True}
    got: dict[str, list[bytes]] = {"b": [], "c": []}
    cancelled: list[str] = []
    conns = {name: connect(nodes[name]) for name in ("b", "c")}

    def subscribe(name: str, offset: Any = None) -> None:
        ch = conns[name].channel()
        ch.basic_qos(prefetch_count=50)
        ch.add_on_cancel_callback(lambda _frame: cancelled.append(name))
        extra = {"x-stream-offset": offset} if offset is not None else {}
        ch.basic_consume("s.sac", lambda chan, m, _p, body: (got[name].append(body),
                                                             chan.basic_ack(m.delivery_tag)),
                         consumer_tag="group", arguments={**args, **extra})

    def pump(until: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            for conn in conns.values():
                conn.process_data_events(0.1)

    subscribe("b", "first")
    pump(lambda: len(got["b"]) >= 1)
    subscribe("c", "first")
    pump(lambda: len(got["b"]) >= 200)
    pump(lambda: False, timeout=1)
    assert got["b"] == bodies and got["c"] == []
    assert group_states(a, "s.sac", "group") == ["active", "inactive"]

    def stored_everywhere(value: int, among: tuple[str, ...]) -> bool:
        pump(lambda: False, timeout=0.2)
        return all(stored(nodes[n], "s.sac", "group") == value for n in among)

    wait_until(lambda: stored_everywhere(199, ("a", "b", "c")), timeout=30)
    leader = kill_leader_and_wait(nodes, etcd, cluster, "s.sac")
    assert leader in ("b", "c")
    pump(lambda: sorted(cancelled) == ["b", "c"])
    assert sorted(cancelled) == ["b", "c"]  # their group's node went: they are told

    subscribe("b")
    pump(lambda: False, timeout=1)
    subscribe("c")
    publish_confirmed(c, "s.sac", [b"after"])
    pump(lambda: len(got["b"]) >= 201)
    pump(lambda: False, timeout=1)
    assert got["b"][200:] == [b"after"] and got["c"] == []
    assert group_states(nodes[leader], "s.sac", "group") == ["active", "inactive"]
    wait_until(lambda: stored_everywhere(200, ("b", "c")), timeout=30)

    conns.pop("b").close()  # the active one goes: the other resumes after the stored offset
    publish_confirmed(b, "s.sac", [b"later"])
    pump(lambda: bool(got["c"]), timeout=60)
    assert got["c"] == [b"later"]
    conns["c"].close()
