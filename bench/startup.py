"""How the bench tools start what they measure, and the record every run keeps.

- `snapshot_leveret`: a copy of this checkout's Leveret sources, so that a long run measures
  one version of the code however the work tree changes meanwhile;
- `LeveretNode`: one `leveret serve` (from that copy, or the installed package) on a data
  directory of its own, which outlives its restarts;
- `free_port`, `wait_port`, `wait`: a port for a node, waiting for one to accept, and waiting
  for any condition, with a deadline;
- `start_run`: what every tool does first (stop cleanly on SIGTERM, raise the open-files limit,
  a temporary folder, the snapshot, the nodes' environment, the run's record: the machine, the
  command line, the sources' fingerprint), and `Run.header` and `Run.save`, the machine line of
  its report and its results file under bench/results/.

A cluster of Leveret nodes with etcd is bench/replicated.py's `LeveretCluster`, RabbitMQ is
tests/support's. Must not know: any scenario, or what a tool measures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load import raise_nofile
from loadgen.report import machine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LEVERET_PARTS = ("amqp", "broker", "storage", "cli", "spark")
FSYNC_ALWAYS = "LEVERET_QUEUE_FSYNC=always"  # as RabbitMQ's quorum queues and message store


def snapshot_leveret(dest: Path) -> str:
    """Copy this checkout's Leveret sources to dest/leveret/ and return their fingerprint.

    The broker children import the copy (PYTHONPATH=dest wins over an editable install's
    finder), so edits made to the work tree during a long run do not change what is measured,
    and every broker restart of one run (scenario f) runs the same code."""
    digest = hashlib.sha256()
    for part in LEVERET_PARTS:
        shutil.copytree(
            ROOT / part,
            dest / "leveret" / part,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        for path in sorted((dest / "leveret" / part).rglob("*.py")):
            digest.update(str(path.relative_to(dest)).encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float) -> None:
    """Until 127.0.0.1:port accepts a connection, or TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {port}") from None
            time.sleep(0.1)


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> None:
    """Until `check()` is true, or RuntimeError naming `what`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class LeveretNode:
    """`leveret serve` on 127.0.0.1 (a free AMQP port, no management port) with its data in
    base/data and its JSON log appended to base/leveret.log, across restarts."""

    def __init__(self, base: Path, snapshot: Path | None, env: dict[str, str],
                 extra: list[str]) -> None:
        self.base, self.extra = base, extra
        self.data = base / "data"
        self.port = free_port()
        self.env = {**os.environ, "LEVERET_LOG_FORMAT": "json", **env}
        if snapshot is not None:
            self.env["PYTHONPATH"] = os.pathsep.join([str(snapshot),
                                                      self.env.get("PYTHONPATH", "")])
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned = 0.0

    def spawn(self) -> None:
        log = open(self.base / "leveret.log", "ab")  # noqa: SIM115 - kept open for the child
        self.spawned = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leveret.cli", "serve", "--host", "127.0.0.1", "--port",
             str(self.port), "--data-dir", str(self.data), "--management-port", "0",
             *self.extra], cwd=self.base, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 300) -> float:
        """SIGTERM (SIGKILL after `timeout` s); the seconds it took to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return time.monotonic() - start

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return (self.base / "leveret.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


def stop_on_sigterm(*_: object) -> None:
    raise SystemExit(143)  # unwinds through main's finally: every broker is stopped


@dataclass
class Run:
    """A run of a bench tool: its temporary folder (removed by the tool), the snapshot of the
    sources its Leveret nodes run (None: the installed package), their environment, and the
    record its results file starts with."""

    tmp: Path
    snapshot: Path | None
    env: dict[str, str]
    info: dict[str, Any]

    def header(self, text: str) -> str:
        """The report's first line: the machine, then `text`."""
        m = self.info["machine"]
        return (f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}; "
                + text)

    def save(self, name: str, suffix: str = "", **data: Any) -> Path:
        """bench/results/<name>-<timestamp><suffix>.json: the record, when it finished, and
        `data`."""
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}{suffix}.json"
        self.info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write_text(json.dumps({**self.info, **data}, indent=1))
        return out


def start_run(args: argparse.Namespace, argv: list[str] | None, prefix: str,
              env: list[str]) -> Run:
    """SIGTERM stops the tool through its finally blocks, the open-files limit is raised (the
    nodes inherit it), and a fresh temporary folder holds the sources' snapshot unless
    --no-snapshot; `env` (NAME=VALUE) then --leveret-env make the nodes' environment."""
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    raise_nofile()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    snapshot = None if args.no_snapshot else tmp / "src"
    leveret_env = dict(kv.split("=", 1) for kv in [*env, *args.leveret_env])
    info: dict[str, Any] = {
        "machine": machine(ROOT), "argv": sys.argv[1:] if argv is None else argv,
        "args": dict(vars(args)), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "leveret_source": snapshot_leveret(snapshot) if snapshot else "work tree",
        "leveret_env": leveret_env,
    }
    return Run(tmp, snapshot, leveret_env, info)
