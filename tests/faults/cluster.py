"""Three real `leveret serve` nodes, each in its own network namespace, and etcd on the bridge.

Role: start and restore the cluster a fault round runs on. etcd (Debian's etcd-server, through
support.etcd) runs in the root namespace and listens on the bridge's etcd address only; each
node runs inside its namespace (`ip netns exec`), listens on its own address (AMQP 5672,
management 15672, the node link 25672: the namespaces keep the ports apart), advertises it,
and reaches etcd over the bridge. Clients and this harness reach the nodes from the bridge's
client address, so a nemesis can cut a node from etcd and spare its clients.

Each node is a process group of its own (`setsid`): SIGSTOP, SIGCONT and SIGKILL go to the
group, so a node started with wire workers (LEVERET_WORKERS) pauses or dies whole.

The harness reads etcd itself (its JSON gateway, with urllib): who leads a stream, its members
and storage folder, which nodes hold a live record. It reads a node's management API for its
links and a stream's status. It never changes the cluster's state except by signals, restarts
and the nemeses' network cuts.

Threading: the test's thread; `leader_of` and `running` are also called from the workload's
monitor thread (each call is one HTTP request of its own).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults.net import Namespace, TestNet
from support.brokers import BrokerProcess
from support.etcd import EtcdServer
from support.ports import wait_for_port

from leveret.broker.cluster.topology_keys import TopologyKeys, escape, topology_root

SECRET = "fault-suite-secret"
AMQP_PORT, MANAGEMENT_PORT, LINK_PORT = 5672, 15672, 25672


def lease_ttl_s() -> int:
    """The nodes' etcd lease TTL: LEVERET_FAULT_LEASE_TTL_S, default 5 s (the broker's default
    is 10 s; 5 keeps a pause past the lease, and a restart after kill -9, short)."""
    return int(os.environ.get("LEVERET_FAULT_LEASE_TTL_S", "5"))


def _node_code() -> dict[str, str]:
    """LEVERET_FAULT_NODE_PYTHONPATH runs the nodes on another tree's code: a folder holding a
    `leveret` directory that links amqp, broker, cli, spark and storage (a tree's own
    `mypy-path`, e.g. of `git archive HEAD` unpacked somewhere) goes before the editable
    install. The harness and the checker keep this tree's code."""
    other = os.environ.get("LEVERET_FAULT_NODE_PYTHONPATH")
    return {"PYTHONPATH": other} if other else {}


class BridgeEtcd(EtcdServer):
    """support.etcd's server, with its client URL on a bridge address instead of loopback (its
    peer URL stays on loopback)."""

    def __init__(self, data_dir: Path, host: str) -> None:
        super().__init__(data_dir)
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.client_port}"


class FaultNode(BrokerProcess):
    """`leveret serve` inside a namespace, as a process group of its own."""

    def __init__(self, name: str, ns: Namespace, base: Path, etcd_url: str,
                 cluster: str) -> None:
        workers = os.environ.get("LEVERET_WORKERS", "1")  # CI sets it; alone, one process
        super().__init__(
            base / name / "data", port=AMQP_PORT, host=ns.ip, preexec=os.setsid,
            program=[*ns.exec_prefix(), sys.executable, "-m", "leveret.cli"],
            args=["--etcd", etcd_url, "--cluster-name", cluster, "--node-name", name,
                  "--cluster-port", str(LINK_PORT), "--advertise-host", ns.ip,
                  "--management-port", str(MANAGEMENT_PORT), "--workers", workers],
            env={"LEVERET_CLUSTER_SECRET": SECRET,
                 "LEVERET_CLUSTER_LEASE_TTL_S": str(lease_ttl_s()),
                 "LEVERET_LOOPBACK_USERS": "",  # guest from the bridge's client address
                 "LEVERET_LOG_LEVEL": "info", **_node_code()})
        self.name, self.ns = name, ns
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.paused = False

    @property
    def connect_host(self) -> str:
        return self.ns.ip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> FaultNode:
        super().start(timeout)
        wait_for_port(MANAGEMENT_PORT, timeout, self.ns.ip)
        return self

    def signal_group(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal_group(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """kill -9 of the whole node (the main process and any wire worker)."""
        if self.alive:
            assert self.proc is not None
            self.signal_group(signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> int:
        self.resume()
        try:
            return super().stop(timeout)
        except subprocess.TimeoutExpired:  # a node that will not stop is killed
            self.kill()
            return -9

    def api(self, path: str, timeout: float = 5.0) -> Any:
        """GET the management API of this node (JSON); OSError/ValueError when it cannot."""
        request = urllib.request.Request(f"http://{self.ns.ip}:{MANAGEMENT_PORT}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def links_up(self) -> int:
        """How many peers this node has a live link to (answering pings), or -1."""
        try:
            local = [n for n in self.api("/api/nodes") if "os_pid" in n]
        except (OSError, ValueError):
            return -1
        if len(local) != 1:
            return -1
        return sum(1 for link in local[0]["cluster_links"] if link["peer_version"])


class FaultCluster:
    """etcd on the bridge and one node per namespace of `net`, named n1, n2, ..."""

    def __init__(self, net: TestNet, base: Path, name: str) -> None:
        self.net, self.base, self.name = net, base, name
        self.etcd = BridgeEtcd(base / "etcd", net.etcd_ip)
        self.nodes: dict[str, FaultNode] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self.nodes)

    def start(self) -> FaultCluster:
        self.etcd.start()
        assert self.etcd.proc is not None
        self.net.remember_pid(self.etcd.proc.pid)
        for n, ns in enumerate(self.net.namespaces, start=1):
            node = FaultNode(f"n{n}", ns, self.base, self.etcd.url, self.name)
            self.nodes[node.name] = node
        for node in self.nodes.values():
            node.start()
        self.wait_healthy(90)
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.alive:
                node.stop()
        self.etcd.stop()

    # -- restoring between rounds ------------------------------------------------------

    def healthy(self) -> bool:
        """Every node alive, unpaused, live in etcd and linked to every other node."""
        if not all(n.alive and not n.paused for n in self.nodes.values()):
            return False
        if self.running() != set(self.nodes):
            return False
        return all(n.links_up() == len(self.nodes) - 1 for n in self.nodes.values())

    def wait_healthy(self, timeout: float) -> float:
        """Wait until healthy(); the seconds it took. AssertionError past `timeout`."""
        started = time.monotonic()
        wait_for(self.healthy, timeout,
                 lambda: "the cluster did not become healthy: " + self.describe())
        return time.monotonic() - started

    def restore(self, timeout: float = 90.0) -> float:
        """Undo every fault: heal the network, resume paused nodes, start dead ones; then wait
        until healthy. The seconds it took."""
        started = time.monotonic()
        self.net.heal_all()
        for node in self.nodes.values():
            if node.paused:
                node.resume()
        for node in self.nodes.values():
            if not node.alive:
                node.start()
        self.wait_healthy(max(1.0, timeout - (time.monotonic() - started)))
        return time.monotonic() - started

    def describe(self) -> str:
        parts = []
        for name, node in sorted(self.nodes.items()):
            state = "dead" if not node.alive else "paused" if node.paused else "up"
            parts.append(f"{name}={state}/links {node.links_up() if state == 'up' else '-'}")
        try:
            parts.append(f"running in etcd: {sorted(self.running())}")
        except OSError as exc:
            parts.append(f"etcd: {exc}")
        return ", ".join(parts)

    # -- etcd, read directly -----------------------------------------------------------

    def _range(self, key: bytes, prefix: bool = False) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"key": base64.b64encode(key).decode()}
        if prefix:
            end = key[:-1] + bytes([key[-1] + 1])
            body["range_end"] = base64.b64encode(end).decode()
        request = urllib.request.Request(self.etcd.url + "/v3/kv/range",
                                         data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=3) as response:
            kvs: list[dict[str, Any]] = json.loads(response.read()).get("kvs", [])
        return [json.loads(base64.b64decode(kv["value"])) for kv in kvs]

    def running(self) -> set[str]:
        """The nodes with a live record (lease) in etcd."""
        return {r["name"] for r in self._range(f"/leveret/{self.name}/nodes/".encode(), True)}

    def queue_record(self, stream: str) -> dict[str, Any] | None:
        key = TopologyKeys(topology_root(self.name)).queue("/", stream)
        found = self._range(key)
        return found[0] if found else None

    def leadership(self, stream: str) -> dict[str, Any] | None:
        """The stream's leadership key: members, leader, epoch."""
        found = self._range(f"/leveret/{self.name}/streams/{escape('/')}/{escape(stream)}"
                            .encode())
        return found[0] if found else None

    def leader_of(self, stream: str) -> str | None:
        """The stream's leader as its leadership key names it (None: no key, or etcd did not
        answer)."""
        try:
            found = self.leadership(stream)
        except (OSError, ValueError):
            return None
        return str(found["leader"]) if found else None

    def stream_dir(self, node: str, stream: str) -> Path:
        record = self.queue_record(stream)
        assert record is not None and record.get("storage_id"), f"no record for {stream}"
        return self.nodes[node].data_dir / "queues" / str(record["storage_id"])

    def stream_status(self, stream: str, via: str) -> dict[str, Any]:
        """stream_status through `via`'s management API (the leader answers for every member)."""
        data: dict[str, Any] = self.nodes[via].api(
            f"/api/leveret/streams/%2F/{stream}/status")
        return data


def wait_for(check: Callable[[], bool], timeout: float, what: str | Callable[[], str],
             interval: float = 0.1) -> None:
    """Poll `check` until it is true; AssertionError naming `what` past `timeout`. A check that
    raises OSError counts as false."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(interval)
