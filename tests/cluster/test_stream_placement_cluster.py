"""Where a new stream is placed in a real cluster (real etcd, `leveret serve` nodes), by all three
ways of declaring one (AMQP queue.declare, the management API, the stream protocol's Create):
declared as the nodes start, it gets every node, waiting for links still coming up; a node live
in etcd whose link never comes up is waited for PLACEMENT_WAIT_S, then left out with a warning;
a node whose link was up and broke (killed, its record not yet expired) is left out at once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

from streamproto.raw import RawStream, s, strmap
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, declare, in_etcd, linked, make_node, wait_until
from support.cluster_api import ok
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.running_nodes import PLACEMENT_WAIT_S

OK = 0x01


def node(tmp_path: Path, etcd: EtcdServer, cluster: str, name: str,
         env: dict[str, str] | None = None) -> ClusterNode:
    """A node with management and a stream-protocol listener."""
    stream_port = free_port()
    made = make_node(tmp_path, etcd.url, cluster, name, management=True, env=env,
                     extra=["--stream-port", str(stream_port),
                            "--stream-advertised-host", "127.0.0.1"])
    made.stream_port = stream_port  # type: ignore[attr-defined]
    return made


def create_over_stream_protocol(at: ClusterNode, name: str) -> None:
    wait_for_port(at.stream_port, 30)  # type: ignore[attr-defined]
    client = RawStream(at.stream_port, timeout=30)  # type: ignore[attr-defined]
    assert client.handshake() == 1
    client.request(0x0D, s(name) + strmap({}))
    assert client.response(0x0D)[1] == OK
    client.close()


def members(etcd: EtcdServer, cluster: str, name: str) -> list[str]:
    record, _ = in_etcd(etcd, cluster, name)
    assert record is not None
    return sorted(record.members)


def test_streams_declared_as_the_nodes_start_get_every_node(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    three = [node(tmp_path, etcd, cluster, name) for name in ("a", "b", "c")]
    nodes.extend(three)
    starting = [threading.Thread(target=n.start) for n in three]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    a, b, c = three
    # at once, before the links are up: each way of declaring a stream, on each node
    began = time.monotonic()
    declare(c, "s.amqp-c")
    declare(a, "s.amqp-a")
    ok(b, "PUT", "/api/queues/%2F/s.api-b", {"durable": True,
                                               "arguments": {"x-queue-type": "stream"}})
    create_over_stream_protocol(c, "s.protocol-c")
    assert time.monotonic() - began < 4 * PLACEMENT_WAIT_S
    for name in ("s.amqp-c", "s.amqp-a", "s.api-b", "s.protocol-c"):
        assert members(etcd, cluster, name) == ["a", "b", "c"], name
    for made in three:
        assert "fewer members than asked" not in made.log()


def test_a_member_whose_link_does_not_come_up_is_waited_for_then_left_out(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    a, b = node(tmp_path, etcd, cluster, "a"), node(tmp_path, etcd, cluster, "b")
    for made in (a, b):
        nodes.append(made.start())
    wait_until(lambda: linked(a, 1) and linked(b, 1), timeout=60)

    async def put_live_record() -> None:  # node z: live in etcd, nothing at its address
        async with EtcdClient([etcd.url]) as client:
            record = {"name": "z", "advertise_host": "127.0.0.1", "cluster_port": free_port(),
                      "started_at": 1, "version": "test"}
            await client.put(f"/leveret/{cluster}/nodes/z", json.dumps(record))

    asyncio.run(put_live_record())
    time.sleep(1.0)  # the nodes' watches have the record (within milliseconds)

    for declare_on, how in ((a, "amqp"), (b, "api"), (a, "protocol")):
        name = f"s.wait-{how}"
        began = time.monotonic()
        if how == "amqp":
            declare(declare_on, name)
        elif how == "api":
            ok(declare_on, "PUT", f"/api/queues/%2F/{name}",
               {"durable": True, "arguments": {"x-queue-type": "stream"}})
        else:
            create_over_stream_protocol(declare_on, name)
        waited = time.monotonic() - began
        assert PLACEMENT_WAIT_S <= waited < PLACEMENT_WAIT_S + 3, (how, waited)
        assert members(etcd, cluster, name) == ["a", "b"], how
        warning = next(json.loads(line) for line in declare_on.log().splitlines()
                       if "fewer members than asked" in line and name in line)
        assert warning["level"] == "warning" and warning["left_out"] == ["z"]
        assert warning["asked"] == 3 and warning["members"][0] == declare_on.node_name


def test_a_node_lost_from_here_is_left_out_at_once(
        tmp_path: Path, etcd: EtcdServer, cluster: str, nodes: list[BrokerProcess]) -> None:
    long_lease = {"LEVERET_CLUSTER_LEASE_TTL_S": "30"}  # c's record outlives the test
    three = [node(tmp_path, etcd, cluster, name, env=long_lease) for name in ("a", "b", "c")]
    for made in three:
        nodes.append(made.start())
    a, _b, c = three
    wait_until(lambda: all(linked(n, 2) for n in three), timeout=60)
    c.kill()  # its links break at once; its record stays until its lease expires
    wait_until(lambda: linked(a, 1), timeout=10)
    began = time.monotonic()
    declare(a, "s.lost")
    assert time.monotonic() - began < PLACEMENT_WAIT_S / 2
    assert members(etcd, cluster, "s.lost") == ["a", "b"]
    assert "fewer members than asked" in a.log()
