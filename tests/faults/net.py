"""A private test network: one network namespace per node, a Linux bridge, and nftables faults.

Role: build and tear down the network a fault round runs on, and cut it. `TestNet.create(3)`
claims a free /24 of 10.231.0.0/16 (the bridge's name `lvf<N>` is the claim: `ip link add`
fails for a second owner), makes the bridge in the root namespace with two addresses (`.1`, the
clients' source address, and `.2`, where etcd listens), and one namespace per node (`lvf<N>-n1`
...), each joined to the bridge by a veth pair and holding one address (`.11`, `.12`, ...).
An `unreachable` route for the /24 sits under the bridge's own route, so nothing aimed at the
subnet ever follows the default route off this machine, even while the bridge is being made or
removed. No namespace has a default route: a node reaches the bridge's addresses and its peers,
nothing else. `destroy()` removes all of it (and kills what still runs in the namespaces); a
run that died without cleaning up is swept by the next one (`sweep_stale`, keyed by the owner's
pid in /run/leveret-faults).

Faults: `Namespace.cut(drop_in=..., drop_out=...)` loads one nftables table
(`inet leveret_fault`) in the node's namespace that drops packets from and to the given
addresses; `heal()` deletes it. Drops, not rejects: a partition is silent, as a pulled cable is.

Must not know: brokers, etcd, AMQP. Threading: call from one thread (the test's); every
change is a subprocess (`ip`, `nft`) run to completion.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BASE = ipaddress.IPv4Network("10.231.0.0/16")
STATE_DIR = Path("/run/leveret-faults")
TABLE = "leveret_fault"


class NetError(RuntimeError):
    """A command that builds or changes the test network failed; the message has its stderr."""


def run(*argv: str, check: bool = True,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30,
                          check=False)
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why this machine cannot run the fault suite, or None when it can: root, `ip`, `nft`, and a
    namespace in which nftables loads a table (probed with a throw-away namespace)."""
    if os.geteuid() != 0:
        return "the fault suite needs root (network namespaces, veth pairs, nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            package = "nftables" if tool == "nft" else "iproute2"
            return f"`{tool}` is not installed: apt-get install {package}"
    probe = f"lvfprobe{os.getpid()}"
    try:
        run("ip", "netns", "add", probe)
    except NetError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        chain = "chain input { type filter hook input priority 0; }"
        table = f"table inet {TABLE} {{\n {chain}\n}}\n"
        run("ip", "netns", "exec", probe, "nft", "-f", "-", stdin=table)
    except NetError as exc:
        return f"nftables cannot load a table in a namespace: {exc}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Namespace:
    """One node's network namespace and its veth pair; `ip` is its one address."""

    name: str
    ip: str
    host_veth: str
    peer_veth: str

    def exec_prefix(self) -> list[str]:
        """Prepend to a command to run it inside this namespace (`ip netns exec` execs it, so
        the process started is the command itself, with its own pid)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self, drop_in: Iterable[str] = (), drop_out: Iterable[str] = ()) -> None:
        """Drop every packet arriving from `drop_in` and leaving for `drop_out` (addresses),
        replacing the previous cut of this namespace."""
        ins, outs = sorted(set(drop_in)), sorted(set(drop_out))
        rules = [f"table inet {TABLE} {{",
                 "  chain input { type filter hook input priority 0; policy accept;"]
        if ins:
            rules.append(f"    ip saddr {{ {', '.join(ins)} }} drop")
        rules += ["  }", "  chain output { type filter hook output priority 0; policy accept;"]
        if outs:
            rules.append(f"    ip daddr {{ {', '.join(outs)} }} drop")
        rules += ["  }", "}"]
        self.heal()
        run(*self.exec_prefix(), "nft", "-f", "-", stdin="\n".join(rules) + "\n")

    def heal(self) -> None:
        """Remove this namespace's cut, if any."""
        run(*self.exec_prefix(), "nft", "delete", "table", "inet", TABLE, check=False)

    def rules(self) -> str:
        """The namespace's nftables ruleset, as `nft list ruleset` prints it."""
        return run(*self.exec_prefix(), "nft", "list", "ruleset", check=False).stdout

    def pids(self) -> list[int]:
        out = run("ip", "netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]


@dataclass
class TestNet:
    """The bridge, its two root-side addresses and the node namespaces of one test run."""

    index: int
    subnet: ipaddress.IPv4Network
    namespaces: list[Namespace] = field(default_factory=list)

    __test__ = False  # not a pytest class, despite the name

    @property
    def bridge(self) -> str:
        return f"lvf{self.index}"

    @property
    def client_ip(self) -> str:
        """The root namespace's source address toward the nodes: clients and the harness."""
        return str(self.subnet.network_address + 1)

    @property
    def etcd_ip(self) -> str:
        """The root namespace's address etcd listens on: cutting it spares the clients."""
        return str(self.subnet.network_address + 2)

    @property
    def root_ips(self) -> tuple[str, str]:
        return self.client_ip, self.etcd_ip

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.index}.json"

    @classmethod
    def create(cls, nodes: int, rng: random.Random | None = None) -> TestNet:
        """Claim a free /24 and build the bridge and `nodes` namespaces on it."""
        sweep_stale()
        rng = rng or random.Random()
        used = _used_networks()
        candidates = list(range(1, 255))
        rng.shuffle(candidates)
        for index in candidates:
            subnet = ipaddress.IPv4Network(f"10.231.{index}.0/24")
            if any(subnet.overlaps(net) for net in used):
                continue
            net = cls(index, subnet)
            if run("ip", "link", "add", net.bridge, "type", "bridge", check=False).returncode:
                continue  # taken by a parallel run a moment ago
            try:
                net._record()
                net._build(nodes)
            except BaseException:
                net.destroy()
                raise
            return net
        raise NetError("no free /24 left in 10.231.0.0/16")

    def _record(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        owner = [os.getpid(), _start_time(os.getpid())]
        self.state_file.write_text(json.dumps({"owner": owner, "pids": []}))

    def remember_pid(self, pid: int) -> None:
        """A root-namespace process of this run (etcd), for the sweep of a run that died."""
        data = json.loads(self.state_file.read_text())
        data["pids"].append([pid, _start_time(pid)])
        self.state_file.write_text(json.dumps(data))

    def _build(self, nodes: int) -> None:
        prefix = self.subnet.prefixlen
        run("ip", "route", "replace", "unreachable", str(self.subnet), "metric", "4000")
        _no_ipv6(None, self.bridge)
        run("ip", "addr", "add", f"{self.client_ip}/{prefix}", "dev", self.bridge)
        run("ip", "addr", "add", f"{self.etcd_ip}/{prefix}", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for n in range(1, nodes + 1):
            ns = Namespace(f"lvf{self.index}-n{n}", str(self.subnet.network_address + 10 + n),
                           f"lvf{self.index}h{n}", f"lvf{self.index}p{n}")
            run("ip", "netns", "add", ns.name)
            self.namespaces.append(ns)
            run("ip", "link", "add", ns.host_veth, "type", "veth", "peer", "name", ns.peer_veth,
                "netns", ns.name)
            _no_ipv6(None, ns.host_veth)
            run("ip", "link", "set", ns.host_veth, "master", self.bridge, "up")
            inside = ns.exec_prefix()
            run(*inside, "ip", "link", "set", "lo", "up")
            _no_ipv6(ns.name, ns.peer_veth)
            run(*inside, "ip", "addr", "add", f"{ns.ip}/{prefix}", "dev", ns.peer_veth)
            run(*inside, "ip", "link", "set", ns.peer_veth, "up")

    def heal_all(self) -> None:
        for ns in self.namespaces:
            ns.heal()

    def destroy(self) -> None:
        """Kill what runs in the namespaces, delete them, the veths, the bridge and the route.
        Safe to call twice, and on a half-built network."""
        _teardown(self.index, [ns.name for ns in self.namespaces])
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()


def _no_ipv6(namespace: str | None, device: str) -> None:
    """IPv4 only on the test links: no router solicitations or other IPv6 chatter."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    run(*prefix, "sysctl", "-q", "-w", f"net.ipv6.conf.{device}.disable_ipv6=1", check=False)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network a route or an address of the root namespace already covers (the
    default route aside), so that a claimed /24 shadows nothing."""
    found: list[ipaddress.IPv4Network] = []
    routes = json.loads(run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst in ("default", "0.0.0.0/0"):
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.IPv4Network(dst, strict=False)
            if net.overlaps(BASE):
                found.append(net)
    return found


def _kill_namespace_processes(names: Sequence[str]) -> None:
    for name in names:
        out = run("ip", "netns", "pids", name, check=False).stdout
        for pid in (int(p) for p in out.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def _teardown(index: int, names: Sequence[str]) -> None:
    _kill_namespace_processes(names)
    for name in names:
        run("ip", "netns", "del", name, check=False)
    for n in range(1, 10):
        run("ip", "link", "del", f"lvf{index}h{n}", check=False)
    run("ip", "link", "del", f"lvf{index}", check=False)
    subnet = f"10.231.{index}.0/24"
    run("ip", "route", "del", "unreachable", subnet, "metric", "4000", check=False)


def sweep_stale() -> None:
    """Remove the networks (and kill the processes) of earlier runs whose owner is gone."""
    if not STATE_DIR.is_dir():
        return
    for state in STATE_DIR.glob("*.json"):
        try:
            data = json.loads(state.read_text())
            index, owner = int(state.stem), data["owner"]
        except (OSError, ValueError, KeyError):
            continue
        if _alive(owner):
            continue
        for pid in data.get("pids", []):
            if _alive(pid):  # the same process, not a later one that got its pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid[0]), signal.SIGKILL)
        listed = run("ip", "netns", "list", check=False).stdout.split("\n")
        names = [line.split()[0] for line in listed
                 if line.strip() and line.split()[0].startswith(f"lvf{index}-")]
        _teardown(index, names)
        with contextlib.suppress(FileNotFoundError):
            state.unlink()


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it is gone or a zombie): with
    the pid, it names one process, whatever later reuses the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return 0 if fields[0] in ("Z", "X") else int(fields[19])


def _alive(process: list[int]) -> bool:
    """Whether the process [pid, start time] still runs."""
    pid, started = int(process[0]), int(process[1])
    return started != 0 and _start_time(pid) == started
