"""A reference RabbitMQ cluster on this machine: three Debian `rabbitmq-server` nodes, joined.

`start_reference_cluster(n)` starts n nodes as tests/support/reference.py starts one (the same
environment variables, config file and wait for AMQP), each with its own node name
(`rabbit1-<pid>@localhost`, ...), AMQP and distribution ports and data folders in one temp
folder, and the same Erlang cookie (`$HOME/.erlang.cookie`, HOME being that folder for every
node and for rabbitmqctl). Management and the stream plugin are off. Nodes 2..n then join the
first: `rabbitmqctl -n rabbitN@localhost stop_app`, `join_cluster rabbit1@localhost`,
`start_app` (/work/shared/reference/cluster-and-stream-protocol.md, section 4).

It returns a `ReferenceCluster` (AMQP ports, pids, `ctl`, `kill`, `stop`) or the reason there
is none. It knows nothing of Leveret; the benchmarks use it (bench/replicated.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from support.ports import free_port
from support.reference import RABBITMQ_SERVER, RABBITMQCTL, _wait_amqp


@dataclass
class RabbitNode:
    name: str  # rabbitN-<pid>@localhost
    port: int  # AMQP
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class ReferenceCluster:
    base: Path
    nodes: list[RabbitNode] = field(default_factory=list)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self.nodes if node.alive]

    def ctl(self, node: RabbitNode, *args: str, timeout: float = 120) -> str:
        """rabbitmqctl -n NODE ARGS..., or RuntimeError with its output."""
        result = subprocess.run([str(RABBITMQCTL), "-n", node.name, *args], env=node.env,
                                capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {node.name} {' '.join(args)}: "
                               f"{(result.stderr or result.stdout).strip()[-800:]}")
        return result.stdout

    def kill(self, node: RabbitNode) -> None:
        if node.proc is not None and node.proc.poll() is None:
            try:
                os.killpg(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.proc.wait(10)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                try:
                    os.killpg(node.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(node)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, node: RabbitNode, chars: int = 1500) -> str:
        path = Path(node.env["HOME"]) / f"{node.name.split('@')[0]}.log"
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def _node(base: Path, index: int) -> RabbitNode:
    short = f"rabbit{index}-{os.getpid()}"
    folder = base / short
    folder.mkdir()
    port, dist_port = free_port(), free_port()
    (folder / "enabled_plugins").write_text("[].\n")
    (folder / "rabbitmq.conf").write_text("loopback_users = none\n")
    env = {
        **os.environ,
        "HOME": str(base),  # the shared .erlang.cookie
        "RABBITMQ_NODENAME": f"{short}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(folder / "log"),
        "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(folder / "rabbitmq.pid"),
        "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
    }
    return RabbitNode(f"{short}@localhost", port, env)


def _spawn(node: RabbitNode) -> None:
    log = open(Path(node.env["HOME"]) / f"{node.name.split('@')[0]}.log", "ab")  # noqa: SIM115
    node.proc = subprocess.Popen([str(RABBITMQ_SERVER)], env=node.env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    log.close()


def start_reference_cluster(size: int = 3, timeout: float = 120) -> ReferenceCluster | str:
    """`size` joined rabbitmq-server nodes, or the reason there are none."""
    if not RABBITMQ_SERVER.exists():
        return "no local rabbitmq-server for a reference cluster (apt-get install rabbitmq-server)"
    base = Path(tempfile.mkdtemp(prefix="leveret-rabbit-cluster-"))
    cookie = base / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(16).upper())
    cookie.chmod(0o400)
    cluster = ReferenceCluster(base, [_node(base, i) for i in range(1, size + 1)])
    try:
        for node in cluster.nodes:
            _spawn(node)
        for node in cluster.nodes:
            try:
                _wait_amqp(node.port, timeout)
            except TimeoutError:
                raise RuntimeError(f"rabbitmq-server {node.name} did not start:\n"
                                   f"{cluster.log_tail(node)}") from None
        first = cluster.nodes[0]
        for node in cluster.nodes[1:]:
            cluster.ctl(node, "stop_app")
            cluster.ctl(node, "join_cluster", first.name)
            cluster.ctl(node, "start_app")
            _wait_amqp(node.port, timeout)
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        cluster.stop()
        return f"the reference cluster did not form: {exc}"
    return cluster
