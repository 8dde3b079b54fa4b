"""The stream protocol in a cluster, with a real etcd and real `leveret serve` nodes: Metadata on
any node names the node that holds the stream, with that node's advertised stream host and
port; a node that does not hold it answers Subscribe and DeclarePublisher with
STREAM_NOT_AVAILABLE (clients then connect to the leader); a stream deleted through another node
sends MetadataUpdate to the holder's publishers and subscribers; a stream whose node is down is
STREAM_NOT_AVAILABLE with no leader; offsets and publisher sequences are answered on a replica's
node from its copy and on a node with no copy by the leader's node, and StoreOffset reaches the
leader from either."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote
from urllib.request import Request, urlopen

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from streamproto.raw import RawStream, s, strmap
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, api_get, linked, make_node, wait_until
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

OK, NOT_AVAILABLE = 0x01, 0x06
STREAM = {"x-queue-type": "stream", "x-queue-leader-locator": "client-local"}


def node_with_streams(tmp_path: Path, etcd: EtcdServer, cluster: str, name: str) -> ClusterNode:
    node = make_node(tmp_path, etcd.url, cluster, name)
    node.stream_port = free_port()  # type: ignore[attr-defined]
    node.args += ["--stream-port", str(node.stream_port),  # type: ignore[attr-defined]
                  "--stream-advertised-host", "127.0.0.1"]
    return node


@pytest.fixture
def ab(tmp_path: Path, etcd: EtcdServer, cluster: str,
       nodes: list[BrokerProcess]) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    a = node_with_streams(tmp_path, etcd, cluster, "a")
    b = node_with_streams(tmp_path, etcd, cluster, "b")
    nodes.extend((a.start(), b.start()))
    for node in (a, b):
        wait_for_port(node.stream_port, 30)  # type: ignore[attr-defined]
    wait_until(lambda: link_settled(a))
    yield a, b


def link_up(node: ClusterNode) -> bool:
    events = [line for line in node.log().splitlines() if '"event": "cluster link ' in line]
    return bool(events) and '"cluster link up"' in events[-1]


def link_settled(node: ClusterNode) -> bool:
    """`node`'s link is up, after the peer's start-up refusal ("node starting") if there was
    one: both stream listeners are open (each node's start is over), and it holds twice."""
    if not link_up(node):
        return False
    time.sleep(0.3)
    return link_up(node)


def raw(node: ClusterNode) -> RawStream:
    client = RawStream(node.stream_port)  # type: ignore[attr-defined]
    assert client.handshake() == 1
    return client


def declare_stream(node: BrokerProcess, name: str, size: int | None = 1) -> None:
    """A stream led by `node`; of `size` members (None: every running node)."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    arguments = {**STREAM, **({"x-initial-cluster-size": size} if size else {})}
    conn.channel().queue_declare(name, durable=True, arguments=arguments)
    conn.close()


def visible(node: BrokerProcess, name: str) -> bool:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()


def metadata(client: RawStream, *names: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(brokers as (host, port), {stream: (code, leader (host, port) or None, replicas)})."""
    client.request(0x0F, struct.pack(">i", len(names)) + b"".join(s(n) for n in names))
    frame = client.next(0x800F)
    pos = 8  # key, version, correlation id

    def string() -> str:
        nonlocal pos
        size = struct.unpack_from(">h", frame, pos)[0]
        pos += 2 + size
        return frame[pos - size:pos].decode()

    brokers: dict[int, tuple[str, int]] = {}
    count = struct.unpack_from(">i", frame, pos)[0]
    pos += 4
    for _ in range(count):
        ref = struct.unpack_from(">H", frame, pos)[0]
        pos += 2
        host = string()
        brokers[ref] = (host, struct.unpack_from(">I", frame, pos)[0])
        pos += 4
    streams = {}
    count = struct.unpack_from(">i", frame, pos)[0]
    pos += 4
    for _ in range(count):
        name = string()
        code, leader = struct.unpack_from(">HH", frame, pos)
        count = struct.unpack_from(">i", frame, pos + 4)[0]
        replicas = [brokers[r] for r in struct.unpack_from(f">{count}H", frame, pos + 8)]
        pos += 8 + 2 * count
        streams[name] = (code, brokers.get(leader) if leader != 0xFFFF else None, replicas)
    return list(brokers.values()), streams


def test_metadata_names_the_holder_and_other_nodes_refuse_politely(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    declare_stream(a, "held-by-a")
    wait_until(lambda: visible(b, "held-by-a"), timeout=10)
    a_endpoint = ("127.0.0.1", a.stream_port)  # type: ignore[attr-defined]
    on_a, on_b = raw(a), raw(b)
    for client in (on_a, on_b):
        brokers, streams = metadata(client, "held-by-a", "nowhere")
        assert brokers == [a_endpoint]
        assert streams == {"held-by-a": (OK, a_endpoint, []), "nowhere": (0x02, None, [])}

    # B holds no member of the stream: RabbitMQ's STREAM_NOT_AVAILABLE, nothing crashes
    on_b.request(0x07, struct.pack(">B", 1) + s("held-by-a") + struct.pack(">HH", 1, 10)
                 + struct.pack(">i", 0))
    assert on_b.response(0x07)[1] == NOT_AVAILABLE
    on_b.request(0x01, struct.pack(">B", 1) + s("p") + s("held-by-a"))
    assert on_b.response(0x01)[1] == NOT_AVAILABLE
    on_b.request(0x0F, struct.pack(">i", 0))  # the connection still serves
    assert on_b.next(0x800F)

    # the holder serves them
    on_a.request(0x07, struct.pack(">B", 1) + s("held-by-a") + struct.pack(">HH", 1, 10)
                 + struct.pack(">i", 0))
    assert on_a.response(0x07)[1] == OK
    publisher = raw(a)
    publisher.request(0x01, struct.pack(">B", 7) + s("ref") + s("held-by-a"))
    assert publisher.response(0x01)[1] == OK

    # deleted through B (AMQP queue.delete, carried out by the cluster): the holder's
    # subscriber and publisher hear MetadataUpdate STREAM_NOT_AVAILABLE
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_delete("held-by-a")
    conn.close()
    for client in (on_a, publisher):
        update = client.next(0x0010)
        assert struct.unpack_from(">H", update, 4)[0] == NOT_AVAILABLE
        assert update[8:] == b"held-by-a"
    wait_until(lambda: metadata(on_b, "held-by-a")[1]["held-by-a"][0] == 0x02, timeout=10)
    for client in (on_a, on_b, publisher):
        client.close()


def test_a_replicated_stream_names_its_leader_and_replicas(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    declare_stream(a, "replicated", size=None)  # members a (leader) and b (replica)
    wait_until(lambda: visible(b, "replicated"), timeout=10)
    a_endpoint = ("127.0.0.1", a.stream_port)  # type: ignore[attr-defined]
    b_endpoint = ("127.0.0.1", b.stream_port)  # type: ignore[attr-defined]
    on_a, on_b = raw(a), raw(b)
    for client in (on_a, on_b):
        assert metadata(client, "replicated") == (
            sorted([a_endpoint, b_endpoint]), {"replicated": (OK, a_endpoint, [b_endpoint])})
    # a replica serves subscribers; publishers go to the leader
    on_b.request(0x07, struct.pack(">B", 1) + s("replicated") + struct.pack(">HH", 1, 10)
                 + struct.pack(">i", 0))
    assert on_b.response(0x07)[1] == OK
    on_b.request(0x01, struct.pack(">B", 1) + s("p") + s("replicated"))
    assert on_b.response(0x01)[1] == NOT_AVAILABLE
    on_a.request(0x01, struct.pack(">B", 1) + s("p") + s("replicated"))
    assert on_a.response(0x01)[1] == OK
    on_a.close()
    on_b.close()


def test_a_stream_whose_node_is_down_has_no_leader(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    declare_stream(a, "orphan")
    wait_until(lambda: visible(b, "orphan"), timeout=10)
    on_b = raw(b)
    assert metadata(on_b, "orphan")[1]["orphan"][0] == OK
    a.kill()
    wait_until(lambda: metadata(on_b, "orphan")[1]["orphan"] == (NOT_AVAILABLE, None, []),
               timeout=20)
    assert metadata(on_b, "orphan")[0] == []
    on_b.close()


def publish_confirmed(client: RawStream, pid: int, reference: str, stream: str,
                      ids: range) -> None:
    """Declare a publisher and publish `ids` with it, until every id is confirmed."""
    client.request(0x01, struct.pack(">B", pid) + s(reference) + s(stream))
    assert client.response(0x01)[1] == OK
    client.send(0x02, 1, struct.pack(">Bi", pid, len(ids)) + b"".join(
        struct.pack(">QI", i, 1) + b"m" for i in ids))
    confirmed: list[int] = []
    while len(confirmed) < len(ids):
        frame = client.next(0x03)
        count = struct.unpack_from(">i", frame, 5)[0]
        confirmed += struct.unpack_from(f">{count}Q", frame, 9)
    assert sorted(confirmed) == list(ids)


def query(client: RawStream, key: int, *fields: str) -> tuple[int, bytes]:
    """(code, rest) of QueryOffset / QueryPublisherSequence / StreamStats."""
    client.request(key, b"".join(s(field) for field in fields))
    _, code, rest = client.response(key)
    return code, rest


def query_offset(client: RawStream, reference: str, stream: str) -> tuple[int, int]:
    code, rest = query(client, 0x0B, reference, stream)
    return code, struct.unpack(">Q", rest)[0]


def sequence(client: RawStream, reference: str, stream: str) -> tuple[int, int]:
    code, rest = query(client, 0x05, reference, stream)
    return code, struct.unpack(">Q", rest)[0]


def stream_stats(client: RawStream, stream: str) -> tuple[int, dict[str, int]]:
    code, rest = query(client, 0x1C, stream)
    stats, pos = {}, 4
    for _ in range(struct.unpack_from(">i", rest)[0]):
        size = struct.unpack_from(">h", rest, pos)[0]
        key = rest[pos + 2 : pos + 2 + size].decode()
        stats[key] = struct.unpack_from(">q", rest, pos + 2 + size)[0]
        pos += 10 + size
    return code, stats


def store_offset(client: RawStream, reference: str, stream: str, offset: int) -> None:
    client.send(0x0A, 1, s(reference) + s(stream) + struct.pack(">Q", offset))  # no answer


def test_offsets_and_publisher_sequences_on_a_replica_and_a_node_without_a_copy(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    declare_stream(a, "tracked", size=None)  # a leads, b holds a replica
    declare_stream(a, "solo")  # only a holds it
    wait_until(lambda: visible(b, "tracked") and visible(b, "solo"), timeout=10)
    on_a, on_b = raw(a), raw(b)
    publish_confirmed(on_a, 1, "pub-t", "tracked", range(1, 4))
    publish_confirmed(on_a, 2, "pub-s", "solo", range(1, 6))

    # the replica answers from its own copy: the publisher's tracking record replicated
    wait_until(lambda: sequence(on_b, "pub-t", "tracked") == (OK, 3), timeout=10)
    # the node with no copy asks the leader's node, as RabbitMQ's reader asks the leader
    assert sequence(on_b, "pub-s", "solo") == (OK, 5)
    assert sequence(on_b, "nobody", "solo") == (OK, 0)
    assert query_offset(on_b, "nobody", "solo") == (0x13, 0)  # NO_OFFSET
    assert query_offset(on_b, "nobody", "tracked") == (0x13, 0)
    assert stream_stats(on_b, "solo") == stream_stats(on_a, "solo")
    assert stream_stats(on_b, "solo")[0] == OK
    wait_until(lambda: stream_stats(on_b, "tracked") == stream_stats(on_a, "tracked"),
               timeout=10)
    for client in (on_a, on_b):
        assert sequence(client, "pub-s", "nowhere") == (0x02, 0)  # STREAM_DOES_NOT_EXIST

    # StoreOffset on the replica's node reaches the leader, which writes it into the log:
    # every node answers it; on the node without a copy it goes to the leader too
    store_offset(on_b, "reader-t", "tracked", 2)
    store_offset(on_b, "reader-s", "solo", 4)
    for client in (on_a, on_b):
        wait_until(lambda c=client: query_offset(c, "reader-t", "tracked") == (OK, 2),
                   timeout=10)
        wait_until(lambda c=client: query_offset(c, "reader-s", "solo") == (OK, 4),
                   timeout=10)
    # stored on the leader's node: the replica hears it too
    store_offset(on_a, "reader-t", "tracked", 3)
    wait_until(lambda: query_offset(on_b, "reader-t", "tracked") == (OK, 3), timeout=10)
    on_a.close()

    # the leader's node down: a node with no copy has nobody to ask
    a.kill()
    wait_until(lambda: query_offset(on_b, "reader-s", "solo") == (NOT_AVAILABLE, 0),
               timeout=20)
    assert sequence(on_b, "pub-s", "solo") == (NOT_AVAILABLE, 0)
    assert stream_stats(on_b, "solo") == (NOT_AVAILABLE, {})
    store_offset(on_b, "reader-s", "solo", 5)  # dropped, logged; the connection carries on
    assert query_offset(on_b, "reader-t", "tracked") == (OK, 3)  # the replica's own copy
    on_b.close()


def test_create_and_delete_over_the_stream_protocol_reach_every_node(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a, on_b = raw(a), raw(b)
    on_b.request(0x0D, s("made-on-b") + strmap({"initial-cluster-size": "1"}))
    assert on_b.response(0x0D)[1] == OK
    b_endpoint = ("127.0.0.1", b.stream_port)  # type: ignore[attr-defined]
    # settled on every node before the answer: A's model has it at once
    assert metadata(on_a, "made-on-b") == ([b_endpoint], {"made-on-b": (OK, b_endpoint, [])})
    wait_until(lambda: visible(a, "made-on-b"), timeout=10)  # AMQP clients of A see it too
    on_a.request(0x0D, s("made-on-b") + struct.pack(">i", 0))
    assert on_a.response(0x0D)[1] == 0x05  # STREAM_ALREADY_EXISTS
    on_a.request(0x0D, s("bad-args") + struct.pack(">i", 1) + s("max-age") + s("1A"))
    assert on_a.response(0x0D)[1] == 0x11  # PRECONDITION_FAILED
    assert not visible(b, "bad-args")

    on_b.request(0x07, struct.pack(">B", 1) + s("made-on-b") + struct.pack(">HH", 1, 10)
                 + struct.pack(">i", 0))
    assert on_b.response(0x07)[1] == OK
    on_a.request(0x0E, s("made-on-b"))  # deleted through the node that does not hold it
    assert on_a.response(0x0E)[1] == OK
    update = on_b.next(0x0010)
    assert struct.unpack_from(">H", update, 4)[0] == NOT_AVAILABLE
    assert not visible(a, "made-on-b") and not visible(b, "made-on-b")
    on_a.request(0x0E, s("made-on-b"))
    assert on_a.response(0x0E)[1] == 0x02  # STREAM_DOES_NOT_EXIST
    on_a.close()
    on_b.close()


def test_management_on_any_node_shows_and_closes_every_nodes_stream_connections(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a = node_with_streams(tmp_path, etcd, cluster, "a")
    b = node_with_streams(tmp_path, etcd, cluster, "b")
    b.management_port = free_port()
    b.args += ["--management-port", str(b.management_port)]
    nodes.extend((a.start(), b.start()))
    wait_for_port(b.management_port, 30)
    wait_until(lambda: link_settled(a) and linked(b, 1))
    declare_stream(a, "watched")
    wait_until(lambda: visible(b, "watched"), timeout=10)
    on_a = raw(a)
    on_a.request(0x01, struct.pack(">B", 4) + s("w-ref") + s("watched"))
    assert on_a.response(0x01)[1] == OK
    on_a.request(0x07, struct.pack(">B", 9) + s("watched") + struct.pack(">HH", 1, 3)
                 + struct.pack(">i", 0))
    assert on_a.response(0x07)[1] == OK
    port = on_a.sock.getsockname()[1]

    [conn] = [c for c in api_get(b, "/api/stream/connections") if c["peer_port"] == port]
    assert (conn["node"], conn["protocol"], conn["subscriptions"]) == ("a", "stream", 1)
    assert [c["name"] for c in api_get(b, "/api/connections")
            if c.get("protocol") == "stream"] == [conn["name"]]
    path = f"/api/stream/connections/%2F/{quote(conn['name'], safe='')}"
    assert api_get(b, path)["node"] == "a"
    [publisher] = api_get(b, path + "/publishers")
    assert (publisher["publisher_id"], publisher["reference"]) == (4, "w-ref")
    assert publisher["connection_details"]["node"] == "a"
    [consumer] = api_get(b, path + "/consumers")
    assert (consumer["subscription_id"], consumer["credits"]) == (9, 3)
    assert api_get(b, "/api/stream/publishers/%2F/watched") == [publisher]
    assert [c for c in api_get(b, "/api/stream/consumers")
            if c.get("connection_details", {}).get("node") == "a"] == [consumer]

    request = Request(f"http://127.0.0.1:{b.management_port}{path}", method="DELETE")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urlopen(request, timeout=15) as response:
        assert response.status == 204
    assert on_a.closed_by_server()
    assert api_get(b, "/api/stream/connections") == []


@pytest.mark.asyncio
async def test_rstream_follows_metadata_to_the_holder(ab: tuple[ClusterNode, ClusterNode]) -> None:
    """rstream connected to B publishes to and consumes from a stream A holds: it asks
    Metadata and connects to A's advertised stream endpoint, unchanged."""
    from rstream import AMQPMessage, Consumer, MessageContext, Producer, amqp_decoder

    a, b = ab
    declare_stream(a, "followed")
    wait_until(lambda: visible(b, "followed"), timeout=10)
    port_b = b.stream_port  # type: ignore[attr-defined]
    async with Producer("127.0.0.1", port=port_b, username="guest", password="guest") as p:
        for i in range(3):
            await p.send_wait("followed", AMQPMessage(body=f"m{i}".encode()))
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        got.append(bytes(message.body))
        if len(got) == 3:
            done.set()

    async with Consumer("127.0.0.1", port=port_b, username="guest", password="guest") as c:
        await c.subscribe("followed", on_message, decoder=amqp_decoder)
        await asyncio.wait_for(done.wait(), 30)
    assert got == [b"m0", b"m1", b"m2"]
