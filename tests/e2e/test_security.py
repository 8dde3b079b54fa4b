"""Who may do what: permissions per method, vhost access, guest on loopback, TLS, limits,
resource alarms, unsafe names, and a storm of failed logins."""

from __future__ import annotations

import ctypes
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pika
import pytest
from support.amqp import channel_error, connect, drain
from support.brokers import BrokerProcess, InProcessBroker
from support.ports import free_port

from leveret.broker.access.auth import Permission, check_password, hash_password
from leveret.broker.process.alarms import resident_memory_bytes, total_memory_bytes


def add_user(broker: InProcessBroker, name: str, password: str, vhost: str = "/",
             permission: Permission | None = None) -> None:
    def run() -> None:
        broker.broker.add_user(name, password)
        if permission is not None:
            broker.broker.set_permissions(name, vhost, permission)
    broker.call(run)


def as_user(broker: InProcessBroker, user: str, password: str, vhost: str = "/"):  # type: ignore[no-untyped-def]
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, password)))


def refused(kind: str, name: str, user: str) -> tuple[int, str]:
    return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user '{user}'"


def test_rabbitmq_password_hash_scheme() -> None:
    # A hash as RabbitMQ's rabbit_password_hashing_sha256 builds it: base64(salt + sha256(salt +
    # password)), here with the salt 0x908dc60a.
    salt = bytes.fromhex("908dc60a")
    known = hash_password("test12", salt)
    assert check_password("test12", known)
    assert not check_password("test13", known)
    assert not check_password("x", "not base64!")


@pytest.fixture
def limited(broker: InProcessBroker) -> InProcessBroker:
    """admin may do anything; 'app' may configure 'app-.*', write 'app-.*', read 'app-.*'."""
    broker.call(lambda: broker.broker.vhosts["/"].declare_exchange("other-x", "direct"))
    add_user(broker, "app", "secret", permission=Permission("^app-", "^app-", "^app-"))
    admin = connect(broker.port)
    ch = admin.channel()
    ch.queue_declare("other-q")
    ch.queue_declare("app-q")
    ch.exchange_declare("app-x", "direct")
    admin.close()
    return broker


@pytest.mark.parametrize(("action", "expected"), [
    (lambda ch: ch.queue_declare("other-new"), refused("queue", "other-new", "app")),
    (lambda ch: ch.exchange_declare("other-new", "fanout"),
     refused("exchange", "other-new", "app")),
    (lambda ch: ch.queue_delete("other-q"), refused("queue", "other-q", "app")),
    (lambda ch: ch.exchange_delete("other-x"), refused("exchange", "other-x", "app")),
    (lambda ch: ch.queue_purge("other-q"), refused("queue", "other-q", "app")),
    (lambda ch: ch.basic_get("other-q"), refused("queue", "other-q", "app")),
    (lambda ch: ch.basic_consume("other-q", lambda *a: None), refused("queue", "other-q", "app")),
    # bind needs write on the queue and read on the exchange
    (lambda ch: ch.queue_bind("other-q", "app-x", "k"), refused("queue", "other-q", "app")),
    (lambda ch: ch.queue_bind("app-q", "other-x", "k"), refused("exchange", "other-x", "app")),
    (lambda ch: ch.exchange_bind("app-x", "other-x", "k"), refused("exchange", "other-x", "app")),
])
def test_each_method_checks_its_permission(limited: InProcessBroker, action, expected) -> None:  # type: ignore[no-untyped-def]
    conn = as_user(limited, "app", "secret")
    assert channel_error(lambda: action(conn.channel())) == expected
    conn.close()


def test_publish_needs_write_on_the_exchange(limited: InProcessBroker) -> None:
    conn = as_user(limited, "app", "secret")
    ch = conn.channel()
    ch.basic_publish("other-x", "k", b"x")
    assert channel_error(lambda: ch.queue_declare("app-q", passive=True)) == refused(
        "exchange", "other-x", "app")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("app-x", "k", b"allowed")  # permitted; routes nowhere
    ch.queue_declare("app-mine")
    ch.queue_bind("app-mine", "app-x", "k")
    ch.basic_publish("app-x", "k", b"allowed")
    assert ch.basic_get("app-mine", auto_ack=True)[2] == b"allowed"
    conn.close()


def test_vhost_access(broker: InProcessBroker) -> None:
    add_user(broker, "nobody", "pw")  # no permissions anywhere
    # pika wraps a close during the handshake in ProbableAccessDeniedError, with the close.
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        as_user(broker, "nobody", "pw")
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'nobody'\"" in str(
        info.value)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        as_user(broker, "guest", "guest", vhost="missing")
    assert "(530) 'NOT_ALLOWED - vhost missing not found'" in str(info.value)


def test_bad_password_is_403(broker: InProcessBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        as_user(broker, "guest", "wrong")
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        info.value)


def test_guest_may_only_connect_from_loopback(tmp_path: Path) -> None:
    address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        addresses = [a for a in subprocess.run(["hostname", "-I"], capture_output=True,
                                               text=True).stdout.split() if "." in a]
        if not addresses:
            pytest.skip("this machine has no non-loopback IPv4 address")
        address = addresses[0]
    broker = InProcessBroker(tmp_path / "data")
    broker.config.host = "0.0.0.0"
    broker.start()
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            pika.BlockingConnection(pika.ConnectionParameters(address, broker.port))
        assert "ACCESS_REFUSED - Login was refused" in str(info.value)
        add_user(broker, "remote", "pw", permission=Permission())
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            address, broker.port, credentials=pika.PlainCredentials("remote", "pw")))
        conn.close()
    finally:
        broker.stop()


def test_login_failure_storm_leaves_the_broker_responsive(broker: InProcessBroker) -> None:
    """1,000 bad logins, 50 at a time over raw sockets; a good client works during and after."""
    from support.rawamqp import RawClient, plain

    failures = []

    def storm(count: int) -> None:
        for _ in range(count):
            with RawClient(broker.port) as client:
                client.begin()
                client.start_ok(plain("guest", "wrong"),
                                capabilities={"authentication_failure_close": True})
                failures.append(client.error()[0])

    threads = [threading.Thread(target=storm, args=(20,)) for _ in range(50)]
    for thread in threads:
        thread.start()
    good = connect(broker.port)
    good.channel().queue_declare("still-here")
    for thread in threads:
        thread.join(60)
    assert len(failures) == 1000
    assert all(code == 403 for code in failures)
    good.channel().queue_declare("still-here", passive=True)
    good.close()


def test_max_connections(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "data", max_connections=2).start()
    try:
        first, second = connect(broker.port), connect(broker.port)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            connect(broker.port, connection_attempts=1)
        first.close()
        drain(second, lambda: False, 0.2)
        third = connect(broker.port)
        third.close()
        second.close()
    finally:
        broker.stop()


def test_message_larger_than_the_limit(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "data", max_message_size_bytes=1000).start()
    try:
        conn = connect(broker.port)
        ch = conn.channel()
        ch.queue_declare("q")
        ch.basic_publish("", "q", b"x" * 1001)
        code, text = channel_error(lambda: ch.queue_declare("q", passive=True))
        assert (code, text) == (406, "PRECONDITION_FAILED - message size 1001 is larger than "
                                     "configured max size 1000")
        other = conn.channel()
        other.basic_publish("", "q", b"x" * 1000)
        assert other.queue_declare("q", passive=True).method.message_count == 1
        conn.close()
    finally:
        broker.stop()


def test_deeply_nested_tables_are_refused_without_harm(broker: InProcessBroker) -> None:
    import struct

    from support.rawamqp import RawClient, raw_frame

    table = struct.pack(">I", 0)
    for _ in range(5000):  # {"n": {"n": ... {}}} five thousand levels deep
        entry = b"\x01nF" + table
        table = struct.pack(">I", len(entry)) + entry
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x04deep" + b"\x00" + table
    with RawClient(broker.port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(raw_frame(1, 1, payload))
        code, text, class_id, method_id = client.error()
    assert (code, class_id, method_id) == (501, 50, 10)
    assert text.startswith("FRAME_ERROR - cannot decode")
    conn = connect(broker.port)
    conn.channel().queue_declare("after-deep")
    conn.close()


@pytest.mark.parametrize("name", ["../../etc/passwd", "CON", "nul:", "é" * 127, "a/b\\c"])
def test_names_never_become_paths(broker_process: BrokerProcess, name: str) -> None:
    stream = name.encode()[:250].decode("utf-8", "ignore") + "-s"
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True)
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    ch.basic_publish("", name, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    data = broker_process.data_dir
    for path in data.rglob("*"):
        assert path.resolve().is_relative_to(data.resolve())
        assert "etc" not in path.name and "CON" not in path.name
    broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    ch = conn.channel()
    assert ch.queue_declare(name, passive=True).method.message_count == 1
    ch.queue_declare(stream, passive=True)
    conn.close()


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for localhost and a client certificate, made with openssl."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=leveret-test-ca")
    for who, cn in (("server", "localhost"), ("client", "client")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out",
            f"{who}.csr", "-subj", f"/CN={cn}", "-addext", f"subjectAltName=DNS:{cn},IP:127.0.0.1")
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{who}.pem", "-days", "2", "-copy_extensions", "copy")
    return {name: directory / name for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.parametrize("verify_peer", [False, True])
def test_tls(tmp_path: Path, verify_peer: bool) -> None:
    certs = make_certificates(tmp_path)
    tls_port = free_port()
    broker = InProcessBroker(
        tmp_path / "data", tls_port=tls_port, tls_certfile=certs["server.pem"],
        tls_keyfile=certs["server.key"], tls_cacertfile=certs["ca.pem"],
        tls_verify_peer=verify_peer).start()
    try:
        context = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        if verify_peer:
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                pika.BlockingConnection(pika.ConnectionParameters(
                    "localhost", tls_port, ssl_options=pika.SSLOptions(context, "localhost"),
                    connection_attempts=1))
            context.load_cert_chain(certs["client.pem"], certs["client.key"])
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "localhost", tls_port, ssl_options=pika.SSLOptions(context, "localhost")))
        ch = conn.channel()
        ch.queue_declare("over-tls")
        ch.basic_publish("", "over-tls", b"secret")
        assert ch.basic_get("over-tls", auto_ack=True)[2] == b"secret"
        conn.close()
    finally:
        broker.stop()


def test_memory_freed_by_python_but_kept_by_glibc_sets_no_alarm(tmp_path: Path) -> None:
    """After a burst of 1 KB buffers (what a burst of messages leaves), glibc keeps the heap
    that Python freed. The alarm gives it back before it judges, so it counts what the broker
    holds, not what it once held."""
    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("no glibc malloc_trim on this system")
    broker = InProcessBroker(tmp_path / "data").start()
    try:
        def burst_then_sample() -> tuple[int, int, bool]:
            alarms = broker.broker.alarms
            burst = [bytes(1000) + os.urandom(24) for _ in range(300_000)]  # about 300 MB
            held_after = [bytearray(600) for _ in range(1000)]  # keeps the heap's top in use
            del burst
            resident = resident_memory_bytes(alarms.worker_pids())
            limit = resident - 150 * 1024 * 1024  # below what glibc kept, above what is held
            alarms.memory_high_watermark = limit / total_memory_bytes()
            alarms.sample()
            del held_after
            return resident, alarms.memory_limit_bytes, alarms.memory

        resident, limit, alarm = broker.call(burst_then_sample)
        assert resident > limit  # without giving the heap back, the alarm would go off
        assert alarm is False
        assert broker.call(lambda: broker.broker.alarm) is None
    finally:
        broker.stop()


def test_memory_alarm_blocks_publishers_and_lets_consumers_drain(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "data", vm_memory_high_watermark=0.0000001).start()
    try:
        assert broker.call(lambda: broker.broker.alarm) == "low on memory"
        consumer = connect(broker.port)
        cch = consumer.channel()
        cch.queue_declare("q")
        publisher = connect(broker.port)
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda c, m: events.append(m.method.reason))
        publisher.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
        pch = publisher.channel()
        pch.basic_publish("", "q", b"first")  # taken, then the connection is blocked
        drain(publisher, lambda: bool(events), 3)
        assert events == ["low on memory"]
        pch.basic_publish("", "q", b"held")  # not read while blocked
        drain(publisher, lambda: False, 0.3)
        assert cch.basic_get("q", auto_ack=True)[2] == b"first"  # consumers still drain
        assert cch.basic_get("q")[0] is None

        def clear() -> None:
            alarms = broker.broker.alarms
            alarms.memory_high_watermark = 1.0
            alarms.sample()

        broker.call(clear)
        drain(publisher, lambda: "unblocked" in events, 3)
        assert events == ["low on memory", "unblocked"]
        drain(consumer, lambda: False, 0.3)
        assert cch.basic_get("q", auto_ack=True)[2] == b"held"
        publisher.close()
        consumer.close()
    finally:
        broker.stop()
