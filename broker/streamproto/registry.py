"""Where the management API finds a broker's stream-protocol listener and its connections.

`register(broker, server)` is called once by `streamproto.server.start`; `server_of(broker)`
answers the StreamServer of that broker (seen as `Listeners`), or None when the stream protocol
is off. A weak map, so that a closed broker (tests start many in one process) takes its server
with it.
Must not know: frames, the management API. Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.streamproto.session import StreamSession


class Listeners(Protocol):
    """What the management API reads of a `server.StreamServer`: a Protocol, so that this
    module (which the management API imports) does not import the server."""

    @property
    def port(self) -> int: ...  # as bound (0: no plain listener)

    @property
    def tls_port(self) -> int: ...

    @property
    def sessions(self) -> set[StreamSession]: ...


_servers: WeakKeyDictionary[Broker, Listeners] = WeakKeyDictionary()


def register(broker: Broker, server: Listeners) -> None:
    _servers[broker] = server


def server_of(broker: Broker) -> Listeners | None:
    return _servers.get(broker)
