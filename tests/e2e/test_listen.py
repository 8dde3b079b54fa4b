"""Where the listeners listen: by default `::` with IPV6_V6ONLY off, one socket for IPv4 and
IPv6 as RabbitMQ listens (a client that resolves localhost to ::1 first, as Node 17+ does, is
served), `0.0.0.0` where the host has no IPv6; `--host` picks one address.

The default-host tests run the real `leveret serve` with no --host (and no LEVERET_HOST), so
the embedded default is what is tested; AMQP, amqps and the management API all listen so.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from support.brokers import BrokerProcess, InProcessBroker
from support.ports import free_port, wait_for_port

from leveret.broker.process.config import Config
from leveret.broker.server import Server, ServerError


def has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(
    not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1 cannot be bound)"
)


def connect(host: str, port: int, **kwargs: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, connection_attempts=1, socket_timeout=5, **kwargs))


def round_trip(host: str, port: int, **kwargs: Any) -> None:
    """A full AMQP handshake to host, then a message through a queue and back."""
    conn = connect(host, port, **kwargs)
    try:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", queue, f"via {host}".encode())
        assert ch.basic_get(queue, auto_ack=True)[2] == f"via {host}".encode()
    finally:
        conn.close()


def assert_refused(host: str, port: int, management_port: int) -> None:
    for target in (port, management_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, target), timeout=5).close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(host, port)


def api(host: str, port: int, path: str) -> Any:
    """GET a management API path as guest through host."""
    netloc = f"[{host}]" if ":" in host else host
    request = urllib.request.Request(f"http://{netloc}:{port}{path}", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def listener_addresses(host: str, port: int) -> dict[str, str]:
    overview = api(host, port, "/api/overview")
    return {listener["protocol"]: listener["ip_address"] for listener in overview["listeners"]}


def served(tmp_path: Path, host: str | None) -> tuple[BrokerProcess, int]:
    """`leveret serve` with this --host (None: none) and the management API on a free port."""
    management_port = free_port()
    proc = BrokerProcess(tmp_path / "data", host=host,
                         args=["--management-port", str(management_port)]).start()
    wait_for_port(management_port, 30, proc.connect_host)
    return proc, management_port


@needs_ipv6
def test_the_default_host_serves_ipv4_and_ipv6(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEVERET_HOST", raising=False)
    proc, management_port = served(tmp_path, None)
    try:
        assert "--host" not in proc.command()
        for host in ("127.0.0.1", "::1", "localhost"):
            round_trip(host, proc.port)
        # both families at once, seen by the management API through both families; an IPv4
        # client is reported as 127.0.0.1, not as ::ffff:127.0.0.1, and IPv6 in brackets
        v4, v6 = connect("127.0.0.1", proc.port), connect("::1", proc.port)
        try:
            for host in ("127.0.0.1", "::1"):
                assert listener_addresses(host, management_port) == {"amqp": "::", "http": "::"}
                connections = api(host, management_port, "/api/connections")
                assert sorted((c["peer_host"], c["host"]) for c in connections) == [
                    ("127.0.0.1", "127.0.0.1"), ("::1", "::1")]
                names = sorted(c["name"] for c in connections)
                assert names[0].startswith("127.0.0.1:")
                assert names[0].endswith(f" -> 127.0.0.1:{proc.port}")
                assert names[1].startswith("[::1]:") and names[1].endswith(f" -> [::1]:{proc.port}")
        finally:
            v4.close()
            v6.close()
        events = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
        listening = [e for e in events if e.get("event") == "listening"]
        assert [e["host"] for e in listening] == ["::"]
    finally:
        assert proc.stop() == 0


@needs_ipv6
@pytest.mark.parametrize(("host", "other"), [("127.0.0.1", "::1"), ("::1", "127.0.0.1")])
def test_host_listens_on_that_address_only(tmp_path: Path, host: str, other: str) -> None:
    proc, management_port = served(tmp_path, host)
    try:
        round_trip(host, proc.port)
        assert listener_addresses(host, management_port) == {"amqp": host, "http": host}
        assert_refused(other, proc.port, management_port)
    finally:
        assert proc.stop() == 0


@needs_ipv6
def test_a_taken_ipv4_port_is_taken_for_the_dual_stack_listener(tmp_path: Path) -> None:
    """The default socket owns the port for IPv4 too, so an IPv4 listener on it conflicts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(Config(host="::", port=port, data_dir=tmp_path / "d", management_port=0))

        async def start() -> str:
            try:
                await server.start()
            except ServerError as exc:
                return str(exc)
            await server.stop()
            return ""

        message = asyncio.run(start())
    assert message == f"port {port} on :: is already in use; stop the other broker or pass --port"


def test_without_ipv6_the_default_falls_back_to_ipv4(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the host has no IPv6 (socket.has_ipv6 false), the default binds 0.0.0.0."""
    monkeypatch.setattr(socket, "has_ipv6", False)
    broker = InProcessBroker(tmp_path / "data", host="::", management_port=free_port()).start()
    try:
        assert broker.server.host == "0.0.0.0"
        round_trip("127.0.0.1", broker.port)
        assert listener_addresses("127.0.0.1", broker.config.management_port) == {
            "amqp": "0.0.0.0", "http": "0.0.0.0"}
        if has_ipv6_loopback():
            assert_refused("::1", broker.port, broker.config.management_port)
    finally:
        broker.stop()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost, 127.0.0.1 and ::1, made with openssl."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem",
         "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"],
        cwd=directory, check=True, capture_output=True)
    return directory / "cert.pem", directory / "key.pem"


@needs_ipv6
def test_the_tls_listener_is_dual_stack_too(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    broker = InProcessBroker(tmp_path / "data", host="::", tls_port=tls_port,
                             tls_certfile=cert, tls_keyfile=key).start()
    try:
        context = ssl.create_default_context(cafile=str(cert))
        for host in ("127.0.0.1", "::1"):
            round_trip(host, tls_port, ssl_options=pika.SSLOptions(context, "localhost"))
    finally:
        broker.stop()
