"""Content: splitting a body into frames, the lazily decoded Message, and SASL parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, encode

from leveret.amqp import auth
from leveret.amqp import constants as c
from leveret.amqp import properties as props
from leveret.amqp.content import Message, content_frames
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import FrameBuffer


def split(parts: list[bytes]) -> list[tuple[int, int, bytes]]:
    return FrameBuffer(0).feed(b"".join(bytes(p) for p in parts))


@given(
    st.integers(1, 65535),
    st.integers(0, 3 * 4096 + 17),
    st.sampled_from([4096, 4097, 8192, 131072]),
)
def test_content_frames_split_the_body(channel: int, size: int, frame_max: int) -> None:
    body = bytes(i % 251 for i in range(size))
    header = props.encode(size, commands.Basic.Properties(content_type="text/plain"))
    frames = split(content_frames(channel, header, body, frame_max))
    assert frames[0] == (c.FRAME_HEADER, channel, header)
    bodies = frames[1:]
    assert all(t == c.FRAME_BODY and ch == channel for t, ch, _ in bodies)
    assert all(len(p) <= frame_max - 8 for _, _, p in bodies)
    assert all(len(p) == frame_max - 8 for _, _, p in bodies[:-1])  # only the last is short
    assert b"".join(p for _, _, p in bodies) == body
    assert len(bodies) == -(-size // (frame_max - 8))  # no body frame for an empty body


@pytest.mark.parametrize(
    ("size", "frames"), [(0, 1), (1, 2), (8184, 2), (8185, 3), (16368, 3), (16369, 4)]
)
def test_content_frames_at_the_edges(size: int, frames: int) -> None:
    got = split(content_frames(1, b"h" * 14, b"b" * size, 8192))
    assert len(got) == frames
    assert sum(len(p) for _, _, p in got[1:]) == size


def test_frame_max_zero_sends_one_body_frame() -> None:
    got = split(content_frames(1, b"h" * 14, b"b" * 300_000, 0))
    assert [len(p) for _, _, p in got] == [14, 300_000]


def test_message_properties_are_decoded_on_first_use() -> None:
    properties = commands.Basic.Properties(
        headers={"k": "v"}, delivery_mode=2, priority=3, expiration="1000"
    )
    message = Message("ex", "rk", props.encode(4, properties), b"body")
    assert message._props is None
    assert (message.exchange, message.routing_key, message.size) == ("ex", "rk", 4)
    assert message.headers == {"k": "v"}
    assert (message.delivery_mode, message.persistent, message.priority) == (2, True, 3)
    assert message.expiration == "1000"


def test_message_without_headers_does_not_decode() -> None:
    message = Message.build("", "q", b"x")
    assert message.headers == {}
    assert message._props is None
    assert (message.delivery_mode, message.persistent, message.priority) == (1, False, 0)
    assert message.expiration is None


def test_message_replace() -> None:
    message = Message.build("", "q", b"x", commands.Basic.Properties(expiration="5", app_id="a"))
    copy = message.replace(routing_key="r", expiration=None)
    assert (copy.exchange, copy.routing_key, copy.body) == ("", "r", b"x")
    assert copy.expiration is None
    assert copy.properties.app_id == "a"
    assert message.expiration == "5"
    assert message.replace().header is message.header


# -- SASL responses ---------------------------------------------------------------------------


def test_plain() -> None:
    assert auth.parse_response("PLAIN", b"\x00guest\x00secret") == ("guest", "secret")
    assert auth.parse_response("PLAIN", b"authz\x00u\x00p") == ("u", "p")


def test_amqplain() -> None:
    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "pw"})[4:]
    assert auth.parse_response("AMQPLAIN", response) == ("guest", "pw")


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        ("PLAIN", b"guest guest"),
        ("PLAIN", b"\x00a\x00b\x00c"),
        ("AMQPLAIN", b"\x05LOGINS\x00\x00\x00\x05guest"),  # no PASSWORD
        ("AMQPLAIN", b"\x05LOGINS\x00\x00"),  # cut short
    ],
)
def test_malformed_responses(mechanism: str, response: bytes) -> None:
    with pytest.raises(auth.BadCredentials):
        auth.parse_response(mechanism, response)


def test_unknown_mechanism_is_503() -> None:
    with pytest.raises(AMQPError) as info:
        auth.parse_response("EXTERNAL", b"")
    error = info.value
    assert (error.code, error.class_id, error.method_id) == (503, 10, 11)
    assert error.reply_text == "COMMAND_INVALID - unknown authentication mechanism 'EXTERNAL'"


@given(st.sampled_from(["PLAIN", "AMQPLAIN"]), st.binary(max_size=60))
def test_any_response_parses_or_is_refused(mechanism: str, response: bytes) -> None:
    try:
        user, password = auth.parse_response(mechanism, response)
    except auth.BadCredentials:
        return
    assert isinstance(user, str)
    assert isinstance(password, str)


def test_quick_fields_agree_with_pamqp() -> None:
    """delivery_mode, priority, expiration and headers read without a full decode give what
    pamqp's full decode gives, for every combination of the properties before expiration."""
    import itertools

    from pamqp import commands

    from leveret.amqp.content import Message

    values = {
        "content_type": "text/plain", "content_encoding": "gzip",
        "headers": {"a": 1, "CC": ["x"], "n": {"deep": [1, "two"]}}, "delivery_mode": 2,
        "priority": 7, "correlation_id": "c-1", "reply_to": "r", "expiration": "1500",
        "message_id": "m",
    }
    names = list(values)
    for mask in itertools.product([False, True], repeat=len(names)):
        chosen = {n: values[n] for n, on in zip(names, mask, strict=True) if on}
        message = Message.build("", "q", b"x", commands.Basic.Properties(**chosen))
        full = message.properties
        assert message.delivery_mode == (full.delivery_mode or 1)
        assert message.persistent == (full.delivery_mode == 2)
        assert message.priority == (full.priority or 0)
        assert message.expiration == (full.expiration or None)
        assert dict(message.headers) == (full.headers or {})
        assert ("CC" in message.headers) == ("CC" in (full.headers or {}))


_ENTRY_VALUES = st.one_of(
    st.builds(lambda raw: b"S" + len(raw).to_bytes(4, "big") + raw, st.binary(max_size=40)),
    st.builds(lambda text: (lambda raw: b"S" + len(raw).to_bytes(4, "big") + raw)(
        text.encode("utf-8")), st.text(max_size=20)),
    st.builds(lambda n: b"l" + n.to_bytes(8, "big", signed=True),
              st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda n: b"I" + n.to_bytes(4, "big", signed=True), st.integers(-(2**31), 2**31 - 1)),
    st.builds(lambda b: b"t" + bytes([b]), st.integers(0, 1)),
    st.just(b"V"),
)


@given(st.dictionaries(st.text(min_size=1, max_size=10), _ENTRY_VALUES, max_size=6),
       st.text(min_size=1, max_size=10))
def test_headers_read_entry_by_entry_as_pamqp_decodes_them(
    entries: dict[str, bytes], missing: str
) -> None:
    """Message.headers decodes one entry at a time (long strings and longs without pamqp):
    every value, and get() of a key that is absent, is what pamqp gives for the whole table."""
    from pamqp import decode

    table = b"".join(bytes([len(k.encode())]) + k.encode() + v for k, v in entries.items())
    header = (b"\x00\x3c\x00\x00" + (4).to_bytes(8, "big") + b"\x20\x00"
              + len(table).to_bytes(4, "big") + table)
    expected = decode.field_table(len(table).to_bytes(4, "big") + table)[1]
    message = Message("ex", "rk", header, b"body")
    assert {key: message.headers[key] for key in message.headers} == expected
    assert {key: message.headers.get(key) for key in expected} == expected
    if missing not in expected:
        assert message.headers.get(missing, "absent") == "absent"
        assert missing not in message.headers


def _header_with_table(table: bytes) -> bytes:
    return (b"\x00\x3c\x00\x00" + (4).to_bytes(8, "big") + b"\x20\x00"
            + len(table).to_bytes(4, "big") + table)


def _read_all(headers: object) -> object:
    try:
        return {key: headers[key] for key in headers}  # type: ignore[attr-defined]
    except AMQPError as error:
        return error.code


@given(st.binary(max_size=300), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2,
                                          max_size=3), st.sampled_from([b"", b"\x04text"]))
def test_a_stream_publishers_two_headers_are_read_as_pamqp_reads_them(
    name: bytes, publishing_ids: list[int], content_type: bytes
) -> None:
    """x-stream-publisher-name then x-stream-publishing-id, the pair every deduplicated
    publish carries, is read from a lookup once a header like it was seen: every message
    of the publisher, the first included, gives what pamqp gives, a name that is not UTF-8
    included (bytes, as pamqp returns it)."""
    from pamqp import decode

    for publishing_id in publishing_ids:
        table = (b"\x17x-stream-publisher-nameS" + len(name).to_bytes(4, "big") + name
                 + b"\x16x-stream-publishing-idl"
                 + publishing_id.to_bytes(8, "big", signed=True))
        header = _header_with_table(table)
        if content_type:
            header = header[:12] + b"\xa0\x00" + content_type + header[14:]
        message = Message("", "s", header, b"body")
        expected = decode.field_table(len(table).to_bytes(4, "big") + table)[1]
        assert dict(message.headers) == expected
        assert message.properties.headers == expected


def test_a_header_like_a_publishers_with_more_after_it_is_read_whole() -> None:
    """A property after the pair's table (a delivery mode) and an id entry that is not a long
    are not the publisher's shape: read in full each time."""
    pair = (b"\x17x-stream-publisher-nameS\x00\x00\x00\x01p"
            b"\x16x-stream-publishing-idl" + (5).to_bytes(8, "big"))
    persistent = _header_with_table(pair)[:12] + b"\x30\x00" + _header_with_table(pair)[14:]
    for _ in range(2):
        message = Message("", "s", persistent + b"\x02", b"body")
        assert dict(message.headers) == {"x-stream-publisher-name": "p",
                                         "x-stream-publishing-id": 5}
        assert message.persistent
    as_int = pair[:-9] + b"I" + (7).to_bytes(4, "big")
    for _ in range(2):
        assert Message("", "s", _header_with_table(as_int), b"b").headers == {
            "x-stream-publisher-name": "p", "x-stream-publishing-id": 7}


@given(st.dictionaries(st.text(min_size=1, max_size=10), _ENTRY_VALUES, max_size=4),
       st.data())
def test_a_cut_table_reads_as_the_entry_by_entry_reading_does(
    entries: dict[str, bytes], data: st.DataObject
) -> None:
    """A headers table cut anywhere (its length says where the cut is): the one-pass reading
    of plain tables gives the same values, or the same 501 FRAME_ERROR, as reading it entry
    by entry; bad bytes never get past both."""
    from leveret.amqp.content import LazyHeaders

    table = b"".join(bytes([len(k.encode())]) + k.encode() + v for k, v in entries.items())
    pairs = (b"\x17x-stream-publisher-nameS\x00\x00\x00\x02ab"
             b"\x16x-stream-publishing-idl" + bytes(8))
    table = data.draw(st.sampled_from([table, pairs + table, pairs]))
    cut = table[: data.draw(st.integers(0, len(table)))]
    try:
        by_entry = _read_all(LazyHeaders(cut))
    except AMQPError as error:
        by_entry = error.code
    try:
        fast = _read_all(Message("", "s", _header_with_table(cut), b"body").headers)
    except AMQPError as error:
        fast = error.code
    assert fast == by_entry
