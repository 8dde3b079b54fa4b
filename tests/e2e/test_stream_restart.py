"""Streams across restarts of a real `leveret serve`: a clean stop, and kill -9."""

from __future__ import annotations

import pika
import pytest
from support.amqp import connect, consume, offsets
from support.brokers import BrokerProcess

STREAM = {"x-queue-type": "stream"}


def fill(port: int, count: int) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    for i in range(count):
        ch.basic_publish("", "s", b"m%d" % i, pika.BasicProperties(headers={
            "x-stream-publisher-name": "producer", "x-stream-publishing-id": i + 1}))
    # A tracked consumer acks the first half; on cancel its offset is stored.
    consume(conn.channel(), "s", count // 2, prefetch=1, tag="tracked",
            arguments={"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
    conn.close()


@pytest.mark.parametrize("stop", ["clean", "kill-9"])
def test_stream_survives_restart(broker_process: BrokerProcess, stop: str) -> None:
    fill(broker_process.port, 40)
    if stop == "clean":
        assert broker_process.stop() == 0
    else:
        broker_process.kill()
    broker_process.restart()
    conn = connect(broker_process.port)
    ch = conn.channel()
    assert ch.queue_declare("s", durable=True, arguments=STREAM).method.message_count == 40
    everything = consume(conn.channel(), "s", 40, arguments={"x-stream-offset": "first"})
    assert offsets(everything) == list(range(40))
    assert [b for _m, _p, b in everything] == [b"m%d" % i for i in range(40)]
    # The consumer resumes right after its stored offset.
    resumed = consume(conn.channel(), "s", 20, tag="tracked")
    assert offsets(resumed) == list(range(20, 40))
    # The publisher's last id survived: a resend of id 40 is a duplicate, 41 is new.
    ch.confirm_delivery()
    for pid in (40, 41):
        ch.basic_publish("", "s", b"again-%d" % pid, pika.BasicProperties(headers={
            "x-stream-publisher-name": "producer", "x-stream-publishing-id": pid}))
    assert ch.queue_declare("s", passive=True).method.message_count == 41
    conn.close()
