"""Listening sockets: IPv4 and IPv6 on one socket by default, as RabbitMQ listens.

The default host, `::`, means every address of both families: one socket
bound to `::` with IPV6_V6ONLY off, so IPv4 clients arrive as IPv4-mapped addresses
(`::ffff:127.0.0.1`) and a client that resolves `localhost` to `::1` first is served too.
Where the host has no IPv6 (`socket.has_ipv6` false, or binding `::` fails with EAFNOSUPPORT
or EADDRNOTAVAIL) it binds `0.0.0.0` instead. Any other host is one address, bound by name by
the caller (asyncio, aiohttp) as before. `unmapped` turns a peer's IPv4-mapped address back
into the IPv4 one, as RabbitMQ reports it, and `connection_name` names a connection as
RabbitMQ does. `tls_context` (the amqps listener's, which the stream protocol's TLS listener
shares), `ServerError` and `listen_error` serve every listener, so the stream protocol's server
finds them here rather than in `server`, which imports it.

It must not know the sessions or the model: sockets, TLS and the config only.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import ssl
from typing import Any

from leveret.broker.process import logs
from leveret.broker.process.config import Config

log = logs.get("leveret.server")

DUAL_STACK = "::"
NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)


def is_dual_stack(host: str) -> bool:
    return host == DUAL_STACK


def _bound(family: socket.AddressFamily, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def dual_stack_socket(port: int) -> socket.socket:
    """A bound, not yet listening socket on `::` for both families, or on `0.0.0.0` where the
    host has no IPv6. OSError (EADDRINUSE and the like) as bind raises it."""
    if socket.has_ipv6:
        try:
            return _bound(socket.AF_INET6, "::", port)
        except OSError as exc:
            if exc.errno not in NO_IPV6:
                raise
            log.info("no IPv6 on this host; listening on IPv4 only", port=port,
                     reason=exc.strerror)
    return _bound(socket.AF_INET, "0.0.0.0", port)


def socket_for(host: str, port: int) -> socket.socket | None:
    """The socket to listen on for the default host; None for any other host, which the
    caller binds by name."""
    return dual_stack_socket(port) if is_dual_stack(host) else None


def sockets_for(host: str, port: int) -> list[socket.socket]:
    """Bound, not yet listening sockets for any host: the dual-stack one for the default,
    else one per address the name resolves to (as asyncio's create_server binds them)."""
    sock = socket_for(host, port)
    if sock is not None:
        return [sock]
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, _type, _proto, _name, address in dict.fromkeys(infos):
            sockets.append(_bound(family, str(address[0]), port))
            port = port or sockets[0].getsockname()[1]  # port 0: every address on the same one
    except BaseException:
        for bound in sockets:
            bound.close()
        raise
    return sockets


def address_of(host: str, sock: socket.socket | None) -> str:
    """The address a listener reports: `::` for a dual-stack socket, `0.0.0.0` where it fell
    back, else the host it was given."""
    return str(sock.getsockname()[0]) if sock is not None else host


def unmapped(address: str) -> str:
    """`::ffff:127.0.0.1` -> `127.0.0.1`; any other address unchanged."""
    if not address.startswith("::ffff:"):
        return address
    try:
        mapped = ipaddress.IPv6Address(address).ipv4_mapped
    except ValueError:
        return address
    return str(mapped) if mapped is not None else address


def local_address(transport: Any) -> tuple[str, int]:
    """The local end of a connection's transport (unmapped), or ("", 0) without one."""
    sock = transport.get_extra_info("sockname") if transport is not None else None
    return (unmapped(sock[0]), sock[1]) if sock else ("", 0)


def connection_name(peer: tuple[str, int], transport: Any) -> str:
    """`peer:port -> local:port`, an IPv6 address in brackets, as RabbitMQ names a
    connection (the management API's name, for both protocols)."""
    host, port = local_address(transport)
    return f"{_bracketed(peer[0])}:{peer[1]} -> {_bracketed(host)}:{port}"


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def tls_context(config: Config) -> ssl.SSLContext:
    """The amqps listener's context: the certificate and key from the config, and client
    certificates verified against the CA file when tls_verify_peer is set."""
    if config.tls_certfile is None or config.tls_keyfile is None:
        raise ServerError("tls_port is set but tls_certfile or tls_keyfile is missing")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_certfile, config.tls_keyfile)
        if config.tls_cacertfile is not None:
            context.load_verify_locations(config.tls_cacertfile)
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(f"cannot load the TLS certificate or key: {exc}") from None
    if config.tls_verify_peer:
        if config.tls_cacertfile is None:
            raise ServerError("tls_verify_peer needs tls_cacertfile")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ServerError(Exception):
    """The broker cannot start; the message is one line for the operator."""


def listen_error(exc: OSError, host: str, port: int, flag: str) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use; stop the other broker or pass {flag}"
    return f"cannot listen on {host}:{port}: {exc.strerror}"
