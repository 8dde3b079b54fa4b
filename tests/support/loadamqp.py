"""A lean asyncio AMQP 0-9-1 client for load tests: thousands of connections in one process.

It speaks just what the load tests need (handshake with heartbeats, channels, declare, bind,
delete, qos, consume with acks, publish with confirms) with pre-encoded frames and a minimal
frame parser, so that the client costs far less CPU than the broker it loads. Message bodies
carry an 8-byte id, so a test can account for every message.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as C
from pamqp import frame as pframe
from pamqp.header import ContentHeader

_HEAD = struct.Struct(">BHI")
_U64 = struct.Struct(">Q")
_END = b"\xce"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120
CONNECTION_CLOSE = (10 << 16) | 50
CHANNEL_CLOSE = (20 << 16) | 40


def method(channel: int, value: Any) -> bytes:
    return pframe.marshal(value, channel)


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    payload = struct.pack(">HHQB", 60, 80, tag, 1 if multiple else 0)
    return _HEAD.pack(1, channel, len(payload)) + payload + _END


def publish_frames(channel: int, routing_key: str, body: bytes, exchange: str = "",
                   persistent: bool = False) -> bytes:
    """basic.publish, its content header and its body frames (frame_max 131072)."""
    props = C.Basic.Properties(delivery_mode=2 if persistent else None)
    parts = [method(channel, C.Basic.Publish(exchange=exchange, routing_key=routing_key)),
             pframe.marshal(ContentHeader(0, len(body), props), channel)]
    step = 131072 - 8
    for start in range(0, len(body), step):
        piece = body[start : start + step]
        parts += (_HEAD.pack(3, channel, len(piece)), piece, _END)
    return b"".join(parts)


class Connection(asyncio.Protocol):
    """One AMQP connection. Replies to synchronous methods resolve futures in FIFO order per
    channel; deliveries, confirms and closes go to callbacks."""

    def __init__(self, heartbeat: int = 0, name: str = "") -> None:
        self.heartbeat = heartbeat
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
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
        transport.write(b"AMQP\x00\x00\x09\x01")

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
        buf = self.buf
        buf += data
        pos = 0
        size_buf = len(buf)
        while size_buf - pos >= 7:
            frame_type, channel, size = _HEAD.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= size_buf:
                break
            self._frame(frame_type, channel, bytes(buf[pos + 7 : end]))
            pos = end + 1
        del buf[:pos]

    # -- frames -------------------------------------------------------------------------------

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == 1:
            index = struct.unpack_from(">I", payload)[0]
            if index == BASIC_DELIVER:
                ctag_len = payload[4]
                tag, bits = struct.unpack_from(">QB", payload, 5 + ctag_len)
                self._deliver = (channel, tag, bool(bits & 1))
                self._header_pending = True
            elif index in (BASIC_ACK, BASIC_NACK):
                tag, bits = struct.unpack_from(">QB", payload, 4)
                if self.on_confirm is not None:
                    self.on_confirm(channel, tag, bool(bits & 1), index == BASIC_ACK)
            else:
                self._method(channel, index, payload)
        elif frame_type == 2 and self._header_pending:
            self._header_pending = False
            self._body_left = _U64.unpack_from(payload, 4)[0]
            self._body = []
            if not self._body_left:
                self._delivered(b"")
        elif frame_type == 3 and self._deliver is not None:
            self._body.append(payload)
            self._body_left -= len(payload)
            if self._body_left <= 0:
                self._delivered(b"".join(self._body))
        elif frame_type == 8 and self.heartbeat:
            pass

    def _delivered(self, body: bytes) -> None:
        assert self._deliver is not None
        channel, tag, redelivered = self._deliver
        self._deliver = None
        if self.on_deliver is not None:
            self.on_deliver(channel, tag, redelivered, body)

    def _method(self, channel: int, index: int, payload: bytes) -> None:
        decoded = C.INDEX_MAPPING[index]()
        decoded.unmarshal(payload[4:])
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
            self.write(HEARTBEAT)

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
