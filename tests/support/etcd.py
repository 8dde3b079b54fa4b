"""A real one-member etcd for tests: Debian's etcd-server on free loopback ports, in a temp dir.

`EtcdServer(data_dir).start()` runs `etcd --unsafe-no-fsync` and waits until its /health says
true; `pause()`/`resume()` (SIGSTOP/SIGCONT), `kill()` and `restart()` (same ports, same data) are
there for fault tests, and `stop()` ends it. `etcd_binary()` says where etcd is, or None (the
fixtures then skip).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from support.ports import free_port

SKIP_REASON = ("etcd is not installed: install Debian's etcd-server "
               "(apt-get install etcd-server), or set ETCD_BINARY")


def etcd_binary() -> str | None:
    """$ETCD_BINARY, /usr/bin/etcd, or etcd on the PATH."""
    for candidate in (os.environ.get("ETCD_BINARY"), "/usr/bin/etcd", shutil.which("etcd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class EtcdServer:
    def __init__(self, data_dir: Path, name: str = "default") -> None:
        self.data_dir = data_dir
        self.name = name
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "etcd.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 30.0) -> EtcdServer:
        """Start etcd (retrying on fresh ports if one was taken meanwhile) and wait for it."""
        for _attempt in range(3):
            self._spawn()
            if self._wait_healthy(timeout):
                return self
            self.kill()
        raise RuntimeError(f"etcd did not start; its log:\n{self.log_tail()}")

    def restart(self, timeout: float = 30.0) -> EtcdServer:
        """Stop etcd and start it again on the same ports with the same data."""
        self.stop()
        self._spawn(same_ports=True)
        if not self._wait_healthy(timeout):
            raise RuntimeError(f"etcd did not restart; its log:\n{self.log_tail()}")
        return self

    def _spawn(self, same_ports: bool = False) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError(SKIP_REASON)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not same_ports:
            self.client_port, self.peer_port = free_port(), free_port()
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            binary, "--name", self.name, "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}", "--initial-cluster-state", "new",
            "--unsafe-no-fsync", "--log-level", "warn",
        ]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()

    def _wait_healthy(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.05)
        return False

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def pause(self) -> None:
        """SIGSTOP: etcd keeps its sockets (connects succeed) but answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, for crash tests (and the last resort of stop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused etcd cannot handle SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
