"""Super streams in a real cluster (real etcd, three real `leveret serve` nodes, pika, the
management API and a raw stream-protocol client): a super stream made on one node goes through
etcd, so its partitions are spread over the nodes (one leader each, `balanced`), replicated per
x-initial-cluster-size, and visible on every node; a publish on any node reaches the partition
its routing key names; deleting it removes the exchange and every partition everywhere."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from streamproto.raw import RawStream, s, strmap
from support.brokers import BrokerProcess
from support.cluster import (
    ClusterNode,
    connect,
    consume,
    in_etcd,
    linked,
    make_node,
    wait_until,
)
from support.cluster_api import api, ok
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

OK, DOES_NOT_EXIST, ALREADY_EXISTS, PRECONDITION_FAILED = 0x01, 0x02, 0x05, 0x11
CREATE_SUPER_STREAM, DELETE_SUPER_STREAM = 0x1D, 0x1E
Three = tuple[ClusterNode, ClusterNode, ClusterNode]


@pytest.fixture
def abc_streams(tmp_path: Path, etcd: EtcdServer, cluster: str,
                nodes: list[BrokerProcess]) -> Iterator[Three]:
    """Nodes a, b and c (management, and a stream-protocol listener), linked to each other."""
    three = []
    for name in ("a", "b", "c"):
        port = free_port()
        node = make_node(tmp_path, etcd.url, cluster, name, management=True,
                         extra=["--stream-port", str(port)])
        node.stream_port = port  # type: ignore[attr-defined]
        three.append(node)
    for node in three:
        nodes.append(node.start())
        wait_for_port(node.stream_port, 30)  # type: ignore[attr-defined]
    wait_until(lambda: all(linked(node, 2) for node in three), timeout=60)
    yield three[0], three[1], three[2]


def placed(etcd: EtcdServer, cluster: str, names: list[str]) -> list[tuple[str, int]]:
    """Each partition's leader and number of members, from its record in etcd."""
    out = []
    for name in names:
        record, leadership = in_etcd(etcd, cluster, name)
        assert record is not None, name
        assert leadership is None or leadership.members == record.members
        out.append((record.node, len(record.members)))
    return out


def partitions_on(node: ClusterNode, name: str) -> list[str]:
    status, found = api(node, "GET", f"/api/leveret/super-streams/%2F/{name}")
    return [p["name"] for p in found["partitions"]] if status == 200 else []


def test_a_super_streams_partitions_are_spread_over_the_nodes_and_route_from_any_node(
        abc_streams: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc_streams
    nodes = (a, b, c)
    ok(a, "PUT", "/api/stream/super-streams/%2F/inv", {"partitions": 3})
    names = ["inv-0", "inv-1", "inv-2"]
    found = placed(etcd, cluster, names)
    assert sorted(leader for leader, _ in found) == ["a", "b", "c"]  # one leader on each node
    assert all(members == 3 for _, members in found)  # replicated on every node by default
    for node in nodes:  # the exchange, its partitions and bindings are on every node
        assert partitions_on(node, "inv") == names

    # a publish on any node reaches the partition its routing key names
    for node in nodes:
        conn = connect(node)
        ch = conn.channel()
        ch.confirm_delivery()
        for key in ("0", "1", "2"):
            ch.basic_publish("inv", key, f"{node.node_name}{key}".encode(), mandatory=True)
        conn.close()
    for index, partition in enumerate(names):
        want = [f"{n}{index}".encode() for n in "abc"]
        for node in nodes:
            assert consume(node, partition, 3) == want, (partition, node.node_name)

    # x-initial-cluster-size: each partition on two nodes, leaders still spread
    ok(b, "PUT", "/api/stream/super-streams/%2F/two",
       {"partitions": 3, "arguments": {"initial-cluster-size": 2}})
    found = placed(etcd, cluster, ["two-0", "two-1", "two-2"])
    assert sorted(leader for leader, _ in found) == ["a", "b", "c"]
    assert all(members == 2 for _, members in found)

    # a second super stream of the same name is refused with RabbitMQ's text, on any node
    status, answer = api(c, "PUT", "/api/stream/super-streams/%2F/inv", {"partitions": 2})
    assert status == 400 and "there is already an exchange named inv" in answer["reason"]

    # a partition name already taken by a queue: refused before anything is made
    conn = connect(a)
    conn.channel().queue_declare("taken-1", durable=True)
    conn.close()
    status, answer = api(b, "PUT", "/api/stream/super-streams/%2F/taken", {"partitions": 2})
    assert status == 400 and "there is already a queue named taken-1" in answer["reason"]
    assert in_etcd(etcd, cluster, "taken-0") == (None, None)
    assert all(api(node, "GET", "/api/exchanges/%2F/taken")[0] == 404 for node in nodes)

    # deleting it removes the exchange and the partitions, on every node and in etcd
    ok(c, "DELETE", "/api/leveret/super-streams/%2F/inv")
    assert all(in_etcd(etcd, cluster, name) == (None, None) for name in names)
    for node in nodes:
        assert partitions_on(node, "inv") == []
        assert api(node, "GET", "/api/queues/%2F/inv-0")[0] == 404
    assert api(a, "DELETE", "/api/leveret/super-streams/%2F/inv")[0] == 404
    conn = connect(a)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        conn.channel().exchange_declare("inv", passive=True)
    assert gone.value.reply_code == 404
    conn.close()


def strings(values: list[str]) -> bytes:
    return struct.pack(">i", len(values)) + b"".join(s(v) for v in values)


def test_the_stream_protocols_create_super_stream_places_partitions_through_etcd(
        abc_streams: Three, etcd: EtcdServer, cluster: str) -> None:
    a, b, c = abc_streams
    client = RawStream(c.stream_port, timeout=30)  # type: ignore[attr-defined]
    assert client.handshake() == OK
    names = ["orders-eu", "orders-us", "orders-asia"]
    client.request(CREATE_SUPER_STREAM, s("orders") + strings(names)
                   + strings(["eu", "us", "asia"]) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == OK
    assert sorted(leader for leader, _ in placed(etcd, cluster, names)) == ["a", "b", "c"]
    for node in (a, b, c):
        assert partitions_on(node, "orders") == names
    conn = connect(a)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("orders", "us", b"to-us", mandatory=True)
    conn.close()
    assert consume(b, "orders-us", 1) == [b"to-us"]

    client.request(CREATE_SUPER_STREAM, s("orders") + strings(names)
                   + strings(["eu", "us", "asia"]) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == ALREADY_EXISTS

    # refused before anything is made: a partition count that is not the keys', a bad argument
    client.request(CREATE_SUPER_STREAM, s("bad") + strings(["bad-a", "bad-b"])
                   + strings(["a"]) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == PRECONDITION_FAILED
    client.request(CREATE_SUPER_STREAM, s("bad") + strings(["bad-a"]) + strings(["a"])
                   + strmap({"initial-cluster-size": "0"}))
    assert client.response(CREATE_SUPER_STREAM)[1] == PRECONDITION_FAILED
    assert in_etcd(etcd, cluster, "bad-a") == (None, None)
    assert all(api(node, "GET", "/api/exchanges/%2F/bad")[0] == 404 for node in (a, b, c))

    # as rabbit_stream_manager answers, and as one node does (STREAM-PROTOCOL.md, "Super
    # streams"): a partition name given twice already exists and nothing is made; partitions
    # are named and bound as sent, a blank key included
    client.request(CREATE_SUPER_STREAM, s("twice") + strings(["twice-a", "twice-a"])
                   + strings(["a", "a"]) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == ALREADY_EXISTS
    assert in_etcd(etcd, cluster, "twice-a") == (None, None)
    assert all(api(node, "GET", "/api/exchanges/%2F/twice")[0] == 404 for node in (a, b, c))
    client.request(CREATE_SUPER_STREAM, s("named") + strings(["named-first", "named-"])
                   + strings(["one", ""]) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == OK
    for node in (a, b, c):
        assert partitions_on(node, "named") == ["named-first", "named-"]
    client.request(DELETE_SUPER_STREAM, s("named"))
    assert client.response(DELETE_SUPER_STREAM)[1] == OK

    client.request(DELETE_SUPER_STREAM, s("orders"))
    assert client.response(DELETE_SUPER_STREAM)[1] == OK
    assert all(in_etcd(etcd, cluster, name) == (None, None) for name in names)
    for node in (a, b, c):
        assert partitions_on(node, "orders") == []
    client.request(DELETE_SUPER_STREAM, s("orders"))
    assert client.response(DELETE_SUPER_STREAM)[1] == DOES_NOT_EXIST
    client.close()
