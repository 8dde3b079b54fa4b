"""The connection and channel state machines of AMQP 0.9.1, with no I/O.

WireConnection takes the bytes a client sends and turns them into calls on a handler (the
broker's session): the handshake (protocol header, start-ok, tune-ok, open), channel life
(open, close, close-ok), assembled publishes, fast acks, and every other method decoded by
pamqp. It writes replies through a `write(bytes)` callable and never touches a socket.

Rules live in tables: which connection methods each handshake state accepts, and what each
channel state does with each frame type. A soft AMQPError raised while handling a channel
method closes that channel; any other AMQPError closes the connection.

One WireConnection belongs to one connection and is used from one thread.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any, Protocol

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp import properties as props
from leveret.amqp.errors import AMQPError, channel_error, command_invalid, unexpected_frame
from leveret.amqp.frames import FrameBuffer, check_heartbeat_channel
from pamqp import commands

_FRAME_HEAD = struct.Struct(">BHI")


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Handler(Protocol):
    """What the session implements; the machine calls it as frames arrive."""

    def on_start_ok(
        self, mechanism: str, response: bytes, client_properties: dict[str, Any]
    ) -> None: ...
    def on_tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None: ...
    def on_open(self, virtual_host: str) -> None: ...
    def on_channel_open(self, channel: int) -> None: ...
    def on_channel_closed(self, channel: int) -> None: ...
    def on_method(self, channel: int, method: Any) -> None: ...
    def on_publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        header: bytes,
        body: bytes,
    ) -> None: ...
    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None: ...
    def on_close(self, code: int, text: str) -> None: ...
    def on_closed(self) -> None: ...


class BadProtocolHeader(Exception):
    """The client did not speak AMQP 0-9-1: `reply` goes back, then the socket closes."""

    def __init__(self, reply: bytes) -> None:
        super().__init__("bad protocol header")
        self.reply = reply


class ChannelState(enum.IntEnum):
    EXPECT_METHOD = 0
    EXPECT_HEADER = 1
    EXPECT_BODY = 2
    CLOSING = 3


class _Channel:
    __slots__ = ("body", "body_left", "header", "publish", "state")

    def __init__(self) -> None:
        self.state = ChannelState.EXPECT_METHOD
        self.publish: tuple[str, str, bool, bool] | None = None
        self.header = b""
        self.body: list[bytes] = []
        self.body_left = 0


_HANDSHAKE_METHODS = {
    State.AWAIT_START_OK: commands.Connection.StartOk,
    State.AWAIT_TUNE_OK: commands.Connection.TuneOk,
    State.AWAIT_OPEN: commands.Connection.Open,
}


def check_protocol_header(data: bytes) -> None:
    """Accept AMQP 0-9-1 (and 1-1-0-9, as RabbitMQ does); otherwise say what we speak."""
    if data in (c.PROTOCOL_HEADER, c.PROTOCOL_HEADER_0_9):
        return
    if data[:4] == b"AMQP" and data[4] == 0 and data[5] == 0 and data[6] >= 9:
        raise BadProtocolHeader(c.PROTOCOL_HEADER)
    if data[:4] == b"AMQP":
        raise BadProtocolHeader(c.PROTOCOL_HEADER)
    raise BadProtocolHeader(c.PROTOCOL_HEADER_UNKNOWN)


class WireConnection:
    """One client connection's protocol state."""

    def __init__(
        self,
        handler: Handler,
        write: Callable[[bytes], None],
        *,
        server_properties: dict[str, Any],
        mechanisms: str = "PLAIN AMQPLAIN",
        frame_max: int = c.DEFAULT_FRAME_MAX,
        channel_max: int = c.DEFAULT_CHANNEL_MAX,
        heartbeat: int = c.DEFAULT_HEARTBEAT_S,
        max_message_size: int = c.DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.handler = handler
        self.write = write
        self.server_properties = server_properties
        self.mechanisms = mechanisms
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.state = State.AWAIT_HEADER
        self.buffer = FrameBuffer(frame_max)
        self.channels: dict[int, _Channel] = {}
        self._pending_header = b""
        self.frames_received = 0

    # -- inbound -----------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Feed received bytes. Raises BadProtocolHeader, or AMQPError for a hard error
        that the caller must turn into close_connection()."""
        if self.state is State.AWAIT_HEADER:
            data = self._receive_protocol_header(data)
            if not data:
                return
        if self.state is State.CLOSED:
            return
        for frame_type, channel, payload in self.buffer.feed(data):
            self.frames_received += 1
            if self.state is State.CLOSED:
                return
            if frame_type == c.FRAME_HEARTBEAT:
                check_heartbeat_channel(channel)
            elif channel == 0:
                self._connection_frame(frame_type, payload)
            elif self.state is State.OPEN:
                self._channel_frame(frame_type, channel, payload)
            elif self.state is not State.CLOSING:
                raise command_invalid("channel frame before connection.open")

    def _receive_protocol_header(self, data: bytes) -> bytes:
        header = self._pending_header + data
        if len(header) < 8:
            if header != c.PROTOCOL_HEADER[: len(header)] and not b"AMQP".startswith(header[:4]):
                raise BadProtocolHeader(c.PROTOCOL_HEADER_UNKNOWN)
            self._pending_header = header
            return b""
        self._pending_header = b""
        check_protocol_header(header[:8])
        self.state = State.AWAIT_START_OK
        self._send_method(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties=self.server_properties,
                mechanisms=self.mechanisms,
                locales="en_US",
            ),
        )
        return header[8:]

    def _connection_frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type != c.FRAME_METHOD:
            raise unexpected_frame("expected method frame, got non method frame instead")
        method = codec.decode_method(payload)
        state = self.state
        expected = _HANDSHAKE_METHODS.get(state)
        if expected is not None:
            if not isinstance(method, expected):
                raise AMQPError(
                    c.COMMAND_INVALID,
                    f"expected '{expected.name.lower()}', got '{method.name.lower()}'",  # type: ignore[attr-defined]
                    *divmod(method.index, 0x10000),
                )
            self._handshake(method)
        elif state is State.OPEN:
            self._open_connection_method(method)
        elif state is State.CLOSING:
            if isinstance(method, commands.Connection.Close):
                self._send_method(0, commands.Connection.CloseOk())
                self._closed()
            elif isinstance(method, commands.Connection.CloseOk):
                self._closed()

    def _handshake(self, method: Any) -> None:
        if isinstance(method, commands.Connection.StartOk):
            self.state = State.AWAIT_TUNE_OK
            raw = method.response
            response = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
            self.handler.on_start_ok(method.mechanism, response, method.client_properties or {})
        elif isinstance(method, commands.Connection.TuneOk):
            self._negotiate(method)
            self.state = State.AWAIT_OPEN
            self.handler.on_tune_ok(self.channel_max, self.frame_max, self.heartbeat)
        elif isinstance(method, commands.Connection.Open):
            self.handler.on_open(method.virtual_host)

    def _negotiate(self, tune_ok: Any) -> None:
        frame_max = tune_ok.frame_max
        if frame_max == 0 or frame_max > self.frame_max:
            raise AMQPError(
                c.NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is higher than the maximum "
                f"allowed value ({self.frame_max})",
                10,
                31,
            )
        if frame_max < c.MIN_FRAME_MAX:
            raise AMQPError(
                c.NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is lower than the minimum "
                f"allowed value ({c.MIN_FRAME_MAX})",
                10,
                31,
            )
        channel_max = tune_ok.channel_max
        if channel_max == 0 or channel_max > self.channel_max:
            suffix = " (no limit)" if channel_max == 0 else ""
            raise AMQPError(
                c.NOT_ALLOWED,
                f"negotiated channel_max = {channel_max}{suffix} is higher than "
                f"the maximum allowed value ({self.channel_max})",
                10,
                31,
            )
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = tune_ok.heartbeat
        self.buffer.set_frame_max(frame_max)

    def _open_connection_method(self, method: Any) -> None:
        if isinstance(method, commands.Connection.Close):
            self.handler.on_close(method.reply_code or 0, method.reply_text or "")
            self._send_method(0, commands.Connection.CloseOk())
            self._closed()
        elif isinstance(method, commands.Connection.CloseOk):
            return
        elif isinstance(method, commands.Connection.UpdateSecret):
            raise AMQPError(c.NOT_IMPLEMENTED, "connection.update_secret", 10, 70)
        else:
            raise AMQPError(
                c.COMMAND_INVALID,
                f"unexpected method {method.name} on channel 0",
                *divmod(method.index, 0x10000),
            )

    def _channel_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        channel = self.channels.get(number)
        if channel is None:
            self._closed_channel_frame(frame_type, number, payload)
            return
        state = channel.state
        if state is ChannelState.EXPECT_METHOD:
            if frame_type != c.FRAME_METHOD:
                raise unexpected_frame("expected method frame, got non method frame instead")
            self._channel_method(channel, number, payload)
        elif state is ChannelState.EXPECT_HEADER:
            if frame_type != c.FRAME_HEADER:
                raise unexpected_frame(
                    "expected content header for class 60, got non content header frame instead"
                )
            self._content_header(channel, number, payload)
        elif state is ChannelState.EXPECT_BODY:
            if frame_type != c.FRAME_BODY:
                raise unexpected_frame("expected content body, got non content body frame instead")
            self._content_body(channel, number, payload)
        elif frame_type == c.FRAME_METHOD:  # CLOSING: only close and close-ok matter
            index = codec.method_index(payload)
            if index == 0x00140028:  # channel.close
                self._send_method(number, commands.Channel.CloseOk())
            elif index == 0x00140029:  # channel.close-ok
                del self.channels[number]
                self.handler.on_channel_closed(number)

    def _closed_channel_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type != c.FRAME_METHOD or codec.method_index(payload) != 0x0014000A:
            raise channel_error("expected 'channel.open'")
        if number > self.channel_max:
            raise AMQPError(
                c.NOT_ALLOWED,
                f"number of channels opened ({len(self.channels)}) has reached "
                f"the negotiated channel_max ({self.channel_max})",
                20,
                10,
            )
        self.channels[number] = _Channel()
        self._guard(number, 0x0014000A, self.handler.on_channel_open, number)

    def _channel_method(self, channel: _Channel, number: int, payload: bytes) -> None:
        index = codec.method_index(payload)
        if index == c.BASIC_PUBLISH:
            channel.publish = codec.decode_publish(payload)
            channel.state = ChannelState.EXPECT_HEADER
        elif index == c.BASIC_ACK:
            tag, multiple = codec.decode_ack(payload)
            self._guard(number, index, self.handler.on_ack, number, tag, multiple)
        elif index == 0x00140028:  # channel.close from the client
            codec.decode_method(payload)
            del self.channels[number]
            self.handler.on_channel_closed(number)
            self._send_method(number, commands.Channel.CloseOk())
        elif index == 0x0014000A:  # channel.open on an open channel
            raise channel_error("second 'channel.open' seen")
        elif index >> 16 == c.CLASS_CONNECTION:
            raise AMQPError(
                c.COMMAND_INVALID,
                "connection method on a non-zero channel",
                *divmod(index, 0x10000),
            )
        else:
            method = codec.decode_method(payload)
            self._guard(number, index, self.handler.on_method, number, method)

    def _content_header(self, channel: _Channel, number: int, payload: bytes) -> None:
        size = props.check_header(payload)
        if size > self.max_message_size:
            channel.state = ChannelState.EXPECT_METHOD
            self.close_channel(
                number,
                AMQPError(
                    c.PRECONDITION_FAILED,
                    f"message size {size} is larger than configured max size "
                    f"{self.max_message_size}",
                    60,
                    40,
                ),
            )
            return
        channel.header = payload
        if size == 0:
            self._publish(channel, number, b"")
        else:
            channel.body_left = size
            channel.body = []
            channel.state = ChannelState.EXPECT_BODY

    def _content_body(self, channel: _Channel, number: int, payload: bytes) -> None:
        left = channel.body_left - len(payload)
        if left < 0:
            raise AMQPError(c.FRAME_ERROR, "content body frame exceeds remaining content size")
        channel.body_left = left
        if left:
            channel.body.append(payload)
            return
        if channel.body:
            channel.body.append(payload)
            body = b"".join(channel.body)
            channel.body = []
        else:
            body = payload
        self._publish(channel, number, body)

    def _publish(self, channel: _Channel, number: int, body: bytes) -> None:
        channel.state = ChannelState.EXPECT_METHOD
        publish = channel.publish
        assert publish is not None
        channel.publish = None
        exchange, routing_key, mandatory, immediate = publish
        self._guard(
            number,
            c.BASIC_PUBLISH,
            self.handler.on_publish,
            number,
            exchange,
            routing_key,
            mandatory,
            immediate,
            channel.header,
            body,
        )

    def _guard(self, number: int, index: int, call: Callable[..., None], *args: Any) -> None:
        """Run a handler call; a soft error closes the channel, a hard one propagates."""
        try:
            call(*args)
        except AMQPError as exc:
            exc.for_method(index >> 16, index & 0xFFFF)
            if exc.hard:
                raise
            self.close_channel(number, exc)

    # -- outbound ----------------------------------------------------------------------------

    def _send_method(self, channel: int, method: Any) -> None:
        self.write(codec.encode_method(channel, method))

    def send_method(self, channel: int, method: Any) -> None:
        self._send_method(channel, method)

    def start_tune(self) -> None:
        """Authentication passed: offer the limits."""
        self._send_method(
            0,
            commands.Connection.Tune(
                channel_max=self.channel_max,
                frame_max=self.frame_max,
                heartbeat=self.heartbeat,
            ),
        )

    def open_ok(self) -> None:
        self.state = State.OPEN
        self._send_method(0, commands.Connection.OpenOk())

    def channel_open_ok(self, channel: int) -> None:
        self._send_method(channel, commands.Channel.OpenOk())

    def close_channel(self, number: int, error: AMQPError) -> None:
        """Send channel.close for a soft error; frames for the channel are then dropped."""
        channel = self.channels.get(number)
        if channel is None or channel.state is ChannelState.CLOSING:
            return
        channel.state = ChannelState.CLOSING
        channel.body = []
        self.handler.on_channel_closed(number)
        self._send_method(
            number,
            commands.Channel.Close(
                reply_code=error.code,
                reply_text=error.reply_text,
                class_id=error.class_id,
                method_id=error.method_id,
            ),
        )

    def close_connection(self, error: AMQPError) -> None:
        """Send connection.close; afterwards only close and close-ok are read."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state is State.AWAIT_HEADER:
            self._closed()
            return
        self.state = State.CLOSING
        self._send_method(
            0,
            commands.Connection.Close(
                reply_code=error.code,
                reply_text=error.reply_text,
                class_id=error.class_id,
                method_id=error.method_id,
            ),
        )

    def _closed(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self.channels.clear()
        self.handler.on_closed()
