"""The hot struct codecs against pamqp, both ways, for random arguments.

Decoding: pamqp marshals a basic.publish or basic.ack and codec.decode_* must read back what
pamqp's own unmarshal reads. Encoding: codec.encode_* must give the very bytes of
pamqp.frame.marshal for the same method. Names are drawn from what pamqp's validation allows;
the `unicode` variants lift pamqp's name pattern (RabbitMQ accepts any UTF-8 name) so that the
codecs are also compared on names outside ASCII.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, constants, frame

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError

_NAME = constants.DOMAIN_REGEX["exchange-name"]
_ANY_NAME = re.compile(r".*", re.DOTALL)

channels = st.integers(1, 65535)
tags = st.integers(0, 2**63 - 1)  # pamqp writes a longlong as signed
u32 = st.integers(0, 2**32 - 1)
# Names pamqp accepts: its pattern, at most 127 characters.
names = st.text(alphabet=string.ascii_letters + string.digits + "-_.:@#,/+ ", max_size=127)
# Any shortstr: up to 255 bytes of UTF-8.
shortstrs = st.text(max_size=255).filter(lambda s: len(s.encode("utf-8")) <= 255)
# Any name RabbitMQ accepts, within pamqp's length limit.
unicode_names = st.text(max_size=127).filter(lambda s: len(s.encode("utf-8")) <= 255)


@contextmanager
def any_name_allowed() -> Iterator[None]:
    """pamqp, with its exchange and queue name pattern lifted."""
    with mock.patch.dict(
        constants.DOMAIN_REGEX, {"exchange-name": _ANY_NAME, "queue-name": _ANY_NAME}
    ):
        yield


def payload_of(method: Any) -> bytes:
    return frame.marshal(method, 1)[7:-1]


def unmarshal(data: bytes) -> tuple[int, Any]:
    consumed, channel, value = frame.unmarshal(data)
    assert consumed == len(data)
    return channel, value


def ss(value: str) -> bytes:
    return codec.short_str(value)


def test_names_strategy_matches_pamqps_pattern() -> None:
    assert _NAME.fullmatch(string.ascii_letters + string.digits + "-_.:@#,/+ ")


# -- decoding: pamqp's bytes in ------------------------------------------------------------


@given(channels, names, shortstrs, st.booleans(), st.booleans())
def test_publish_codecs_match_pamqp(
    channel: int, exchange: str, routing_key: str, mandatory: bool, immediate: bool
) -> None:
    """decode_publish (the broker's) and encode_publish (a client's)."""
    data = frame.marshal(
        commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        ),
        channel,
    )
    ours = codec.decode_publish(data[7:-1])
    _, theirs = unmarshal(data)
    assert ours == (theirs.exchange, theirs.routing_key, theirs.mandatory, theirs.immediate)
    assert ours == (exchange, routing_key, mandatory, immediate)
    ours_out = codec.encode_publish(channel, ss(exchange), ss(routing_key), mandatory, immediate)
    assert ours_out == data


@given(unicode_names, shortstrs, st.booleans(), st.booleans())
def test_publish_codecs_match_pamqp_unicode(
    exchange: str, routing_key: str, mandatory: bool, immediate: bool
) -> None:
    with any_name_allowed():
        data = frame.marshal(
            commands.Basic.Publish(
                exchange=exchange,
                routing_key=routing_key,
                mandatory=mandatory,
                immediate=immediate,
            ),
            1,
        )
        _, theirs = unmarshal(data)
    ours = codec.decode_publish(data[7:-1])
    assert ours == (theirs.exchange, theirs.routing_key, theirs.mandatory, theirs.immediate)
    assert ours == (exchange, routing_key, mandatory, immediate)
    assert codec.encode_publish(1, ss(exchange), ss(routing_key), mandatory, immediate) == data


@given(tags, st.booleans())
def test_decode_ack_matches_pamqp(tag: int, multiple: bool) -> None:
    data = frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), 1)
    _, theirs = unmarshal(data)
    assert (
        codec.decode_ack(data[7:-1])
        == (theirs.delivery_tag, theirs.multiple)
        == (
            tag,
            multiple,
        )
    )


@given(tags, st.booleans(), st.booleans())
def test_decode_method_agrees_with_the_fast_paths(tag: int, multiple: bool, flag: bool) -> None:
    ack = payload_of(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
    method = codec.decode_method(ack)
    assert (method.delivery_tag, method.multiple) == codec.decode_ack(ack)
    publish = payload_of(commands.Basic.Publish(exchange="x", routing_key="k", mandatory=flag))
    method = codec.decode_method(publish)
    assert (method.exchange, method.routing_key, method.mandatory, method.immediate) == (
        codec.decode_publish(publish)
    )


# -- encoding: pamqp's bytes out -----------------------------------------------------------


@given(channels, shortstrs, tags, st.booleans(), names, shortstrs)
def test_deliver_codecs_match_pamqp(
    channel: int, ctag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> None:
    """encode_deliver (the broker's) and decode_deliver (a client's)."""
    expected = frame.marshal(
        commands.Basic.Deliver(
            consumer_tag=ctag,
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=exchange,
            routing_key=routing_key,
        ),
        channel,
    )
    ours = codec.encode_deliver(channel, ss(ctag), tag, redelivered, ss(exchange) + ss(routing_key))
    assert ours == expected
    got_channel, method = unmarshal(ours)
    assert got_channel == channel
    assert (method.consumer_tag, method.delivery_tag, method.redelivered) == (
        ctag,
        tag,
        redelivered,
    )
    assert (method.exchange, method.routing_key) == (exchange, routing_key)
    assert codec.decode_deliver(expected[7:-1]) == (ctag, tag, redelivered, exchange, routing_key)


@given(channels, shortstrs, tags, st.booleans(), unicode_names, shortstrs)
def test_deliver_codecs_match_pamqp_unicode(
    channel: int, ctag: str, tag: int, redelivered: bool, exchange: str, routing_key: str
) -> None:
    with any_name_allowed():
        expected = frame.marshal(
            commands.Basic.Deliver(
                consumer_tag=ctag,
                delivery_tag=tag,
                redelivered=redelivered,
                exchange=exchange,
                routing_key=routing_key,
            ),
            channel,
        )
    assert (
        codec.encode_deliver(channel, ss(ctag), tag, redelivered, ss(exchange) + ss(routing_key))
        == expected
    )
    assert codec.decode_deliver(expected[7:-1]) == (ctag, tag, redelivered, exchange, routing_key)


@given(channels, tags, st.booleans(), names, shortstrs, u32)
def test_encode_get_ok_is_pamqps_bytes(
    channel: int, tag: int, redelivered: bool, exchange: str, routing_key: str, count: int
) -> None:
    expected = frame.marshal(
        commands.Basic.GetOk(
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=exchange,
            routing_key=routing_key,
            message_count=count,
        ),
        channel,
    )
    ours = codec.encode_get_ok(channel, tag, redelivered, ss(exchange), ss(routing_key), count)
    assert ours == expected


@given(channels, tags, st.booleans(), unicode_names, shortstrs, u32)
def test_encode_get_ok_is_pamqps_bytes_unicode(
    channel: int, tag: int, redelivered: bool, exchange: str, routing_key: str, count: int
) -> None:
    with any_name_allowed():
        expected = frame.marshal(
            commands.Basic.GetOk(
                delivery_tag=tag,
                redelivered=redelivered,
                exchange=exchange,
                routing_key=routing_key,
                message_count=count,
            ),
            channel,
        )
    ours = codec.encode_get_ok(channel, tag, redelivered, ss(exchange), ss(routing_key), count)
    assert ours == expected


@given(channels, st.integers(0, 65535), shortstrs, names, shortstrs)
def test_encode_return_is_pamqps_bytes(
    channel: int, code: int, text: str, exchange: str, routing_key: str
) -> None:
    expected = frame.marshal(
        commands.Basic.Return(
            reply_code=code, reply_text=text, exchange=exchange, routing_key=routing_key
        ),
        channel,
    )
    assert codec.encode_return(channel, code, text, ss(exchange), ss(routing_key)) == expected


@given(channels, st.integers(0, 65535), shortstrs, unicode_names, shortstrs)
def test_encode_return_is_pamqps_bytes_unicode(
    channel: int, code: int, text: str, exchange: str, routing_key: str
) -> None:
    with any_name_allowed():
        expected = frame.marshal(
            commands.Basic.Return(
                reply_code=code, reply_text=text, exchange=exchange, routing_key=routing_key
            ),
            channel,
        )
    assert codec.encode_return(channel, code, text, ss(exchange), ss(routing_key)) == expected


@given(channels, names, u32, u32)
def test_encode_declare_ok_is_pamqps_bytes(
    channel: int, queue: str, messages: int, consumers: int
) -> None:
    expected = frame.marshal(
        commands.Queue.DeclareOk(queue=queue, message_count=messages, consumer_count=consumers),
        channel,
    )
    assert codec.encode_declare_ok(channel, queue, messages, consumers) == expected


@given(channels, unicode_names, u32, u32)
def test_encode_declare_ok_is_pamqps_bytes_unicode(
    channel: int, queue: str, messages: int, consumers: int
) -> None:
    with any_name_allowed():
        expected = frame.marshal(
            commands.Queue.DeclareOk(queue=queue, message_count=messages, consumer_count=consumers),
            channel,
        )
    assert codec.encode_declare_ok(channel, queue, messages, consumers) == expected


@given(channels, tags, st.booleans())
def test_encode_ack_is_pamqps_bytes(channel: int, tag: int, multiple: bool) -> None:
    expected = frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), channel)
    assert codec.encode_ack(channel, tag, multiple) == expected


@given(channels, tags, st.booleans())
def test_encode_nack_is_pamqps_bytes(channel: int, tag: int, multiple: bool) -> None:
    """requeue=True: the field's default, which RabbitMQ leaves in its publisher nacks."""
    expected = frame.marshal(
        commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=True), channel
    )
    assert codec.encode_nack(channel, tag, multiple) == expected


# -- a client's side: what the Spark data source and the test clients send and read ----------


@given(channels, unicode_names, st.booleans())
def test_encode_get_is_pamqps_bytes(channel: int, queue: str, no_ack: bool) -> None:
    with any_name_allowed():
        expected = frame.marshal(commands.Basic.Get(queue=queue, no_ack=no_ack), channel)
    assert codec.encode_get(channel, ss(queue), no_ack) == expected


def test_encode_get_takes_names_pamqp_refuses() -> None:
    name = "amq.leveret.publisher-id?stream=s&publisher=p"
    with pytest.raises(ValueError):
        frame.marshal(commands.Basic.Get(queue=name), 1)
    _, method = unmarshal(codec.encode_get(1, ss(name), True))
    assert (method.queue, method.no_ack) == (name, True)


@given(tags, st.booleans(), st.booleans())
def test_decode_ack_reads_a_nack(tag: int, multiple: bool, requeue: bool) -> None:
    data = frame.marshal(
        commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue), 1
    )
    _, theirs = unmarshal(data)
    assert codec.decode_ack(data[7:-1]) == (theirs.delivery_tag, theirs.multiple)


def test_encode_method_is_pamqp() -> None:
    method = commands.Channel.OpenOk()
    assert codec.encode_method(5, method) == frame.marshal(method, 5)


# -- shortstr --------------------------------------------------------------------------------


def test_short_str() -> None:
    assert codec.short_str("abc") == b"\x03abc"
    assert codec.short_str(b"abc") == b"\x03abc"
    assert codec.short_str("") == b"\x00"
    assert codec.short_str("x" * 300) == b"\xff" + b"x" * 255
    assert codec.short_str(b"y" * 300) == b"\xff" + b"y" * 255


def test_short_str_cuts_on_a_character_boundary() -> None:
    encoded = codec.short_str("é" * 200)  # 400 bytes of UTF-8
    assert encoded[0] == 254
    assert encoded[1:].decode("utf-8") == "é" * 127


def test_short_str_uncut_refuses_long_values() -> None:
    assert codec.short_str("x" * 255, cut=False) == b"\xff" + b"x" * 255
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        codec.short_str("é" * 128, cut=False)
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        codec.short_str(b"y" * 256, cut=False)


# -- errors ----------------------------------------------------------------------------------


def test_method_index() -> None:
    assert codec.method_index(payload_of(commands.Basic.Publish())) == c.BASIC_PUBLISH


def test_unknown_method_is_540() -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_method(bytes.fromhex("0063 0001"))
    error = info.value
    assert (error.code, error.reply_text) == (540, "NOT_IMPLEMENTED - unknown method 99/1")
    assert (error.class_id, error.method_id) == (99, 1)


@pytest.mark.parametrize(
    ("payload", "ids", "text"),
    [
        # queue.declare whose queue name claims 32 bytes and has 2: RabbitMQ 3.10's text.
        (bytes.fromhex("0032 000a 0000 20") + b"ab", (50, 10), "cannot decode <<0,0,32,97,98>>"),
        (bytes.fromhex("0014 000a"), (20, 10), "cannot decode <<>>"),  # channel.open, no args
        (bytes.fromhex("003c 0050 0000"), (60, 80), "cannot decode <<0,0>>"),  # basic.ack
        # basic.qos cut in the middle of prefetch_count
        (bytes.fromhex("003c 000a 00000000 00"), (60, 10), "cannot decode <<0,0,0,0,0>>"),
        # exchange.declare with a table that claims more than there is
        (
            bytes.fromhex("0028 000a 0000 0178 0164 00 0000ffff"),
            (40, 10),
            "cannot decode <<0,0,1,120,1,100,0,0,0,255,255>>",
        ),
    ],
)
def test_truncated_arguments_are_501(payload: bytes, ids: tuple[int, int], text: str) -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_method(payload)
    error = info.value
    assert (error.code, (error.class_id, error.method_id)) == (501, ids)
    assert error.reply_text == f"FRAME_ERROR - {text}"


def test_invalid_utf8_name_is_501() -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_method(bytes.fromhex("0032 000a 0000 02 ff fe 00 00000000"))
    assert (info.value.code, info.value.class_id, info.value.method_id) == (501, 50, 10)


@pytest.mark.parametrize(
    "payload",
    [
        bytes.fromhex("003c 0028 0000"),  # no exchange
        bytes.fromhex("003c 0028 0000 05") + b"ab",  # exchange cut short
        bytes.fromhex("003c 0028 0000 00 00"),  # no bits
        bytes.fromhex("003c 0028 0000 01 ff 00 00"),  # exchange is not UTF-8
    ],
)
def test_bad_publish_is_501(payload: bytes) -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_publish(payload)
    error = info.value
    assert (error.code, error.class_id, error.method_id) == (501, 60, 40)
    assert error.reply_text.startswith("FRAME_ERROR - cannot decode <<")


def test_short_ack_is_501() -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_ack(bytes.fromhex("003c 0050 00000000 0000 00"))
    error = info.value
    assert (error.code, error.class_id, error.method_id) == (501, 60, 80)
    assert error.reply_text == "FRAME_ERROR - cannot decode <<0,0,0,0,0,0,0>>"


@pytest.mark.parametrize(
    "payload",
    [
        bytes.fromhex("003c 003c"),  # no consumer tag
        bytes.fromhex("003c 003c 01") + b"c" + bytes(8),  # no redelivered octet
        bytes.fromhex("003c 003c 01") + b"c" + bytes(9) + b"\x05ab",  # exchange cut short
        bytes.fromhex("003c 003c 00") + bytes(9) + b"\x00\x01\xff",  # key is not UTF-8
    ],
)
def test_bad_deliver_is_501(payload: bytes) -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_deliver(payload)
    error = info.value
    assert (error.code, error.class_id, error.method_id) == (501, 60, 60)


def test_short_nack_is_501_for_basic_nack() -> None:
    with pytest.raises(AMQPError) as info:
        codec.decode_ack(bytes.fromhex("003c 0078 0000"))
    assert (info.value.code, info.value.class_id, info.value.method_id) == (501, 60, 120)


@pytest.mark.parametrize(
    "method",
    [
        commands.Connection.StartOk(
            client_properties={"capabilities": {"basic.nack": True}},
            mechanism="PLAIN",
            response="\0guest\0guest",
            locale="en_US",
        ),
        commands.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=5),
        commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 5}),
        commands.Basic.Consume(queue="q", consumer_tag="t", no_ack=True, exclusive=True),
        commands.Basic.Nack(delivery_tag=3, multiple=True, requeue=False),
        commands.Exchange.Bind(destination="d", source="s", routing_key="k", nowait=True),
    ],
)
def test_whole_arguments_decode(method: Any) -> None:
    """The length check accepts everything pamqp itself writes."""
    decoded = codec.decode_method(payload_of(method))
    assert type(decoded) is type(method)
    assert fields(decoded) == fields(method)


def fields(method: Any) -> dict[str, Any]:
    return {name: getattr(method, name) for name in method.__slots__}
