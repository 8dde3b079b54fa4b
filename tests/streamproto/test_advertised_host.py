"""The host that Open and Metadata announce with no `--stream-advertised-host`
(broker/streamproto/advertise.py): `localhost` to a client over loopback when that name reaches
the listener at every address it names, else the address the client connected to. Clients
compare it with what they dialled: rstream publishes and consumes on the connection it opened
only when Metadata names that address, and opens (and closes) others when it does not.

RabbitMQ announces the host of its node name; the reference node is `...@localhost`, so it
announces `localhost`, and a client of `localhost` is told what it dialled on both brokers."""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support.brokers import BrokerProcess
from support.ports import free_port, wait_for_port
from support.reference import Reference

from leveret.broker.streamproto import advertise
from leveret.broker.streamproto.peers import ClusterPeers, OneNode
from leveret.broker.streamproto.server import StreamServer
from leveret.broker.streamproto.settings import Settings

from .conftest import LOOPBACK_NAME, StreamBroker, resolves
from .raw import RawStream, s


def metadata_leader(client: RawStream, stream: str) -> tuple[str, int]:
    """The leader's (host, port) in Metadata's answer for one existing stream."""
    client.request(0x0F, struct.pack(">i", 1) + s(stream))
    frame = client.next(0x800F)
    pos, brokers = 12, struct.unpack(">i", frame[8:12])[0]
    endpoints = []
    for _ in range(brokers):
        size = struct.unpack(">h", frame[pos + 2 : pos + 4])[0]
        host = frame[pos + 4 : pos + 4 + size].decode()
        endpoints.append((host, struct.unpack(">I", frame[pos + 4 + size : pos + 8 + size])[0]))
        pos += 8 + size
    pos += 4 + 2 + len(stream.encode())
    code, leader = struct.unpack(">HH", frame[pos : pos + 4])
    assert code == 1
    return endpoints[leader]


def announced(port: int, host: str) -> tuple[str, tuple[str, int]]:
    """Open's advertised host, and Metadata's leader of a new stream, for a client of `host`."""
    client = RawStream(port, host=host)
    try:
        assert client.handshake() == 1
        stream = f"adv-{uuid.uuid4().hex[:8]}"
        client.request(0x0D, s(stream) + struct.pack(">i", 0))
        assert client.response(0x0D)[1] == 1
        try:
            return client.open_properties["advertised_host"], metadata_leader(client, stream)
        finally:
            client.request(0x0E, s(stream))
            client.response(0x0E)
    finally:
        client.close()


@pytest.fixture(scope="module")
def dual_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`leveret serve` on its default host (every address, IPv4 and IPv6): `localhost` reaches
    it whatever it resolves to; guest may log in from any address. Its stream port."""
    port = free_port()
    process = BrokerProcess(tmp_path_factory.mktemp("dual") / "data", host=None,
                            args=["--stream-port", str(port)],
                            env={"LEVERET_LOOPBACK_USERS": ""}).start()
    wait_for_port(port, 30)
    yield port
    process.kill()


def test_a_loopback_client_is_told_localhost(lev: StreamBroker) -> None:
    """Dialled as 127.0.0.1 or as localhost, Open and Metadata say `localhost` (the test
    broker listens on 127.0.0.1: `localhost` is announced only where it resolves to that)."""
    for host in ("127.0.0.1", "localhost"):
        assert announced(lev.stream_port, host) == (LOOPBACK_NAME,
                                                    (LOOPBACK_NAME, lev.stream_port))


@pytest.mark.reference
@pytest.mark.parametrize("broker", ["leveret", "rabbitmq"])
def test_a_client_of_localhost_is_told_what_it_dialled(broker: str, dual_stack: int,
                                                       request: pytest.FixtureRequest) -> None:
    """The same on RabbitMQ 3.10.8 (node `...@localhost`, no advertised_host set)."""
    if broker == "rabbitmq":
        reference: Reference = request.getfixturevalue("stream_reference")
        port = reference.stream_port
    else:
        port = dual_stack
    assert announced(port, "localhost") == ("localhost", ("localhost", port))


def test_a_client_elsewhere_is_told_the_address_it_connected_to(dual_stack: int) -> None:
    """A connection that did not come over loopback is told the address it connected to
    (this machine's address on its first non-loopback interface), which the client reached
    without resolving a name; over IPv6 loopback, `localhost` again."""
    address = _outward_address()
    if address is None:
        pytest.skip("no non-loopback address on this machine")
    assert announced(dual_stack, address) == (address, (address, dual_stack))
    if "::1" in resolves("localhost") or _ipv6_loopback():
        assert announced(dual_stack, "::1")[0] == "localhost"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def _outward_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks a route
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_localhost_is_announced_only_where_it_reaches_the_listener() -> None:
    with socket.socket(socket.AF_INET) as v4:
        v4.bind(("127.0.0.1", 0))
        assert advertise.localhost_reaches([v4], ["127.0.0.1"])
        assert not advertise.localhost_reaches([v4], ["127.0.0.1", "::1"])  # not on ::1
        assert not advertise.localhost_reaches([v4], [])
    assert advertise.default_host("127.0.0.1", True) == "localhost"
    assert advertise.default_host("::ffff:127.0.0.1", True) == "localhost"
    assert advertise.default_host("127.0.0.1", False) == "127.0.0.1"
    assert advertise.default_host("::1", False) == "::1"
    assert advertise.default_host("192.0.2.7", True) == "192.0.2.7"
    if not _ipv6_loopback():
        return
    for v6only, both in ((0, True), (1, False)):
        with socket.socket(socket.AF_INET6) as any6:
            any6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
            any6.bind(("::", 0))
            assert advertise.localhost_reaches([any6], ["::1"])
            assert advertise.localhost_reaches([any6], ["127.0.0.1", "::1"]) is both


class _Transport:
    def __init__(self, sockname: tuple[str, int]) -> None:
        self.sockname = sockname

    def get_extra_info(self, name: str) -> object:
        return self.sockname if name == "sockname" else None


@pytest.mark.parametrize("peers, local, reaches, setting, expected", [
    (OneNode("n"), "::ffff:127.0.0.1", True, "", ("localhost", 5552)),
    (OneNode("n"), "127.0.0.1", False, "", ("127.0.0.1", 5552)),
    (OneNode("n"), "10.1.2.3", True, "", ("10.1.2.3", 5552)),
    (OneNode("n"), "127.0.0.1", True, "streams.example", ("streams.example", 5552)),
    # in a cluster every node announces this one at its advertise_host, itself included
    (ClusterPeers(cast(Any, None), "node-a.example"), "127.0.0.1", True, "",
     ("node-a.example", 5552)),
    (ClusterPeers(cast(Any, None), "node-a.example"), "10.1.2.3", True, "streams.example",
     ("streams.example", 5552)),
])
def test_what_open_and_metadata_announce(peers: Any, local: str, reaches: bool, setting: str,
                                         expected: tuple[str, int]) -> None:
    server = StreamServer(cast(Any, None), Settings(advertised_host=setting), peers)
    server.localhost_reaches[5552] = reaches
    session = SimpleNamespace(transport=_Transport((local, 5552)))
    assert server.advertised(cast(Any, session)) == expected
