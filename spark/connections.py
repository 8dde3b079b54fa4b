"""Connections kept per Python worker process, and reused by the tasks and batches it runs.

Spark reuses a Python worker process for task after task (spark.python.worker.reuse, on by
default), so the first task of a process opens the connection and the following ones, in
this micro-batch and the next, find it here. A connection is reused only while it is open,
has no close or EOF waiting in its socket, and has been idle for less than its heartbeat
interval (a broker drops a silent client after two); otherwise a new one replaces it. A task
that fails discards its connection, so that its retry starts on a clean one.

Process-wide state, used by one task at a time (a Python worker runs one task at a time).
"""

from __future__ import annotations

import time

from leveret.spark.endpoint import Endpoint
from leveret.spark.wire import Connection

_connections: dict[str, Connection] = {}


def checkout(uri: str) -> Connection:
    """An open connection to `uri`: the cached one when it is still good, else a new one."""
    conn = _connections.get(uri)
    if conn is not None:
        idle = time.monotonic() - max(conn.last_sent, conn.last_received)
        if (conn.heartbeat_s and idle > conn.heartbeat_s) or not conn.alive():
            discard(uri)
            conn = None
    if conn is None:
        conn = Connection(Endpoint.parse(uri))
        _connections[uri] = conn
    return conn


def discard(uri: str) -> None:
    """Forget (and close, without waiting long) the connection to `uri`."""
    conn = _connections.pop(uri, None)
    if conn is not None:
        conn.abort()


def close_all() -> None:
    for uri in list(_connections):
        conn = _connections.pop(uri)
        conn.close()
