"""Cluster nodes as real `leveret serve` processes, for tests against a real etcd: a node with
its own cluster and management ports, `leveret cluster-status`, and the management API."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import pika
from support.brokers import BrokerProcess
from support.etcd import EtcdServer
from support.ports import free_port, wait_for_port

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.membership import ClusterKeys
from leveret.broker.cluster.stream_leadership import StreamLeadership, StreamLeaderships
from leveret.broker.cluster.topology_keys import TopologyKeys
from leveret.broker.cluster.topology_records import QueueRecord, decode

TTL_S = 2  # etcd's minimum: a killed node shows as down within about two seconds
SECRET = "test-cluster-secret"
STREAM = {"x-queue-type": "stream"}


class ClusterNode(BrokerProcess):
    management_port = 0
    cluster_port = 0
    node_name = ""

    def start(self, timeout: float = 30.0) -> ClusterNode:
        """Started once the AMQP port answers, and the management port too when it has one
        (it opens a moment later: a test that calls the API at once must not race it)."""
        super().start(timeout)
        if self.management_port:
            wait_for_port(self.management_port, timeout, self.connect_host)
        return self


def make_node(tmp_path: Path, etcd_url: str, cluster: str, name: str, *,
              env: dict[str, str] | None = None, extra: list[str] | None = None,
              management: bool = False) -> ClusterNode:
    cluster_port = free_port()  # the node-to-node link's listener: one per node on this host
    args = ["--etcd", etcd_url, "--cluster-name", cluster, "--node-name", name,
            "--cluster-port", str(cluster_port), *(extra or [])]
    node = ClusterNode(tmp_path / name, args=args,
                         env={"LEVERET_CLUSTER_SECRET": SECRET,
                              "LEVERET_CLUSTER_LEASE_TTL_S": str(TTL_S), **(env or {})})
    node.cluster_port = cluster_port
    node.node_name = name
    if management:
        node.management_port = free_port()
        node.args += ["--management-port", str(node.management_port)]
    return node


def leveret(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "leveret.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def status(etcd_url: str, cluster: str) -> dict[str, Any]:
    result = leveret("cluster-status", "--etcd", etcd_url, "--cluster-name", cluster,
                     "--formatter", "json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def states(etcd_url: str, cluster: str) -> dict[str, str]:
    return {n["name"]: n["state"] for n in status(etcd_url, cluster)["nodes"]}


@contextmanager
def paused(*nodes: BrokerProcess) -> Iterator[None]:
    """The nodes' processes stopped (SIGSTOP) for the block, continued after it, whatever
    happens (a node killed meanwhile is left as it is)."""
    for node in nodes:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def api_get(node: ClusterNode, path: str) -> Any:
    request = Request(f"http://127.0.0.1:{node.management_port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urlopen(request, timeout=15) as response:
        return json.loads(response.read())


def api_nodes(node: ClusterNode) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = api_get(node, "/api/nodes")
    return data


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exit code 1 and said so in exactly one line."""
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, lines)
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


def linked(node: ClusterNode, peers: int) -> bool:
    """`node` (started with management) has a link to `peers` other nodes, each answering its
    ping: a change it makes is settled on all of them before its -ok."""
    try:
        local = [n for n in api_nodes(node) if "os_pid" in n]
    except OSError:  # the management listener opens after the AMQP one
        return False
    return len(local) == 1 and sum(1 for link in local[0]["cluster_links"]
                                   if link["peer_version"]) == peers


# Replicated streams: a stream on three nodes, its record and leadership key in etcd, its
# members' segment files, confirmed publishing and reading from the first offset.

def connect(node: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url))


def declare(node: BrokerProcess, name: str, **arguments: Any) -> None:
    conn = connect(node)
    conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    conn.close()


def in_etcd(etcd: EtcdServer, cluster: str,
            name: str) -> tuple[QueueRecord | None, StreamLeadership | None]:
    """The stream's queue record and its leadership key, read straight from etcd."""
    async def read() -> tuple[QueueRecord | None, StreamLeadership | None]:
        async with EtcdClient([etcd.url], timeout_s=5.0) as client:
            keys = TopologyKeys(ClusterKeys(cluster).root + "topology/")
            kv = await client.get(keys.queue("/", name))
            record = decode("queues", kv) if kv is not None else None
            assert record is None or isinstance(record, QueueRecord)
            return record, await StreamLeaderships(client, cluster).get("/", name)
    return asyncio.run(read())


def segments(node: ClusterNode, storage_id: str) -> dict[str, bytes]:
    folder = node.data_dir / "queues" / storage_id
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.segment"))}


def same_logs(nodes: tuple[ClusterNode, ...], storage_id: str) -> bool:
    found = [segments(node, storage_id) for node in nodes]
    return bool(found[0]) and all(f == found[0] for f in found[1:])


def consume(node: BrokerProcess, name: str, want: int, timeout: float = 60) -> list[bytes]:
    """Read `want` messages of stream `name` from its first offset, through `node`."""
    conn = connect(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got: list[bytes] = []

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(name, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    conn.close()
    return got


def publish_confirmed(node: BrokerProcess, name: str, bodies: list[bytes]) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body)  # raises if nacked; returns once acked
    conn.close()


def publish_until_confirmed(node: BrokerProcess, name: str, body: bytes,
                            timeout: float = 60) -> int:
    """Publish `body` until one copy is confirmed (basic.ack); the number of tries before that
    were not: a nack, or a connection or channel a failover broke (send it again)."""
    refused = 0
    deadline = time.monotonic() + timeout
    while True:
        try:
            publish_confirmed(node, name, [body])
            return refused
        except (pika.exceptions.AMQPError, OSError):
            refused += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def leader_of(etcd: EtcdServer, cluster: str, name: str) -> str:
    record, _ = in_etcd(etcd, cluster, name)
    assert record is not None
    return record.node
