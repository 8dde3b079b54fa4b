"""Where the management API finds a broker's stream-protocol listener and its connections.

`register(broker, server)` is called once by `streamproto.server.start`; `server_of(broker)`
answers the StreamServer of that broker, or None when the stream protocol is off. A weak map,
so that a closed broker (tests start many in one process) takes its server with it.
Must not know: frames, the management API. Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.streamproto.server import StreamServer

_servers: WeakKeyDictionary[Broker, StreamServer] = WeakKeyDictionary()


def register(broker: Broker, server: StreamServer) -> None:
    _servers[broker] = server


def server_of(broker: Broker) -> StreamServer | None:
    return _servers.get(broker)
