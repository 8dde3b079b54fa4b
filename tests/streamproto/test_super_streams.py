"""Create, Delete, CreateSuperStream and DeleteSuperStream on one node: the topology port
answers in the turn that read the command, so pipelined commands see what the ones before
them made; CreateSuperStream takes the partition names and binding keys as the client sent
them, as rabbit_stream_manager does (the comparison with the reference RabbitMQ is in
test_differential.py; the same answers in a cluster are in
tests/cluster/test_super_streams_cluster.py)."""

from __future__ import annotations

import struct

from .conftest import StreamBroker
from .raw import RawStream, s, strmap

OK, DOES_NOT_EXIST, ALREADY_EXISTS, PRECONDITION_FAILED = 0x01, 0x02, 0x05, 0x11
CREATE, DELETE, DECLARE_PUBLISHER, ROUTE, PARTITIONS = 0x0D, 0x0E, 0x01, 0x18, 0x19
CREATE_SUPER_STREAM, DELETE_SUPER_STREAM = 0x1D, 0x1E


def strings(values: list[str]) -> bytes:
    return struct.pack(">i", len(values)) + b"".join(s(v) for v in values)


def frame(key: int, corr: int, body: bytes) -> bytes:
    payload = struct.pack(">HHI", key, 1, corr) + body
    return struct.pack(">I", len(payload)) + payload


def answers(client: RawStream, count: int) -> list[tuple[int, int, int]]:
    """The next `count` responses as (key, correlation id, code), in the order they came."""
    out = []
    while len(out) < count:
        raw = client.read_frame()
        key = struct.unpack(">H", raw[:2])[0]
        if key & 0x8000:
            corr, code = struct.unpack(">IH", raw[4:10])
            out.append((key & 0x7FFF, corr, code))
    return out


def listed(client: RawStream, key: int, body: bytes) -> tuple[int, list[str]]:
    client.request(key, body)
    _corr, code, rest = client.response(key)
    count = struct.unpack(">i", rest[:4])[0]
    names, pos = [], 4
    for _ in range(max(count, 0) if code == OK else 0):
        size = struct.unpack(">h", rest[pos:pos + 2])[0]
        names.append(rest[pos + 2:pos + 2 + size].decode())
        pos += 2 + size
    return code, names


def test_pipelined_commands_see_what_the_ones_before_them_made(lev: StreamBroker,
                                                              name: str) -> None:
    """One write: Create, DeclarePublisher on it, CreateSuperStream, DeclarePublisher on a
    partition, DeleteSuperStream, Delete: each answered in order, each seeing the last."""
    client = lev.raw()
    sup = f"{name}-super"
    client.sock.sendall(
        frame(CREATE, 1, s(name) + strmap({}))
        + frame(DECLARE_PUBLISHER, 2, struct.pack(">B", 1) + s("") + s(name))
        + frame(CREATE_SUPER_STREAM, 3, s(sup) + strings([f"{sup}-a"]) + strings(["a"])
                + strmap({}))
        + frame(DECLARE_PUBLISHER, 4, struct.pack(">B", 2) + s("") + s(f"{sup}-a"))
        + frame(DELETE_SUPER_STREAM, 5, s(sup))
        + frame(DELETE, 6, s(name)))
    assert answers(client, 6) == [
        (CREATE, 1, OK), (DECLARE_PUBLISHER, 2, OK), (CREATE_SUPER_STREAM, 3, OK),
        (DECLARE_PUBLISHER, 4, OK), (DELETE_SUPER_STREAM, 5, OK), (DELETE, 6, OK)]
    client.close()


def test_partitions_are_named_and_bound_as_the_client_sent_them(lev: StreamBroker,
                                                               name: str) -> None:
    """Names that are not `<super stream>-<key>`, a blank key and a key with spaces: each
    partition as named, bound with its key as it is."""
    client = lev.raw()
    names = [f"{name}-first", f"{name}-", f"{name}- spaced "]
    keys = ["one", "", " spaced "]
    client.request(CREATE_SUPER_STREAM, s(name) + strings(names) + strings(keys) + strmap({}))
    assert client.response(CREATE_SUPER_STREAM)[1] == OK
    assert listed(client, PARTITIONS, s(name)) == (OK, names)
    for key, partition in zip(keys, names, strict=True):
        assert listed(client, ROUTE, s(key) + s(name)) == (OK, [partition])
    client.request(DELETE_SUPER_STREAM, s(name))
    assert client.response(DELETE_SUPER_STREAM)[1] == OK
    client.close()


def test_a_partition_named_twice_already_exists_and_nothing_is_made(lev: StreamBroker,
                                                                   name: str) -> None:
    client = lev.raw()
    for names, keys in (([f"{name}-a", f"{name}-a"], ["a", "a"]),
                        ([f"{name}-x", f"{name}-x"], ["x", "y"])):
        client.request(CREATE_SUPER_STREAM, s(name) + strings(names) + strings(keys)
                       + strmap({}))
        assert client.response(CREATE_SUPER_STREAM)[1] == ALREADY_EXISTS
        assert listed(client, PARTITIONS, s(name))[0] == DOES_NOT_EXIST
        client.request(DELETE, s(names[0]))
        assert client.response(DELETE)[1] == DOES_NOT_EXIST
    # a bad argument is found first, as RabbitMQ's first partition finds it
    client.request(CREATE_SUPER_STREAM, s(name) + strings([f"{name}-a", f"{name}-a"])
                   + strings(["a", "a"]) + strmap({"initial-cluster-size": "0"}))
    assert client.response(CREATE_SUPER_STREAM)[1] == PRECONDITION_FAILED
    client.close()
