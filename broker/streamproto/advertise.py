"""The host that Open (`advertised_host`) and Metadata announce for this node when the settings
name none (`stream_advertised_host`).

Clients compare it with what they dialled. rstream keeps one connection per (host, port) and
reuses it for a stream only when Metadata names the address it connected to; any other name
costs a connection of its own, and closing its locator then pauses 200 ms per stream (its first
publish to each of a super stream's partitions took 0.4 s more with `127.0.0.1` announced to a
client of `localhost`). Load-balancer modes (rstream's, the Java and Node clients' address
resolvers) compare Open's `advertised_host` with Metadata's leader. RabbitMQ announces the host
part of its node name (`rabbit@<host>`), which a client elsewhere must resolve, and which a
client on the node's machine rarely dialled: every client defaults to `localhost`, and
RabbitMQ's own CI for rstream sets `advertised_host = localhost` for that reason.

So, with no setting:
- a connection that came over loopback is told `localhost`, when every address `localhost`
  resolves to reaches the listener it came through (else its loopback address);
- any other connection is told the address it connected to, which the client reached without
  a name to resolve;
- in a cluster, the node's record decides (`peers.Peers.own_host`): every node announces each
  node, itself included, the same way, so Open and any node's Metadata agree.

Must not know: frames, sessions. `localhost_reaches` resolves a name: run it off the hot path
(once per listener, at start).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any, Protocol

from leveret.broker.process import listen

LOCALHOST = "localhost"


class Bound(Protocol):
    """A listening socket (asyncio's `TransportSocket` or a `socket.socket`)."""

    @property
    def family(self) -> int: ...

    def getsockname(self) -> Any: ...

    def getsockopt(self, level: int, option: int) -> int: ...


def default_host(local_address: str, localhost_reaches_listener: bool) -> str:
    """What a connection whose local end is `local_address` is told, with no setting and no
    cluster: `localhost` for a loopback connection when that name reaches its listener, else
    the address itself."""
    address = listen.unmapped(local_address)
    if localhost_reaches_listener and _is_loopback(address):
        return LOCALHOST
    return address


def localhost_reaches(listening: Iterable[Bound], addresses: Iterable[str]) -> bool:
    """Whether every one of `addresses` (what `localhost` resolves to) is served by one of a
    listener's bound sockets (all on one port)."""
    wanted = [listen.unmapped(a) for a in addresses]
    sockets = list(listening)
    return bool(wanted) and all(any(_serves(s, a) for s in sockets) for a in wanted)


def _serves(sock: Bound, address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
        bound = ipaddress.ip_address(listen.unmapped(str(sock.getsockname()[0]).split("%")[0]))
    except (ValueError, OSError):
        return False
    if sock.family == socket.AF_INET6 and bound == ipaddress.IPv6Address("::"):
        return ip.version == 6 or not _v6only(sock)  # a dual-stack socket takes IPv4 too
    if sock.family == socket.AF_INET and bound == ipaddress.IPv4Address("0.0.0.0"):
        return ip.version == 4
    return ip == bound


def _v6only(sock: Bound) -> bool:
    try:
        return bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
    except OSError:
        return True


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False
