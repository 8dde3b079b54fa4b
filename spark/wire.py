"""A small blocking AMQP 0.9.1 client: what the Spark sink and source need, and no more.

`Connection` opens a connection (amqp:// or amqps://, see `endpoint.py`), then reads frames
and hands them to its channels (`channel.py`: declares, publisher confirms with a bounded
window of unconfirmed messages, consumers with manual acks). It speaks through the broker's
own wire layer, `leveret.amqp`, which does no I/O: its FrameBuffer splits the bytes received
into frames, pamqp encodes and decodes the rare methods (the handshake, declares, closes), and
the three hot ones (basic.publish with its content, basic.ack coming back, basic.deliver with
its content) go through its struct codecs.

It knows nothing of Spark, and of the broker's code only that wire layer.
Threading: one connection belongs to one thread at a time; nothing here starts a thread.
Heartbeats are sent whenever the client waits on the socket and one is due; a connection
idle for longer than its heartbeat interval is replaced by `connections.checkout`.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections import deque
from typing import Any, NoReturn

from pamqp import commands

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.frames import HEARTBEAT_FRAME, Frame, FrameBuffer
from leveret.spark.channel import Channel, close_error, decode_method
from leveret.spark.endpoint import Endpoint
from leveret.spark.errors import BrokerError, ConnectionLost, LeveretConnectionError

CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "leveret-spark",
    "platform": "Python",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


class Connection:
    """One AMQP connection over a blocking socket; channels multiplex over it."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.frame_max = 131072
        self.channel_max = 2047
        self.heartbeat_s = 0
        self.closed: BrokerError | ConnectionLost | None = None
        self.last_sent = self.last_received = time.monotonic()
        self._reader = FrameBuffer(self.frame_max)
        self._frames: deque[Frame] = deque()
        self._channels: dict[int, Channel] = {}
        self._next_channel = 1
        self._connection_replies: deque[Any] = deque()
        self.blocked = False
        self.state: dict[str, Any] = {}  # what users of the connection keep with it
        self._sock = self._open_socket()
        try:
            self._handshake()
        except BaseException:
            self._sock.close()
            raise

    # -- socket and handshake -------------------------------------------------------------

    def _open_socket(self) -> socket.socket:
        ep = self.endpoint
        try:
            sock = socket.create_connection((ep.host, ep.port), timeout=ep.connect_timeout_s)
        except OSError as exc:
            raise LeveretConnectionError(
                f"cannot connect to {ep.display}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if ep.scheme == "amqps":
            server_name = ep.tls.get("server_name_indication", ep.host)
            try:
                sock = ep.ssl_context().wrap_socket(sock, server_hostname=server_name)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise LeveretConnectionError(
                    f"TLS handshake with {ep.display} failed: {exc}") from None
        return sock

    def _handshake(self) -> None:
        ep = self.endpoint
        self._send(c.PROTOCOL_HEADER)
        try:
            start = self._expect_method(0, commands.Connection.Start)
        except ConnectionLost:
            raise LeveretConnectionError(
                f"{ep.display} closed the connection before AMQP 0.9.1 started") from None
        caps = (start.server_properties or {}).get("capabilities")
        self.server_capabilities: dict[str, Any] = caps if isinstance(caps, dict) else {}
        mechanisms = start.mechanisms.split()
        if "PLAIN" not in mechanisms:
            raise LeveretConnectionError(f"{ep.display} does not offer PLAIN: {mechanisms}")
        self._send_method(0, commands.Connection.StartOk(
            client_properties=CLIENT_PROPERTIES, mechanism="PLAIN",
            response=f"\0{ep.username}\0{ep.password}", locale="en_US"))
        try:
            tune = self._expect_method(0, commands.Connection.Tune)
        except BrokerError as exc:
            raise LeveretConnectionError(
                f"{ep.display} refused the login of user {ep.username!r}: "
                f"{exc.code} {exc.text}") from None
        except ConnectionLost:
            raise LeveretConnectionError(
                f"{ep.display} refused the login of user {ep.username!r} "
                "(the connection was closed during authentication)") from None
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self._reader.set_frame_max(self.frame_max)
        self.channel_max = tune.channel_max or 2047
        wanted = ep.heartbeat_s if ep.heartbeat_s is not None else tune.heartbeat
        self.heartbeat_s = min(wanted, tune.heartbeat) if wanted and tune.heartbeat else wanted
        self._send_method(0, commands.Connection.TuneOk(
            channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat_s))
        self._send_method(0, commands.Connection.Open(virtual_host=ep.vhost))
        try:
            self._expect_method(0, commands.Connection.OpenOk)
        except BrokerError as exc:
            raise LeveretConnectionError(
                f"{ep.display}: cannot open vhost {ep.vhost!r}: {exc.code} {exc.text}") from None
        self._sock.settimeout(None)

    # -- sending --------------------------------------------------------------------------

    def _send(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed is not None:
            raise self.closed
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._lost(f"send failed: {exc}")
        self.last_sent = time.monotonic()

    def _send_method(self, channel: int, method: Any) -> None:
        self._send(codec.encode_method(channel, method))

    def send_raw(self, data: bytes | bytearray | memoryview) -> None:
        self._send(data)

    def _lost(self, why: str) -> NoReturn:
        lost = ConnectionLost(f"lost the connection to {self.endpoint.display}: {why}")
        self.closed = lost
        try:
            self._sock.close()
        except OSError:
            pass
        raise lost

    # -- receiving ------------------------------------------------------------------------

    def _fill(self, timeout: float | None) -> bool:
        """Read what the socket has (waiting up to `timeout`); False if nothing came."""
        if timeout is not None and not self._pending_ssl():
            try:
                ready, _w, _x = select.select([self._sock], [], [], max(0.0, timeout))
            except (OSError, ValueError) as exc:
                self._lost(str(exc))
            if not ready:
                return False
        try:
            chunk = self._sock.recv(1 << 18)
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            self._lost(f"receive failed: {exc}")
        self._take(chunk)
        return True

    def _take(self, chunk: bytes) -> None:
        if not chunk:
            self._lost("the broker closed the socket")
        self._frames.extend(self._reader.feed(chunk))
        self.last_received = time.monotonic()

    def _pending_ssl(self) -> bool:
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    def _next_frame(self) -> Frame | None:
        """The next complete frame received: (type, channel, payload), or None."""
        if self._frames:
            return self._frames.popleft()
        if self._reader.error is not None:
            self._lost(f"a bad frame: {self._reader.error.explanation[:200]}")
        return None

    def pump(self, timeout: float | None) -> bool:
        """Wait up to `timeout` (None: forever) for frames and dispatch them; True if any."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got = False
        while True:
            while (item := self._next_frame()) is not None:
                got = True
                self._dispatch(*item)
            if got or self.closed is not None:
                return got
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            wait = remaining
            if self.heartbeat_s:
                self._maybe_heartbeat()
                cap = self.heartbeat_s / 2
                wait = cap if wait is None else min(wait, cap)
            if not self._fill(wait) and self.heartbeat_s:
                silent = time.monotonic() - self.last_received
                if silent > 2 * self.heartbeat_s:
                    self._lost(f"no heartbeat from the broker for {silent:.0f} s")

    def poll(self) -> None:
        """Dispatch whatever has already arrived, without waiting."""
        while (item := self._next_frame()) is not None:
            self._dispatch(*item)
        if self._fill(0.0):
            while (item := self._next_frame()) is not None:
                self._dispatch(*item)

    def _maybe_heartbeat(self) -> None:
        if self.heartbeat_s and time.monotonic() - self.last_sent > self.heartbeat_s / 2:
            self._send(HEARTBEAT_FRAME)

    def _dispatch(self, ftype: int, channel: int, payload: bytes) -> None:
        if ftype == c.FRAME_HEARTBEAT:
            return
        if channel == 0:
            self._on_connection_frame(ftype, payload)
            return
        ch = self._channels.get(channel)
        if ch is not None:
            ch.on_frame(ftype, payload)

    def _on_connection_frame(self, ftype: int, payload: bytes) -> None:
        if ftype != c.FRAME_METHOD:
            return
        method = decode_method(payload)
        if isinstance(method, commands.Connection.Close):
            try:
                self._sock.sendall(codec.encode_method(0, commands.Connection.CloseOk()))
            except OSError:
                pass
            error = close_error(method, "connection")
            self.closed = error
            self._sock.close()
            for ch in self._channels.values():
                ch.error = ch.error or error
            raise error
        if isinstance(method, commands.Connection.Blocked):
            self.blocked = True
        elif isinstance(method, commands.Connection.Unblocked):
            self.blocked = False
        else:
            self._connection_replies.append(method)

    def _expect_method(self, channel: int, kind: type) -> Any:
        """During the handshake: the next method on channel 0, which must be `kind`."""
        self._connection_replies = deque()
        self._sock.settimeout(self.endpoint.connect_timeout_s)
        while not self._connection_replies:
            item = self._next_frame()
            if item is None:
                try:
                    chunk = self._sock.recv(65536)
                except TimeoutError:
                    self._lost("timed out during the handshake")
                except OSError as exc:
                    self._lost(f"receive failed: {exc}")
                self._take(chunk)
                continue
            self._dispatch(*item)
        method = self._connection_replies.popleft()
        if not isinstance(method, kind):
            self._lost(f"expected {kind.__name__}, got {type(method).__name__}")
        return method

    # -- channels -------------------------------------------------------------------------

    def channel(self) -> Channel:
        number = self._next_channel
        while number in self._channels:
            number = number % self.channel_max + 1
        self._next_channel = number % self.channel_max + 1
        ch = Channel(self, number)
        self._channels[number] = ch
        self._send_method(number, commands.Channel.Open())
        ch.wait_for(commands.Channel.OpenOk)
        return ch

    def forget(self, channel: Channel) -> None:
        self._channels.pop(channel.number, None)

    @property
    def is_open(self) -> bool:
        return self.closed is None

    def alive(self) -> bool:
        """A cheap check before reuse: open, and no close or EOF waiting in the socket."""
        if self.closed is not None:
            return False
        try:
            self.poll()
        except (BrokerError, ConnectionLost):
            return False
        return self.closed is None

    def abort(self) -> None:
        """Drop the socket at once (after a failure, when the state is unknown)."""
        if self.closed is None:
            self.closed = ConnectionLost("aborted by the client")
        try:
            self._sock.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.closed is not None:
            return
        try:
            self._send_method(0, commands.Connection.Close(
                reply_code=200, reply_text="bye", class_id=0, method_id=0))
            deadline = time.monotonic() + 2.0
            self._connection_replies = deque()
            while time.monotonic() < deadline and not any(
                    isinstance(m, commands.Connection.CloseOk) for m in self._connection_replies):
                for ch in self._channels.values():
                    ch.ignore_content = True
                self.pump(deadline - time.monotonic())
        except (BrokerError, ConnectionLost, OSError):
            pass
        self.closed = ConnectionLost("closed by the client")
        try:
            self._sock.close()
        except OSError:
            pass
