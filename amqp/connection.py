"""The connection and channel state machines of AMQP 0.9.1, with no I/O.

WireConnection takes the bytes a client sends and turns them into calls on a handler (the
broker's session): channel 0 (the handshake, update-secret and close, read by
handshake.ChannelZero), channel life (open, close, close-ok), assembled publishes, fast acks,
and every other method decoded by pamqp. It writes replies through a `write(bytes)` callable
and never touches a socket.

Rules live in tables: which connection method each handshake state accepts, and which frame
type each channel state expects (with the 505 for any other). A soft AMQPError raised while
handling a channel method closes that channel; any other AMQPError closes the connection. The
codes and texts are RabbitMQ's (rabbit_reader, rabbit_command_assembler, rabbit_channel). The
deliberate differences: a wrong protocol header always gets the AMQP 0-9-1 header back
(RabbitMQ 4.x answers non-AMQP bytes with the AMQP 1.0 one; Leveret speaks only 0-9-1); an
unknown class or method id is 540 NOT_IMPLEMENTED, as in LavinMQ (RabbitMQ's reader crashes
and drops the socket); errors during the handshake are reported with connection.close
(RabbitMQ often just drops the socket after 3 s); and connection.close from the client during
the handshake is answered with close-ok.

One WireConnection belongs to one connection and is used from one thread.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp import properties as props
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import (
    VALID_TYPES,
    FrameBuffer,
    encode_frame,
    unexpected_frame_type,
    unknown_frame,
)
from leveret.amqp.handshake import ChannelZero, Handler, State
from leveret.amqp.split_input import SplitInput

CHANNEL_OPEN = 0x0014000A
CHANNEL_CLOSE = 0x00140028
CHANNEL_CLOSE_OK = 0x00140029
_CONTENT_HEADER_MIN = 14  # class id, weight, body size, first flag word
_METHOD_MIN = 4  # class id, method id


class ChannelState(enum.IntEnum):
    EXPECT_METHOD = 0
    EXPECT_HEADER = 1
    EXPECT_BODY = 2
    CLOSING = 3


_PUBLISH_INDEX = struct.pack(">I", c.BASIC_PUBLISH)
_HEADER_PREFIX = struct.Struct(">HHQ")  # class id, weight, body size
# channel.open-ok with an empty channel-id, as RabbitMQ sends it (pamqp only encodes "0")
_OPEN_OK = struct.pack(">HHI", c.CLASS_CHANNEL, 11, 0)


class _Channel:
    __slots__ = ("body", "body_left", "header", "publish", "state")

    def __init__(self) -> None:
        self.state = ChannelState.EXPECT_METHOD
        self.publish: tuple[str, str, bool, bool] | None = None
        self.header = b""
        self.body: list[bytes] = []
        self.body_left = 0


# The frame type each channel state expects, its handler, and the 505 (text, class, method)
# for a frame of another type. A CLOSING channel answers close, close-ok and a second open
# (504), and drops the rest.
_CHANNEL_TABLE = {
    ChannelState.EXPECT_METHOD: (
        c.FRAME_METHOD,
        "_channel_method",
        ("expected method frame, got non method frame instead", 0, 0),
    ),
    ChannelState.EXPECT_HEADER: (
        c.FRAME_HEADER,
        "_content_header",
        (
            f"expected content header for class {c.CLASS_BASIC}, "
            "got non content header frame instead",
            60,
            40,
        ),
    ),
    ChannelState.EXPECT_BODY: (
        c.FRAME_BODY,
        "_content_body",
        ("expected content body, got non content body frame instead", 60, 40),
    ),
}


def _ids(index: int) -> tuple[int, int]:
    return index >> 16, index & 0xFFFF


class WireConnection(ChannelZero, SplitInput):
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
        # Until tune-ok, frames are limited to the protocol minimum, as in RabbitMQ.
        self.buffer = FrameBuffer(min(frame_max, c.MIN_FRAME_MAX) if frame_max else 0)
        self.channels: dict[int, _Channel] = {}
        # The channel state table, with its handlers bound once (a frame looks up one entry).
        self._rules = {
            state: (expected, getattr(self, name), error)
            for state, (expected, name, error) in _CHANNEL_TABLE.items()
        }
        self._pending_header = b""
        self._unread: list[tuple[int, int, bytes]] = []  # behind a frame that raised
        self.frames_received = 0

    # -- inbound -----------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Feed received bytes. Raises BadProtocolHeader, or AMQPError for a hard error
        that the caller must turn into close_connection()."""
        if self.state is State.AWAIT_HEADER:
            data = self._receive_protocol_header(data)
            if not data:
                return
        buffer = self.buffer
        self._unread = []
        if self.state is State.CLOSED or buffer.error is not None:
            return  # closed, or out of sync with the peer after a fatal frame error
        while True:
            # Until the connection is open, frames are taken one at a time, so that the
            # frame_max of tune-ok applies to the very next frame, as in RabbitMQ's reader.
            one_by_one = self.state is not State.OPEN
            frames = buffer.feed(data, max_frames=1 if one_by_one else 0)
            data = b""
            if not frames:
                break
            skip = 0
            for i, (frame_type, channel, payload) in enumerate(frames):
                if skip:  # taken by the fast path with the publish before it
                    skip -= 1
                    continue
                self.frames_received += 1
                state = self.state
                if (
                    frame_type == c.FRAME_METHOD
                    and payload[:4] == _PUBLISH_INDEX
                    and state is State.OPEN
                    and self._publish_whole(frames, i)
                ):
                    skip = 2
                    self.frames_received += 2
                    continue
                if state is State.CLOSING:
                    if channel == 0:
                        self._closing_frame(frame_type, payload)
                    continue
                # mypy keeps the narrowing of the check above the loop, but _frame() may
                # have closed the connection on an earlier frame of this batch
                if state is State.CLOSED:  # type: ignore[comparison-overlap]
                    return
                try:
                    self._frame(frame_type, channel, payload)
                except AMQPError:
                    # The frames behind the bad one still count once we are closing: the
                    # client's own connection.close may be among them.
                    self._unread = frames[i + 1 :] + buffer.feed(b"")
                    raise
            if not one_by_one:
                break
        if buffer.error is not None and self.state not in (State.CLOSING, State.CLOSED):
            raise buffer.error

    def _publish_whole(self, frames: list[tuple[int, int, bytes]], i: int) -> bool:
        """The common case in one step: a basic.publish whose header and only body frame
        follow it in the same read, on an open channel, with nothing unusual about them.
        Returns False (and does nothing) for anything else, which takes the frame-by-frame
        path and its checks instead."""
        if i + 2 >= len(frames):
            return False
        _m, number, method_payload = frames[i]
        header_type, header_channel, header = frames[i + 1]
        body_type, body_channel, body = frames[i + 2]
        if (
            header_type != c.FRAME_HEADER
            or body_type != c.FRAME_BODY
            or header_channel != number
            or body_channel != number
        ):
            return False
        try:
            return self._publish_triple(number, method_payload, header, body)
        except AMQPError:
            self._unread = frames[i + 3 :] + self.buffer.feed(b"")
            raise

    def _publish_triple(self, number: int, method_payload: bytes, header: bytes,
                        body: bytes) -> bool:
        """A publish, its content header and its one body frame, all on channel `number`:
        handled (True), or False for the frame-by-frame path. A hard error raises."""
        if len(header) < _CONTENT_HEADER_MIN:
            return False
        channel = self.channels.get(number)
        if channel is None or channel.state is not ChannelState.EXPECT_METHOD:
            return False
        class_id, weight, size = _HEADER_PREFIX.unpack_from(header, 0)
        if class_id != c.CLASS_BASIC or weight or size != len(body) or not size:
            return False
        if size > self.max_message_size:
            return False
        exchange, routing_key, mandatory, immediate = codec.decode_publish(method_payload)
        try:
            self.handler.on_publish(
                number, exchange, routing_key, mandatory, immediate, header, body
            )
        except AMQPError as exc:
            exc.for_method(c.CLASS_BASIC, 40)
            if exc.hard:
                raise
            self.close_channel(number, exc)
        return True

    def _run_fits(self, run: list[Any]) -> bool:
        """Whether every publish of a worker's run would take `_publish_triple`'s one step
        (split_input.py): its channel expects a method, and each frame, header and size is
        as that way requires."""
        channel = self.channels.get(run[0])
        if channel is None or channel.state is not ChannelState.EXPECT_METHOD:
            return False
        frame_max = self.buffer.frame_max or 0xFFFFFFFF
        if len(run[1]) > frame_max:
            return False
        unpack = _HEADER_PREFIX.unpack_from
        for j in range(2, len(run), 2):
            header, body = run[j], run[j + 1]
            if (len(header) < _CONTENT_HEADER_MIN or len(header) > frame_max
                    or len(body) > frame_max):
                return False
            class_id, weight, size = unpack(header, 0)
            if (class_id != c.CLASS_BASIC or weight or size != len(body) or not size
                    or size > self.max_message_size):
                return False
        return True

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        """Checks every frame needs, as RabbitMQ's rabbit_command_assembler:analyze_frame."""
        if channel and self.state is State.OPEN and (
            frame_type == c.FRAME_BODY
            or (frame_type == c.FRAME_METHOD and len(payload) >= _METHOD_MIN)
            or (frame_type == c.FRAME_HEADER and len(payload) >= _CONTENT_HEADER_MIN)
        ):  # the common case, checked first: a well-formed frame on an open channel
            self._channel_frame(frame_type, channel, payload)
            return
        if frame_type not in VALID_TYPES:
            raise unknown_frame(frame_type, payload)
        if frame_type == c.FRAME_HEARTBEAT:
            if payload:
                raise unknown_frame(frame_type, payload)
            if channel != 0:
                raise unexpected_frame_type(frame_type, payload)
            return
        if (frame_type == c.FRAME_METHOD and len(payload) < _METHOD_MIN) or (
            frame_type == c.FRAME_HEADER and len(payload) < _CONTENT_HEADER_MIN
        ):
            raise unknown_frame(frame_type, payload)
        if channel == 0:
            self._connection_frame(frame_type, payload)
        elif self.state is State.OPEN:
            self._channel_frame(frame_type, channel, payload)
        else:
            raise unexpected_frame_type(frame_type, payload)

    # -- channels ----------------------------------------------------------------------------

    def _channel_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        channel = self.channels.get(number)
        if channel is None:
            self._new_channel_frame(frame_type, number, payload)
            return
        rule = self._rules.get(channel.state)
        if rule is None:  # CLOSING: only close, close-ok and open matter
            if frame_type == c.FRAME_METHOD:
                self._closing_channel_method(number, payload)
            return
        expected, handler, error = rule
        if frame_type != expected:
            raise AMQPError(c.UNEXPECTED_FRAME, *error)
        handler(channel, number, payload)

    def _new_channel_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        """A frame on a channel that is not open: it must be channel.open."""
        if self.channel_max and len(self.channels) >= self.channel_max:
            raise AMQPError(
                c.NOT_ALLOWED,
                f"number of channels opened ({len(self.channels)}) has reached "
                f"the negotiated channel_max ({self.channel_max})",
            )
        if frame_type != c.FRAME_METHOD:
            raise AMQPError(
                c.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        method = codec.decode_method(payload)
        if method.index != CHANNEL_OPEN:
            raise AMQPError(c.CHANNEL_ERROR, "expected 'channel.open'", *_ids(method.index))
        self.channels[number] = _Channel()
        self._guard(number, CHANNEL_OPEN, self.handler.on_channel_open, number)

    def _closing_channel_method(self, number: int, payload: bytes) -> None:
        index = codec.method_index(payload)
        if index == CHANNEL_CLOSE:
            self._send_method(number, commands.Channel.CloseOk())
        elif index == CHANNEL_CLOSE_OK:
            del self.channels[number]
            self.handler.on_channel_closed(number)
        elif index == CHANNEL_OPEN:  # checked before the closing state, as rabbit_channel does
            codec.decode_method(payload)
            raise AMQPError(c.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def _channel_method(self, channel: _Channel, number: int, payload: bytes) -> None:
        index = codec.method_index(payload)
        if index == c.BASIC_PUBLISH:
            channel.publish = codec.decode_publish(payload)
            channel.state = ChannelState.EXPECT_HEADER
        elif index == c.BASIC_ACK:
            tag, multiple = codec.decode_ack(payload)
            self._guard(number, index, self.handler.on_ack, number, tag, multiple)
        elif index == CHANNEL_CLOSE:  # from the client
            codec.decode_method(payload)
            del self.channels[number]
            self.handler.on_channel_closed(number)
            self._send_method(number, commands.Channel.CloseOk())
        elif index == CHANNEL_OPEN:
            codec.decode_method(payload)
            raise AMQPError(c.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        elif index >> 16 == c.CLASS_CONNECTION:
            codec.decode_method(payload)
            raise AMQPError(c.COMMAND_INVALID, "unimplemented method", *_ids(index))
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
            raise AMQPError(
                c.FRAME_ERROR, "content body frame exceeds remaining content size", 60, 40
            )
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
        try:  # _guard, inlined: this runs for every message
            self.handler.on_publish(
                number, exchange, routing_key, mandatory, immediate, channel.header, body
            )
        except AMQPError as exc:
            exc.for_method(c.CLASS_BASIC, 40)
            if exc.hard:
                raise
            self.close_channel(number, exc)

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

    def channel_open_ok(self, channel: int) -> None:
        self.write(encode_frame(c.FRAME_METHOD, channel, _OPEN_OK))

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
        """Send connection.close; afterwards only close and close-ok are read, starting with
        the frames that arrived behind the one that raised `error`."""
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
        unread, self._unread = self._unread, []
        for frame_type, channel, payload in unread:
            if channel == 0 and self.state is State.CLOSING:
                self._closing_frame(frame_type, payload)

    def _closed(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self.channels.clear()
        self.handler.on_closed()

