"""The connection handshake of AMQP 0.9.1 and the other methods of channel 0.

The protocol header check, the one method each handshake state accepts, RabbitMQ's names for
the states (as its error texts say them), the negotiation of tune-ok's limits, `Handler`, the
interface through which `WireConnection` calls the broker's session, and `ChannelZero`, the
part of `WireConnection` that reads channel 0 (handshake, update-secret, close). No I/O and no
state of its own: `ChannelZero` works on the attributes of the `connection.WireConnection` it
is mixed into, on that connection's thread.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from pamqp import commands

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import FrameBuffer, unexpected_frame_type

CONNECTION_CLOSE = 0x000A0032
CONNECTION_CLOSE_OK = 0x000A0033
UPDATE_SECRET = 70
_METHOD_MIN = 4  # class id, method id


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# RabbitMQ's names for the states, as its "unexpected method in connection state ..." says them.
RABBIT_STATE = {
    State.AWAIT_START_OK: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPEN: "running",
}


class Handler(Protocol):
    """What the session implements; the machine calls it as frames arrive."""

    def on_start_ok(
        self, mechanism: str, response: bytes, client_properties: dict[str, Any]
    ) -> None: ...
    def on_tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None: ...
    def on_open(self, virtual_host: str) -> None: ...
    def on_update_secret(self, new_secret: bytes, reason: str) -> None: ...
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
    def on_publish_run(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        run: list[Any],
    ) -> None:
        """on_publish for each `run[2::2]` header and `run[3::2]` body, in order; an
        AMQPError raised for one of them carries its index in `at` (the later ones are not
        taken)."""
    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None: ...
    def on_close(self, code: int, text: str) -> None: ...
    def on_closed(self) -> None: ...


class BadProtocolHeader(Exception):
    """The client did not speak AMQP 0-9-1: `reply` goes back, then the socket closes."""

    def __init__(self, reply: bytes) -> None:
        super().__init__("bad protocol header")
        self.reply = reply


# The one connection method each handshake state accepts (connection.close aside).
HANDSHAKE_METHODS = {
    State.AWAIT_START_OK: commands.Connection.StartOk,
    State.AWAIT_TUNE_OK: commands.Connection.TuneOk,
    State.AWAIT_OPEN: commands.Connection.Open,
}


def check_protocol_header(data: bytes) -> None:
    """Accept AMQP 0-9-1 (and 1-1-0-9, as RabbitMQ does); answer anything else with the
    0-9-1 header, the one protocol spoken here."""
    if data in (c.PROTOCOL_HEADER, c.PROTOCOL_HEADER_0_9):
        return
    raise BadProtocolHeader(c.PROTOCOL_HEADER)


def check_limit(field: str, value: int, minimum: int, maximum: int) -> None:
    """RabbitMQ's validate_negotiated_integer_value, with its texts (530, as connection.tune)."""
    if value != 0 and value < minimum:
        relation, bound_name, bound = "lower", "minimum", minimum
    elif maximum != 0 and (value == 0 or value > maximum):
        relation, bound_name, bound = "higher", "maximum", maximum
    else:
        return
    detail = " (no limit)" if field == "channel_max" and value == 0 else ""
    raise AMQPError(
        c.NOT_ALLOWED,
        f"negotiated {field} = {value}{detail} is {relation} than the {bound_name} "
        f"allowed value ({bound})",
        10,
        30,
    )


def _octets(value: str | bytes | None) -> bytes:
    """A longstr as sent (pamqp hands back text when it decodes as UTF-8)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value or b"")


class ChannelZero:
    """Channel 0 of a WireConnection: the protocol header, the handshake methods, update-secret
    once open, and connection.close from either side. Mixed into WireConnection, whose
    attributes these are."""

    handler: Handler
    state: State
    server_properties: dict[str, Any]
    mechanisms: str
    frame_max: int
    channel_max: int
    heartbeat: int
    buffer: FrameBuffer
    _pending_header: bytes

    def _send_method(self, channel: int, method: Any) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        raise NotImplementedError

    def _receive_protocol_header(self, data: bytes) -> bytes:
        header = self._pending_header + data
        if len(header) < 8:
            if not b"AMQP".startswith(header[:4]):
                raise BadProtocolHeader(c.PROTOCOL_HEADER)  # cannot become one
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
            raise unexpected_frame_type(frame_type, payload)
        method = codec.decode_method(payload)
        if isinstance(method, commands.Connection.Close):
            self.handler.on_close(method.reply_code or 0, method.reply_text or "")
            self._send_method(0, commands.Connection.CloseOk())
            self._closed()
            return
        state = self.state
        expected = HANDSHAKE_METHODS.get(state)
        if expected is not None and isinstance(method, expected):
            self._handshake(method)
            return
        if state is State.OPEN and isinstance(method, commands.Connection.UpdateSecret):
            self._update_secret(method)
            return
        raise AMQPError(
            c.CHANNEL_ERROR,
            f"unexpected method in connection state {RABBIT_STATE[state]}",
            *divmod(method.index, 0x10000),
        )

    def _closing_frame(self, frame_type: int, payload: bytes) -> None:
        """After our connection.close, only close and close-ok matter (on channel 0)."""
        if frame_type != c.FRAME_METHOD or len(payload) < _METHOD_MIN:
            return
        index = codec.method_index(payload)
        if index == CONNECTION_CLOSE:
            self._send_method(0, commands.Connection.CloseOk())
            self._closed()
        elif index == CONNECTION_CLOSE_OK:
            self._closed()

    def _update_secret(self, method: Any) -> None:
        """The session checks the new secret (an AMQPError refuses it); then update-secret-ok.
        Channels, consumers and content in progress are untouched."""
        try:
            self.handler.on_update_secret(_octets(method.new_secret), method.reason or "")
        except AMQPError as exc:
            raise exc.for_method(c.CLASS_CONNECTION, UPDATE_SECRET) from None
        self._send_method(0, commands.Connection.UpdateSecretOk())

    def _handshake(self, method: Any) -> None:
        if isinstance(method, commands.Connection.StartOk):
            self.state = State.AWAIT_TUNE_OK
            response = _octets(method.response)
            self.handler.on_start_ok(method.mechanism, response, method.client_properties or {})
        elif isinstance(method, commands.Connection.TuneOk):
            self._negotiate(method)
            self.state = State.AWAIT_OPEN
            self.handler.on_tune_ok(self.channel_max, self.frame_max, self.heartbeat)
        elif isinstance(method, commands.Connection.Open):
            self.handler.on_open(method.virtual_host)

    def _negotiate(self, tune_ok: Any) -> None:
        """The client's tune-ok, checked as RabbitMQ does: each value at least the minimum
        (unless 0) and, when the server has a maximum, neither 0 nor above it."""
        frame_max, channel_max = tune_ok.frame_max, tune_ok.channel_max
        check_limit("frame_max", frame_max, c.MIN_FRAME_MAX, self.frame_max)
        check_limit("channel_max", channel_max, 1, self.channel_max)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = tune_ok.heartbeat
        self.buffer.set_frame_max(frame_max)

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

