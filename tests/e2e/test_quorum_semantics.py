"""Quorum queues on one node: ordering, confirms, returns and their counts, the delivery
limit, dead lettering, priorities and RabbitMQ's refusals, against Leveret and RabbitMQ 3.10.8
alike (`mq`) where the two agree; `lev` where Leveret follows RabbitMQ 4.x and 3.10.8 answers
otherwise (each such test says how 3.10.8 differs; docs/QUORUM-QUEUES.md lists them).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import kombu
import pika
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from support.brokers import BrokerProcess

QUORUM = {"x-queue-type": "quorum"}


def declare(mq: Amqp, prefix: str = "qq", **arguments: Any) -> str:
    name = mq.uid(prefix)
    mq.channel().queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    return name


def get(ch: Any, queue: str) -> tuple[Any, Any, bytes]:
    method, props, body = ch.basic_get(queue)
    assert method is not None, f"{queue} is empty"
    return method, props, body


def test_fifo_with_confirms_get_and_consume(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel(confirm=True)
    for i in range(20):
        ch.basic_publish("", queue, f"m{i}".encode())  # confirmed: raises if nacked
    method = ch.queue_declare(queue, passive=True).method
    assert method.message_count == 20
    assert get(ch, queue)[2] == b"m0"
    bodies = []
    ch.basic_qos(prefetch_count=5)
    for method, _props, body in ch.consume(queue, inactivity_timeout=3):
        if method is None:
            break
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 19:
            break
    assert bodies == [f"m{i}".encode() for i in range(1, 20)]


def test_a_reject_with_requeue_counts_a_failed_delivery(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel(confirm=True)
    ch.basic_publish("", queue, b"a", pika.BasicProperties(headers={"k": "v"}))
    first, props, _ = get(ch, queue)
    # 4.3 adds no header to a first delivery; 3.10.8's basic.get adds x-delivery-count 0
    assert not first.redelivered and (props.headers or {}).get("x-delivery-count", 0) == 0
    ch.basic_reject(first.delivery_tag, requeue=True)
    again, props, body = get(ch, queue)
    assert body == b"a" and again.redelivered
    assert props.headers["x-delivery-count"] == 1 and props.headers["k"] == "v"
    ch.basic_reject(again.delivery_tag, requeue=True)
    assert get(ch, queue)[1].headers["x-delivery-count"] == 2


def test_a_closed_channel_counts_a_failed_delivery(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel(confirm=True)
    ch.basic_publish("", queue, b"a")
    taker = mq.connection().channel()
    assert get(taker, queue)[2] == b"a"
    taker.close()
    method, props, _ = get(ch, queue)
    assert method.redelivered
    assert props.headers["x-delivery-count"] == 1
    if mq.is_leveret:  # 4.3 (3.10.8 has no x-acquired-count)
        assert props.headers["x-acquired-count"] == 1


def test_basic_get_is_refused_with_single_active_consumer(mq: Amqp) -> None:
    queue = declare(mq, **{"x-single-active-consumer": True})
    ch = mq.channel()
    code, text = mq.soft_error(lambda: ch.basic_get(queue))
    assert code == 405
    assert text == (f"RESOURCE_LOCKED - cannot obtain access to locked queue '{queue}' in vhost"
                    " '/'. basic.get operations are not supported by quorum queues with single"
                    " active consumer")


def test_exclusive_consumers_are_not_enforced(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel()
    ch.basic_consume(queue, lambda *a: None, exclusive=True)
    ch.basic_consume(queue, lambda *a: None)
    other = mq.connection().channel()
    other.basic_consume(queue, lambda *a: None, exclusive=True)
    assert mq.counts(queue)[1] == 3


def test_reject_publish_takes_one_more_then_refuses_until_eighty_percent(mq: Amqp) -> None:
    queue = declare(mq, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    ch = mq.channel(confirm=True)
    outcomes = []
    for i in range(8):
        try:
            ch.basic_publish("", queue, b"%d" % i)
            outcomes.append("ack")
        except pika.exceptions.NackError:
            outcomes.append("nack")
    assert outcomes == ["ack"] * 6 + ["nack"] * 2
    assert mq.ready(queue) == 6
    for _ in range(1):  # 5 left: over 80% of 5 (4): still refused
        ch.basic_get(queue, auto_ack=True)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", queue, b"x")
    ch.basic_get(queue, auto_ack=True)  # 4 left: 80%: taken again
    ch.basic_publish("", queue, b"y")
    assert mq.drain(ch, queue) == [b"2", b"3", b"4", b"5", b"y"]


def test_reject_publish_dlx_is_drop_head(mq: Amqp) -> None:
    queue = declare(mq, **{"x-max-length": 2, "x-overflow": "reject-publish-dlx"})
    ch = mq.channel(confirm=True)
    for i in range(4):
        ch.basic_publish("", queue, b"%d" % i)  # all confirmed: the head is dropped
    assert mq.drain(ch, queue) == [b"2", b"3"]


def test_past_the_delivery_limit_a_message_is_dead_lettered(mq: Amqp) -> None:
    dlq = mq.uid("dlq")
    ch = mq.channel(confirm=True)
    ch.queue_declare(dlq)
    queue = declare(mq, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                           "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", queue, b"poison")
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=True)  # count 1: back
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=True)  # count 2 > 1: dead
    assert mq.wait(lambda: mq.ready(dlq) == 1)
    assert mq.ready(queue) == 0
    _method, props, body = get(ch, dlq)
    assert body == b"poison"
    death = props.headers["x-death"][0]
    assert death["reason"] == "delivery_limit" and death["queue"] == queue
    assert props.headers["x-first-death-reason"] == "delivery_limit"


def test_past_the_delivery_limit_without_a_dlx_a_message_is_dropped(mq: Amqp) -> None:
    queue = declare(mq, **{"x-delivery-limit": 0})
    ch = mq.channel(confirm=True)
    ch.basic_publish("", queue, b"x")
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=True)
    assert mq.wait(lambda: mq.ready(queue) == 0)
    assert ch.basic_get(queue)[0] is None


def test_global_qos_is_refused(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    code, text = mq.hard_error(lambda: ch.basic_consume(queue, lambda *a: None))
    assert code == 540
    assert text == (f"NOT_IMPLEMENTED - queue '{queue}' in vhost '/' does not support global qos")


@pytest.mark.parametrize("flag", ["if_unused", "if_empty"])
def test_delete_with_if_unused_or_if_empty_is_refused(mq: Amqp, flag: str) -> None:
    queue = declare(mq)
    ch = mq.channel()
    code, text = mq.hard_error(lambda: ch.queue_delete(queue, **{flag: True}))
    assert code == 540
    assert text == (
        f"NOT_IMPLEMENTED - cannot delete queue '{queue}' in vhost '/'. queue.delete operations"
        f" with {flag.replace('_', '-')} flag set are not supported by quorum queues")
    assert mq.exists("queue", queue)


def test_purge_and_delete_report_the_ready_messages(mq: Amqp) -> None:
    queue = declare(mq)
    ch = mq.channel(confirm=True)
    for i in range(3):
        ch.basic_publish("", queue, b"%d" % i)
    assert ch.queue_purge(queue).method.message_count == 3
    ch.basic_publish("", queue, b"z")
    assert ch.queue_delete(queue).method.message_count == 1


def test_transient_messages_are_kept(lev: Amqp, broker_process: BrokerProcess) -> None:
    """A quorum queue keeps every message: a transient one survives a kill -9 too."""
    amqp = type(lev)("leveret", broker_process.port)
    queue = declare(amqp)
    ch = amqp.channel(confirm=True)
    ch.basic_publish("", queue, b"transient", pika.BasicProperties(delivery_mode=1))
    amqp.close()
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    assert get(amqp.channel(), queue)[2] == b"transient"
    amqp.close()


def test_counts_survive_a_restart(lev: Amqp, broker_process: BrokerProcess) -> None:
    amqp = type(lev)("leveret", broker_process.port)
    queue = declare(amqp)
    ch = amqp.channel(confirm=True)
    ch.basic_publish("", queue, b"a")
    ch.basic_publish("", queue, b"b")
    for _ in range(3):
        ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=True)
    ch.basic_nack(get(ch, queue)[0].delivery_tag, requeue=True)
    amqp.close()
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    ch = amqp.channel()
    method, props, body = get(ch, queue)
    assert body == b"a" and method.redelivered
    assert props.headers["x-delivery-count"] == 3
    assert props.headers["x-acquired-count"] == 4
    assert get(ch, queue)[2] == b"b"
    amqp.close()


def test_a_message_given_as_it_arrives_comes_back_redelivered_after_a_restart(
        lev: Amqp, broker_process: BrokerProcess) -> None:
    """A consumer is waiting when the message arrives, takes it and dies with it unacked
    (kill -9 of the broker): the message was delivered, so it comes back `redelivered` (as a
    message taken from a backlog does: test_counts_survive_a_restart)."""
    amqp = type(lev)("leveret", broker_process.port)
    queue = declare(amqp)
    consumer = amqp.connection()
    got: list[bytes] = []
    consumer.channel().basic_consume(queue, lambda _c, _m, _p, body: got.append(body))
    amqp.channel(confirm=True).basic_publish("", queue, b"live")
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        consumer.process_data_events(time_limit=0.1)
    assert got == [b"live"]  # delivered, left unacked
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    method, props, body = get(amqp.channel(), queue)
    assert body == b"live"
    assert method.redelivered, "delivered before the kill, yet not flagged redelivered"
    # returned by the restart as RabbitMQ 4.3 returns a consumer that is down: acquired once,
    # and a failed delivery
    assert props.headers.get("x-acquired-count") == 1
    assert props.headers.get("x-delivery-count") == 1
    amqp.close()


def test_a_message_taken_again_after_a_return_counts_both_after_a_restart(
        lev: Amqp, broker_process: BrokerProcess) -> None:
    """Taken, nack'ed back (acquired once), taken again and held when the broker is killed:
    the log recorded the second delivery, so the restart counts its return too."""
    amqp = type(lev)("leveret", broker_process.port)
    queue = declare(amqp)
    ch = amqp.channel(confirm=True)
    ch.basic_publish("", queue, b"twice")
    ch.basic_nack(get(ch, queue)[0].delivery_tag, requeue=True)
    method, props, _ = get(ch, queue)
    assert method.redelivered and props.headers["x-acquired-count"] == 1
    ch.basic_qos(prefetch_count=1)  # a round trip: the get's record is written by now
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    method, props, body = get(amqp.channel(), queue)
    assert body == b"twice" and method.redelivered
    assert props.headers["x-acquired-count"] == 2
    assert props.headers["x-delivery-count"] == 1  # the restart's; the nack is no failure
    amqp.close()


# -- RabbitMQ 4.x, where 3.10.8 answers otherwise ------------------------------------------------


def test_nack_and_recover_count_acquisitions_only(lev: Amqp) -> None:
    """4.3 (#15387): basic.nack and basic.recover return a message without a failed delivery,
    so they never reach the delivery limit (3.10.8 counts every return in x-delivery-count
    and has no x-acquired-count)."""
    queue = declare(lev, **{"x-delivery-limit": 0})
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"a")
    for _ in range(3):
        ch.basic_nack(get(ch, queue)[0].delivery_tag, requeue=True)
    get(ch, queue)
    ch.basic_recover(requeue=True)
    method, props, _ = get(ch, queue)
    assert method.redelivered
    assert "x-delivery-count" not in props.headers
    assert props.headers["x-acquired-count"] == 4
    ch.basic_reject(method.delivery_tag, requeue=True)  # the first failed one: over 0
    assert ch.basic_get(queue)[0] is None


def test_the_default_delivery_limit_is_twenty(lev: Amqp) -> None:
    """4.x: 20 by default (3.10.8: no limit unless one is set)."""
    queue = declare(lev)
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"p")
    for count in range(21):
        method, props, _ = get(ch, queue)
        assert (props.headers or {}).get("x-delivery-count", 0) == count
        ch.basic_reject(method.delivery_tag, requeue=True)
    assert ch.basic_get(queue)[0] is None


def test_a_negative_delivery_limit_disables_it(lev: Amqp) -> None:
    queue = declare(lev, **{"x-delivery-limit": -1})
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"p")
    for _ in range(25):
        ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=True)
    assert get(ch, queue)[1].headers["x-delivery-count"] == 25


def test_a_requeued_message_goes_before_every_priority(lev: Amqp) -> None:
    """4.3's returns queue: a requeued message is served first."""
    queue = declare(lev)
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"low", pika.BasicProperties(priority=1))
    taken = get(ch, queue)[0]
    ch.basic_publish("", queue, b"high", pika.BasicProperties(priority=30))
    ch.basic_reject(taken.delivery_tag, requeue=True)
    assert lev.drain(ch, queue) == [b"low", b"high"]


def test_single_active_consumer_prefers_the_highest_priority(lev: Amqp) -> None:
    """4.3: a consumer of a higher x-priority takes over once the active one has settled
    what it holds (3.10.8 keeps the first consumer active)."""
    queue = declare(lev, **{"x-single-active-consumer": True})
    ch = lev.channel(confirm=True)
    got: list[tuple[str, bytes]] = []
    low = lev.connection().channel()
    low.basic_qos(prefetch_count=1)
    held: list[Any] = []

    def on_low(channel: Any, method: Any, _p: Any, body: bytes) -> None:
        got.append(("low", body))
        held.append(method.delivery_tag)

    low.basic_consume(queue, on_low)
    ch.basic_publish("", queue, b"1")
    lev.wait(lambda: (low.connection.process_data_events(0.05), got)[1])
    high = lev.connection().channel()
    high.basic_consume(queue, lambda c, m, p, b: (got.append(("high", b)),
                                                  c.basic_ack(m.delivery_tag)),
                       arguments={"x-priority": 5})
    ch.basic_publish("", queue, b"2")
    high.connection.process_data_events(0.3)
    assert got == [("low", b"1")]  # the low one still holds 1: "2" waits
    low.basic_ack(held[0])
    lev.wait(lambda: (low.connection.process_data_events(0.05),
                      high.connection.process_data_events(0.05), len(got) == 2)[2])
    assert got == [("low", b"1"), ("high", b"2")]


def test_priorities_are_strict_and_no_priority_means_four(lev: Amqp) -> None:
    """4.x: 32 strict levels, no x-max-priority (3.10.8 ignores priorities)."""
    queue = declare(lev)
    ch = lev.channel(confirm=True)
    for body, priority in [(b"none", None), (b"p9", 9), (b"p0", 0), (b"p4", 4),
                           (b"p99", 99), (b"p5", 5), (b"none2", None), (b"p3", 3)]:
        ch.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    assert lev.drain(ch, queue) == [b"p99", b"p9", b"p5", b"none", b"p4", b"none2",
                                   b"p3", b"p0"]


def test_priorities_survive_a_restart_and_paging(lev: Amqp, broker_process: BrokerProcess
                                                 ) -> None:
    """More messages than a page at the default level, a few above and below it, read back
    from the log after a kill -9 in priority order."""
    amqp = type(lev)("leveret", broker_process.port)
    queue = declare(amqp)
    ch = amqp.channel()
    ch.confirm_delivery()
    for i in range(3000):
        priority = 7 if i % 1000 == 500 else (1 if i % 1000 == 600 else None)
        ch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(priority=priority))
    amqp.close()
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    got = amqp.drain(amqp.channel(), queue)
    high = [b"500", b"1500", b"2500"]
    low = [b"600", b"1600", b"2600"]
    assert got[:3] == high and got[-3:] == low
    assert got[3:-3] == [b"%d" % i for i in range(3000) if b"%d" % i not in high + low]
    amqp.close()


# -- other clients ------------------------------------------------------------------------------


def test_aio_pika_round_trip(mq: Amqp) -> None:
    async def scenario() -> list[tuple[bytes, bool, Any]]:
        connection = await aio_pika.connect(mq.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            name = mq.uid("aio")
            queue = await channel.declare_queue(name, durable=True, arguments=QUORUM)
            for body in (b"one", b"two"):
                await channel.default_exchange.publish(aio_pika.Message(body), routing_key=name)
            seen = []
            async with queue.iterator() as messages:
                async for message in messages:
                    seen.append((message.body, message.redelivered,
                                 message.headers.get("x-delivery-count")))
                    if len(seen) == 1:
                        await message.reject(requeue=True)
                    else:
                        await message.ack()
                    if len(seen) == 3:
                        break
            return seen

    seen = asyncio.run(scenario())
    assert seen == [(b"one", False, None), (b"two", False, None), (b"one", True, 1)]


def test_kombu_round_trip(mq: Amqp) -> None:
    name = mq.uid("kombu")
    queue = kombu.Queue(name, routing_key=name, exchange=kombu.Exchange("", type="direct"),
                        durable=True, queue_arguments=QUORUM)
    with kombu.Connection(mq.url) as connection:
        producer = connection.Producer()
        producer.publish({"n": 1}, routing_key=name, declare=[queue], serializer="json")
        received: list[Any] = []

        def on_message(body: Any, message: Any) -> None:
            received.append((body, message.headers.get("x-delivery-count")))
            if len(received) == 1:
                message.requeue()
            else:
                message.ack()

        with connection.Consumer(queue, callbacks=[on_message]):
            while len(received) < 2:
                connection.drain_events(timeout=5)
    assert received == [({"n": 1}, None), ({"n": 1}, 1)]


# -- at-least-once dead lettering ----------------------------------------------------------------


def at_least_once(mq: Amqp, dlx: str) -> str:
    return declare(mq, **{"x-dead-letter-exchange": dlx, "x-dead-letter-strategy":
                          "at-least-once", "x-overflow": "reject-publish"})


def test_at_least_once_dead_letters_reach_their_target(mq: Amqp) -> None:
    dlx, target = mq.uid("dlx"), mq.uid("target")
    ch = mq.channel(confirm=True)
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(target, durable=True, arguments=QUORUM)
    ch.queue_bind(target, dlx)
    queue = at_least_once(mq, dlx)
    ch.basic_publish("", queue, b"dead")
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=False)
    assert mq.wait(lambda: mq.ready(target) == 1)
    _method, props, body = get(ch, target)
    assert body == b"dead" and props.headers["x-death"][0]["reason"] == "rejected"
    assert mq.ready(queue) == 0


def test_an_unroutable_dead_letter_waits_for_a_route(lev: Amqp) -> None:
    """At least once, a dead letter no queue takes stays in its queue and goes as soon as a
    route exists (at most once, it would be lost)."""
    dlx, target = lev.uid("dlx"), lev.uid("target")
    ch = lev.channel(confirm=True)
    ch.exchange_declare(dlx, "fanout")
    queue = at_least_once(lev, dlx)
    ch.basic_publish("", queue, b"kept")
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=False)
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, dlx)
    assert lev.wait(lambda: lev.ready(target) == 1, timeout=5)
    assert get(ch, target)[2] == b"kept"


def test_held_dead_letters_survive_a_restart(lev: Amqp, broker_process: BrokerProcess) -> None:
    amqp = type(lev)("leveret", broker_process.port)
    dlx, target = amqp.uid("dlx"), amqp.uid("target")
    ch = amqp.channel(confirm=True)
    ch.exchange_declare(dlx, "fanout", durable=True)
    queue = at_least_once(amqp, dlx)
    for body in (b"one", b"two"):
        ch.basic_publish("", queue, body)
    for _ in range(2):
        ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=False)
    assert ch.basic_get(queue)[0] is None  # held, not ready
    amqp.close()
    broker_process.kill()
    broker_process.start()
    amqp = type(lev)("leveret", broker_process.port)
    ch = amqp.channel()
    assert ch.basic_get(queue)[0] is None  # still held after the restart
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, dlx)
    assert amqp.wait(lambda: amqp.ready(target) == 2, timeout=5)
    assert amqp.drain(ch, target) == [b"one", b"two"]
    amqp.close()


def test_at_least_once_needs_reject_publish(lev: Amqp) -> None:
    """With drop-head, at-least-once falls back to at-most-once (RabbitMQ logs a warning):
    an unroutable dead letter is lost."""
    dlx, target = lev.uid("dlx"), lev.uid("target")
    ch = lev.channel(confirm=True)
    ch.exchange_declare(dlx, "fanout")
    queue = declare(lev, **{"x-dead-letter-exchange": dlx,
                            "x-dead-letter-strategy": "at-least-once"})
    ch.basic_publish("", queue, b"lost")
    ch.basic_reject(get(ch, queue)[0].delivery_tag, requeue=False)
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, dlx)
    time.sleep(1.5)
    assert lev.ready(target) == 0 and lev.ready(queue) == 0


# -- consumer timeout (RabbitMQ 4.3: the queue's; 3.10.8 has only the channel's global one) ------


def test_a_consumer_past_its_timeout_is_cancelled_and_its_message_returns(lev: Amqp) -> None:
    """x-consumer-timeout on the queue: the consumer that holds a delivery too long gets
    basic.cancel (pika announces consumer_cancel_notify), the delivery goes back (counted
    as an acquisition, not a failure), and the channel stays open."""
    queue = declare(lev, **{"x-consumer-timeout": 1000})
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"slow")
    conn = lev.connection()
    slow = conn.channel()
    cancelled: list[Any] = []
    held: list[int] = []
    slow.add_on_cancel_callback(cancelled.append)
    slow.basic_consume(queue, lambda c, m, p, b: held.append(m.delivery_tag))
    lev.wait(lambda: (conn.process_data_events(0.05), cancelled)[1], timeout=5)
    assert held and slow.is_open
    method, props, body = get(ch, queue)
    assert body == b"slow" and method.redelivered
    assert props.headers["x-acquired-count"] == 1 and "x-delivery-count" not in props.headers
    slow.basic_ack(held[0])  # a late ack of a delivery given back: dropped, no error
    conn.process_data_events(0.2)
    assert slow.is_open


def test_the_consumers_own_timeout_wins(lev: Amqp) -> None:
    queue = declare(lev, **{"x-consumer-timeout": 100})
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"patient")
    conn = lev.connection()
    patient = conn.channel()
    cancelled: list[Any] = []
    patient.add_on_cancel_callback(cancelled.append)
    patient.basic_consume(queue, lambda *a: None, arguments={"x-consumer-timeout": 60_000})
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        conn.process_data_events(0.1)
    assert not cancelled and lev.counts(queue) == (0, 1)


def test_a_basic_get_past_the_timeout_closes_the_channel(lev: Amqp) -> None:
    queue = declare(lev, **{"x-consumer-timeout": 500})
    ch = lev.channel(confirm=True)
    ch.basic_publish("", queue, b"got")
    conn = lev.connection()
    getter = conn.channel()
    assert get(getter, queue)[2] == b"got"
    lev.wait(lambda: (conn.process_data_events(0.05), getter.is_closed)[1], timeout=5)
    reason = getter._closing_reason  # pika keeps the broker's channel.close here
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker)
    assert reason.reply_code == 406
    assert reason.reply_text == (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel {getter.channel_number} "
        "timed out. Timeout value used: -1 ms. This timeout value can be configured, see "
        "consumers doc guide to learn more")
    assert get(ch, queue)[2] == b"got"
