"""Durable classic queues across restarts of a real `leveret serve`: clean stop and kill -9."""

from __future__ import annotations

import os
from pathlib import Path

import pika
import pytest
from support.amqp import connect, drain
from support.brokers import BrokerProcess

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def get_all(ch, queue: str) -> list[tuple[bytes, bool]]:  # type: ignore[no-untyped-def]
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


@pytest.mark.parametrize("stop", ["clean", "kill-9"])
def test_persistent_messages_survive_with_order_and_redelivered_flag(
        broker_process: BrokerProcess, stop: str) -> None:
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dq", durable=True)
    ch.queue_declare("transient-q", durable=False)
    for i in range(10):
        ch.basic_publish("", "dq", b"p%d" % i, PERSISTENT)
        ch.basic_publish("", "dq", b"t%d" % i, TRANSIENT)
    ch.basic_publish("", "transient-q", b"gone", PERSISTENT)
    # Take p0, t0, p1: ack p0; leave t0 and p1 unacked (p1 comes back redelivered).
    taken = [ch.basic_get("dq") for _ in range(3)]
    assert [body for _m, _p, body in taken] == [b"p0", b"t0", b"p1"]
    ch.basic_ack(taken[0][0].delivery_tag)
    drain(conn, lambda: False, 0.3)
    if stop == "clean":
        conn.close()
        assert broker_process.stop() == 0
    else:
        broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    ch = conn.channel()
    assert ch.queue_declare("dq", durable=True).method.message_count == 9
    # In order, p1 flagged as redelivered; the transient t0..t9 are gone.
    assert get_all(ch, "dq") == [(b"p1", True)] + [(b"p%d" % i, False) for i in range(2, 10)]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("transient-q", passive=True)  # transient queues are gone
    conn.close()


def test_paged_out_messages_keep_their_redelivered_flag_and_acks_after_kill_9(
        broker_process: BrokerProcess) -> None:
    """Past the first page, a restarted queue reads its messages back from the log a page at
    a time: those delivered before the kill come back redelivered, the acked ones not at all,
    in chunks that hold all three kinds."""
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.queue_declare("paged", durable=True)
    for i in range(5000):  # no confirms: many messages to a chunk
        ch.basic_publish("", "paged", b"%05d" % i, PERSISTENT)
    assert ch.queue_declare("paged", passive=True).method.message_count == 5000
    ch.basic_qos(prefetch_count=3000)
    tags = []
    for method, _props, _body in ch.consume("paged", inactivity_timeout=10):
        assert method is not None, "fewer than 3,000 deliveries"
        tags.append(method.delivery_tag)
        if len(tags) == 3000:
            break
    ch.cancel()  # no more deliveries once the acks open the prefetch window
    acked = set(range(2200, 3000, 3))
    for index in sorted(acked):
        ch.basic_ack(tags[index])
    drain(conn, lambda: False, 0.3)
    broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    ch = conn.channel()
    expected = [(b"%05d" % i, i < 3000) for i in range(5000) if i not in acked]
    assert ch.queue_declare("paged", durable=True).method.message_count == len(expected)
    assert get_all(ch, "paged") == expected
    conn.close()


def test_fully_acked_segments_are_deleted(broker_process: BrokerProcess) -> None:
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("big", durable=True)
    body = b"x" * 100_000
    for _ in range(400):  # 40 MB: several 16 MB segments
        ch.basic_publish("", "big", body, PERSISTENT)
    data = broker_process.data_dir / "queues"

    def size() -> int:
        return sum(f.stat().st_size for f in Path(data).rglob("*.segment"))

    assert size() > 35_000_000
    for _ in range(400):
        ch.basic_get("big", auto_ack=True)
    ch.basic_publish("", "big", b"last", PERSISTENT)  # a turn of the writer after the acks
    drain(conn, lambda: size() < 20_000_000, 3)
    assert size() < 20_000_000  # only the active segment remains
    conn.close()
    broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    assert conn.channel().queue_declare("big", durable=True).method.message_count == 1
    conn.close()


def test_a_long_queue_pages_to_disk_and_keeps_exact_counts(broker_process: BrokerProcess) -> None:
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("long", durable=True)
    for i in range(6000):  # more than a page (2048) of messages
        ch.basic_publish("", "long", b"%05d" % i, PERSISTENT if i % 2 else TRANSIENT)
    assert ch.queue_declare("long", passive=True).method.message_count == 6000
    bodies = [ch.basic_get("long", auto_ack=True)[2] for _ in range(6000)]
    assert bodies == [b"%05d" % i for i in range(6000)]
    assert ch.basic_get("long")[0] is None
    for i in range(5000):
        ch.basic_publish("", "long", b"%05d" % i, PERSISTENT if i % 2 else TRANSIENT)
    conn.close()
    broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    ch = conn.channel()
    assert ch.queue_declare("long", durable=True).method.message_count == 2500
    bodies = [ch.basic_get("long", auto_ack=True)[2] for _ in range(2500)]
    assert bodies == [b"%05d" % i for i in range(1, 5000, 2)]
    conn.close()
    assert os.path.exists(broker_process.data_dir)
