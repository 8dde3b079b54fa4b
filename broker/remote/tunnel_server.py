"""The holding node's end of a tunnel: a real `Session` whose socket is the node-to-node link.

Another node that has a client using a queue held here opens a tunnel (request `tunnel.open`
with its id and vhost) and speaks AMQP 0-9-1 to it in TUNNEL frames. This side serves it with
the ordinary `Session` and `Channel` classes, so every queue rule of this node (prefetch,
exclusive consumers, stream offsets, requeue and redelivery, the errors' codes and texts) holds
for a client of another node as for one of its own. The session is trusted: the link passed the
HMAC handshake and the other node has checked its client's permissions, so it skips the AMQP
handshake and gets full permissions on the vhost.

One difference from a client's channel: a publish on a tunnel channel does not route. The
other node routed it already; it declares (passively) the one queue the channel carries
publishes for, and each publish goes to that queue with its original exchange and routing key.

It knows the session and the link's tunnel frames; nothing of how the other node uses them.
Asyncio: one event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.amqp.content import Message
from leveret.amqp.handshake import State
from leveret.broker.cluster.link import Link
from leveret.broker.cluster.link_frames import TUNNEL_FROM_OPENER
from leveret.broker.process import logs
from leveret.broker.session.channel import Channel
from leveret.broker.session.connection import Session

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.model.vhost import VHost

log = logs.get("leveret.cluster.tunnel")
HIGH_WATER = 4 * 1024 * 1024  # bytes buffered on the link before the session stops delivering
LOW_WATER = 1024 * 1024
POLL_S = 0.002
FLUSH_EARLY_BYTES = 64 * 1024  # see TunnelSession


class TunnelChannel(Channel):
    enforces_timeouts = False  # the consumer's own node's channel times it out
    """A channel of a tunnel session: publishes go to the channel's declared queue."""

    def publish(self, exchange_name: str, routing_key: str, mandatory: bool, immediate: bool,
                header: bytes, body: bytes) -> None:
        confirm = self.confirms.track() if self.confirms is not None else None
        queue = self.vhost.queues.get(self.last_queue or "")
        if queue is not None and not queue.deleted:
            queue.publish(Message(exchange_name, routing_key, header, body), confirm)
        if confirm is not None:
            confirm.seal()


class TunnelTransport:
    """What the session writes to: TUNNEL frames on the link. Pauses the session's deliveries
    while the link holds more than HIGH_WATER unsent bytes."""

    def __init__(self, link: Link, tunnel_id: int, on_close: Callable[[], None]) -> None:
        self.link = link
        self.id = tunnel_id
        self.closing = False
        self.session: Session | None = None
        self._on_close = on_close
        self._polling = False

    def write(self, data: bytes) -> None:
        if self.closing or self.link.closed:
            return
        self.link.send_tunnel(self.id, data)
        if not self._polling and self.link.buffered_bytes > HIGH_WATER and self.session:
            self._polling = True
            self.session.pause_writing()
            self.session.loop.call_later(POLL_S, self._poll)

    def _poll(self) -> None:
        if self.closing or self.session is None:
            return
        if self.link.closed or self.link.buffered_bytes <= LOW_WATER:
            self._polling = False
            self.session.resume_writing()
        else:
            self.session.loop.call_later(POLL_S, self._poll)

    def is_closing(self) -> bool:
        return self.closing or self.link.closed

    def flush(self) -> None:
        """What was written goes to the link's socket now, not at the end of the turn."""
        if not self.closing:
            self.link.flush()

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if not self.link.closed:
            self.link.send_tunnel(self.id, b"")
        self._on_close()

    abort = close

    def get_extra_info(self, name: str, default: object = None) -> object:
        return (f"node:{self.link.peer_node}", self.id) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.link.buffered_bytes

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class TunnelSession(Session):
    """A trusted session for another node: opened at once, with full permissions. Its output
    leaves in pieces of FLUSH_EARLY_BYTES, so that the other node passes the first deliveries
    of a turn on to its client while this one makes the rest."""

    flush_early_bytes = FLUSH_EARLY_BYTES

    def flush_now(self) -> None:
        """As a client's session, and through the link too: the link also leaves at the end
        of the turn, and a process stopped in between (SIGSTOP past an election) would send a
        forwarded consumer, on waking, deliveries its successor has redelivered (issue 28)."""
        super().flush_now()
        if isinstance(self.transport, TunnelTransport):
            self.transport.flush()

    def on_channel_open(self, number: int) -> None:
        self.channels[number] = TunnelChannel(self, number)
        self.wire.channel_open_ok(number)


class TunnelServer:
    """The tunnels other nodes opened to this one, by (link, id)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions: dict[tuple[int, int], Session] = {}
        self._watched: set[int] = set()  # the links whose closing is followed

    async def open(self, link: Link, body: object) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("id"), int):
            raise ValueError("tunnel.open takes {id, vhost}")
        tunnel_id = int(body["id"]) & ~TUNNEL_FROM_OPENER
        vhost = self.broker.vhosts.get(str(body.get("vhost")))
        if vhost is None:
            raise LookupError(f"no vhost '{body.get('vhost')}'")
        key = (id(link), tunnel_id)
        old = self.sessions.pop(key, None)
        if old is not None:
            old.connection_lost(None)
        session = TunnelSession(self.broker)
        transport = TunnelTransport(link, tunnel_id, lambda: self._closed(key, session))
        transport.session = session
        session.connection_made(transport)  # type: ignore[arg-type]
        if session.closed:  # the connection limit refused it
            raise RuntimeError("connection limit reached")
        self._trust(session, vhost)
        self.sessions[key] = session
        if id(link) not in self._watched:
            self._watched.add(id(link))
            link.on_close(self._link_closed)
        return {"frame_max": session.frame_max}

    def _trust(self, session: Session, vhost: VHost) -> None:
        timer = session._handshake_timer
        if timer is not None:
            timer.cancel()
            session._handshake_timer = None
        session.username = "cluster"
        session.vhost = vhost
        session.limited_permissions = False
        session.capabilities = {"consumer_cancel_notify": True, "publisher_confirms": True}
        session.client_product = "leveret-node"
        wire = session.wire
        wire.state = State.OPEN
        wire.channel_max = 0  # one channel per remote consumer: the other node bounds them
        session.frame_max = self.broker.config.frame_max
        wire.buffer.set_frame_max(session.frame_max)

    def receive(self, link: Link, tunnel_id: int, data: bytes) -> None:
        session = self.sessions.get((id(link), tunnel_id))
        if session is None:
            return
        if not data:  # the other node closed the tunnel
            self._drop((id(link), tunnel_id))
            return
        session.data_received(data)

    def _closed(self, key: tuple[int, int], session: Session) -> None:
        if self.sessions.get(key) is session:
            del self.sessions[key]
        session.loop.call_soon(session.connection_lost, None)

    def _drop(self, key: tuple[int, int]) -> None:
        session = self.sessions.pop(key, None)
        if session is not None:
            transport = session.transport
            if isinstance(transport, TunnelTransport):
                transport.closing = True
            session.connection_lost(None)

    def _link_closed(self, link: Link) -> None:
        self._watched.discard(id(link))
        for key in [k for k in self.sessions if k[0] == id(link)]:
            self._drop(key)
