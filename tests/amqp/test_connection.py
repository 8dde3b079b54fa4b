"""WireConnection driven with a fake handler: the handshake and channel state tables, every
error with RabbitMQ's code, text and failing method, and publish assembly however the bytes
are split. No sockets: bytes in, recorded handler calls and written frames out."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp.header import ContentHeader

from leveret.amqp import constants as c
from leveret.amqp.connection import ChannelState, WireConnection
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import FrameBuffer, encode_frame
from leveret.amqp.handshake import BadProtocolHeader, State, check_protocol_header

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
SERVER_PROPERTIES = {"product": "Leveret", "capabilities": {"basic.nack": True}}
CLOSE = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


class FakeHandler:
    """Records every call; answers the handshake the way the session does."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.wire: WireConnection | None = None
        self.raise_on_method: AMQPError | None = None
        self.refuse_vhost = False
        self.refuse_secret = False

    def on_start_ok(self, mechanism: str, response: bytes, client_properties: Any) -> None:
        self.calls.append(("start_ok", mechanism, response, client_properties))
        assert self.wire is not None
        self.wire.start_tune()

    def on_tune_ok(self, channel_max: int, frame_max: int, heartbeat: int) -> None:
        self.calls.append(("tune_ok", channel_max, frame_max, heartbeat))

    def on_open(self, virtual_host: str) -> None:
        self.calls.append(("open", virtual_host))
        if self.refuse_vhost:
            raise AMQPError(530, f"vhost {virtual_host} not found", 10, 40)
        assert self.wire is not None
        self.wire.open_ok()

    def on_update_secret(self, new_secret: bytes, reason: str) -> None:
        self.calls.append(("update_secret", new_secret, reason))
        if self.refuse_secret:
            raise AMQPError(530, "New secret was refused by one of the backends")

    def on_channel_open(self, channel: int) -> None:
        self.calls.append(("channel_open", channel))
        assert self.wire is not None
        self.wire.channel_open_ok(channel)

    def on_channel_closed(self, channel: int) -> None:
        self.calls.append(("channel_closed", channel))

    def on_method(self, channel: int, method: Any) -> None:
        self.calls.append(("method", channel, type(method).__name__))
        if self.raise_on_method is not None:
            raise self.raise_on_method

    def on_publish(self, *args: Any) -> None:
        self.calls.append(("publish", *args))

    def on_ack(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        self.calls.append(("ack", channel, delivery_tag, multiple))
        if self.raise_on_method is not None:
            raise self.raise_on_method

    def on_close(self, code: int, text: str) -> None:
        self.calls.append(("close", code, text))

    def on_closed(self) -> None:
        self.calls.append(("closed",))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] == name]


class Peer:
    """A WireConnection, its fake handler and what it wrote, decoded."""

    def __init__(self, **limits: Any) -> None:
        self.handler = FakeHandler()
        self.out = bytearray()
        self.wire = WireConnection(
            self.handler, self.out.extend, server_properties=SERVER_PROPERTIES, **limits
        )
        self.handler.wire = self.wire
        self.parser = FrameBuffer(0)

    def send(self, data: bytes) -> None:
        self.wire.receive(data)

    def method(self, channel: int, method: Any) -> None:
        self.send(frame.marshal(method, channel))

    def written(self) -> list[tuple[int, Any]]:
        """(channel, pamqp method or raw frame) of everything written since the last call."""
        frames = self.parser.feed(bytes(self.out))
        self.out.clear()
        result: list[tuple[int, Any]] = []
        for frame_type, channel, payload in frames:
            if frame_type == c.FRAME_METHOD:
                data = encode_frame(frame_type, channel, payload)
                result.append((channel, frame.unmarshal(data)[2]))
            else:
                result.append((channel, (frame_type, payload)))
        return result

    def written_methods(self) -> list[Any]:
        return [m for _, m in self.written()]

    def handshake(self, **tune: int) -> Peer:
        self.send(PROTOCOL_HEADER)
        self.method(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "test"},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
        )
        values = {"channel_max": 2047, "frame_max": 131072, "heartbeat": 0, **tune}
        self.method(0, commands.Connection.TuneOk(**values))
        self.method(0, commands.Connection.Open(virtual_host="/"))
        assert self.wire.state is State.OPEN
        self.written()
        return self

    def open_channel(self, number: int = 1) -> None:
        self.method(number, commands.Channel.Open())
        assert isinstance(self.written_methods()[-1], commands.Channel.OpenOk)

    def error(self, data: bytes) -> AMQPError:
        with pytest.raises(AMQPError) as info:
            self.send(data)
        return info.value


def opened(**tune: int) -> Peer:
    peer = Peer().handshake(**tune)
    peer.open_channel(1)
    return peer


def method_bytes(channel: int, method: Any) -> bytes:
    return frame.marshal(method, channel)


def header_bytes(channel: int, size: int, properties: Any = None) -> bytes:
    return frame.marshal(ContentHeader(0, size, properties or commands.Basic.Properties()), channel)


def publish_bytes(
    channel: int, body: bytes, routing_key: str = "q", frame_max: int = 131072
) -> bytes:
    data = method_bytes(channel, commands.Basic.Publish(exchange="ex", routing_key=routing_key))
    data += header_bytes(channel, len(body))
    step = frame_max - 8
    for start in range(0, len(body), step):
        data += encode_frame(c.FRAME_BODY, channel, body[start : start + step])
    return data


def fields(error: AMQPError) -> tuple[int, str, int, int]:
    return error.code, error.reply_text, error.class_id, error.method_id


# -- protocol header ---------------------------------------------------------------------------


@pytest.mark.parametrize("header", [PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09"])
def test_accepted_protocol_headers_get_connection_start(header: bytes) -> None:
    peer = Peer()
    peer.send(header)
    [(channel, start)] = peer.written()
    assert channel == 0
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.server_properties == SERVER_PROPERTIES
    assert (start.mechanisms, start.locales) == ("PLAIN AMQPLAIN", "en_US")
    assert peer.wire.state is State.AWAIT_START_OK


@pytest.mark.parametrize(
    "header",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"AMQP\x00\x00\x09\x00",
        b"AMQP\x00\x00\x08\x00",
        b"AMQP\x00\x01\x00\x00",
        b"AMQP\x03\x01\x00\x00",
        b"AMQP\x01\x01\x08\x00",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    ],
)
def test_any_other_header_gets_the_0_9_1_header(header: bytes) -> None:
    peer = Peer()
    with pytest.raises(BadProtocolHeader) as info:
        peer.send(header)
    assert info.value.reply == PROTOCOL_HEADER
    assert peer.out == b""
    with pytest.raises(BadProtocolHeader):
        check_protocol_header(header[:8])


def test_header_split_across_reads() -> None:
    peer = Peer()
    for piece in (b"AM", b"QP\x00", b"\x00\x09", b"\x01"):
        assert peer.written() == []
        peer.send(piece)
    assert isinstance(peer.written_methods()[0], commands.Connection.Start)


def test_bytes_that_cannot_become_a_header_are_refused_early() -> None:
    peer = Peer()
    with pytest.raises(BadProtocolHeader):
        peer.send(b"GET")


def test_header_and_first_frame_in_one_read() -> None:
    peer = Peer()
    peer.send(
        PROTOCOL_HEADER
        + method_bytes(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0a\0b", locale="en_US"
            ),
        )
    )
    assert peer.handler.named("start_ok") == [("start_ok", "PLAIN", b"\0a\0b", {})]


# -- the handshake -----------------------------------------------------------------------------


def test_handshake() -> None:
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    peer.method(
        0,
        commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="AMQPLAIN",
            response="x",
            locale="en_US",
        ),
    )
    assert peer.wire.state is State.AWAIT_TUNE_OK
    tune = peer.written_methods()[-1]
    assert isinstance(tune, commands.Connection.Tune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    peer.method(0, commands.Connection.TuneOk(channel_max=100, frame_max=65536, heartbeat=7))
    assert peer.wire.state is State.AWAIT_OPEN
    assert peer.handler.named("tune_ok") == [("tune_ok", 100, 65536, 7)]
    assert (peer.wire.channel_max, peer.wire.frame_max, peer.wire.heartbeat) == (100, 65536, 7)
    assert peer.wire.buffer.frame_max == 65536
    peer.method(0, commands.Connection.Open(virtual_host="/vh"))
    assert peer.handler.named("open") == [("open", "/vh")]
    assert isinstance(peer.written_methods()[-1], commands.Connection.OpenOk)
    assert peer.wire.state is State.OPEN


def test_offered_limits_come_from_the_configuration() -> None:
    peer = Peer(frame_max=65536, channel_max=16, heartbeat=10)
    peer.send(PROTOCOL_HEADER)
    peer.method(
        0,
        commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0a\0b", locale="en_US"
        ),
    )
    tune = peer.written_methods()[-1]
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (16, 65536, 10)


START_OK = commands.Connection.StartOk(
    client_properties={}, mechanism="PLAIN", response="\0a\0b", locale="en_US"
)
TUNE_OK = commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0)
OPEN = commands.Connection.Open(virtual_host="/")


def at_state(state: State) -> Peer:
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    if state in (State.AWAIT_TUNE_OK, State.AWAIT_OPEN, State.OPEN):
        peer.method(0, START_OK)
    if state in (State.AWAIT_OPEN, State.OPEN):
        peer.method(0, commands.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=0))
    if state is State.OPEN:
        peer.method(0, OPEN)
    assert peer.wire.state is state
    peer.written()
    return peer


# Every state, with a method it does not accept: RabbitMQ's 504 and the method's ids.
@pytest.mark.parametrize(
    ("state", "method", "name", "ids"),
    [
        (State.AWAIT_START_OK, OPEN, "starting", (10, 40)),
        (State.AWAIT_START_OK, TUNE_OK, "starting", (10, 31)),
        (State.AWAIT_TUNE_OK, START_OK, "tuning", (10, 11)),
        (State.AWAIT_TUNE_OK, OPEN, "tuning", (10, 40)),
        (State.AWAIT_OPEN, TUNE_OK, "opening", (10, 31)),
        (State.AWAIT_OPEN, commands.Connection.CloseOk(), "opening", (10, 51)),
        (State.OPEN, OPEN, "running", (10, 40)),
        (State.OPEN, START_OK, "running", (10, 11)),
        (State.OPEN, commands.Connection.CloseOk(), "running", (10, 51)),
        (State.OPEN, commands.Connection.Blocked(reason="x"), "running", (10, 60)),
    ],
)
def test_unexpected_connection_method_is_504(
    state: State, method: Any, name: str, ids: tuple[int, int]
) -> None:
    peer = at_state(state)
    error = peer.error(method_bytes(0, method))
    assert fields(error) == (
        504,
        f"CHANNEL_ERROR - unexpected method in connection state {name}",
        *ids,
    )


@pytest.mark.parametrize(
    "state", [State.AWAIT_START_OK, State.AWAIT_TUNE_OK, State.AWAIT_OPEN, State.OPEN]
)
def test_connection_close_in_any_state_gets_close_ok(state: State) -> None:
    peer = at_state(state)
    peer.method(0, CLOSE)
    assert isinstance(peer.written_methods()[-1], commands.Connection.CloseOk)
    assert peer.handler.named("close") == [("close", 200, "bye")]
    assert peer.handler.named("closed") == [("closed",)]
    assert peer.wire.state is State.CLOSED
    peer.method(0, CLOSE)  # ignored once closed
    assert peer.written() == []


def test_update_secret_asks_the_handler_then_answers_ok() -> None:
    peer = opened()
    publish = commands.Basic.Publish(exchange="", routing_key="q")
    peer.send(method_bytes(1, publish) + header_bytes(1, 3))  # the body is still to come
    peer.method(0, commands.Connection.UpdateSecret(new_secret="s\u00e9cret", reason="token"))
    assert peer.handler.named("update_secret") == [
        ("update_secret", "s\u00e9cret".encode(), "token")
    ]
    [(channel, reply)] = peer.written()
    assert (channel, type(reply)) == (0, commands.Connection.UpdateSecretOk)
    assert peer.wire.state is State.OPEN
    assert peer.wire.channels[1].state is ChannelState.EXPECT_BODY
    peer.send(encode_frame(c.FRAME_BODY, 1, b"abc"))
    assert [call[-1] for call in peer.handler.named("publish")] == [b"abc"]


def test_refused_secret_closes_the_connection_as_update_secret() -> None:
    peer = opened()
    peer.handler.refuse_secret = True
    error = peer.error(
        method_bytes(0, commands.Connection.UpdateSecret(new_secret="s", reason="r"))
    )
    assert fields(error) == (
        530,
        "NOT_ALLOWED - New secret was refused by one of the backends",
        10,
        70,
    )
    assert peer.written() == []


@pytest.mark.parametrize(
    ("state", "name"),
    [
        (State.AWAIT_START_OK, "starting"),
        (State.AWAIT_TUNE_OK, "tuning"),
        (State.AWAIT_OPEN, "opening"),
    ],
)
def test_update_secret_during_the_handshake_is_504(state: State, name: str) -> None:
    peer = at_state(state)
    error = peer.error(
        method_bytes(0, commands.Connection.UpdateSecret(new_secret="s", reason="r"))
    )
    text = f"CHANNEL_ERROR - unexpected method in connection state {name}"
    assert fields(error) == (504, text, 10, 70)
    assert peer.handler.named("update_secret") == []


@pytest.mark.parametrize("state", [State.AWAIT_START_OK, State.AWAIT_TUNE_OK, State.AWAIT_OPEN])
def test_channel_frames_before_open_are_505(state: State) -> None:
    peer = at_state(state)
    error = peer.error(method_bytes(1, commands.Channel.Open()))
    assert fields(error) == (
        505,
        "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,1,48>>",
        0,
        0,
    )


def test_content_frame_on_channel_0_is_505() -> None:
    peer = at_state(State.OPEN)
    error = peer.error(header_bytes(0, 3))
    assert fields(error) == (
        505,
        "UNEXPECTED_FRAME - type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,3,0,0>>",
        0,
        0,
    )


@pytest.mark.parametrize(
    ("frame_max", "channel_max", "text"),
    [
        (4096, 10, "negotiated frame_max = 4096 is lower than the minimum allowed value (8192)"),
        (8191, 10, "negotiated frame_max = 8191 is lower than the minimum allowed value (8192)"),
        (
            131073,
            10,
            "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)",
        ),
        (0, 10, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
        (
            8192,
            0,
            "negotiated channel_max = 0 (no limit) is higher than the maximum allowed value (2047)",
        ),
        (
            8192,
            2048,
            "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)",
        ),
    ],
)
def test_tune_ok_out_of_bounds_is_530(frame_max: int, channel_max: int, text: str) -> None:
    peer = at_state(State.AWAIT_TUNE_OK)
    error = peer.error(
        method_bytes(
            0,
            commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0),
        )
    )
    assert fields(error) == (530, f"NOT_ALLOWED - {text}", 10, 30)
    assert peer.handler.named("tune_ok") == []


@pytest.mark.parametrize(("frame_max", "channel_max"), [(8192, 1), (131072, 2047), (9000, 5)])
def test_tune_ok_within_bounds(frame_max: int, channel_max: int) -> None:
    peer = at_state(State.AWAIT_TUNE_OK)
    peer.method(
        0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=3)
    )
    assert peer.handler.named("tune_ok") == [("tune_ok", channel_max, frame_max, 3)]


def test_server_without_limits_accepts_zero() -> None:
    peer = Peer(frame_max=0, channel_max=0)
    peer.handshake(frame_max=0, channel_max=0)
    assert (peer.wire.frame_max, peer.wire.channel_max) == (0, 0)
    for number in (1, 2, 3):
        peer.open_channel(number)


def test_frames_are_limited_to_8192_until_tune_ok() -> None:
    peer = at_state(State.AWAIT_START_OK)
    error = peer.error(encode_frame(c.FRAME_METHOD, 0, b"x" * 8193))
    assert fields(error) == (
        501,
        "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,8193,8184}",
        0,
        0,
    )


def test_negotiated_frame_max_applies_after_tune_ok() -> None:
    peer = opened(frame_max=10000)
    error = peer.error(encode_frame(c.FRAME_BODY, 1, b"x" * 10001))
    assert error.explanation == "type 3, all octets = <<>>: {frame_too_large,10001,9992}"


def test_open_refused_by_the_handler_propagates() -> None:
    peer = at_state(State.AWAIT_OPEN)
    peer.handler.refuse_vhost = True
    error = peer.error(method_bytes(0, commands.Connection.Open(virtual_host="nope")))
    assert fields(error) == (530, "NOT_ALLOWED - vhost nope not found", 10, 40)
    assert peer.wire.state is State.AWAIT_OPEN


# -- frames any state must check ---------------------------------------------------------------


def test_heartbeats_on_channel_0_are_accepted_in_every_state() -> None:
    for state in (State.AWAIT_START_OK, State.AWAIT_TUNE_OK, State.AWAIT_OPEN, State.OPEN):
        peer = at_state(state)
        peer.send(encode_frame(c.FRAME_HEARTBEAT, 0, b""))
        assert peer.written() == []
        assert peer.wire.frames_received >= 1


@pytest.mark.parametrize(
    ("data", "code", "text"),
    [
        (
            encode_frame(c.FRAME_HEARTBEAT, 1, b""),
            505,
            "UNEXPECTED_FRAME - type 8, all octets = <<>>",
        ),
        (
            encode_frame(c.FRAME_HEARTBEAT, 0, b"ab"),
            501,
            'FRAME_ERROR - type 8, all octets = <<"ab">>: unknown_frame',
        ),
        (encode_frame(9, 0, b""), 501, "FRAME_ERROR - type 9, all octets = <<>>: unknown_frame"),
        (
            encode_frame(0, 1, b"hello"),
            501,
            'FRAME_ERROR - type 0, all octets = <<"hello">>: unknown_frame',
        ),
        (
            encode_frame(c.FRAME_METHOD, 1, b"\x00\x14"),
            501,
            "FRAME_ERROR - type 1, all octets = <<0,20>>: unknown_frame",
        ),
        (
            encode_frame(c.FRAME_HEADER, 1, b"\x00\x3c\x00\x00"),
            501,
            "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame",
        ),
        (
            encode_frame(c.FRAME_METHOD, 1, method_bytes(1, commands.Channel.Open())[7:-1])[:-1]
            + b"\x00",
            501,
            "FRAME_ERROR - type 1, all octets = <<0,20,0,10,1,48>>: {invalid_frame_end_marker,0}",
        ),
    ],
    ids=[
        "heartbeat-on-channel-1",
        "heartbeat-with-payload",
        "unknown-type",
        "type-0",
        "short-method",
        "short-header",
        "bad-frame-end",
    ],
)
def test_frame_level_errors(data: bytes, code: int, text: str) -> None:
    peer = opened()
    error = peer.error(data)
    assert fields(error) == (code, text, 0, 0)


def test_after_a_fatal_frame_error_input_is_ignored() -> None:
    peer = opened()
    good = method_bytes(1, commands.Basic.Qos(prefetch_count=1))
    bad = encode_frame(c.FRAME_BODY, 1, b"x")[:-1] + b"\x00"
    error = peer.error(good + bad)
    assert error.explanation == 'type 3, all octets = <<"x">>: {invalid_frame_end_marker,0}'
    assert peer.handler.named("method") == [("method", 1, "Qos")]  # the frame before it counts
    peer.wire.close_connection(error)
    peer.send(good + method_bytes(0, commands.Connection.CloseOk()))  # out of sync: dropped
    assert peer.handler.named("method") == [("method", 1, "Qos")]
    assert peer.wire.state is State.CLOSING


# -- channels ----------------------------------------------------------------------------------


def test_channel_open() -> None:
    peer = Peer().handshake()
    peer.method(5, commands.Channel.Open())
    assert peer.handler.named("channel_open") == [("channel_open", 5)]
    [(channel, open_ok)] = peer.written()
    assert (channel, type(open_ok)) == (5, commands.Channel.OpenOk)
    assert peer.wire.channels[5].state is ChannelState.EXPECT_METHOD


def test_second_channel_open_is_504() -> None:
    error = opened().error(method_bytes(1, commands.Channel.Open()))
    assert fields(error) == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (commands.Queue.Declare(queue="x"), (50, 10)),
        (commands.Basic.Publish(), (60, 40)),
        (commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), (20, 40)),
        (commands.Connection.Open(), (10, 40)),
    ],
)
def test_method_before_channel_open_is_504(method: Any, ids: tuple[int, int]) -> None:
    error = Peer().handshake().error(method_bytes(1, method))
    assert fields(error) == (504, "CHANNEL_ERROR - expected 'channel.open'", *ids)


def test_content_before_channel_open_is_505() -> None:
    error = Peer().handshake().error(header_bytes(1, 3))
    assert fields(error) == (
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        0,
        0,
    )


def test_channel_max_counts_open_channels() -> None:
    """As RabbitMQ: the limit is on how many channels are open, not on their numbers."""
    peer = Peer().handshake(channel_max=2)
    peer.open_channel(7)
    peer.open_channel(100)
    error = peer.error(method_bytes(3, commands.Channel.Open()))
    assert fields(error) == (
        530,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
        0,
        0,
    )


def test_closed_channels_free_their_slot() -> None:
    peer = Peer().handshake(channel_max=1)
    peer.open_channel(1)
    peer.method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    [(channel, close_ok)] = peer.written()
    assert (channel, type(close_ok)) == (1, commands.Channel.CloseOk)
    assert peer.handler.named("channel_closed") == [("channel_closed", 1)]
    peer.open_channel(2)


def test_connection_method_on_a_channel_is_503() -> None:
    error = opened().error(method_bytes(1, commands.Connection.Open()))
    assert fields(error) == (503, "COMMAND_INVALID - unimplemented method", 10, 40)


def test_unknown_method_is_540() -> None:
    error = opened().error(encode_frame(c.FRAME_METHOD, 1, struct.pack(">HH", 99, 1)))
    assert fields(error) == (540, "NOT_IMPLEMENTED - unknown method 99/1", 99, 1)


def test_unknown_method_on_channel_0_is_540() -> None:
    error = opened().error(encode_frame(c.FRAME_METHOD, 0, struct.pack(">HH", 10, 99)))
    assert fields(error) == (540, "NOT_IMPLEMENTED - unknown method 10/99", 10, 99)


def test_undecodable_method_is_501() -> None:
    data = encode_frame(c.FRAME_METHOD, 1, struct.pack(">HH", 50, 10) + b"\x00\x00\x20ab")
    error = opened().error(data)
    assert fields(error) == (501, "FRAME_ERROR - cannot decode <<0,0,32,97,98>>", 50, 10)


def test_other_methods_go_to_the_handler() -> None:
    peer = opened()
    peer.method(1, commands.Basic.Qos(prefetch_count=10))
    peer.method(1, commands.Channel.Flow(active=True))
    assert peer.handler.named("method") == [("method", 1, "Qos"), ("method", 1, "Flow")]


def test_ack_takes_the_fast_path() -> None:
    peer = opened()
    peer.method(1, commands.Basic.Ack(delivery_tag=2**40, multiple=True))
    assert peer.handler.named("ack") == [("ack", 1, 2**40, True)]
    assert peer.handler.named("method") == []


def test_short_ack_is_501() -> None:
    error = opened().error(encode_frame(c.FRAME_METHOD, 1, bytes.fromhex("003c 0050 0000")))
    assert fields(error) == (501, "FRAME_ERROR - cannot decode <<0,0>>", 60, 80)


def test_hard_error_from_the_handler_is_stamped_and_propagates() -> None:
    peer = opened()
    peer.handler.raise_on_method = AMQPError(540, "active=false")
    error = peer.error(method_bytes(1, commands.Channel.Flow(active=False)))
    assert fields(error) == (540, "NOT_IMPLEMENTED - active=false", 20, 20)


def test_soft_error_closes_only_the_channel() -> None:
    peer = opened()
    peer.open_channel(2)
    peer.handler.raise_on_method = AMQPError(404, "no queue 'q' in vhost '/'")
    peer.method(1, commands.Queue.Declare(queue="q", passive=True))
    [(channel, close)] = peer.written()
    assert channel == 1
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        404,
        "NOT_FOUND - no queue 'q' in vhost '/'",
        50,
        10,
    )
    assert peer.wire.channels[1].state is ChannelState.CLOSING
    assert peer.handler.named("channel_closed") == [("channel_closed", 1)]
    # Until close-ok, the channel drops everything but close (answered), close-ok and a
    # second channel.open (a 504, see below).
    peer.handler.raise_on_method = None
    peer.send(publish_bytes(1, b"dropped"))
    peer.method(1, commands.Basic.Qos())
    peer.method(1, commands.Channel.Flow(active=False))
    assert peer.written() == []
    peer.method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert isinstance(peer.written_methods()[-1], commands.Channel.CloseOk)
    peer.method(1, commands.Channel.CloseOk())
    assert 1 not in peer.wire.channels
    assert peer.handler.named("publish") == []
    # The other channel never noticed, and channel 1 can be opened again.
    peer.method(2, commands.Basic.Qos())
    peer.open_channel(1)
    assert peer.handler.named("method") == [
        ("method", 1, "Declare"),
        ("method", 2, "Qos"),
    ]


def test_channel_open_on_a_closing_channel_is_504() -> None:
    """rabbit_channel checks for a second channel.open before it drops a closing channel's
    methods: the connection closes."""
    peer = opened()
    peer.wire.close_channel(1, AMQPError(406, "x"))
    peer.written()
    error = peer.error(method_bytes(1, commands.Channel.Open()))
    assert fields(error) == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_channel_open_ok_has_an_empty_channel_id() -> None:
    peer = Peer().handshake()
    peer.method(3, commands.Channel.Open())
    [(channel, open_ok)] = peer.written()
    assert (channel, open_ok.channel_id) == (3, "")


def test_close_channel_is_idempotent() -> None:
    peer = opened()
    peer.wire.close_channel(1, AMQPError(406, "x"))
    peer.wire.close_channel(1, AMQPError(406, "y"))
    peer.wire.close_channel(9, AMQPError(406, "z"))
    assert len(peer.written()) == 1


# -- publishes ---------------------------------------------------------------------------------


def test_publish_is_assembled() -> None:
    peer = opened()
    properties = commands.Basic.Properties(content_type="text/plain", headers={"a": 1})
    data = method_bytes(1, commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True))
    header = header_bytes(1, 11, properties)
    data += (
        header + encode_frame(c.FRAME_BODY, 1, b"hello ") + encode_frame(c.FRAME_BODY, 1, b"world")
    )
    peer.send(data)
    assert peer.handler.named("publish") == [
        ("publish", 1, "ex", "rk", True, False, header[7:-1], b"hello world")
    ]
    assert peer.wire.channels[1].state is ChannelState.EXPECT_METHOD


def test_empty_body_needs_no_body_frame() -> None:
    peer = opened()
    peer.send(publish_bytes(1, b""))
    assert [call[-1] for call in peer.handler.named("publish")] == [b""]


@given(
    st.lists(st.binary(max_size=20000), min_size=1, max_size=4),
    st.lists(st.integers(0, 100_000), max_size=12),
)
def test_publishes_survive_any_split(bodies: list[bytes], cuts: list[int]) -> None:
    peer = opened(frame_max=8192)
    data = b"".join(
        publish_bytes(1, body, f"k{i}", frame_max=8192) for i, body in enumerate(bodies)
    )
    points = sorted({min(x, len(data)) for x in cuts})
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        peer.send(data[a:b])
    published = peer.handler.named("publish")
    assert [(call[3], call[7]) for call in published] == [
        (f"k{i}", body) for i, body in enumerate(bodies)
    ]


def test_publishes_on_two_channels_interleave() -> None:
    peer = opened()
    peer.open_channel(2)
    one = FrameBuffer(0).feed(publish_bytes(1, b"one"))
    two = FrameBuffer(0).feed(publish_bytes(2, b"two"))
    # method 1, method 2, header 1, header 2, body 1, body 2
    for a, b in zip(one, two, strict=True):
        peer.send(encode_frame(*a) + encode_frame(*b))
    assert [(call[1], call[7]) for call in peer.handler.named("publish")] == [
        (1, b"one"),
        (2, b"two"),
    ]


PUBLISH = method_bytes(1, commands.Basic.Publish(routing_key="q"))


@pytest.mark.parametrize(
    ("after_publish", "code", "text"),
    [
        (
            method_bytes(1, commands.Basic.Qos()),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
        ),
        (
            encode_frame(c.FRAME_BODY, 1, b"abc"),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
        ),
        (
            encode_frame(c.FRAME_HEADER, 1, struct.pack(">HHQH", 50, 0, 3, 0)),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        ),
        (
            encode_frame(c.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 1, 3, 0)),
            505,
            "UNEXPECTED_FRAME - expected content header for class 60, "
            "got non content header frame instead",
        ),
        (
            header_bytes(1, 3) + method_bytes(1, commands.Basic.Qos()),
            505,
            "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        ),
        (
            header_bytes(1, 3) + header_bytes(1, 3),
            505,
            "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        ),
        (
            header_bytes(1, 3) + encode_frame(c.FRAME_BODY, 1, b"abcd"),
            501,
            "FRAME_ERROR - content body frame exceeds remaining content size",
        ),
        (
            header_bytes(1, 2**29 + 1),
            501,
            "FRAME_ERROR - content body size 536870913 exceeds maximum allowed size 536870912",
        ),
    ],
    ids=[
        "method-for-header",
        "body-for-header",
        "header-of-class-50",
        "header-with-weight",
        "method-for-body",
        "header-for-body",
        "body-too-long",
        "body-over-512MiB",
    ],
)
def test_content_errors(after_publish: bytes, code: int, text: str) -> None:
    error = opened().error(PUBLISH + after_publish)
    assert fields(error) == (code, text, 60, 40)


def test_message_over_max_message_size_closes_the_channel() -> None:
    peer = Peer(max_message_size=10).handshake()
    peer.open_channel(1)
    peer.send(PUBLISH + header_bytes(1, 11) + encode_frame(c.FRAME_BODY, 1, b"x" * 11))
    [(channel, close)] = peer.written()
    assert channel == 1
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406,
        "PRECONDITION_FAILED - message size 11 is larger than configured max size 10",
        60,
        40,
    )
    assert peer.handler.named("publish") == []


def test_bad_publish_arguments_are_501() -> None:
    data = encode_frame(c.FRAME_METHOD, 1, bytes.fromhex("003c 0028 0000 05") + b"ab")
    error = opened().error(data)
    assert fields(error) == (501, "FRAME_ERROR - cannot decode <<0,0,5,97,98>>", 60, 40)


# -- closing -----------------------------------------------------------------------------------


def test_server_close_then_close_ok() -> None:
    peer = opened()
    peer.wire.close_connection(
        AMQPError(320, "broker forced connection closure with reason 'shutdown'")
    )
    [(channel, close)] = peer.written()
    assert channel == 0
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        320,
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
        0,
        0,
    )
    assert peer.wire.state is State.CLOSING
    peer.wire.close_connection(AMQPError(541, "again"))  # only one close is ever sent
    # While closing, channel frames, heartbeats, garbage types and other methods are ignored.
    peer.send(publish_bytes(1, b"late"))
    peer.send(encode_frame(9, 0, b"") + encode_frame(c.FRAME_HEARTBEAT, 3, b""))
    peer.method(0, commands.Connection.Open())
    peer.send(encode_frame(c.FRAME_METHOD, 0, struct.pack(">HH", 99, 9)))
    assert peer.written() == []
    assert peer.handler.named("closed") == []
    peer.method(0, commands.Connection.CloseOk())
    assert peer.handler.named("closed") == [("closed",)]
    assert peer.handler.named("publish") == []
    assert peer.wire.state is State.CLOSED
    assert peer.wire.channels == {}


def test_closes_crossing() -> None:
    peer = opened()
    peer.wire.close_connection(AMQPError(504, "second 'channel.open' seen", 20, 10))
    peer.written()
    peer.method(0, CLOSE)
    assert isinstance(peer.written_methods()[-1], commands.Connection.CloseOk)
    assert peer.wire.state is State.CLOSED


def test_close_before_the_protocol_header_writes_nothing() -> None:
    peer = Peer()
    peer.wire.close_connection(AMQPError(320, "x"))
    assert peer.out == b""
    assert peer.wire.state is State.CLOSED
    assert peer.handler.named("closed") == [("closed",)]


def test_frames_behind_a_hard_error_are_read_as_closing() -> None:
    """The client's close may arrive in the same read as the frame that failed."""
    peer = opened()
    error = peer.error(method_bytes(1, commands.Channel.Open()) + method_bytes(0, CLOSE))
    assert error.code == 504
    peer.wire.close_connection(error)
    [close, close_ok] = peer.written_methods()
    assert isinstance(close, commands.Connection.Close)
    assert isinstance(close_ok, commands.Connection.CloseOk)
    assert peer.wire.state is State.CLOSED


frames_strategy = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2, 3, 4, 8, 9]),
        st.sampled_from([0, 1, 2, 300]),
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from(
                [
                    method_bytes(0, commands.Channel.Open())[7:-1],
                    method_bytes(0, commands.Basic.Publish(routing_key="q"))[7:-1],
                    method_bytes(0, commands.Basic.Ack(delivery_tag=1))[7:-1],
                    method_bytes(0, CLOSE)[7:-1],
                    header_bytes(0, 3)[7:-1],
                    b"abc",
                ]
            ),
        ),
    ),
    max_size=12,
)


@given(frames_strategy)
def test_any_frames_end_in_a_reply_code_never_a_crash(frames: list[tuple[int, int, bytes]]) -> None:
    """Whatever well-framed nonsense arrives, the machine either takes it or raises an
    AMQPError with a code RabbitMQ uses; it never fails in another way."""
    peer = opened()
    try:
        for frame_type, channel, payload in frames:
            peer.send(encode_frame(frame_type, channel, payload))
    except AMQPError as error:
        assert error.code in c.REPLY_NAMES
        assert error.hard
        peer.wire.close_connection(error)
        peer.send(method_bytes(0, commands.Connection.CloseOk()))
        assert peer.wire.state is State.CLOSED


@given(st.binary(max_size=300))
def test_any_bytes_end_in_a_reply_code_never_a_crash(data: bytes) -> None:
    peer = opened()
    try:
        peer.send(data)
    except AMQPError as error:
        assert error.code in c.REPLY_NAMES
        peer.wire.close_connection(error)


def test_tune_ok_frame_max_applies_to_the_frames_right_behind_it() -> None:
    """A client may send tune-ok, open and its first big frames in one write."""
    peer = at_state(State.AWAIT_TUNE_OK)
    body = b"x" * 20000
    peer.send(
        method_bytes(0, commands.Connection.TuneOk(channel_max=10, frame_max=65536, heartbeat=0))
        + method_bytes(0, OPEN)
        + method_bytes(1, commands.Channel.Open())
        + publish_bytes(1, body, frame_max=65536)
    )
    assert [call[-1] for call in peer.handler.named("publish")] == [body]
