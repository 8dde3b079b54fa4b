"""A lean asyncio AMQP 0-9-1 client for load tests: thousands of connections in one process.

It speaks just what the load tests need (handshake with heartbeats, channels, declare, bind,
delete, qos, consume with acks, publish with confirms) through the broker's own wire layer
(`leveret.amqp`: its FrameBuffer, and its struct codecs for the hot frames, which a property
test proves equal to pamqp's), so that the client costs far less CPU than the broker it loads.
Message bodies carry an 8-byte id, so a test can account for every message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as C

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.content import content_frames
from leveret.amqp.frames import HEARTBEAT_FRAME, FrameBuffer
from leveret.amqp.properties import body_size, encode_values

_PERSISTENT = {"delivery_mode": 2}


def method(channel: int, value: Any) -> bytes:
    return codec.encode_method(channel, value)


def publish_frames(channel: int, routing_key: str, body: bytes, exchange: str = "",
                   persistent: bool = False) -> bytes:
    """basic.publish, its content header and its body frames (frame_max 131072)."""
    header = encode_values(len(body), _PERSISTENT if persistent else None)
    method = codec.encode_publish(channel, codec.short_str(exchange), codec.short_str(routing_key))
    return method + b"".join(content_frames(channel, header, body, c.DEFAULT_FRAME_MAX))


class Connection(asyncio.Protocol):
    """One AMQP connection. Replies to synchronous methods resolve futures in FIFO order per
    channel; deliveries, confirms and closes go to callbacks."""

    def __init__(self, heartbeat: int = 0, name: str = "") -> None:
        self.heartbeat = heartbeat
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.frames = FrameBuffer(0)  # 0: no frame_max check
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters: dict[int, list[asyncio.Future[Any]]] = {}
        self.on_deliver: Callable[[int, int, bool, bytes], None] | None = None
        self.on_confirm: Callable[[int, int, bool, bool], None] | None = None
        self.closed_by_broker: tuple[int, str] | None = None
        self.channel_closes: list[tuple[int, int, str]] = []
        self.last_received = time.monotonic()
        self.max_silence = 0.0  # the longest gap between frames from the broker
        self.last_sent = time.monotonic()
        self._deliver: tuple[int, int, bool] | None = None
        self._header_pending = False
        self._body_left = 0
        self._body: list[bytes] = []

    # -- asyncio ------------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(c.PROTOCOL_HEADER)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"{self.name}: lost during handshake"))
        for waiters in self.waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(ConnectionError(f"{self.name}: connection lost"))
        self.waiters.clear()

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self.max_silence = max(self.max_silence, now - self.last_received)
        self.last_received = now
        for frame_type, channel, payload in self.frames.feed(data):
            self._frame(frame_type, channel, payload)

    # -- frames -------------------------------------------------------------------------------

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == c.FRAME_METHOD:
            index = codec.method_index(payload)
            if index == c.BASIC_DELIVER:
                _ctag, tag, redelivered, _exchange, _key = codec.decode_deliver(payload)
                self._deliver = (channel, tag, redelivered)
                self._header_pending = True
            elif index in (c.BASIC_ACK, c.BASIC_NACK):
                tag, multiple = codec.decode_ack(payload)
                if self.on_confirm is not None:
                    self.on_confirm(channel, tag, multiple, index == c.BASIC_ACK)
            else:
                self._method(channel, payload)
        elif frame_type == c.FRAME_HEADER and self._header_pending:
            self._header_pending = False
            self._body_left = body_size(payload)
            self._body = []
            if not self._body_left:
                self._delivered(b"")
        elif frame_type == c.FRAME_BODY and self._deliver is not None:
            self._body.append(payload)
            self._body_left -= len(payload)
            if self._body_left <= 0:
                self._delivered(b"".join(self._body))

    def _delivered(self, body: bytes) -> None:
        assert self._deliver is not None
        channel, tag, redelivered = self._deliver
        self._deliver = None
        if self.on_deliver is not None:
            self.on_deliver(channel, tag, redelivered, body)

    def _method(self, channel: int, payload: bytes) -> None:
        decoded = codec.decode_method(payload)
        if isinstance(decoded, C.Connection.Start):
            self.write(method(0, C.Connection.StartOk(
                client_properties={"product": "leveret-load",
                                   "capabilities": {"consumer_cancel_notify": True,
                                                    "basic.nack": True}},
                mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US")))
        elif isinstance(decoded, C.Connection.Tune):
            self.write(method(0, C.Connection.TuneOk(
                channel_max=decoded.channel_max, frame_max=decoded.frame_max,
                heartbeat=self.heartbeat)) + method(0, C.Connection.Open(virtual_host="/")))
        elif isinstance(decoded, C.Connection.OpenOk):
            if not self.opened.done():
                self.opened.set_result(None)
        elif isinstance(decoded, C.Connection.Close):
            self.closed_by_broker = (decoded.reply_code, decoded.reply_text)
            self.write(method(0, C.Connection.CloseOk()))
        elif isinstance(decoded, C.Connection.CloseOk):
            if self.transport is not None:
                self.transport.close()
        elif isinstance(decoded, C.Channel.Close):
            self.channel_closes.append((channel, decoded.reply_code, decoded.reply_text))
            self.write(method(channel, C.Channel.CloseOk()))
            for waiter in self.waiters.pop(channel, []):
                if not waiter.done():
                    waiter.set_exception(RuntimeError(
                        f"channel {channel} closed: {decoded.reply_code} {decoded.reply_text}"))
        else:
            waiters = self.waiters.get(channel)
            if waiters:
                waiter = waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(decoded)

    # -- sending ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.last_sent = time.monotonic()

    def call(self, channel: int, value: Any) -> asyncio.Future[Any]:
        """Send a synchronous method; the future gets its reply."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(channel, []).append(future)
        self.write(method(channel, value))
        return future

    def beat(self) -> None:
        """Send a heartbeat if nothing was sent for half the interval."""
        if self.heartbeat and time.monotonic() - self.last_sent >= self.heartbeat / 2:
            self.write(HEARTBEAT_FRAME)

    def close(self) -> None:
        """A clean close; the transport goes once the broker answers close-ok."""
        self.write(method(0, C.Connection.Close(reply_code=200, reply_text="bye",
                                                class_id=0, method_id=0)))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def connect(port: int, heartbeat: int = 0, name: str = "",
                  timeout: float = 30.0) -> Connection:
    loop = asyncio.get_running_loop()
    _transport, conn = await loop.create_connection(
        lambda: Connection(heartbeat, name), "127.0.0.1", port)
    await asyncio.wait_for(conn.opened, timeout)
    return conn


async def open_channel(conn: Connection, channel: int = 1) -> None:
    await conn.call(channel, C.Channel.Open())


async def heartbeats(conns: Callable[[], list[Connection]], interval: float,
                     stop: asyncio.Event) -> None:
    """Keep every connection's heartbeat going until `stop` is set."""
    while not stop.is_set():
        for conn in conns():
            conn.beat()
        try:
            await asyncio.wait_for(stop.wait(), interval / 4)
        except TimeoutError:
            pass


class Publisher:
    """Publishes with confirms, keeping at most `window` unconfirmed; tracks what was acked."""

    def __init__(self, conn: Connection, channel: int = 1, window: int = 2000) -> None:
        self.conn = conn
        self.channel = channel
        self.window = window
        self.seq = 0
        self.outstanding: dict[int, bytes] = {}
        self.acked: list[bytes] = []
        self.nacked: list[bytes] = []
        self.room = asyncio.Event()
        self.room.set()
        conn.on_confirm = self._confirm

    async def start(self) -> Publisher:
        await open_channel(self.conn, self.channel)
        await self.conn.call(self.channel, C.Confirm.Select())
        return self

    def _confirm(self, _channel: int, tag: int, multiple: bool, ack: bool) -> None:
        tags = [t for t in self.outstanding if t <= tag] if multiple else [tag]
        for t in tags:
            body = self.outstanding.pop(t, None)
            if body is not None:
                (self.acked if ack else self.nacked).append(body)
        if len(self.outstanding) < self.window:
            self.room.set()

    async def publish(self, routing_key: str, body: bytes, exchange: str = "",
                      persistent: bool = False) -> None:
        while len(self.outstanding) >= self.window:
            self.room.clear()
            await self.room.wait()
        self.seq += 1
        self.outstanding[self.seq] = body
        self.conn.write(publish_frames(self.channel, routing_key, body, exchange, persistent))

    async def drain(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.outstanding and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not self.outstanding, f"{len(self.outstanding)} publishes never confirmed"
