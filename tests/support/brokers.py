"""Leveret brokers for tests: in-process (a thread with its own loop) and as a subprocess.

The in-process broker is fast to start and lets a test look at the broker's state; the
subprocess broker is the real `leveret serve`, for restarts, signals and `kill -9`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from support.ports import free_port, wait_for_port

from leveret.broker.process.config import Config
from leveret.broker.server import Server

T = TypeVar("T")


class InProcessBroker:
    """A Leveret server on a free port, running on an event loop in a background thread."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        overrides.setdefault("management_port", 0)
        overrides.setdefault("stream_port", 0)  # a test that wants it asks for a free port
        overrides.setdefault("host", "127.0.0.1")
        # the suite runs once as one process and once with wire workers (.ci/run); without
        # LEVERET_WORKERS, the default (one process per core), as `leveret serve`'s
        if "LEVERET_WORKERS" in os.environ:
            overrides.setdefault("workers", int(os.environ["LEVERET_WORKERS"]))
        self.config = Config(port=0, data_dir=data_dir, **overrides)
        self.loop = asyncio.new_event_loop()
        self.server = Server(self.config)
        self._thread = threading.Thread(target=self._run, name="leveret-broker", daemon=True)
        self._ready: Future[None] = Future()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        self.loop.run_forever()

    def start(self) -> InProcessBroker:
        self._thread.start()
        self._ready.result(timeout=30)
        return self

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def broker(self) -> Any:
        return self.server.broker

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the broker's loop thread and return its result."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


class BrokerProcess:
    """`leveret serve` as a child process, with its log in the data dir's parent."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
        program: list[str] | None = None,
        host: str | None = "127.0.0.1",
    ) -> None:
        self.data_dir = data_dir
        # the --host flag; None leaves it out, for the broker's default (dual-stack)
        self.host = host
        # how `leveret` is run: this interpreter's by default, or a `leveret` script from a venv
        self.program = program or [sys.executable, "-m", "leveret.cli"]
        self.port = port or free_port()
        self.args = args or []
        self.env = env or {}
        self.preexec = preexec  # run in the child before exec (resource limits)
        self.log_path = data_dir.parent / f"leveret-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect_host(self) -> str:
        """The loopback address that reaches the listener: ::1 for an IPv6 host, else
        127.0.0.1 (the default host serves both)."""
        if self.host is not None and self.host != "::" and ":" in self.host:
            return "::1"
        return "127.0.0.1"

    @property
    def url(self) -> str:
        host = self.connect_host
        return f"amqp://guest:guest@{f'[{host}]' if ':' in host else host}:{self.port}/"

    def command(self) -> list[str]:
        return [
            *self.program,
            "serve",
            *(["--host", self.host] if self.host is not None else []),
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--management-port",
            "0",
            "--stream-port",
            "0",
            *self.args,
        ]

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        env = {**os.environ, "LEVERET_LOG_FORMAT": "json", **self.env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=self.data_dir.parent, preexec_fn=self.preexec,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                wait_for_port(self.port, 0.5, self.connect_host)
                return self
            except TimeoutError:
                if self.proc.poll() is None and time.monotonic() < deadline:
                    continue
            self.kill()
            raise RuntimeError(f"leveret did not start; log:\n{self.log()}")

    def run_to_exit(self, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run `leveret serve` for a broker that is expected to refuse to start: its exit
        code and its stdout and stderr, separately. TimeoutExpired if it serves instead."""
        env = {**os.environ, "LEVERET_LOG_FORMAT": "json", **self.env}
        return subprocess.run(self.command(), capture_output=True, text=True, env=env,
                              cwd=self.data_dir.parent, timeout=timeout,
                              preexec_fn=self.preexec, check=False)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the crash every durability promise is tested against."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> BrokerProcess:
        return self.start()
