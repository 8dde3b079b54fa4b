"""One stream-protocol connection: the asyncio protocol, its handshake, dispatch and closing.

StreamSession reads frames (frames.FrameBuffer), walks the handshake (PeerProperties,
SaslHandshake, SaslAuthenticate, Tune, Open) with users, vhosts and permissions exactly as the
AMQP session checks them, then hands every command to its handler (the table `server.HANDLERS`
built from the handler modules: handshake, publishing, consuming, streams, cluster, tracking),
and writes what they answer in one socket write per loop turn (output.py: one writev, Deliver
data not copied). Errors are answered as RabbitMQ's stream reader answers them: before Open the
socket is closed; after it, a frame too large or an unknown command or version gets a Close
(code 14 or 13) and nothing after it is read. It reaches its server through the `Server`
Protocol below, never by importing the server module.

The only broad `except` of a stream connection sits in `data_received`: an unexpected error
closes this connection; the broker and other connections carry on.
Must not know: AMQP 0.9.1 framing. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from leveret.amqp import auth as wire_auth
from leveret.broker.access.auth import from_loopback
from leveret.broker.model.errors import AccessRefused
from leveret.broker.process import listen, logs
from leveret.broker.streamproto import certlogin, output
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f

if TYPE_CHECKING:
    from leveret.broker.access.auth import Permission, User
    from leveret.broker.broker import Broker
    from leveret.broker.streamproto.peers import Peers
    from leveret.broker.streamproto.publisher import Publisher
    from leveret.broker.streamproto.settings import Settings
    from leveret.broker.streamproto.subscription import Subscription

log = logs.get("leveret.stream_connection")
_ids = itertools.count(1)
Handler = Callable[["StreamSession", f.Decoder, int], None]


class Server(Protocol):
    """What a session and its handlers need of the listeners that accepted it
    (`server.StreamServer`): a Protocol, so that this module does not import the server that
    composes the handlers."""

    @property
    def broker(self) -> Broker: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def peers(self) -> Peers: ...

    @property
    def handlers(self) -> dict[int, Handler]: ...

    @property
    def pre_open(self) -> frozenset[int]: ...

    @property
    def sessions(self) -> set[StreamSession]: ...

    def advertised(self, session: StreamSession) -> tuple[str, int]: ...

    def forget(self, session: StreamSession) -> None: ...

    def stream_deleted(self, vhost: str, name: str) -> None: ...
_KEY = struct.Struct(">HH")
CLOSE_TIMEOUT_S = 3.0


class StreamSession(asyncio.Protocol):
    """One client of the stream protocol."""

    def __init__(self, server: Server, tls: bool = False) -> None:
        self.server = server
        self.broker: Broker = server.broker
        self.id = next(_ids)
        self.tls = tls
        self.buffer = f.FrameBuffer(k.INITIAL_FRAME_MAX)
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.step = "peer_properties"  # sasl, tune, open, opened, close_sent, closed
        self.client_properties: dict[str, str] = {}
        self.user: User | None = None
        self.username = ""
        self.vhost: Any = None
        self.permission: Permission | None = None
        self.frame_max = k.DEFAULT_FRAME_MAX
        self.heartbeat = k.DEFAULT_HEARTBEAT_S
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.deliver_version = 1
        self.consumer_updates: dict[int, int] = {}  # ConsumerUpdate correlation id -> sub id
        self.correlation = itertools.count(1)
        self._out: list[bytes | memoryview] = []
        self._writer: output.Writer | None = None
        self._flush_scheduled = False
        self._timers: list[asyncio.TimerHandle] = []
        self._unavailable: set[str] = set()
        self.last_received = self.last_sent = time.monotonic()
        self.connected_at = time.time()
        self.auth_mechanism = ""  # the SASL mechanism that logged in (management views)
        self.peer_cert: dict[str, Any] | None = None  # a TLS client certificate's items
        self._cert: dict[str, Any] | None = None  # as getpeercert() gives it
        self.bytes_received = self.bytes_sent = 0
        self.closed = False
        self.writable = True
        self.blocked = False  # a publisher during a resource alarm: its socket is not read
        self.loop = asyncio.get_event_loop()
        self.handlers = server.handlers

    @property
    def name(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]} (stream)"

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        self.peer = (listen.unmapped(peer[0]), peer[1]) if peer else ("", 0)
        if self.tls:  # a client certificate, verified when tls_verify_peer is set
            self._cert = transport.get_extra_info("peercert") or None
            self.peer_cert = certlogin.cert_info(self._cert)
        self.server.sessions.add(self)
        self._timers.append(self.loop.call_later(
            self.broker.config.handshake_timeout_s, self._handshake_timeout))

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        self.bytes_received += len(data)
        if self.step in ("closed", "failure"):
            return
        try:
            for raw in self.buffer.feed(data):
                if self.step in ("closed", "failure"):
                    return
                self._frame(raw)
        except f.FrameTooLarge as exc:
            log.warning("stream frame too large", connection=self.name, size=exc.size,
                        frame_max=exc.frame_max)
            self.fail_or_close(k.FRAME_TOO_LARGE, "frame too large")
        except Exception:
            log.exception("stream connection crashed", connection=self.name)
            self.fail_or_close(k.INTERNAL_ERROR, "internal error")
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.step = "closed"
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.server.forget(self)
        if self.user is not None and self.vhost is not None:
            log.info("stream connection closed", connection=self.name, user=self.username)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for sub in list(self.subscriptions.values()):
            sub.resume()

    # -- resource alarms ----------------------------------------------------------------------

    def block(self) -> None:
        """A publish during a resource alarm: stop reading this socket until it clears, as the
        AMQP session does (RabbitMQ's stream reader blocks publishers the same way)."""
        if not self.blocked and self.transport is not None:
            self.blocked = True
            self.transport.pause_reading()
            log.info("stream connection blocked", connection=self.name, reason=self.broker.alarm)

    def unblock(self) -> None:
        if self.blocked:
            self.blocked = False
            self.last_received = time.monotonic()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
            log.info("stream connection unblocked", connection=self.name)

    # -- output -------------------------------------------------------------------------------

    def send(self, data: bytes | memoryview) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def stream_unavailable(self, stream: str) -> None:
        """MetadataUpdate STREAM_NOT_AVAILABLE, once per stream and turn (a connection with
        publishers and subscribers of a deleted stream hears it once)."""
        if stream in self._unavailable:
            return
        self._unavailable.add(stream)
        self.send(f.frame(k.METADATA_UPDATE, 1, f.u16(k.STREAM_NOT_AVAILABLE)
                          + f.enc_string(stream)))

    def flush(self) -> None:
        self._flush_scheduled = False
        self._unavailable.clear()
        if not self._out:
            return
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            if self._writer is None or self._writer.transport is not self.transport:
                self._writer = output.Writer(self.transport, self.tls)
            self.bytes_sent += self._writer.write(out)
            self.last_sent = time.monotonic()

    # -- frames -------------------------------------------------------------------------------

    def _frame(self, raw: bytes) -> None:
        if len(raw) < 4:
            self.fail_or_close(k.UNKNOWN_FRAME, "unknown frame")
            return
        key, version = _KEY.unpack_from(raw, 0)
        decoder = f.Decoder(raw, 4)
        if self.step == "close_sent":
            if key == k.CLOSE | k.RESPONSE:
                self.abort()
            return
        handler = self.handlers.get(key)
        if handler is None or not self._version_ok(key, version):
            self.fail_or_close(k.UNKNOWN_FRAME, "unknown frame")
            return
        if self.step != "opened" and key not in self.server.pre_open:
            self.fail_or_close(k.UNKNOWN_FRAME, "unknown frame")
            return
        try:
            handler(self, decoder, version)
        except f.FrameError:
            self.fail_or_close(k.UNKNOWN_FRAME, "unknown frame")

    def _version_ok(self, key: int, version: int) -> bool:
        if key & k.RESPONSE:
            return True
        span = k.VERSIONS.get(key)
        return span is not None and span[0] <= version <= span[1]

    def fail_or_close(self, code: int, text: str) -> None:
        """RabbitMQ's answer to bad input: before Open the socket just closes; after it, a
        Close request goes out and nothing more is read."""
        if self.step != "opened":
            self.step = "failure"
            self.abort()
            return
        self.close(code, text)

    def close(self, code: int, text: str) -> None:
        """The server closes the connection (Close request, then wait for the answer)."""
        if self.step in ("close_sent", "closed"):
            return
        # correlation id 1, as RabbitMQ's reader sends its Close
        self.send(f.request(k.CLOSE, 1, f.u16(code) + f.enc_string(text)))
        self.step = "close_sent"
        self._release()
        self._timers.append(self.loop.call_later(CLOSE_TIMEOUT_S, self.abort))
        self.flush()

    def abort(self) -> None:
        """Close the socket without a Close frame, as RabbitMQ's stream reader closes it
        (after a failed login, and when the management API or leveret-streams closes the
        connection: no frame, FIN after what was already written). What is still to be
        written gets CLOSE_TIMEOUT_S; a client that does not read it by then does not keep
        the connection (and its listing) alive: the rest is dropped."""
        self.flush()
        self._release()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            self._timers.append(self.loop.call_later(CLOSE_TIMEOUT_S, self._drop))

    def _drop(self) -> None:
        if not self.closed and self.transport is not None:
            log.info("stream connection dropped: its client did not read what was left",
                     connection=self.name, buffered=self.transport.get_write_buffer_size())
            self.transport.abort()

    def _release(self) -> None:
        """Consumers and publishers go with the connection."""
        for sub in list(self.subscriptions.values()):
            sub.cancel()
        self.subscriptions.clear()
        self.publishers.clear()

    def force_close(self) -> None:
        """Broker shutdown."""
        if self.step == "opened":
            self.close(k.OK, "broker shutdown")  # RabbitMQ's shutdown close
        else:
            self.abort()

    # -- handshake helpers --------------------------------------------------------------------

    def mechanisms(self) -> tuple[str, ...]:
        """What SaslHandshake offers: EXTERNAL on TLS connections, as RabbitMQ offers it (and
        refuses it at SaslAuthenticate when no verified certificate came)."""
        return ("PLAIN", "AMQPLAIN", "EXTERNAL") if self.tls else ("PLAIN", "AMQPLAIN")

    def authenticate(self, mechanism: str, opaque: bytes) -> int:
        """SASL PLAIN, AMQPLAIN or EXTERNAL: the response code, and self.user set on success."""
        if mechanism == "EXTERNAL":
            try:
                username = certlogin.login_name(self._cert, self.broker.config.tls_verify_peer)
            except certlogin.Refused as refused:
                self.broker.login_failed()
                log.warning("stream login refused", connection=self.name, mechanism=mechanism,
                            reason=str(refused))
                return k.AUTHENTICATION_FAILURE
            user = self.broker.users.users.get(username)
        else:
            try:
                username, password = wire_auth.parse_response(mechanism, opaque)
            except wire_auth.BadCredentials:
                return k.SASL_ERROR
            user = self.broker.users.authenticate(username, password)
        self.username = username
        if user is None:
            self.broker.login_failed()
            log.warning("stream login refused", connection=self.name, user=username,
                        mechanism=mechanism)
            return k.AUTHENTICATION_FAILURE
        if username in self.broker.config.loopback_users and not self.loopback():
            log.warning("stream login refused: user can only connect via localhost",
                        connection=self.name, user=username)
            return k.SASL_AUTHENTICATION_FAILURE_LOOPBACK
        self.user = user
        self.auth_mechanism = mechanism
        return k.OK

    def open_vhost(self, name: str) -> int:
        assert self.user is not None
        vhost = self.broker.vhosts.get(name)
        permission = self.user.permissions.get(name)
        if vhost is None or permission is None:
            log.warning("stream vhost access refused", connection=self.name, vhost=name,
                        user=self.username)
            return k.VIRTUAL_HOST_ACCESS_FAILURE
        self.vhost = vhost
        self.permission = permission
        self.step = "opened"
        self.buffer.frame_max = self.frame_max
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self.heartbeat:
            self._timers.append(self.loop.call_later(self.heartbeat, self._heartbeat_tick))
        log.info("stream connection opened", connection=self.name, user=self.username,
                 vhost=name)
        return k.OK

    def check_permission(self, kind: str, resource_kind: str, name: str) -> None:
        assert self.permission is not None
        if not self.permission.allows(kind, name):
            raise AccessRefused(
                f"access to {resource_kind} '{name}' in vhost '{self.vhost.name}' refused for "
                f"user '{self.username}'")

    def allowed(self, kind: str, name: str) -> bool:
        return self.permission is not None and self.permission.allows(kind, name)

    def loopback(self) -> bool:
        return from_loopback(self.peer[0])

    # -- timers -------------------------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.step != "opened":
            log.info("stream handshake timeout", connection=self.name)
            self.abort()

    def _heartbeat_tick(self) -> None:
        now = time.monotonic()
        interval = self.heartbeat
        if self.blocked:  # we stopped reading: the client's heartbeats wait in the socket
            self.last_received = now
        if now - self.last_received > 2 * interval:
            log.warning("missed heartbeats from stream client", connection=self.name)
            if self.transport is not None:
                self.transport.abort()
            return
        if now - self.last_sent >= interval / 2:
            self.send(f.frame(k.HEARTBEAT, 1, b""))
        self._timers.append(self.loop.call_later(interval / 2, self._heartbeat_tick))
