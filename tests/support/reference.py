"""A reference RabbitMQ for differential tests.

In order: the URL in LEVERET_REFERENCE_URL; a testcontainers RabbitMQ when a Docker engine
answers; Debian's `rabbitmq-server` started on free ports in a temp folder; otherwise the
tests that need it are skipped, with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from support.ports import free_port

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
RABBITMQ_STREAMS = Path("/usr/lib/rabbitmq/bin/rabbitmq-streams")
INSTALLED_PLUGINS = next(iter(sorted(
    Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins"))), Path("/nonexistent"))


@dataclass
class Reference:
    url: str
    kind: str
    stop: Any = None
    version: str = ""
    ctl_env: dict[str, str] | None = None  # set for a local rabbitmq-server: rabbitmqctl works
    stream_port: int = 0  # the stream protocol's listener (start_stream_reference)
    management_port: int = 0  # the management HTTP API (start_stream_management_reference)
    restart_node: Callable[[], None] | None = None  # a local node: stop, start on its data

    def restart(self) -> None:
        """Stop the node and start it again with its data; skips the test when that is not
        possible."""
        import pytest

        if self.restart_node is None:
            pytest.skip(f"restarting needs the local reference node, not {self.kind}")
        self.restart_node()

    def ctl(self, *args: str) -> str:
        """Run rabbitmqctl against this node; skips the test when that is not possible."""
        return self._run(RABBITMQCTL, *args)

    def streams(self, *args: str) -> str:
        """Run rabbitmq-streams (the stream plugin's commands: add_super_stream...) against
        this node; skips the test when that is not possible."""
        return self._run(RABBITMQ_STREAMS, *args)

    def _run(self, tool: Path, *args: str) -> str:
        import pytest

        if self.ctl_env is None:
            pytest.skip(f"{tool.name} needs the local reference node, not {self.kind}")
        result = subprocess.run([str(tool), *args], env=self.ctl_env,
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{tool.name} {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout

    @property
    def port(self) -> int:
        return urlparse(self.url).port or 5672

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"


def _wait_amqp(port: int, timeout: float) -> None:
    import pika

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            conn = pika.BlockingConnection(
                pika.ConnectionParameters(
                    "127.0.0.1", port, connection_attempts=1, socket_timeout=2
                )
            )
            conn.close()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
            time.sleep(0.3)
    raise TimeoutError(f"RabbitMQ did not answer on port {port}: {last}")


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_container() -> Reference:
    from testcontainers.rabbitmq import RabbitMqContainer

    container = RabbitMqContainer("rabbitmq:3.10")
    container.start()
    port = int(container.get_exposed_port(5672))
    host = container.get_container_host_ip()
    return Reference(f"amqp://guest:guest@{host}:{port}/", "testcontainers", container.stop)


def _start_local(plugins: tuple[str, ...] = (), conf: str = "", advanced: str = "",
                 plugins_dir: Path | None = None) -> Reference:
    """`advanced`: the terms of advanced.config (e.g. `[{rabbit, [...]}].`); `plugins_dir`:
    one more folder of plugins, after the installed ones."""
    base = Path(tempfile.mkdtemp(prefix="leveret-rabbitmq-"))
    port, dist_port = free_port(), free_port()
    (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    (base / "rabbitmq.conf").write_text("loopback_users = none\n" + conf)
    if advanced:
        (base / "advanced.config").write_text(advanced + "\n")
    env = {
        **os.environ,
        "HOME": str(base),
        "RABBITMQ_NODENAME": f"leveret-ref-{os.getpid()}-{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
        "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
    }
    if plugins_dir is not None:
        env["RABBITMQ_PLUGINS_DIR"] = f"{INSTALLED_PLUGINS}:{plugins_dir}"
    procs = [_launch(env, base)]

    def halt() -> None:
        try:
            os.killpg(procs[-1].pid, signal.SIGTERM)
            procs[-1].wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(procs[-1].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop() -> None:
        """The node and its folder go: nothing of it is read again, so no clean shutdown
        (SIGTERM took RabbitMQ 5-9 s, at the end of every test session)."""
        try:
            os.killpg(procs[-1].pid, signal.SIGKILL)
            procs[-1].wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(base, ignore_errors=True)

    def restart() -> None:
        """Stop the node and start it again on the same ports and data."""
        halt()
        procs.append(_launch(env, base))
        _wait_started(port, base, stop)

    _wait_started(port, base, stop)
    return Reference(f"amqp://guest:guest@127.0.0.1:{port}/", "rabbitmq-server", stop,
                     ctl_env=env, restart_node=restart)


def _launch(env: dict[str, str], base: Path) -> subprocess.Popen[bytes]:
    log = open(base / "server.log", "ab")  # noqa: SIM115 - kept open for the child
    proc = subprocess.Popen(
        [str(RABBITMQ_SERVER)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc


def _wait_started(port: int, base: Path, stop: Callable[[], None]) -> None:
    try:
        _wait_amqp(port, 90)
    except TimeoutError:
        output = (base / "server.log").read_text(errors="replace")[-2000:]
        stop()
        raise RuntimeError(f"rabbitmq-server did not start:\n{output}") from None


def start_reference() -> Reference | str:
    """A running reference broker, or the reason there is none."""
    url = os.environ.get("LEVERET_REFERENCE_URL")
    if url:
        return Reference(url, "LEVERET_REFERENCE_URL")
    if _docker_available():
        return _start_container()
    if RABBITMQ_SERVER.exists():
        return _start_local()
    return (
        "no reference RabbitMQ: set LEVERET_REFERENCE_URL, start a Docker engine, or "
        "install Debian's rabbitmq-server (apt-get install rabbitmq-server)"
    )


def start_stream_reference() -> Reference | str:
    """A local rabbitmq-server with its stream plugin on a free port (stream_port), or the
    reason there is none."""
    if not RABBITMQ_SERVER.exists():
        return "no local rabbitmq-server for the stream protocol (apt-get install rabbitmq-server)"
    stream_port = free_port()
    reference = _start_local(("rabbitmq_stream",), f"stream.listeners.tcp.1 = {stream_port}\n"
                             "stream.advertised_host = localhost\n")
    reference.stream_port = stream_port
    return reference


def start_stream_management_reference(conf: str = "") -> Reference | str:
    """A local rabbitmq-server with its stream, management and stream management plugins
    (`/api/stream/...`) on free ports (stream_port, management_port), or the reason there is
    none; `conf`: more rabbitmq.conf lines."""
    if not RABBITMQ_SERVER.exists():
        return "no local rabbitmq-server (apt-get install rabbitmq-server)"
    stream_port, management_port = free_port(), free_port()
    reference = _start_local(("rabbitmq_stream", "rabbitmq_management",
                              "rabbitmq_stream_management"),
                             f"stream.listeners.tcp.1 = {stream_port}\n"
                             f"management.tcp.port = {management_port}\n"
                             "management.tcp.ip = 127.0.0.1\n" + conf)
    reference.stream_port = stream_port
    reference.management_port = management_port
    return reference


def start_consistent_hash_reference() -> Reference | str:
    """A local rabbitmq-server with its rabbitmq_consistent_hash_exchange plugin (the
    `x-consistent-hash` type) and rabbitmq_sharding (3.10's `x-modulus-hash`), or the reason
    there is none. Its worker pool has one process, so that a restart recovers bindings one
    after another, in order (with more, their recovery races; see docs/EXCHANGES.md)."""
    if not RABBITMQ_SERVER.exists():
        return "no local rabbitmq-server (apt-get install rabbitmq-server)"
    return _start_local(("rabbitmq_consistent_hash_exchange", "rabbitmq_sharding"),
                        advanced="[{rabbit, [{default_worker_pool_size, 1}]}].")


DELAYED_PLUGIN = "rabbitmq_delayed_message_exchange"
DELAYED_PLUGIN_VERSION = "3.10.2"
# the plugin's src/ folder (a checkout of rabbitmq/rabbitmq-delayed-message-exchange at tag
# 3.10.2): Debian's package has no such plugin, and its code is not part of this repository
DELAYED_PLUGIN_SOURCE = os.environ.get("LEVERET_DELAYED_PLUGIN_SRC", "")
ERLC = Path("/usr/bin/erlc")


def start_delayed_reference() -> Reference | str:
    """A local rabbitmq-server with the delayed-message plugin 3.10.2, compiled from the
    source LEVERET_DELAYED_PLUGIN_SRC names (Debian's package has no such plugin), or the
    reason there is none."""
    if not DELAYED_PLUGIN_SOURCE:
        return ("the delayed-message plugin is not in Debian's rabbitmq-server: set "
                "LEVERET_DELAYED_PLUGIN_SRC to the src/ folder of "
                "rabbitmq-delayed-message-exchange 3.10.2 to compile it")
    if not RABBITMQ_SERVER.exists() or not INSTALLED_PLUGINS.is_dir():
        return "no local rabbitmq-server (apt-get install rabbitmq-server)"
    if not ERLC.exists():
        return "no erlc to compile the delayed-message plugin (apt-get install erlang-dev)"
    deps = {name.split("-")[0]: INSTALLED_PLUGINS / name
            for name in os.listdir(INSTALLED_PLUGINS)
            if name.startswith(("rabbit_common-", "rabbit-"))}
    if set(deps) != {"rabbit_common", "rabbit"}:
        return "no rabbit and rabbit_common in the installed plugins to compile against"
    plugins = Path(tempfile.mkdtemp(prefix="leveret-delayed-plugin-"))
    ebin = plugins / f"{DELAYED_PLUGIN}-{DELAYED_PLUGIN_VERSION}" / "ebin"
    ebin.mkdir(parents=True)
    sources = sorted(Path(DELAYED_PLUGIN_SOURCE).glob("*.erl"))
    built = subprocess.run(
        [str(ERLC), "-I", str(deps["rabbit_common"] / "include"), "-I", str(INSTALLED_PLUGINS),
         "-pa", str(deps["rabbit_common"] / "ebin"), "-pa", str(deps["rabbit"] / "ebin"),
         "-o", str(ebin), *map(str, sources)], capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        shutil.rmtree(plugins, ignore_errors=True)
        return f"the delayed-message plugin did not compile: {built.stderr[-500:]}"
    modules = ",".join(f"'{source.stem}'" for source in sources)
    (ebin / f"{DELAYED_PLUGIN}.app").write_text(
        f"{{application, '{DELAYED_PLUGIN}', [\n"
        f"  {{description, \"RabbitMQ Delayed Message Exchange\"}},\n"
        f"  {{vsn, \"{DELAYED_PLUGIN_VERSION}\"}},\n"
        f"  {{modules, [{modules}]}},\n"
        "  {registered, [rabbit_delayed_message_sup]},\n"
        "  {applications, [kernel, stdlib, rabbit_common, rabbit]},\n"
        "  {mod, {rabbit_delayed_message_app, []}},\n"
        "  {env, []},\n"
        '  {broker_version_requirements, ["3.10.0"]}\n'
        "]}.\n")
    try:
        reference = _start_local((DELAYED_PLUGIN,), plugins_dir=plugins)
    except BaseException:
        shutil.rmtree(plugins, ignore_errors=True)
        raise
    stop = reference.stop

    def stop_and_remove() -> None:
        stop()
        shutil.rmtree(plugins, ignore_errors=True)

    reference.stop = stop_and_remove
    return reference


def running(start: Callable[[], Reference | str]) -> Iterator[Reference]:
    """A fixture's body: the reference `start` gives, stopped afterwards; skip without one."""
    import pytest

    ref = start()
    if isinstance(ref, str):
        pytest.skip(ref)
    yield ref
    if ref.stop is not None:
        ref.stop()
