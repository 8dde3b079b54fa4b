"""Bad input on the stream port gets RabbitMQ's answer on that connection only: before Open the
socket closes; after it, a Close with UNKNOWN_FRAME (13) or FRAME_TOO_LARGE (14). Commands'
own errors are response codes. Other connections keep working throughout."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from .conftest import StreamBroker, start_stream_broker
from .raw import RawStream, s, strmap

CLOSE = 0x16


def server_close(client: RawStream) -> tuple[int, str]:
    """The server's Close request: (code, reason); it is answered, then the socket closes."""
    frame = client.next(CLOSE)
    corr, code = struct.unpack(">IH", frame[4:10])
    size = struct.unpack(">h", frame[10:12])[0]
    reason = frame[12 : 12 + size].decode()
    client.send(CLOSE | 0x8000, 1, struct.pack(">IH", corr, 1))
    assert client.closed_by_server()
    return code, reason


def still_serves(lev: StreamBroker) -> None:
    client = lev.raw()
    client.request(0x0F, struct.pack(">i", 1) + s("no-such-stream"))  # metadata
    frame = client.next(0x0F | 0x8000)
    assert frame  # answered
    client.close()


def test_malformed_frame_after_open(lev: StreamBroker) -> None:
    client = lev.raw()
    client.request(0x0D, struct.pack(">h", 50) + b"abc")  # create, its name cut short
    assert server_close(client) == (13, "unknown frame")
    still_serves(lev)


def test_unknown_command_after_open(lev: StreamBroker) -> None:
    client = lev.raw()
    client.request(0x7F, b"")
    assert server_close(client) == (13, "unknown frame")
    still_serves(lev)


def test_unknown_version_after_open(lev: StreamBroker) -> None:
    client = lev.raw()
    client.request(0x0D, s("x") + struct.pack(">i", 0), version=9)
    assert server_close(client) == (13, "unknown frame")
    still_serves(lev)


def test_frame_too_large_before_open_closes_the_socket(lev: StreamBroker) -> None:
    client = RawStream(lev.stream_port)
    client.sock.sendall(struct.pack(">I", 9000) + b"\x00" * 100)  # over 8192 before Open
    assert client.closed_by_server()
    still_serves(lev)


def test_frame_too_large_after_tune(lev: StreamBroker) -> None:
    client = lev.raw()
    client.sock.sendall(struct.pack(">I", 2_000_000) + b"\x00\x0d\x00\x01")
    assert server_close(client) == (14, "frame too large")
    still_serves(lev)


def test_command_before_open_closes_the_socket(lev: StreamBroker) -> None:
    client = RawStream(lev.stream_port)
    client.request(0x0D, s("early") + struct.pack(">i", 0))
    assert client.closed_by_server()
    still_serves(lev)


def test_bad_password_and_vhost(lev: StreamBroker) -> None:
    client = RawStream(lev.stream_port)
    assert client.handshake(password="wrong") == 8
    assert client.closed_by_server()
    client = RawStream(lev.stream_port)
    assert client.handshake(vhost="no-such-vhost") == 12
    assert client.closed_by_server()
    client = RawStream(lev.stream_port)
    client.request(0x11, strmap({}))
    client.response(0x11)
    client.request(0x13, s("SCRAM") + struct.pack(">i", 0))
    assert client.response(0x13)[1] == 7
    still_serves(lev)


def test_publish_for_an_unknown_publisher(lev: StreamBroker) -> None:
    client = lev.raw()
    message = b"hello"
    client.send(0x02, 1, struct.pack(">Bi", 7, 2)
                + struct.pack(">QI", 11, len(message)) + message
                + struct.pack(">QI", 12, len(message)) + message)
    frame = client.next(0x04)
    pid, count = struct.unpack(">Bi", frame[4:9])
    errors = [struct.unpack(">QH", frame[9 + 10 * i : 19 + 10 * i]) for i in range(count)]
    assert (pid, errors) == (7, [(11, 18), (12, 18)])
    client.request(0x0F, struct.pack(">i", 0))  # the connection carries on
    assert client.next(0x0F | 0x8000)


@pytest.mark.parametrize(
    ("key", "body", "code"),
    [
        (0x0D, s("amq.reserved") + struct.pack(">i", 0), 17),  # create: a reserved name
        (0x0D, s("bad-args") + strmap({"initial-cluster-size": "0"}), 17),
        (0x0D, s("bad-args") + strmap({"max-length-bytes": "lots"}), 17),
        (0x0D, s("bad-args") + strmap({"stream-filter-size-bytes": "300"}), 17),
        (0x0E, s("no-such-stream"), 2),  # delete
        (0x01, struct.pack(">B", 1) + s("ref") + s("no-such-stream"), 2),  # declare publisher
        (0x06, struct.pack(">B", 99), 18),  # delete publisher
        (0x07, struct.pack(">B", 1) + s("no-such-stream") + struct.pack(">HH", 1, 10)
         + strmap({}), 2),  # subscribe
        (0x0C, struct.pack(">B", 42), 4),  # unsubscribe
        (0x0B, s("ref") + s("no-such-stream"), 2),  # query offset
        (0x05, s("ref") + s("no-such-stream"), 2),  # query publisher sequence
        (0x19, s("no-such-super-stream"), 2),  # partitions
        (0x18, s("key") + s("no-such-super-stream"), 2),  # route
        (0x1C, s("no-such-stream"), 2),  # stream stats
        (0x1E, s("no-such-super-stream"), 2),  # delete super stream
    ],
)
def test_response_codes(lev: StreamBroker, key: int, body: bytes, code: int) -> None:
    client = lev.raw()
    corr = client.request(key, body)
    assert client.response(key)[:2] == (corr, code)
    client.close()


def test_subscription_errors(lev: StreamBroker, name: str) -> None:
    client = lev.raw()
    client.request(0x0D, s(name) + struct.pack(">i", 0))
    assert client.response(0x0D)[1] == 1
    client.request(0x0D, s(name) + struct.pack(">i", 0))
    assert client.response(0x0D)[1] == 5  # already exists
    subscribe = struct.pack(">B", 3) + s(name) + struct.pack(">HH", 1, 1) + strmap({})
    client.request(0x07, subscribe)
    assert client.response(0x07)[1] == 1
    client.request(0x07, subscribe)
    assert client.response(0x07)[1] == 3  # the subscription id is taken
    sac = struct.pack(">B", 4) + s(name) + struct.pack(">HH", 1, 1) + strmap(
        {"single-active-consumer": "true"})
    client.request(0x07, sac)
    assert client.response(0x07)[1] == 17  # single active consumer needs a name
    client.send(0x09, 1, struct.pack(">BH", 77, 1))  # credit for no subscription
    frame = client.next(0x8009)
    assert struct.unpack(">HB", frame[4:7]) == (4, 77)
    client.request(0x0A, b"")  # StoreOffset has no response: here it is malformed
    assert server_close(client) == (13, "unknown frame")


def test_guest_may_only_log_in_from_loopback(tmp_path: Path) -> None:
    """RabbitMQ's loopback_users over the stream protocol: guest from another address gets
    SASL_AUTHENTICATION_FAILURE_LOOPBACK (0x0B) and the socket closes; from 127.0.0.1 it opens."""
    address = next((a for a in subprocess.run(["hostname", "-I"], capture_output=True,
                                              text=True).stdout.split()
                    if "." in a and not a.startswith("127.")), None)
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    broker = start_stream_broker(tmp_path / "data", "--host", "0.0.0.0")
    try:
        remote = RawStream(broker.stream_port, host=address)
        assert remote.handshake() == 0x0B
        assert remote.closed_by_server()
        local = RawStream(broker.stream_port)
        assert local.handshake() == 1
        local.close()
    finally:
        broker.process.kill()
