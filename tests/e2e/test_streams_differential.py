"""Stream scenarios run against Leveret and against the reference RabbitMQ (3.10 here).

Both must give the same observable result. Where RabbitMQ changed a text after 3.10 and
Leveret follows the newer text (it targets 4.2, see shared/reference/rabbitmq-behaviour.md),
the code is compared on both and the text on Leveret only; each such place says so.
"""

from __future__ import annotations

from typing import Any

import pika
import pytest
from support.amqp import channel_error, connect, connection_error, consume, offsets, unique

STREAM = {"x-queue-type": "stream"}


def rs(name: str) -> str:
    return f"queue '{name}' in vhost '/'"


@pytest.fixture
def conn(target: tuple[str, int]):  # type: ignore[no-untyped-def]
    connection = connect(target[1])
    yield connection
    if connection.is_open:
        connection.close()


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        ({"durable": True, "auto_delete": True}, "invalid property 'auto-delete' for {rs}"),
        ({"durable": True, "exclusive": True}, "invalid property 'exclusive-owner' for {rs}"),
        ({"durable": False}, "invalid property 'non-durable' for {rs}"),
    ],
)
def test_flags_a_stream_cannot_have(conn, flags: dict[str, bool], text: str) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    code, reply = channel_error(
        lambda: conn.channel().queue_declare(name, arguments=STREAM, **flags))
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(rs=rs(name)))


def test_server_named_stream_is_refused(conn) -> None:  # type: ignore[no-untyped-def]
    code, reply = channel_error(lambda: conn.channel().queue_declare("", durable=True,
                                                                     arguments=STREAM))
    assert (code, reply) == (406, "PRECONDITION_FAILED - Cannot declare a server-named queue "
                                  "for type rabbit_stream_queue")


@pytest.mark.parametrize(
    ("arguments", "suffix"),
    [
        ({"x-max-age": "1A"}, ": invalid_max_age"),
        ({"x-max-age": "0D"}, ": invalid_max_age"),
        ({"x-max-age": 5}, ": {unacceptable_type,signedint}"),
        ({"x-max-length-bytes": -1}, ": {value_negative,-1}"),
        ({"x-max-length": 5}, " of queue type rabbit_stream_queue"),
        ({"x-message-ttl": 5}, " of queue type rabbit_stream_queue"),
        ({"x-max-priority": 5}, " of queue type rabbit_stream_queue"),
        ({"x-overflow": "drop-head"}, " of queue type rabbit_stream_queue"),
        ({"x-single-active-consumer": True}, " of queue type rabbit_stream_queue"),
    ],
)
def test_invalid_arguments(conn, arguments: dict[str, Any], suffix: str) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    key = next(iter(arguments))
    code, reply = channel_error(lambda: conn.channel().queue_declare(
        name, durable=True, arguments={**STREAM, **arguments}))
    assert (code, reply) == (406, f"PRECONDITION_FAILED - invalid arg '{key}' for "
                                  f"{rs(name)}{suffix}")


def test_segment_size_cap(conn) -> None:  # type: ignore[no-untyped-def]
    code, reply = channel_error(lambda: conn.channel().queue_declare(
        unique("s"), durable=True,
        arguments={**STREAM, "x-stream-max-segment-size-bytes": 4_000_000_000}))
    assert (code, reply) == (406, "PRECONDITION_FAILED - Exceeded max value for "
                                  "x-stream-max-segment-size-bytes")


def test_accepted_arguments_and_equivalent_redeclare(conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    arguments = {**STREAM, "x-max-length-bytes": 10_000_000, "x-max-age": "7D",
                 "x-stream-max-segment-size-bytes": 1_000_000, "x-initial-cluster-size": 1,
                 "x-queue-leader-locator": "balanced", "x-custom": "kept"}
    ch = conn.channel()
    assert ch.queue_declare(name, durable=True, arguments=arguments).method.message_count == 0
    # Keys outside the stream's list are not compared.
    ok = ch.queue_declare(name, durable=True, arguments={**arguments, "x-custom": "other"})
    assert ok.method.queue == name


def test_inequivalent_redeclare(conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    conn.channel().queue_declare(name, durable=True, arguments={**STREAM, "x-max-age": "1D"})
    code, reply = channel_error(lambda: conn.channel().queue_declare(
        name, durable=True, arguments={**STREAM, "x-max-age": "2D"}))
    # rabbit_misc:assert_args_equivalence prints bare values when both sides have the key.
    assert (code, reply) == (406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for "
                                  f"{rs(name)}: received '2D' but current is '1D'")
    code, _reply = channel_error(lambda: conn.channel().queue_declare(name, durable=True))
    assert code == 406  # without x-queue-type the redeclare is not equivalent either


def test_consume_without_qos(target, conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    code, reply = channel_error(lambda: ch.basic_consume(name, lambda *a: None))
    assert code == 406
    if target[0] == "leveret":  # 3.10: "... is not set for '<rs>'"
        assert reply == ("PRECONDITION_FAILED - consumer prefetch count is not set for stream "
                         f"{rs(name)}")


def test_consume_with_auto_ack(target, conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    code, reply = connection_error(lambda: (ch.basic_consume(name, lambda *a: None, auto_ack=True),
                                            conn.process_data_events(1)))
    assert code == 540
    if target[0] == "leveret":  # 3.10: "... not supported by stream queues <rs>"
        assert reply == ("NOT_IMPLEMENTED - automatic acknowledgement not supported by stream "
                         f"{rs(name)}")


def test_consume_with_global_qos(conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    ch.basic_qos(prefetch_count=10, global_qos=True)
    code, reply = connection_error(lambda: (ch.basic_consume(name, lambda *a: None),
                                            conn.process_data_events(1)))
    assert (code, reply) == (540, f"NOT_IMPLEMENTED - {rs(name)} does not support global qos")


def test_consumer_argument_of_another_queue_type(conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    code, reply = channel_error(lambda: ch.basic_consume(name, lambda *a: None,
                                                         arguments={"x-priority": 5}))
    assert (code, reply) == (406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for "
                                  f"{rs(name)} of queue type rabbit_stream_queue")


def test_bad_offset(target, conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_qos(prefetch_count=10)
    if target[0] == "rabbitmq":
        pytest.skip("RabbitMQ 3.10 crashes the channel with 541 here; 4.x answers 406")
    code, reply = channel_error(lambda: ch.basic_consume(
        name, lambda *a: None, arguments={"x-stream-offset": "foo"}))
    term = '{invalid_stream_offset_arg,{longstr,<<"foo">>}}'
    assert (code, reply) == (406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for "
                                  f"{rs(name)}: {term}")


@pytest.mark.parametrize(("method", "text"), [
    ("basic_get", "basic.get not supported by stream queues {rs}"),
    ("queue_purge", "queue.purge not supported by stream queues {rs}"),
])
def test_get_and_purge_close_the_connection(conn, method: str, text: str) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    code, reply = connection_error(lambda: getattr(conn.channel(), method)(name))
    assert (code, reply) == (540, "NOT_IMPLEMENTED - " + text.format(rs=rs(name)))


def test_delete_ignores_if_unused_and_if_empty(conn) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_publish("", name, b"x")
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    cch.basic_consume(name, lambda *a: None)
    assert ch.queue_delete(name, if_unused=True, if_empty=True).method.message_count == 0


@pytest.mark.parametrize(("spec", "expected"), [
    ("first", [0, 1, 2, 3, 4]),
    (2, [2, 3, 4]),
    (-3, [0, 1, 2, 3, 4]),
    (5, []),
    (99, []),
    ("next", []),
])
def test_offsets_and_delivery_shape(conn, spec: Any, expected: list[int]) -> None:  # type: ignore[no-untyped-def]
    name = unique("s")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.exchange_declare(name, "direct")
    ch.queue_bind(name, name, "rk")
    for i in range(5):
        ch.basic_publish(name, "rk", b"%d" % i, pika.BasicProperties(
            content_type="text/plain", headers={"app": "test"}))
    got = consume(conn.channel(), name, len(expected) or 1, prefetch=10,
                  arguments={"x-stream-offset": spec}, timeout=3 if expected else 0.7)
    assert offsets(got) == expected
    for method, props, body in got:
        assert (method.exchange, method.routing_key, method.redelivered) == (name, "rk", False)
        assert props.content_type == "text/plain"
        assert props.headers["app"] == "test"
        assert body == b"%d" % props.headers["x-stream-offset"]


def test_nack_keeps_the_channel_and_the_message(target, conn) -> None:  # type: ignore[no-untyped-def]
    if target[0] == "rabbitmq":
        pytest.skip("RabbitMQ 3.10 closes the connection (540) on a stream nack; 3.13+ and 4.x "
                    "treat it as credit only, which Leveret follows")
    name = unique("s")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True, arguments=STREAM)
    ch.basic_publish("", name, b"x")
    got = consume(conn.channel(), name, 1, ack=False, arguments={"x-stream-offset": "first"})
    assert len(got) == 1
    cch = conn.channel()
    got = consume(cch, name, 1, ack=False, arguments={"x-stream-offset": "first"})
    cch.basic_nack(got[0][0].delivery_tag, requeue=True)
    cch.queue_declare(name, durable=True, arguments=STREAM)  # the channel is still open
    again = consume(conn.channel(), name, 2, arguments={"x-stream-offset": "first"}, timeout=0.7)
    assert len(again) == 1
