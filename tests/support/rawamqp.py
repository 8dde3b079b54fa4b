"""The tests' one raw AMQP 0-9-1 client: pamqp encodes, a plain socket carries the bytes.

It does exactly what a test tells it to, including things no real client would do (a wrong
protocol header, a frame with a bad end octet, a heartbeat on channel 1), and reports what came
back: whole frames decoded with pamqp, the raw bytes, or the socket being closed. Tests use it
where a client library hides what they check: the exact order of frames, the multiple flag of
confirms, empty consumer tags, reply codes and texts. `open_client` gives one past the
handshake with channel 1 open. (support/fuzzwire.py is not a client: it encodes the invalid
bytes that pamqp refuses to write, for the fuzzers, which send them with this client.)
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from pamqp import commands, encode, frame, heartbeat
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"
_HEAD = struct.Struct(">BHI")

# What pika, aio-pika and the Java client announce; tests remove entries to see the difference.
CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "basic.nack": True,
    "publisher_confirms": True,
}


T = TypeVar("T")


class PeerClosed(Exception):
    """The broker closed the TCP connection."""


@dataclass
class Frame:
    type: int
    channel: int
    payload: bytes

    @property
    def method(self) -> Any:
        """The pamqp method of a method frame."""
        assert self.type == FRAME_METHOD, f"not a method frame: {self}"
        index = struct.unpack_from(">I", self.payload)[0]
        method = commands.INDEX_MAPPING[index]()
        method.unmarshal(self.payload[4:])
        return method

    @property
    def value(self) -> Any:
        """The frame decoded with pamqp: a method, a ContentHeader, a ContentBody or a
        Heartbeat."""
        if self.type == FRAME_METHOD:
            return self.method
        if self.type == FRAME_HEADER:
            content = ContentHeader()
            content.unmarshal(self.payload)
            return content
        if self.type == FRAME_BODY:
            return ContentBody(self.payload)
        assert self.type == FRAME_HEARTBEAT, f"unknown frame type: {self}"
        return heartbeat.Heartbeat()


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain(user: str, password: str) -> bytes:
    """An AMQPLAIN response: a field table without its length prefix."""
    return encode.field_table({"LOGIN": user, "PASSWORD": password})[4:]


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return _HEAD.pack(frame_type, channel, len(payload)) + payload + end


def method_payload(method: Any) -> bytes:
    return frame.marshal(method, 0)[7:-1]


class RawClient:
    """One TCP connection speaking (or misspeaking) AMQP 0-9-1."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.start: Any = None
        self.tune: Any = None
        self.heartbeats_received = 0

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- sending ---------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: Any) -> None:
        self.send(frame.marshal(method, channel))

    def send_frame(
        self, frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END
    ) -> None:
        self.send(raw_frame(frame_type, channel, payload, end))

    def send_heartbeat(self, channel: int = 0) -> None:
        self.send_frame(FRAME_HEARTBEAT, channel, b"")

    def publish(
        self,
        channel: int,
        body: bytes,
        exchange: str = "",
        routing_key: str = "",
        properties: Any = None,
        frame_max: int = 131072,
        *,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> None:
        """basic.publish, its content header and as many body frames as frame_max allows."""
        self.send(b"".join(self.publish_frames(
            channel, body, exchange, routing_key, properties, frame_max,
            mandatory=mandatory, immediate=immediate)))

    @staticmethod
    def publish_frames(
        channel: int,
        body: bytes,
        exchange: str = "",
        routing_key: str = "",
        properties: Any = None,
        frame_max: int = 131072,
        *,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> list[bytes]:
        """The frames of one publish, each encoded: method, content header, bodies."""
        method = commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        )
        header = ContentHeader(0, len(body), properties or commands.Basic.Properties())
        step = frame_max - 8
        return [frame.marshal(method, channel), frame.marshal(header, channel)] + [
            raw_frame(FRAME_BODY, channel, body[start : start + step])
            for start in range(0, len(body), step)
        ]

    # -- receiving -------------------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("nothing received in time")
        ready, _, _ = select.select([self.sock], [], [], remaining)
        if not ready:
            raise TimeoutError("nothing received in time")
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            raise PeerClosed("the broker closed the connection")
        self.buf += data

    def read_exact(self, size: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < size:
            self._fill(deadline)
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def next_frame(self, timeout: float | None = None) -> Frame:
        """The next frame, heartbeats included. Raises PeerClosed or TimeoutError."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < 7:
            self._fill(deadline)
        frame_type, channel, size = _HEAD.unpack_from(self.buf)
        while len(self.buf) < 8 + size:
            self._fill(deadline)
        payload = bytes(self.buf[7 : 7 + size])
        assert self.buf[7 + size] == 0xCE, "the broker sent a bad frame end"
        del self.buf[: 8 + size]
        return Frame(frame_type, channel, payload)

    def _next_but_heartbeats(self, timeout: float | None) -> Frame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            got = self.next_frame(max(deadline - time.monotonic(), 0.001))
            if got.type != FRAME_HEARTBEAT:
                return got
            self.heartbeats_received += 1

    def next_value(self, timeout: float | None = None) -> tuple[int, Any]:
        """(channel, frame decoded with pamqp) of the next frame; heartbeats are counted and
        skipped."""
        got = self._next_but_heartbeats(timeout)
        return got.channel, got.value

    def next_method(self, timeout: float | None = None) -> tuple[int, Any]:
        """(channel, method) of the next method frame; heartbeats are counted and skipped."""
        got = self._next_but_heartbeats(timeout)
        assert got.type == FRAME_METHOD, f"expected a method frame, got {got}"
        return got.channel, got.method

    def methods(self, count: int, timeout: float | None = None) -> list[Any]:
        """The next `count` methods, skipping content headers and bodies."""
        out: list[Any] = []
        while len(out) < count:
            _channel, value = self.next_value(timeout)
            if not isinstance(value, ContentHeader | ContentBody):
                out.append(value)
        return out

    def expect(self, cls: type[T], channel: int | None = None, timeout: float | None = None) -> T:
        """The next frame (heartbeats skipped), which must be a `cls` (a method class,
        ContentHeader or ContentBody), on `channel` if given."""
        got_channel, value = self.next_value(timeout)
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
        if channel is not None:
            assert got_channel == channel, f"{value!r} on channel {got_channel}, not {channel}"
        return value

    def expect_connection_close(self, timeout: float | None = None) -> Any:
        """The broker's connection.close; answers it with close-ok."""
        close = self.expect(commands.Connection.Close, 0, timeout)
        try:
            self.send_method(0, commands.Connection.CloseOk())
        except OSError:
            pass
        return close

    def error(self, timeout: float | None = None) -> tuple[int, str, int, int]:
        """(reply code, reply text, class id, method id) of the broker's connection.close."""
        close = self.expect_connection_close(timeout)
        return close.reply_code, close.reply_text, close.class_id, close.method_id

    def read_until_closed(self, timeout: float = 5.0) -> bytes:
        """Everything the broker sends until it closes the socket; TimeoutError if it doesn't."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except PeerClosed:
                data = bytes(self.buf)
                self.buf.clear()
                return data

    def assert_closed(self, timeout: float = 5.0) -> bytes:
        """The socket is closed by the broker within `timeout`; returns what came before."""
        return self.read_until_closed(timeout)

    def assert_open(self, seconds: float) -> None:
        """Nothing but heartbeats arrives for `seconds`, and the socket stays open."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                got = self.next_frame(remaining)
            except TimeoutError:
                return
            assert got.type == FRAME_HEARTBEAT, f"unexpected frame {got}"
            self.heartbeats_received += 1

    # -- the handshake ---------------------------------------------------------------------

    def start_ok(
        self,
        response: bytes | None = None,
        mechanism: str = "PLAIN",
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        if response is None:
            response = plain("guest", "guest")
        caps: dict[str, Any] = CLIENT_CAPABILITIES if capabilities is None else capabilities
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "leveret-rawamqp", "capabilities": caps},
                mechanism=mechanism,
                response=response.decode("latin-1"),
                locale="en_US",
            ),
        )

    def begin(self, header: bytes = PROTOCOL_HEADER) -> Any:
        self.send(header)
        self.start = self.expect(commands.Connection.Start, 0)
        return self.start

    def handshake(
        self,
        *,
        response: bytes | None = None,
        mechanism: str = "PLAIN",
        capabilities: dict[str, Any] | None = None,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int = 0,
        vhost: str = "/",
        open_ok: bool = True,
    ) -> RawClient:
        """Protocol header to open-ok. Limits left as None take the broker's offer."""
        self.begin()
        self.start_ok(response, mechanism, capabilities)
        self.tune = self.expect(commands.Connection.Tune, 0)
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=self.tune.channel_max if channel_max is None else channel_max,
                frame_max=self.tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
        )
        self.send_method(0, commands.Connection.Open(virtual_host=vhost))
        if open_ok:
            self.expect(commands.Connection.OpenOk, 0)
        return self

    def open_channel(self, number: int = 1) -> None:
        self.send_method(number, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, number)

    def close_connection(self) -> None:
        """A clean client-initiated close: close, close-ok, then the broker drops the socket."""
        self.send_method(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        self.expect(commands.Connection.CloseOk, 0)


def open_client(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> RawClient:
    """A client past the handshake (the broker's limits, no heartbeats) with channel 1 open."""
    client = RawClient(port, host, timeout).handshake()
    client.open_channel(1)
    return client
