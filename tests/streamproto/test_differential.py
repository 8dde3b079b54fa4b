"""The same raw stream-protocol scenarios against Leveret and against the reference RabbitMQ
(Debian's 3.10.8 with `rabbitmq_stream` enabled): the same response codes, the same closes,
the same chunks. Skipped, with the reason, where no local rabbitmq-server can start."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from support.reference import Reference

from .conftest import start_stream_broker
from .raw import RawStream, s, strmap

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def leveret(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    broker = start_stream_broker(tmp_path_factory.mktemp("diff") / "data")
    yield broker.stream_port, broker.amqp_port
    broker.process.kill()


class Ports(tuple[int, int]):
    """(stream port, AMQP port) of a target, and its name."""

    name: str


@pytest.fixture(params=["leveret", "rabbitmq"])
def ports(request: pytest.FixtureRequest) -> Ports:
    if request.param == "rabbitmq":
        reference: Reference = request.getfixturevalue("stream_reference")
        value = Ports((reference.stream_port, reference.port))
    else:
        value = Ports(request.getfixturevalue("leveret"))
    value.name = request.param
    return value


def opened(ports: Ports) -> RawStream:
    client = RawStream(ports[0], timeout=10)
    assert client.handshake() == 1
    return client


def unique() -> str:
    return f"d-{uuid.uuid4().hex[:10]}"


def create(client: RawStream, name: str) -> None:
    client.request(0x0D, s(name) + struct.pack(">i", 0))
    assert client.response(0x0D)[1] == 1


def code_of(client: RawStream, key: int, body: bytes) -> int:
    corr = client.request(key, body)
    got_corr, code, _ = client.response(key)
    assert got_corr == corr
    return code


def server_close_code(client: RawStream) -> int:
    frame = client.next(0x16)
    return int(struct.unpack(">H", frame[8:10])[0])


def test_create_and_delete_codes(ports: Ports) -> None:
    client = opened(ports)
    name = unique()
    assert code_of(client, 0x0D, s(name) + struct.pack(">i", 0)) == 1
    assert code_of(client, 0x0D, s(name) + struct.pack(">i", 0)) == 5
    assert code_of(client, 0x0D, s("amq.reserved") + struct.pack(">i", 0)) == 17
    assert code_of(client, 0x0E, s(name)) == 1
    assert code_of(client, 0x0E, s(name)) == 2


@pytest.mark.parametrize("arguments", [{"initial-cluster-size": "0"},
                                       {"stream-max-segment-size-bytes": "4000000000"}])
def test_create_with_bad_arguments(ports: Ports, arguments: dict[str, str]) -> None:
    client = opened(ports)
    assert code_of(client, 0x0D, s(unique()) + strmap(arguments)) == 17


# The Node client's own test (test/unit/create_stream.test.ts) creates streams and super
# streams with the first; `random` and `least-leaders` are the deprecated locators that
# RabbitMQ still takes (rabbit_queue_location:queue_leader_locators(), placed as `balanced`).
NODE_SUITE_ARGUMENTS = {"queue-leader-locator": "random", "max-age": "120s",
                        "stream-max-segment-size-bytes": "1000", "initial-cluster-size": "5",
                        "max-length-bytes": "20000"}


@pytest.mark.parametrize("arguments", [NODE_SUITE_ARGUMENTS,
                                       {"queue-leader-locator": "least-leaders"},
                                       {"queue-leader-locator": "balanced"}])
def test_create_with_every_leader_locator_rabbitmq_takes(ports: Ports,
                                                        arguments: dict[str, str]) -> None:
    client = opened(ports)
    name = unique()
    assert code_of(client, 0x0D, s(name) + strmap(arguments)) == 1
    assert code_of(client, 0x0E, s(name)) == 1


def test_create_with_an_unknown_leader_locator(ports: Ports) -> None:
    client = opened(ports)
    assert code_of(client, 0x0D, s(unique()) + strmap({"queue-leader-locator": "nearest"})) == 17


@pytest.mark.parametrize("arguments", [{"max-age": "1A"}, {"max-length-bytes": "-1"}])
def test_create_with_arguments_queue_declare_refuses(ports: Ports,
                                                     arguments: dict[str, str]) -> None:
    """RabbitMQ 3.10 creates these streams; later RabbitMQ declares through the queue type's
    checks and answers PRECONDITION_FAILED, as Leveret does (the checks of queue.declare)."""
    client = opened(ports)
    code = code_of(client, 0x0D, s(unique()) + strmap(arguments))
    assert code == (1 if ports.name == "rabbitmq" else 17)


def test_delete_a_classic_queue_is_no_stream(ports: Ports) -> None:
    name = unique()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ports[1]))
    connection.channel().queue_declare(name)
    client = opened(ports)
    assert code_of(client, 0x0E, s(name)) == 2
    connection.channel().queue_delete(name)
    connection.close()


def test_publisher_and_subscription_codes(ports: Ports) -> None:
    client = opened(ports)
    name = unique()
    create(client, name)
    assert code_of(client, 0x01, struct.pack(">B", 1) + s("") + s("missing-" + name)) == 2
    assert code_of(client, 0x01, struct.pack(">B", 1) + s("") + s(name)) == 1
    assert code_of(client, 0x01, struct.pack(">B", 1) + s("") + s(name)) == 17
    assert code_of(client, 0x06, struct.pack(">B", 9)) == 18
    subscribe = struct.pack(">B", 1) + s(name) + struct.pack(">HH", 1, 1) + strmap({})
    assert code_of(client, 0x07, subscribe) == 1
    assert code_of(client, 0x07, subscribe) == 3
    missing = struct.pack(">B", 2) + s("missing-" + name) + struct.pack(">HH", 1, 1) + strmap({})
    assert code_of(client, 0x07, missing) == 2
    assert code_of(client, 0x0C, struct.pack(">B", 7)) == 4
    assert code_of(client, 0x0B, s("nobody") + s(name)) == 19
    corr = client.request(0x05, s("nobody") + s(name))
    assert client.response(0x05) == (corr, 1, struct.pack(">Q", 0))
    client.send(0x09, 1, struct.pack(">BH", 42, 1))
    frame = client.next(0x8009)
    assert struct.unpack(">HB", frame[4:7]) == (4, 42)


def test_publish_for_an_unknown_publisher(ports: Ports) -> None:
    client = opened(ports)
    client.send(0x02, 1, struct.pack(">BiQI", 5, 1, 77, 1) + b"x")
    frame = client.next(0x04)
    assert struct.unpack(">BiQH", frame[4:19]) == (5, 1, 77, 18)


def test_metadata_of_a_missing_stream(ports: Ports) -> None:
    client = opened(ports)
    name = "missing-" + unique()
    client.request(0x0F, struct.pack(">i", 1) + s(name))
    frame = client.next(0x800F)
    brokers = struct.unpack(">i", frame[8:12])[0]
    pos = 12
    for _ in range(brokers):
        size = struct.unpack(">h", frame[pos + 2 : pos + 4])[0]
        pos += 4 + size + 4
    count = struct.unpack(">i", frame[pos : pos + 4])[0]
    pos += 4 + 2 + len(name)
    assert count == 1
    assert struct.unpack(">HHi", frame[pos : pos + 8]) == (2, 0xFFFF, 0)


@pytest.mark.parametrize("body", [
    (0x7F, 1, b""),  # an unknown command
    (0x0D, 9, s("x") + struct.pack(">i", 0)),  # an unknown version
    (0x0D, 1, struct.pack(">h", 50) + b"abc"),  # a truncated field
    (0x1B, 1, struct.pack(">i", 0)),  # ExchangeCommandVersions: unknown to 3.10
])
def test_unknown_frames_get_close(ports: Ports, body: tuple[int, int, bytes]) -> None:
    key, version, fields = body
    if key == 0x1B and ports.name == "leveret":
        pytest.skip("Leveret serves ExchangeCommandVersions (3.13's protocol)")
    client = opened(ports)
    client.request(key, fields, version=version)
    frame = client.next(0x16)
    assert frame[4:] == struct.pack(">IH", 1, 13) + s("unknown frame")


def test_frame_too_large_after_open(ports: Ports) -> None:
    if ports.name == "rabbitmq":
        pytest.skip("RabbitMQ 3.10 answers nothing; later RabbitMQ sends Close 14, as Leveret")
    client = opened(ports)
    client.sock.sendall(struct.pack(">I", 2_000_000) + b"\x00\x0d\x00\x01")
    assert server_close_code(client) == 14


def test_before_open(ports: Ports) -> None:
    client = RawStream(ports[0], timeout=10)
    client.sock.sendall(struct.pack(">I", 9000) + b"\x00" * 16)
    assert client.closed_by_server()
    client = RawStream(ports[0], timeout=10)
    assert client.handshake(password="wrong") == 8
    assert client.closed_by_server()
    client = RawStream(ports[0], timeout=10)
    assert client.handshake(vhost="no-such-vhost") == 12


def test_published_messages_come_back_in_chunks(ports: Ports) -> None:
    client = opened(ports)
    name = unique()
    create(client, name)
    client.request(0x01, struct.pack(">B", 1) + s("ref-a") + s(name))
    assert client.response(0x01)[1] == 1
    bodies = [b"\x00\x53\x75\xa0\x03ab" + bytes((i,)) for i in range(3)]  # data sections
    client.send(0x02, 1, struct.pack(">Bi", 1, 3) + b"".join(
        struct.pack(">QI", i + 1, len(b)) + b for i, b in enumerate(bodies)))
    frame = client.next(0x03)
    assert struct.unpack(">Bi", frame[4:9]) == (1, 3)
    corr = client.request(0x05, s("ref-a") + s(name))
    assert client.response(0x05) == (corr, 1, struct.pack(">Q", 3))
    client.request(0x07, struct.pack(">B", 1) + s(name) + struct.pack(">HH", 1, 10)
                   + strmap({}))
    assert client.response(0x07)[1] == 1
    got = []
    while len(got) < 3:
        frame = client.next(0x08)
        magic, kind, entries, _records = struct.unpack_from(">BBHI", frame, 5)
        first = struct.unpack_from(">Q", frame, 5 + 24)[0]
        assert (magic, kind) == (0x50, 0)
        data = frame[5 + 48 :]
        pos = 0
        for i in range(entries):
            size = struct.unpack(">I", data[pos : pos + 4])[0]
            got.append((first + i, data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
    assert got == list(enumerate(bodies))


def test_store_and_query_offset(ports: Ports, tmp_path: Path) -> None:
    client = opened(ports)
    name = unique()
    create(client, name)
    client.send(0x0A, 1, s("reader") + s(name) + struct.pack(">Q", 4))
    for _ in range(50):
        corr = client.request(0x0B, s("reader") + s(name))
        got = client.response(0x0B)
        if got[1] == 1:
            assert got == (corr, 1, struct.pack(">Q", 4))
            return
    raise AssertionError("the offset was never stored")


def make_super_stream(request: pytest.FixtureRequest, ports: Ports, name: str,
                      keys: list[str]) -> int:
    """A super stream with these binding keys and partitions `<name>-<key>`, and the response
    code. 3.10.8's stream protocol has no CreateSuperStream: the reference makes it with
    `rabbitmq-streams add_super_stream --routing-keys`, which calls the same
    rabbit_stream_manager:create_super_stream (its `reference_already_exists` is what later
    readers answer as STREAM_ALREADY_EXISTS); Leveret with CreateSuperStream."""
    if ports.name == "rabbitmq":
        reference: Reference = request.getfixturevalue("stream_reference")
        try:
            reference.streams("add_super_stream", name, "--routing-keys", ",".join(keys))
        except RuntimeError as exc:
            if "reference_already_exists" in str(exc):
                return 0x05
            raise
        return 0x01
    names = [f"{name}-{key}" for key in keys]
    return code_of(opened(ports), 0x1D, s(name) + _strings(names) + _strings(keys) + strmap({}))


def _strings(values: list[str]) -> bytes:
    return struct.pack(">i", len(values)) + b"".join(s(v) for v in values)


def _listed(client: RawStream, key: int, body: bytes) -> tuple[int, list[str]]:
    """Route's or Partitions' code and streams. 3.10.8 answers them with the command's key
    without the response bit (later releases, and Leveret, set it)."""
    corr = client.request(key, body)
    while True:
        frame = client.read_frame()
        if struct.unpack(">H", frame[:2])[0] & 0x7FFF == key:
            break
    got_corr, code = struct.unpack(">IH", frame[4:10])
    assert got_corr == corr
    rest = frame[10:]
    names, pos = [], 4
    for _ in range(struct.unpack(">i", rest[:4])[0] if code == 1 else 0):
        size = struct.unpack(">h", rest[pos:pos + 2])[0]
        names.append(rest[pos + 2:pos + 2 + size].decode())
        pos += 2 + size
    return code, names


def test_super_stream_partitions_and_a_partition_named_twice(request: pytest.FixtureRequest,
                                                            ports: Ports) -> None:
    """Partitions in key order, routed by key; a partition name given twice is
    STREAM_ALREADY_EXISTS and leaves nothing (RabbitMQ rolls back what it made)."""
    name = unique()
    assert make_super_stream(request, ports, name, ["b", "a"]) == 1
    client = opened(ports)
    assert _listed(client, 0x19, s(name)) == (1, [f"{name}-b", f"{name}-a"])
    assert _listed(client, 0x18, s("a") + s(name)) == (1, [f"{name}-a"])
    twice = unique()
    assert make_super_stream(request, ports, twice, ["a", "a"]) == 5
    assert _listed(client, 0x19, s(twice))[0] == 2
    assert code_of(client, 0x0E, s(f"{twice}-a")) == 2  # the partition made first is gone


def test_partitions_and_route_of_any_exchange(ports: Ports) -> None:
    """Partitions and Route take whatever exchange has the name, as rabbit_stream_manager
    does: its bindings to streams (a classic queue is left out), in `x-stream-partition-order`
    (a string is read as a number), routed by the exchange's own type. The Node client's own
    suite makes its super streams so, through the management API: an exchange with no
    `x-super-stream` marker, partitions bound with orders "0", "1", "2"."""
    name = unique()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ports[1]))
    channel = connection.channel()
    channel.exchange_declare(name, "direct", durable=True)
    for i in range(3):
        channel.queue_declare(f"{name}-{i}", durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_bind(f"{name}-{i}", name, str(i), {"x-stream-partition-order": str(2 - i)})
    channel.queue_declare(f"{name}-classic")
    channel.queue_bind(f"{name}-classic", name, "1")
    try:
        client = opened(ports)
        assert _listed(client, 0x19, s(name)) == (1, [f"{name}-2", f"{name}-1", f"{name}-0"])
        assert _listed(client, 0x18, s("1") + s(name)) == (1, [f"{name}-1"])
        assert _listed(client, 0x18, s("none") + s(name)) == (1, [])
        assert _listed(client, 0x19, s("no-" + name)) == (2, [])
    finally:
        channel.exchange_delete(name)
        for queue in [f"{name}-{i}" for i in range(3)] + [f"{name}-classic"]:
            channel.queue_delete(queue)
        connection.close()
