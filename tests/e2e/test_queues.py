"""queue.declare / bind / unbind / purge / delete with RabbitMQ's semantics and error texts,
against Leveret and RabbitMQ alike (`mq`); a few through aio-pika and kombu."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import aio_pika
import kombu
import pika
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp


def locked(queue: str) -> tuple[int, str]:
    return (
        405,
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in vhost "
        "'/'. It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration.",
    )


def test_server_named_queue_and_last_declared_queue(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    assert mq.soft_error(lambda: ch.queue_purge("")) == (
        404,
        "NOT_FOUND - no previously declared queue",
    )
    ch = mq.channel(confirm=True)
    declared = ch.queue_declare("", exclusive=True).method
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", declared.queue)
    assert (declared.message_count, declared.consumer_count) == (0, 0)
    # An empty queue name means the channel's last declared queue; queue.bind with an empty
    # queue AND an empty routing key binds with the queue's name as the key.
    ch.queue_bind("", "amq.direct", "")
    ch.basic_publish("amq.direct", declared.queue, b"by-name")
    ch.basic_publish("", declared.queue, b"default")
    # A passive declare of "" is not "the last queue": RabbitMQ looks for a queue named "".
    assert mq.soft_error(lambda: ch.queue_declare("", passive=True)) == (
        404,
        "NOT_FOUND - no queue '' in vhost '/'",
    )
    ch = mq.channel(confirm=True)
    ch.queue_declare(declared.queue, passive=True)  # sets the last queue again
    method, _props, body = ch.basic_get("", auto_ack=True)
    assert (body, method.message_count) == (b"by-name", 1)
    assert ch.queue_purge("").method.message_count == 1
    ch.queue_unbind(declared.queue, "amq.direct", declared.queue)
    assert ch.queue_delete("").method.message_count == 0
    assert not mq.exists("queue", declared.queue)


def test_names_up_to_255_bytes(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    name = mq.uid("q") + "€" * 80  # multi-byte: the limit is in bytes
    name += "x" * (255 - len(name.encode()))
    assert len(name.encode()) == 255
    assert ch.queue_declare(name, exclusive=True).method.queue == name
    ch.basic_publish("", name, b"m")
    assert mq.drain(ch, name) == [b"m"]


def test_amq_prefix_is_reserved(mq: Amqp) -> None:
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.queue_declare("amq.custom")) == (
        403,
        "ACCESS_REFUSED - queue name 'amq.custom' contains reserved prefix 'amq.*'",
    )
    ch = mq.channel()
    generated = ch.queue_declare("", exclusive=True).method.queue
    # A non-passive redeclare of a server-named queue is refused too; passive works.
    assert ch.queue_declare(generated, passive=True).method.queue == generated
    assert mq.soft_error(lambda: ch.queue_declare(generated, exclusive=True)) == (
        403,
        f"ACCESS_REFUSED - queue name '{generated}' contains reserved prefix 'amq.*'",
    )


def test_passive_declare_of_a_missing_queue(mq: Amqp) -> None:
    ch = mq.channel()
    name = mq.uid("missing")
    assert mq.soft_error(lambda: ch.queue_declare(name, passive=True)) == (
        404,
        f"NOT_FOUND - no queue '{name}' in vhost '/'",
    )


@pytest.mark.parametrize(
    ("redeclare", "received", "current", "field"),
    [
        ({"durable": True}, "'true'", "'false'", "durable"),
        ({"auto_delete": True}, "'true'", "'false'", "auto_delete"),
        ({"arguments": {"x-message-ttl": 2000, "x-max-length": 5}}, "'2000'", "'1000'",
         "x-message-ttl"),
        ({"arguments": {"x-max-length": 5}}, "none", "the value '1000' of type 'signedint'",
         "x-message-ttl"),
        ({"arguments": {"x-message-ttl": 1000}}, "none", "the value '5' of type 'signedint'",
         "x-max-length"),
        ({"arguments": {"x-message-ttl": 1000, "x-max-length": 5, "x-expires": 10000}},
         "the value '10000' of type 'signedint'", "none", "x-expires"),
        ({"arguments": {"x-message-ttl": "1000", "x-max-length": 5}}, "'1000'", "'1000'",
         "x-message-ttl"),
    ],
)  # fmt: skip
def test_redeclare_must_be_equivalent(
    mq: Amqp, redeclare: dict[str, object], received: str, current: str, field: str
) -> None:
    ch = mq.channel()
    queue = mq.uid("q")
    ch.queue_declare(queue, arguments={"x-message-ttl": 1000, "x-max-length": 5})
    assert mq.soft_error(lambda: ch.queue_declare(queue, **redeclare)) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg '{field}' for queue '{queue}' in vhost '/': "
        f"received {received} but current is {current}",
    )


def test_equivalent_redeclares(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = mq.uid("q")
    ch.queue_declare(queue, arguments={"x-max-length": 5})
    ch.basic_publish("", queue, b"m")
    same = [
        {"arguments": {"x-max-length": 5}},
        {"arguments": {"x-max-length": 5, "x-queue-type": "classic"}},  # classic == absent
        {"arguments": {"x-max-length": 5, "not-an-x-arg": 1}},  # unknown keys: not compared
    ]
    for kwargs in same:
        declared = ch.queue_declare(queue, **kwargs).method
        assert (declared.queue, declared.message_count) == (queue, 1)


def test_exclusive_queue_is_locked_for_other_connections(mq: Amqp) -> None:
    owner = mq.connection().channel()
    queue = mq.uid("excl")
    owner.queue_declare(queue, exclusive=True)
    owner.queue_bind(queue, "amq.direct", "bound")
    other = mq.connection()
    attempts = [
        lambda ch: ch.queue_declare(queue),
        lambda ch: ch.queue_declare(queue, passive=True),
        lambda ch: ch.queue_declare(queue, exclusive=True),
        lambda ch: ch.queue_declare(queue, durable=True),  # exclusivity is checked first
        lambda ch: ch.basic_get(queue),
        lambda ch: ch.basic_consume(queue, lambda *_: None),
        lambda ch: ch.queue_purge(queue),
        lambda ch: ch.queue_delete(queue),
        lambda ch: ch.queue_bind(queue, "amq.direct", "k"),
        lambda ch: ch.queue_unbind(queue, "amq.direct", "bound"),
    ]
    for attempt in attempts:
        ch = other.channel()
        assert mq.soft_error(lambda: attempt(ch)) == locked(queue)  # noqa: B023
    # Unbinding what was never bound does not look at the queue at all.
    other.channel().queue_unbind(queue, "amq.direct", "never-bound")
    # Publishing to it is allowed.
    publisher = other.channel()
    publisher.confirm_delivery()
    publisher.basic_publish("", queue, b"from-other")
    assert mq.drain(owner, queue) == [b"from-other"]


def test_exclusive_flag_must_match_on_the_same_connection(mq: Amqp) -> None:
    ch = mq.channel()
    excl, shared = mq.uid("excl"), mq.uid("shared")
    ch.queue_declare(excl, exclusive=True)
    assert mq.soft_error(lambda: ch.queue_declare(excl)) == locked(excl)
    ch = mq.channel()
    ch.queue_declare(shared)
    assert mq.soft_error(lambda: ch.queue_declare(shared, exclusive=True)) == locked(shared)


def test_exclusive_queue_is_deleted_with_its_connection(mq: Amqp) -> None:
    conn = mq.connection()
    ch = conn.channel()
    named = ch.queue_declare(mq.uid("excl"), exclusive=True).method.queue
    generated = ch.queue_declare("", exclusive=True).method.queue
    conn.close()
    assert mq.wait(lambda: not mq.exists("queue", named) and not mq.exists("queue", generated))


def test_auto_delete_queue(mq: Amqp) -> None:
    ch = mq.channel()
    queue = mq.uid("auto")
    ch.queue_declare(queue, auto_delete=True)
    assert mq.exists("queue", queue)  # never consumed: stays
    first = ch.basic_consume(queue, lambda *_: None)
    second = ch.basic_consume(queue, lambda *_: None)
    ch.basic_cancel(first)
    assert mq.exists("queue", queue)  # one consumer left
    ch.basic_cancel(second)
    assert mq.wait(lambda: not mq.exists("queue", queue))
    # The same when the consumer's channel closes.
    other = mq.channel()
    again = mq.uid("auto")
    other.queue_declare(again, auto_delete=True)
    other.basic_consume(again, lambda *_: None)
    other.close()
    assert mq.wait(lambda: not mq.exists("queue", again))


def test_declare_ok_counts(mq: Amqp) -> None:
    publisher = mq.channel(confirm=True)
    queue = publisher.queue_declare("", exclusive=True).method.queue
    for i in range(4):
        publisher.basic_publish("", queue, str(i).encode())
    publisher.basic_get(queue)  # one unacked: not counted
    consumers = mq.channel()
    consumers.basic_qos(prefetch_count=1)
    consumers.basic_consume(queue, lambda *_: None)
    consumers.basic_consume(queue, lambda *_: None)
    consumers.connection.process_data_events(0.1)
    declared = mq.wait(
        lambda: (m := publisher.queue_declare(queue, passive=True).method).message_count == 1 and m
    )
    assert (declared.message_count, declared.consumer_count) == (1, 2)


def test_bind_and_unbind(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, "amq.topic", "a.*")
    ch.queue_bind(queue, "amq.headers", "", {"x-match": "any", "k": 1})
    ch.basic_publish("amq.topic", "a.b", b"topic")
    ch.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"k": 1}))
    assert mq.drain(ch, queue) == [b"topic", b"headers"]
    ch.queue_unbind(queue, "amq.topic", "a.*")
    ch.queue_unbind(queue, "amq.headers", "", {"x-match": "any", "k": 2})  # not that one
    ch.basic_publish("amq.topic", "a.b", b"topic")
    ch.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"k": 1}))
    assert mq.drain(ch, queue) == [b"headers"]
    ch.queue_unbind(queue, "amq.headers", "", {"x-match": "any", "k": 1})
    ch.queue_unbind(queue, "amq.topic", "never-bound")  # unbind-ok
    ch.queue_unbind(queue, mq.uid("missing"), "k")  # a missing exchange: unbind-ok too
    ch.queue_unbind(mq.uid("missing"), "amq.topic", "k")  # and a missing queue


def test_bind_errors(mq: Amqp) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    missing_x, missing_q = mq.uid("missing-x"), mq.uid("missing-q")
    assert mq.soft_error(lambda: ch.queue_bind(queue, missing_x, "k")) == (
        404,
        f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'",
    )
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.queue_bind(missing_q, "amq.direct", "k")) == (
        404,
        f"NOT_FOUND - no queue '{missing_q}' in vhost '/'",
    )
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.queue_bind(missing_q, missing_x, "k")) == (
        404,
        f"NOT_FOUND - no exchange '{missing_x}' in vhost '/'",
    )


def test_purge(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", queue, str(i).encode())
    ch.basic_get(queue)  # unacked messages are not purged
    assert ch.queue_purge(queue).method.message_count == 2
    assert ch.queue_purge(queue).method.message_count == 0
    ch.basic_recover(requeue=True)
    assert mq.drain(ch, queue) == [b"0"]
    missing = mq.uid("missing")
    assert mq.soft_error(lambda: ch.queue_purge(missing)) == (
        404,
        f"NOT_FOUND - no queue '{missing}' in vhost '/'",
    )


def test_delete_conditions(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    queue = mq.uid("q")
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"m")
    assert mq.soft_error(lambda: ch.queue_delete(queue, if_empty=True)) == (
        406,
        f"PRECONDITION_FAILED - queue '{queue}' in vhost '/' not empty",
    )
    consumer = mq.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(queue, lambda *_: None)
    ch = mq.channel()
    assert mq.soft_error(lambda: ch.queue_delete(queue, if_unused=True)) == (
        406,
        f"PRECONDITION_FAILED - queue '{queue}' in vhost '/' in use",
    )
    consumer.close()  # the unacked message goes back
    mq.wait(lambda: mq.counts(queue) == (1, 0))
    ch = mq.channel()
    assert ch.queue_delete(queue, if_unused=True, if_empty=False).method.message_count == 1
    assert ch.queue_delete(queue).method.message_count == 0  # missing: delete-ok, 0


def test_delete_cancels_consumers(mq: Amqp) -> None:
    conn = mq.connection()
    ch = conn.channel()
    queue = mq.uid("q")
    ch.queue_declare(queue)
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(queue, lambda *_: None, consumer_tag="doomed")
    mq.channel().queue_delete(queue)
    mq.wait(lambda: conn.process_data_events(0.05) or cancelled)
    assert cancelled == ["doomed"]
    assert ch.is_open  # a server-sent basic.cancel does not close the channel


async def test_aio_pika_queue_lifecycle(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        assert queue.name.startswith("amq.gen-")
        await queue.bind("amq.fanout")
        await channel.default_exchange.publish(aio_pika.Message(b"1"), queue.name)
        await channel.get_exchange("amq.fanout")
        fanout = await channel.get_exchange("amq.fanout")
        await fanout.publish(aio_pika.Message(b"2"), "")
        again = await channel.declare_queue(queue.name, passive=True)
        assert again.declaration_result.message_count == 2
        assert await queue.purge() is not None
        await queue.unbind("amq.fanout")
        await queue.delete(if_unused=True, if_empty=True)
        other = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as info:
            await other.declare_queue(queue.name, passive=True)
        assert info.value.args[0] == f"NOT_FOUND - no queue '{queue.name}' in vhost '/'"


def test_kombu_queue_declare_purge_delete(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.channel()
        queue = kombu.Queue("k-queue", kombu.Exchange("k-ex", "direct"), "rk", channel=channel)
        queue.declare()
        producer = kombu.Producer(channel)
        for i in range(3):
            producer.publish({"n": i}, exchange="k-ex", routing_key="rk")
        assert queue.queue_declare(passive=True).message_count == 3
        assert queue.purge() == 3
        queue.delete()
        with pytest.raises(conn.channel_errors) as info:
            queue.queue_declare(passive=True)
        assert "NOT_FOUND - no queue 'k-queue' in vhost '/'" in str(info.value)
