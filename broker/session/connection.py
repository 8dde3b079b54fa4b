"""One client connection: the asyncio protocol that feeds the wire machine and runs channels.

Session reads bytes into the WireConnection, answers the handshake (authentication, vhost,
permissions), opens and closes Channels, buffers outbound frames into one socket write per
loop turn, keeps heartbeats, and follows the transport's flow control (a paused transport
stops deliveries; a resource alarm stops reading from publishers).

The only broad `except` of a connection sits in `_take`, under `data_received` and
`split_received`: an unexpected error closes this connection with 541 and is logged; the
broker and other connections carry on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from pamqp import commands
from pamqp.base import Frame

from leveret.amqp import auth as wire_auth
from leveret.amqp import constants as c
from leveret.amqp.connection import WireConnection
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import HEARTBEAT_FRAME
from leveret.amqp.handshake import BadProtocolHeader, State
from leveret.broker.access.auth import from_loopback
from leveret.broker.model.errors import AccessRefused, BrokerError
from leveret.broker.process import listen, logs
from leveret.broker.session import backlog
from leveret.broker.session.channel import Channel
from leveret.broker.session.errors import to_amqp

if TYPE_CHECKING:
    from leveret.broker.access.auth import Permission, User, Users
    from leveret.broker.model.vhost import VHost
    from leveret.broker.process.config import Config
    from leveret.broker.topology.port import TopologyPort

log = logs.get("leveret.connection")
_ids = itertools.count(1)
FLUSH_EARLY_BYTES = 1 << 20  # unwritten output that is written at once, mid-turn
DRAIN_TIMEOUT_S = 5.0  # how long a closing socket may take to send what is buffered
CLOSING_TIMEOUT_S = 30  # the longest a client that closed may keep its socket (rabbit_reader's)


def _discard(_data: bytes) -> None:
    """What a closed connection's wire machine writes to."""


class _Detached:
    """What a closed connection's wire machine calls: nothing happens any more."""

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *_args: None


class Host(Protocol):
    """What a connection needs of the broker that accepted it (`broker.Broker`): a Protocol,
    so that this module does not import the broker, which imports it."""

    channels_opened_total: int

    @property
    def config(self) -> Config: ...

    @property
    def users(self) -> Users: ...

    @property
    def vhosts(self) -> Mapping[str, VHost]: ...

    @property
    def alarm(self) -> str | None: ...

    @property
    def topology(self) -> TopologyPort: ...

    def server_properties(self) -> dict[str, Any]: ...

    def too_many_connections(self) -> bool: ...

    def connection_opened(self, session: Session) -> None: ...

    def connection_closed(self, session: Session) -> None: ...

    def login_failed(self) -> None: ...

    def cluster_key(self, session: Session) -> str: ...


class Session(asyncio.Protocol):
    flush_early_bytes = FLUSH_EARLY_BYTES  # a tunnel's session leaves sooner (tunnel_server)

    def __init__(self, broker: Host, tls: bool = False) -> None:
        self.broker = broker
        self.id = next(_ids)
        self.tls = tls
        cfg = broker.config
        self.wire = WireConnection(
            self,
            self.write,
            server_properties=broker.server_properties(),
            frame_max=cfg.frame_max,
            channel_max=cfg.channel_max,
            heartbeat=cfg.heartbeat_s,
            max_message_size=cfg.max_message_size_bytes,
        )
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.channels: dict[int, Channel] = {}
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0  # of what write_many added to _out
        self._flush_scheduled = False
        self._after_turn: list[Callable[[], None]] = []
        self.writable = True
        self.user: User | None = None
        self.username = ""
        self.vhost: Any = None
        self.permission: Permission | None = None
        self.limited_permissions = True
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.client_product = ""
        self.frame_max = cfg.frame_max
        self.heartbeat = 0
        self.connected_at = time.time()
        self.last_received = time.monotonic()
        self.last_sent = time.monotonic()
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._peer_closed = False  # the client sent connection.close, once open
        self.blocked = False
        self.closed = False
        self.bytes_received = 0
        self.bytes_sent = 0
        self.loop = asyncio.get_event_loop()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport, though not always an asyncio.Transport subclass (uvloop's are not).
        self.transport = transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        # an IPv4 client of the dual-stack listener is `::ffff:a.b.c.d`; RabbitMQ shows a.b.c.d
        self.peer = (listen.unmapped(peer[0]), peer[1]) if peer else ("", 0)
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        if self.broker.too_many_connections():
            log.warning("connection refused: connection limit reached", connection=self.name,
                        limit=self.broker.config.max_connections)
            transport.close()
            self.closed = True
            return
        self.broker.connection_opened(self)
        self._handshake_timer = self.loop.call_later(
            self.broker.config.handshake_timeout_s, self._handshake_timeout
        )

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        self.bytes_received += len(data)
        self._take(self.wire.receive, data)

    def split_received(self, items: list[Any], size: int) -> None:
        """What a wire worker received and split into frames and publishes (`size` bytes on
        the wire): as data_received, through the wire machine's receive_split."""
        self.last_received = time.monotonic()
        self.bytes_received += size
        self._take(self.wire.receive_split, items)

    def _take(self, feed: Callable[[Any], None], received: Any) -> None:
        """Hand what the client sent to the wire machine; its errors close this connection."""
        try:
            feed(received)
        except BadProtocolHeader as bad:
            self._write_now(bad.reply)
            self.abort()
        except AMQPError as error:
            self.close_with(error)
        except Exception:
            log.exception("connection crashed", connection=self.name)
            self.close_with(AMQPError(c.INTERNAL_ERROR, "internal error"))

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self.closed:
            return
        self.closed = True
        for timer in (self._heartbeat_timer, self._handshake_timer, self._close_timer,
                      self._drain_timer):
            if timer is not None:
                timer.cancel()
        for channel in list(self.channels.values()):
            channel.close()
        self.channels.clear()
        self.broker.connection_closed(self)
        # The wire machine and this session refer to each other (handler, write): break the
        # cycle, so that reference counting frees the connection at once. The cyclic collector
        # runs rarely (server.settle_garbage_collector), and under connection churn its
        # garbage would pile up.
        self.wire.handler = _Detached()
        self.wire.write = _discard
        if self.wire.state not in (State.AWAIT_HEADER, State.AWAIT_START_OK):
            log.info(
                "connection closed",
                connection=self.name,
                client=self.client_product,
                user=self.username,
                reason=str(exc) if exc else "normal",
            )

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for channel in list(self.channels.values()):
            channel.redispatch()

    # -- output -------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def write_many(self, parts: list[bytes | memoryview], size: int = -1) -> None:
        """Send `parts` (`size` bytes in all, if the caller knows)."""
        self._out += parts
        self._out_bytes += size if size >= 0 else sum(map(len, parts))
        if self._out_bytes > self.flush_early_bytes:
            # A consumer without a prefetch limit (or no_ack) on a long queue: write now, so
            # that a peer that reads slowly pauses the transport (and so the deliveries)
            # instead of the whole queue piling up here in one turn.
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def after_turn(self, callback: Callable[[], None]) -> None:
        """Run a callback just before this turn's output is written (confirm coalescing)."""
        self._after_turn.append(callback)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def flush_now(self) -> None:
        """Write what this turn gathered now rather than at its end (a replicated quorum
        queue's deliveries, sent in the callback that saw their records committed: a stop of
        the process must not fall between the two, docs/REPLICATION.md)."""
        if self._out or self._after_turn:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._after_turn:
            callbacks, self._after_turn = self._after_turn, []
            for callback in callbacks:
                callback()
        self._out_bytes = 0
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        data = b"".join(self._out)
        self._out.clear()
        self.bytes_sent += len(data)
        self.last_sent = time.monotonic()
        self.transport.write(data)

    def _write_now(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    @property
    def name(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]} #{self.id}"

    @property
    def cluster_key(self) -> str:
        """This connection's name across the cluster (an exclusive queue's owner in etcd)."""
        return self.broker.cluster_key(self)

    # -- the wire handler interface -----------------------------------------------------------

    def on_start_ok(
        self, mechanism: str, response: bytes, client_properties: dict[str, Any]
    ) -> None:
        self.client_properties = client_properties
        caps = client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        product = client_properties.get("product", "")
        self.client_product = (
            product.decode("utf-8", "replace") if isinstance(product, bytes) else str(product)
        )
        try:
            username, password = wire_auth.parse_response(mechanism, response)
        except wire_auth.BadCredentials:
            username, password = "", ""
        user = self.broker.users.authenticate(username, password)
        self.username = username
        if (
            user is not None
            and username in self.broker.config.loopback_users
            and not self._loopback()
        ):
            log.warning(
                "login refused: user can only connect via localhost",
                connection=self.name,
                user=username,
            )
            user = None
        if user is None:
            log.warning("login refused", connection=self.name, user=username, mechanism=mechanism)
            self.broker.login_failed()
            if self.capabilities.get("authentication_failure_close") is True:
                # As RabbitMQ: a text that tells nothing, and no failing method (0/0).
                raise AMQPError(
                    c.ACCESS_REFUSED,
                    f"Login was refused using authentication mechanism "
                    f"{mechanism}. For details see the broker logfile.",
                )
            self.abort()
            return
        self.user = user
        self.wire.start_tune()

    def on_tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None:
        if self.user is None:  # the login was refused and the socket is closing: the tune-ok
            return  # and open that a client sent right behind its start-ok count for nothing
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        if heartbeat:
            self._heartbeat_timer = self.loop.call_later(heartbeat / 2, self._heartbeat_tick)

    def on_open(self, virtual_host: str) -> None:
        if self.user is None:  # see on_tune_ok
            return
        vhost = self.broker.vhosts.get(virtual_host)
        if vhost is None:
            raise AMQPError(c.NOT_ALLOWED, f"vhost {virtual_host} not found", 10, 40)
        permission = self.user.permissions.get(virtual_host)
        if permission is None:
            raise AMQPError(
                c.NOT_ALLOWED,
                f"access to vhost '{virtual_host}' refused for user '{self.user.name}'",
                10,
                40,
            )
        self.vhost = vhost
        self.permission = permission
        self.limited_permissions = (permission.configure, permission.write, permission.read) != (
            ".*",
            ".*",
            ".*",
        )
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.wire.open_ok()
        log.info(
            "connection opened",
            connection=self.name,
            client=self.client_product,
            user=self.username,
            vhost=virtual_host,
        )

    def on_update_secret(self, new_secret: bytes, reason: str) -> None:
        """connection.update-secret: taken, as RabbitMQ takes it for an internal user.

        RabbitMQ hands a new secret only to the auth backends whose credentials expire
        (rabbit_access_control:update_state skips those whose expiry is `never`), and closes
        the connection with 530 "New secret was refused by one of the backends" when one of
        them refuses it. Leveret's one backend, its user database, is RabbitMQ's internal one:
        its credentials never expire, so any secret is taken and nothing is re-checked. A
        backend whose credentials expire would re-check the secret here and raise that 530
        (the wire layer closes the connection with it)."""
        log.info("secret updated", connection=self.name, user=self.username, reason=reason)

    def on_channel_open(self, number: int) -> None:
        self.channels[number] = Channel(self, number)
        self.broker.channels_opened_total += 1  # closed: opened minus open now (metrics)
        self.wire.channel_open_ok(number)

    def on_channel_closed(self, number: int) -> None:
        channel = self.channels.pop(number, None)
        if channel is not None:
            channel.close()

    def on_method(self, number: int, method: Frame) -> None:
        channel = self.channels[number]
        if channel.backlog is None or not backlog.defer(channel, method.index, channel.handle,
                                                        method):
            channel.handle(method)

    def on_publish(
        self,
        number: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        header: bytes,
        body: bytes,
    ) -> None:
        channel = self.channels[number]
        if channel.backlog is None or not backlog.defer(
            channel, backlog.PUBLISH_INDEX, channel.publish, exchange, routing_key, mandatory,
            immediate, header, body,
        ):
            channel.publish(exchange, routing_key, mandatory, immediate, header, body)
        if self.broker.alarm is not None and not self.blocked:
            self.block(self.broker.alarm)

    def on_publish_run(self, number: int, exchange: str, routing_key: str, mandatory: bool,
                       immediate: bool, run: list[Any]) -> None:
        """Publishes alike in a row on one channel (a wire worker gathered them): checked and
        routed as a run by the channel, or one by one while the channel has a backlog."""
        channel = self.channels[number]
        if channel.backlog is not None:
            for at, j in enumerate(range(2, len(run), 2)):
                try:
                    self.on_publish(number, exchange, routing_key, mandatory, immediate,
                                    run[j], run[j + 1])
                except AMQPError as exc:
                    exc.at = at
                    raise
            return
        channel.publish_run(exchange, routing_key, mandatory, immediate, run)
        if self.broker.alarm is not None and not self.blocked:
            self.block(self.broker.alarm)

    # -- resource alarms ----------------------------------------------------------------------

    def block(self, reason: str) -> None:
        """A publisher during a resource alarm: say so, and stop reading its socket."""
        self.blocked = True
        if self.capabilities.get("connection.blocked") is True:
            self.wire.send_method(0, commands.Connection.Blocked(reason=reason))
            self._flush()
        if self.transport is not None:
            self.transport.pause_reading()
        log.info("connection blocked", connection=self.name, reason=reason)

    def unblock(self) -> None:
        if not self.blocked:
            return
        self.blocked = False
        self.last_received = time.monotonic()
        if self.capabilities.get("connection.blocked") is True:
            self.wire.send_method(0, commands.Connection.Unblocked())
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        log.info("connection unblocked", connection=self.name)

    def on_ack(self, number: int, delivery_tag: int, multiple: bool) -> None:
        channel = self.channels[number]
        try:
            if channel.backlog is None or not backlog.defer(
                channel, backlog.ACK_INDEX, channel.ack, delivery_tag, multiple,
            ):
                channel.ack(delivery_tag, multiple)
        except BrokerError as error:
            raise to_amqp(error) from None

    def on_close(self, code: int, text: str) -> None:
        # an open connection's: during the handshake there is nothing in flight behind it
        self._peer_closed = self.wire.state is State.OPEN

    def on_closed(self) -> None:
        """The close handshake is complete. After our connection.close, the client's close-ok
        ends it: flush and drop the socket. After the client's connection.close, release the
        connection now, and leave the socket to the client (`_linger`)."""
        if not self._peer_closed or self.transport is None or self.transport.is_closing():
            self.abort()
            return
        self._flush()
        self.connection_lost(None)  # channels, exclusive queues, the broker's record, the log
        self._linger()

    def _linger(self) -> None:
        """A client that sent connection.close may still be writing what it wrote before it:
        amqplib sends its close ahead of a channel's buffered publishes. Closing the socket
        under those writes resets it, and the client gets EPIPE or ECONNRESET instead of the
        close-ok it waits for. RabbitMQ (rabbit_reader:close_connection) reads on and discards
        until the client closes, for at most the heartbeat timeout or 30 s: so does this."""
        transport = self.transport
        assert transport is not None
        if self.blocked:
            transport.resume_reading()  # what it still sends is read and dropped (wire CLOSED)
        timeout = self.heartbeat if 0 < self.heartbeat < CLOSING_TIMEOUT_S else CLOSING_TIMEOUT_S
        self._linger_timer = self.loop.call_later(timeout, self._end_linger)

    def _end_linger(self) -> None:
        self._linger_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            self.loop.call_later(DRAIN_TIMEOUT_S, self.transport.abort)

    # -- permissions --------------------------------------------------------------------------

    def check_permission(self, kind: str, resource_kind: str, name: str) -> None:
        if not self.limited_permissions:
            return
        assert self.permission is not None
        if not self.permission.allows(kind, name):
            raise AccessRefused(
                f"access to {resource_kind} '{name}' in vhost '{self.vhost.name}' refused for "
                f"user '{self.username}'"
            )

    # -- closing and timers -------------------------------------------------------------------

    def close_with(self, error: AMQPError) -> None:
        """Send connection.close for a hard error; drop the socket if the client lingers."""
        # A frame error stays in the wire machine's frame buffer: without its traceback, so
        # that it keeps no frames (and the reads in them) alive in a cycle with this session.
        error.__traceback__ = None
        log.info("closing connection", connection=self.name, code=error.code, text=error.reply_text)
        was_closing = self.wire.state in (State.CLOSING, State.CLOSED)
        self.wire.close_connection(error)
        for channel in list(self.channels.values()):
            channel.close()
        self.channels.clear()
        if not was_closing and self._close_timer is None:
            self._close_timer = self.loop.call_later(3.0, self.abort)
        self._flush()

    def abort(self) -> None:
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
            # close() waits for the write buffer to drain, which a peer that stopped reading
            # never lets happen: the socket and all it holds would stay forever.
            self._drain_timer = self.loop.call_later(DRAIN_TIMEOUT_S, self._drop)

    def _drop(self) -> None:
        """Close the socket at once, discarding what is still buffered for the peer."""
        if not self.closed and self.transport is not None:
            self.transport.abort()

    def _loopback(self) -> bool:
        return from_loopback(self.peer[0])

    def _handshake_timeout(self) -> None:
        self._handshake_timer = None
        if self.wire.state is not State.OPEN:
            log.info("handshake timeout", connection=self.name)
            self.abort()

    def _heartbeat_tick(self) -> None:
        interval = self.heartbeat
        now = time.monotonic()
        if self.blocked:  # we stopped reading: the client's heartbeats wait in the socket
            self.last_received = now
        if now - self.last_received > 2 * interval:
            log.warning(
                f"missed heartbeats from client, timeout: {interval}s",
                connection=self.name,
                client=self.client_product,
            )
            self._drop()  # the peer is gone or stuck: nothing buffered for it will be read
            return
        if now - self.last_sent >= interval / 2 - 0.05:
            self.write(HEARTBEAT_FRAME)
        self._heartbeat_timer = self.loop.call_later(interval / 2, self._heartbeat_tick)

    # -- server-initiated close (shutdown) ----------------------------------------------------

    def force_close(
        self, text: str = "broker forced connection closure with reason 'shutdown'"
    ) -> None:
        if self.wire.state is State.OPEN:
            self.close_with(AMQPError(c.CONNECTION_FORCED, text))
        else:
            self.abort()
