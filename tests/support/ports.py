"""Free TCP ports and waiting for a port to answer.

Ports come from below the kernel's ephemeral range: a port picked there by
binding to 0 can be taken a moment later as the local end of any outgoing
connection (etcd clients, node links), and a broker started on it then fails
with "already in use". Below the range only listeners compete."""

from __future__ import annotations

import os
import random
import socket
import time

_LOW, _HIGH = 20000, 32000
_next = _LOW + (os.getpid() * 7919 + random.randrange(_HIGH - _LOW)) % (_HIGH - _LOW)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range."""
    global _next
    high = min(_HIGH, _ephemeral_low())
    for _ in range(high - _LOW):
        port = _next
        _next = _LOW if _next + 1 >= high else _next + 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOW} and {high}")


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)
