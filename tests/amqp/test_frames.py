"""FrameBuffer: whole frames out of a byte stream however it is split, and RabbitMQ's 501s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame, heartbeat

from leveret.amqp import constants as c
from leveret.amqp.frames import (
    HEARTBEAT_FRAME,
    FrameBuffer,
    encode_frame,
    unexpected_frame_type,
    unknown_frame,
)


def method_frame(channel: int, method: object) -> bytes:
    return frame.marshal(method, channel)  # type: ignore[arg-type]


def test_one_frame() -> None:
    data = method_frame(1, commands.Channel.Open())
    buf = FrameBuffer()
    assert buf.feed(data) == [(c.FRAME_METHOD, 1, data[7:-1])]
    assert len(buf) == 0
    assert buf.error is None


def test_several_frames_in_one_feed() -> None:
    a = method_frame(0, commands.Connection.CloseOk())
    b = encode_frame(c.FRAME_BODY, 3, b"xyz")
    buf = FrameBuffer()
    assert buf.feed(a + b + HEARTBEAT_FRAME) == [
        (c.FRAME_METHOD, 0, a[7:-1]),
        (c.FRAME_BODY, 3, b"xyz"),
        (c.FRAME_HEARTBEAT, 0, b""),
    ]


def test_byte_by_byte() -> None:
    data = encode_frame(c.FRAME_BODY, 7, b"hello") * 2
    buf = FrameBuffer()
    frames = []
    for i in range(len(data)):
        got = buf.feed(data[i : i + 1])
        if i not in (12, 25):  # the two frame-end octets
            assert got == []
        frames += got
    assert frames == [(c.FRAME_BODY, 7, b"hello")] * 2


@pytest.mark.parametrize("cut", [1, 6, 7, 8, 11, 12])
def test_partial_frame_waits_for_the_rest(cut: int) -> None:
    data = encode_frame(c.FRAME_BODY, 1, b"hello")  # 13 bytes
    buf = FrameBuffer()
    assert buf.feed(data[:cut]) == []
    assert len(buf) == cut
    assert buf.feed(data[cut:]) == [(c.FRAME_BODY, 1, b"hello")]
    assert len(buf) == 0


def test_frame_followed_by_part_of_the_next() -> None:
    data = encode_frame(c.FRAME_BODY, 1, b"a") + encode_frame(c.FRAME_BODY, 1, b"bc")
    buf = FrameBuffer()
    assert buf.feed(data[:12]) == [(c.FRAME_BODY, 1, b"a")]
    assert len(buf) == 3
    assert buf.feed(data[12:]) == [(c.FRAME_BODY, 1, b"bc")]


def test_empty_payload() -> None:
    assert FrameBuffer().feed(HEARTBEAT_FRAME) == [(c.FRAME_HEARTBEAT, 0, b"")]


def test_unknown_frame_types_are_passed_on() -> None:
    """RabbitMQ reads such a frame whole and stays in sync; the connection reports it."""
    buf = FrameBuffer()
    assert buf.feed(encode_frame(9, 0, b"hi")) == [(9, 0, b"hi")]
    assert buf.error is None


def test_payload_may_reach_frame_max() -> None:
    """RabbitMQ allows 8 bytes of slack: a payload of frame_max bytes is accepted."""
    buf = FrameBuffer(8192)
    assert buf.feed(encode_frame(c.FRAME_BODY, 1, b"x" * 8192)) == [(c.FRAME_BODY, 1, b"x" * 8192)]


def test_frame_too_large_is_found_from_the_header_alone() -> None:
    buf = FrameBuffer(8192)
    assert buf.feed(bytes.fromhex("03 0001 00002001")) == []  # 8193 bytes announced
    assert buf.error is not None
    assert (buf.error.code, buf.error.class_id, buf.error.method_id) == (501, 0, 0)
    assert buf.error.reply_text == (
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,8193,8184}"
    )


def test_initial_limit_is_the_protocol_minimum() -> None:
    buf = FrameBuffer()
    assert buf.frame_max == c.MIN_FRAME_MAX == 8192
    buf.feed(encode_frame(c.FRAME_METHOD, 0, b"x" * 8193))
    assert buf.error is not None
    assert buf.error.explanation == "type 1, all octets = <<>>: {frame_too_large,8193,8184}"


def test_set_frame_max() -> None:
    buf = FrameBuffer(8192)
    buf.set_frame_max(131072)
    assert buf.feed(encode_frame(c.FRAME_BODY, 1, b"x" * 100_000))[0][2] == b"x" * 100_000
    buf.set_frame_max(9000)
    buf.feed(encode_frame(c.FRAME_BODY, 1, b"x" * 9001))
    assert buf.error is not None
    assert buf.error.explanation.endswith("{frame_too_large,9001,8992}")


def test_frame_max_zero_means_no_limit() -> None:
    buf = FrameBuffer(0)
    assert len(buf.feed(encode_frame(c.FRAME_BODY, 1, b"x" * 200_000))) == 1


def test_bad_frame_end_quotes_the_payload() -> None:
    buf = FrameBuffer()
    data = method_frame(1, commands.Channel.Open())[:-1] + b"\x00"
    assert buf.feed(data) == []
    assert buf.error is not None
    assert (buf.error.code, buf.error.class_id, buf.error.method_id) == (501, 0, 0)
    assert buf.error.reply_text == (
        "FRAME_ERROR - type 1, all octets = <<0,20,0,10,1,48>>: {invalid_frame_end_marker,0}"
    )


def test_bad_frame_end_with_a_long_payload_is_worded_as_rabbitmq_words_it() -> None:
    """The first 16 octets, and Erlang's ~p breaking the tuple that passes column 80 (the
    text RabbitMQ 3.10 sends for this very frame)."""
    payload = bytes([0, 50, 0, 10, 0, 0, 26]) + b"abcdefghijklmnopqrstuvwxyz" + bytes(7)
    buf = FrameBuffer()
    buf.feed(encode_frame(c.FRAME_METHOD, 1, payload)[:-1] + b"\x00")
    assert buf.error is not None
    assert buf.error.explanation == (
        "type 1, first 16 octets = <<0,50,0,10,0,0,26,97,98,99,100,101,102,103,104,105>>: "
        "{invalid_frame_end_marker,\n" + " " * 82 + "0}"
    )


def test_printable_payloads_are_quoted_as_text() -> None:
    buf = FrameBuffer()
    buf.feed(encode_frame(c.FRAME_BODY, 1, b"hello")[:-1] + b"x")
    assert buf.error is not None
    assert buf.error.explanation == (
        'type 3, all octets = <<"hello">>: {invalid_frame_end_marker,120}'
    )


def test_frames_before_an_error_are_returned_and_later_input_is_dropped() -> None:
    good = encode_frame(c.FRAME_BODY, 1, b"ok")
    bad = encode_frame(c.FRAME_BODY, 1, b"no")[:-1] + b"\xcd"
    buf = FrameBuffer()
    assert buf.feed(good + bad + good) == [(c.FRAME_BODY, 1, b"ok")]
    assert buf.error is not None
    assert buf.error.explanation.endswith("{invalid_frame_end_marker,205}")
    assert buf.feed(good) == []  # later input is dropped...
    assert buf.take_rest() == bad + good  # ...and what the error stopped at is kept, whole
    assert len(buf) == 0


@given(
    st.lists(
        st.tuples(
            st.sampled_from([c.FRAME_METHOD, c.FRAME_HEADER, c.FRAME_BODY, c.FRAME_HEARTBEAT]),
            st.integers(0, 65535),
            st.binary(max_size=300),
        ),
        max_size=8,
    ),
    st.lists(st.integers(0, 4000), max_size=10),
)
def test_any_split_gives_back_the_frames(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(*f) for f in frames)
    points = sorted({min(x, len(data)) for x in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    buf = FrameBuffer(c.DEFAULT_FRAME_MAX)
    got = []
    for piece in pieces:
        got += buf.feed(piece)
    assert got == frames
    assert len(buf) == 0
    assert buf.error is None


def test_frame_helpers() -> None:
    assert heartbeat.Heartbeat.marshal() == HEARTBEAT_FRAME
    assert encode_frame(c.FRAME_BODY, 2, b"ab") == b"\x03\x00\x02\x00\x00\x00\x02ab\xce"
    error = unknown_frame(9, b"hello")
    assert (error.code, error.reply_text) == (
        501,
        'FRAME_ERROR - type 9, all octets = <<"hello">>: unknown_frame',
    )
    error = unexpected_frame_type(2, bytes([0, 60, 0, 0]))
    assert (error.code, error.reply_text) == (
        505,
        "UNEXPECTED_FRAME - type 2, all octets = <<0,60,0,0>>",
    )


def test_max_frames_leaves_the_rest_buffered() -> None:
    data = encode_frame(c.FRAME_BODY, 1, b"a") + encode_frame(c.FRAME_BODY, 1, b"b")
    buf = FrameBuffer()
    assert buf.feed(data, max_frames=1) == [(c.FRAME_BODY, 1, b"a")]
    assert buf.feed(b"", max_frames=1) == [(c.FRAME_BODY, 1, b"b")]
    assert buf.feed(b"", max_frames=1) == []
    assert len(buf) == 0
