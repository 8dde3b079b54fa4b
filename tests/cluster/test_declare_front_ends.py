"""One declare path (issue 27): the same queue declared through each front end of a real
cluster (AMQP 0.9.1, the stream protocol, the management API, a definitions import) gets the
same placement, the same record in etcd and the same refusals, since every front end calls the
one topology port (`broker/topology/`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pika.exceptions import ChannelClosedByBroker
from streamproto.raw import RawStream, s, strmap
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, in_etcd, make_node
from support.cluster_api import api, connect, wait_linked
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

from leveret.broker.cluster.topology_records import QueueRecord

STREAM_OK, STREAM_ALREADY_EXISTS = 0x01, 0x05
CREATE = 0x0D
STREAM_PORTS: dict[str, int] = {}  # each node's stream protocol port, by node name
PLACED = {"x-queue-type": "stream", "x-queue-leader-locator": "balanced",
          "x-initial-cluster-size": 2}


@pytest.fixture
def ab(tmp_path: Path, etcd: EtcdServer, cluster: str,
       nodes: list[BrokerProcess]) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    """Nodes a and b, with management and stream ports, linked; a holds one stream of one
    member, so that `balanced` places a new leader on b (not merely on the first name)."""
    two = []
    for name in ("a", "b"):
        stream_port = free_port()
        node = make_node(tmp_path, etcd.url, cluster, name, management=True,
                         extra=["--stream-port", str(stream_port),
                                "--stream-advertised-host", "127.0.0.1"])
        STREAM_PORTS[name] = stream_port
        nodes.append(node.start())
        wait_for_port(stream_port, 30)
        two.append(node)
    wait_linked(two)
    with connect(two[0]) as conn:
        conn.channel().queue_declare("held-by-a", durable=True, arguments={
            "x-queue-type": "stream", "x-queue-leader-locator": "client-local",
            "x-initial-cluster-size": 1})
    yield two[0], two[1]


def over_amqp(node: ClusterNode, name: str, arguments: dict[str, Any]) -> str | None:
    with connect(node) as conn:
        try:
            conn.channel().queue_declare(name, durable=True, arguments=arguments)
        except ChannelClosedByBroker as refused:
            return str(refused.reply_text).removeprefix("PRECONDITION_FAILED - ")
    return None


def over_http(node: ClusterNode, name: str, arguments: dict[str, Any]) -> str | None:
    status, answer = api(node, "PUT", f"/api/queues/%2F/{name}",
                         {"durable": True, "arguments": arguments})
    return None if status in (201, 204) else str(answer["reason"])


def over_definitions(node: ClusterNode, name: str, arguments: dict[str, Any]) -> str | None:
    status, answer = api(node, "POST", "/api/definitions", {"queues": [
        {"name": name, "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": arguments}]})
    return None if 200 <= status < 300 else str(answer["reason"])


def over_stream_protocol(node: ClusterNode, name: str, arguments: dict[str, Any]) -> int:
    """Create, with the stream protocol's own argument names; its response code."""
    texts = {"x-queue-leader-locator": "queue-leader-locator",
             "x-initial-cluster-size": "initial-cluster-size"}
    client = RawStream(STREAM_PORTS[node.node_name])
    try:
        assert client.handshake() == 1
        client.request(CREATE, s(name) + strmap(
            {texts[k]: str(v) for k, v in arguments.items() if k in texts}))
        return client.response(CREATE)[1]
    finally:
        client.close()


def declared(etcd: EtcdServer, cluster: str, name: str) -> QueueRecord:
    """The record etcd holds, less the declaration's own identity (its fresh storage_id)."""
    record, _leadership = in_etcd(etcd, cluster, name)
    assert record is not None and record.storage_id
    return dataclasses.replace(record, storage_id=None)


def delete(node: ClusterNode, name: str) -> None:
    with connect(node) as conn:
        conn.channel().queue_delete(name)


FrontEnd = Callable[[ClusterNode, str, dict[str, Any]], Any]
FRONT_ENDS: dict[str, FrontEnd] = {"http": over_http, "definitions": over_definitions,
                                   "stream protocol": over_stream_protocol}


def test_one_queue_through_every_front_end(ab: tuple[ClusterNode, ClusterNode],
                                           etcd: EtcdServer, cluster: str) -> None:
    a, _b = ab
    assert over_amqp(a, "same", PLACED) is None
    expected = declared(etcd, cluster, "same")
    assert (expected.node, expected.members) == ("b", ("b", "a"))  # balanced, 2 members
    delete(a, "same")
    for front_end, declare in FRONT_ENDS.items():
        answer = declare(a, "same", PLACED)
        assert answer in (None, STREAM_OK), (front_end, answer)
        assert declared(etcd, cluster, "same") == expected, front_end
        delete(a, "same")

    classic = {"x-queue-leader-locator": "balanced"}  # a holds a queue: b holds fewest
    for front_end, declare in {"amqp": over_amqp, "http": over_http,
                               "definitions": over_definitions}.items():
        assert declare(a, "classic", classic) is None
        record = declared(etcd, cluster, "classic")
        assert (record.node, record.type, record.durable) == ("b", "classic", True), front_end
        delete(a, "classic")


def test_the_same_refusal_through_every_front_end(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    assert over_amqp(b, "taken", {}) is None  # a classic queue, held by b
    text = over_amqp(a, "taken", PLACED)
    assert text == ("inequivalent arg 'x-queue-type' for queue 'taken' in vhost '/': "
                    "received 'stream' but current is 'classic'")
    assert over_http(a, "taken", PLACED) == text
    assert over_definitions(a, "taken", PLACED) == text
    assert over_stream_protocol(a, "taken", PLACED) == STREAM_ALREADY_EXISTS
    with connect(a) as conn:  # the refusals left it as it was
        assert conn.channel().queue_declare("taken", passive=True).method.message_count == 0
