"""What clients keep across the failover of a replicated stream (real etcd, three real `leveret
serve` nodes, pika, `kill -9` of the leader's node, clients connected to another node): a
deduplicating publisher that re-sends what was not confirmed ends with every message once, in
order, and its last publishing id never goes back; a stored consumer offset is on every member
afterwards, and a new consumer resumes after it; a single-active-consumer group keeps exactly
one active consumer, and the next one resumes after the stored offset."""

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
    assert all(stored(nodes[n], "s.offsets", "reader") >= 99 for n in survivors)

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


def test_a_single_active_consumer_group_keeps_one_active_across_a_failover(
        abc: Three, etcd: EtcdServer, cluster: str) -> None:
    """Two members of one group on a surviving node (a group is per node: see REPLICATION.md);
    the leader dies while the first is active; afterwards exactly one is active, and when the
    active one goes away the other resumes right after the stored offset."""
    a, b, c = abc
    nodes = {"a": a, "b": b, "c": c}
    declare(a, "s.sac")
    bodies = [f"s{i}".encode() for i in range(200)]
    publish_confirmed(c, "s.sac", bodies)
    args = {"x-single-active-consumer": True, "x-stream-automatic-offset-tracking": True}

    first = connect(b)
    ch1 = first.channel()
    ch1.basic_qos(prefetch_count=50)
    got1: list[bytes] = []

    def take1(chan: Any, m: Any, _p: Any, body: bytes) -> None:
        got1.append(body)
        chan.basic_ack(m.delivery_tag)

    ch1.basic_consume("s.sac", take1, consumer_tag="group",
                      arguments={**args, "x-stream-offset": "first"})
    second = connect(b)
    ch2 = second.channel()
    ch2.basic_qos(prefetch_count=50)
    got2: list[bytes] = []
    ch2.basic_consume("s.sac", lambda chan, m, p, body: (got2.append(body),
                                                         chan.basic_ack(m.delivery_tag)),
                      consumer_tag="group", arguments=args)

    def pump(until: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            first.process_data_events(0.1)
            second.process_data_events(0.1)

    pump(lambda: len(got1) >= 200)
    assert got1 == bodies and got2 == []
    assert group_states(b, "s.sac", "group") == ["active", "inactive"]

    # the stored offset reaches every member before the leader dies (at most a second)
    def stored_everywhere(value: int, among: tuple[str, ...]) -> bool:
        pump(lambda: False, timeout=0.2)
        return all(stored(nodes[n], "s.sac", "group") == value for n in among)

    wait_until(lambda: stored_everywhere(199, ("a", "b", "c")), timeout=30)
    leader = kill_leader_and_wait(nodes, etcd, cluster, "s.sac")
    assert leader in ("b", "c")
    pump(lambda: False, timeout=1)
    assert group_states(b, "s.sac", "group") == ["active", "inactive"]

    # the new leader takes a publish; only the active consumer gets it
    publish_confirmed(c, "s.sac", [b"after"])
    pump(lambda: len(got1) >= 201)
    assert got1[200:] == [b"after"] and got2 == []
    wait_until(lambda: stored_everywhere(200, ("b", "c")), timeout=30)

    # the active one goes away: the other becomes active and resumes after the stored offset
    first.close()
    publish_confirmed(b, "s.sac", [b"later"])
    deadline = time.monotonic() + 60
    while not got2 and time.monotonic() < deadline:
        second.process_data_events(0.2)
    assert got2 == [b"later"]
    assert group_states(b, "s.sac", "group") == ["active"]
    second.close()
