"""Quorum queues on one node: the order in which a waiting consumer receives messages.

Messages committed together (one transaction's publishes are written and committed in one
batch) that find no ready message go straight to the consumers (QuorumQueue's
`_deliver_ready`): they must leave as the queue's store would hand them out, by priority, with
expired messages dead-lettered. `lev`: RabbitMQ 3.10.8 ignores priorities on quorum queues
(docs/QUORUM-QUEUES.md). A multiple ack, which settles its deliveries at once
(`settled_many`), against both brokers (`mq`). And a long queue, read back from its log while
it is published to.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
import pytest
from support.brokers import BrokerProcess

if TYPE_CHECKING:
    from e2e.conftest import Amqp

QUORUM = {"x-queue-type": "quorum"}


def consume(lev: Amqp, queue: str, prefetch: int = 100) -> tuple[Any, list[bytes]]:
    """A consumer with acks waiting on `queue` on a connection of its own: its channel, and
    the bodies it receives, in order."""
    ch = lev.connection().channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[bytes] = []

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message)
    return ch, got


def publish_together(lev: Amqp, queue: str, messages: list[tuple[bytes, Any]]) -> None:
    """Publish in one transaction: routed in one turn, so written and committed in one batch."""
    ch = lev.channel()
    ch.tx_select()
    for body, properties in messages:
        ch.basic_publish("", queue, body, properties)
    ch.tx_commit()


def received(lev: Amqp, ch: Any, got: list[bytes], count: int) -> list[bytes]:
    lev.wait(lambda: (ch.connection.process_data_events(0.05), len(got) >= count)[1])
    ch.connection.process_data_events(0.2)  # and nothing more
    return got


def test_a_batch_committed_together_reaches_a_waiting_consumer_by_priority(lev: Amqp) -> None:
    queue = lev.uid("qq")
    lev.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    ch, got = consume(lev, queue)
    publish_together(lev, queue, [
        (b"p1", pika.BasicProperties(priority=1)), (b"none", None),
        (b"p9", pika.BasicProperties(priority=9)), (b"p5", pika.BasicProperties(priority=5))])
    assert received(lev, ch, got, 4) == [b"p9", b"p5", b"none", b"p1"]


def test_a_batch_at_one_priority_reaches_a_waiting_consumer_in_order(lev: Amqp) -> None:
    queue = lev.uid("qq")
    lev.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    ch, got = consume(lev, queue, prefetch=3)  # three now, the rest as acks come
    bodies = [f"m{i}".encode() for i in range(10)]
    publish_together(lev, queue, [(body, None) for body in bodies])
    assert received(lev, ch, got, 10) == bodies


def test_an_expired_message_of_a_batch_is_dead_lettered_not_delivered(lev: Amqp) -> None:
    queue, dead = lev.uid("qq"), lev.uid("dead")
    setup = lev.channel()
    setup.queue_declare(dead, durable=True)
    setup.queue_declare(queue, durable=True, arguments={
        **QUORUM, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    ch, got = consume(lev, queue)
    publish_together(lev, queue, [
        (b"expired", pika.BasicProperties(expiration="0")), (b"live", None),
        (b"expired too", pika.BasicProperties(expiration="0"))])
    assert received(lev, ch, got, 1) == [b"live"]
    assert lev.wait(lambda: lev.ready(dead) == 2)
    assert lev.drain(setup, dead) == [b"expired", b"expired too"]


def test_a_multiple_ack_lets_a_rejecting_queue_take_publishes_again(mq: Amqp) -> None:
    """reject-publish refuses until the queue is back at 80% of its limit; deliveries settled
    by one multiple ack count as each one's ack would."""
    queue = mq.uid("qq")
    mq.channel().queue_declare(queue, durable=True, arguments={
        **QUORUM, "x-max-length": 5, "x-overflow": "reject-publish"})
    ch = mq.channel(confirm=True)
    for i in range(6):  # one more than the limit, then refused
        ch.basic_publish("", queue, b"%d" % i)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", queue, b"refused")
    tags = [ch.basic_get(queue)[0].delivery_tag for _ in range(2)]
    ch.basic_ack(tags[-1], multiple=True)  # 4 left: 80%
    ch.basic_publish("", queue, b"taken")
    assert mq.drain(ch, queue) == [b"2", b"3", b"4", b"5", b"taken"]


def test_a_long_queue_consumed_while_publishing_delivers_each_message_once_in_order(
        tmp_path: Path) -> None:
    """Past a page of ready messages the rest wait in the log and are read back as the head
    drains, while new ones keep being written and committed (with `queue_fsync = always`,
    reading back commits what is written first, which delivers it or adds it to what is read
    back): each message arrives once, in order."""
    broker = BrokerProcess(tmp_path / "data", env={"LEVERET_QUEUE_FSYNC": "always"})
    broker.start()
    try:
        received = consume_while_publishing(broker.port, 20_000)
    finally:
        broker.kill()
    assert received == list(range(20_000))


def consume_while_publishing(port: int, count: int) -> list[int]:
    """A quorum queue: `count` messages published (without confirms, as fast as they go) on
    one connection while a consumer takes them on another (prefetch 100, a multiple ack
    every 50). What the consumer received, in order."""
    params = pika.ConnectionParameters("127.0.0.1", port)
    consumer = pika.BlockingConnection(params)
    ch = consumer.channel()
    ch.queue_declare("long", durable=True, arguments=QUORUM)
    ch.basic_qos(prefetch_count=100)

    def publish() -> None:
        publisher = pika.BlockingConnection(params)
        out = publisher.channel()
        for i in range(count):
            out.basic_publish("", "long", b"%d" % i)
        publisher.close()

    thread = threading.Thread(target=publish)
    thread.start()
    got: list[int] = []
    try:
        for method, _props, body in ch.consume("long", inactivity_timeout=10):
            if method is None:
                break
            got.append(int(body))
            if len(got) % 50 == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)
            if len(got) == count:
                break
    finally:
        thread.join()
        consumer.close()
    return got
