"""Snapshots of durable and quorum queues (docs/QUORUM-QUEUES.md, "Compaction and restart"):
a real `leveret serve` stopped with SIGTERM (a snapshot is written at the close) or killed with
kill -9 after a snapshot (snapshot plus a longer tail) gives back, through pika, the same
messages in the same order, with the same redelivered flags, x-delivery-count and
x-acquired-count headers and bodies, as the same data directory with its snapshots deleted
(the whole log read); the broker's log says which restart used a snapshot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pika
import pytest
from support.brokers import BrokerProcess

SNAPSHOT = "queue.snapshot"
Read = list[tuple[bytes, bool, Any, Any, int | None]]


def declare(ch: Any, queue: str, kind: str) -> None:
    arguments = {"x-queue-type": "quorum"} if kind == "quorum" else {}
    ch.queue_declare(queue, durable=True, arguments=arguments)


def publish(ch: Any, queue: str, kind: str, numbers: range) -> None:
    for i in numbers:
        priority = 7 if kind == "quorum" and i % 500 == 7 else None
        mode = 1 if kind == "classic" and i % 3 == 0 else 2  # transient: dropped at a restart
        ch.basic_publish("", queue, b"m%d-" % i + b"x" * (i % 50),
                         pika.BasicProperties(priority=priority, delivery_mode=mode,
                                              headers={"i": i} if i % 2 else None))


def take(ch: Any, queue: str, count: int) -> None:
    """Deliveries settled every way: acked, rejected, returned with and without a failed
    delivery; five left unacked when the broker goes."""
    tags = []
    for _ in range(count):
        method, _props, _body = ch.basic_get(queue)
        assert method is not None
        tags.append(method.delivery_tag)
    fifth = count // 5
    for tag in tags[:fifth * 2]:
        ch.basic_ack(tag)
    for tag in tags[fifth * 2: fifth * 3]:
        ch.basic_reject(tag, requeue=False)
    for tag in tags[fifth * 3: fifth * 4]:
        ch.basic_reject(tag, requeue=True)
    for tag in tags[fifth * 4: count - 5]:
        ch.basic_nack(tag, requeue=True)


def scenario(broker: BrokerProcess, queue: str, kind: str, numbers: range, taken: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = connection.channel()
    ch.confirm_delivery()
    declare(ch, queue, kind)
    publish(ch, queue, kind, numbers)
    take(ch, queue, taken)
    ch.queue_declare(queue, passive=True)  # a round trip: every settlement reached the broker


def read_all(broker: BrokerProcess, queue: str) -> Read:
    """Every message, in order, by basic.get; the count queue.declare gave first, each
    basic.get's message_count too, and an end row for the empty queue's answer."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = connection.channel()
        count = ch.queue_declare(queue, passive=True).method.message_count
        out: Read = []
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                assert count == len(out), "queue.declare's message_count is not what it held"
                return out
            assert method.message_count == count - len(out) - 1
            headers = props.headers or {}
            out.append((body, method.redelivered, headers.get("x-delivery-count"),
                        headers.get("x-acquired-count"), props.delivery_mode))
    finally:
        connection.close()


def recoveries(broker: BrokerProcess, queue: str) -> list[dict[str, Any]]:
    """The broker log's "durable queue recovered" lines for `queue`, oldest first."""
    lines = []
    for line in broker.log().splitlines():
        if '"durable queue recovered"' in line:
            record = json.loads(line)
            if record.get("queue") == queue:
                lines.append(record)
    return lines


def with_and_without(broker: BrokerProcess, queue: str, spare: Path) -> tuple[Read, Read]:
    """The queue read after a start on the data directory as the broker left it, and after a
    start on a copy of it whose snapshots were deleted."""
    shutil.copytree(broker.data_dir, spare)
    snapshots = list(spare.rglob(SNAPSHOT))
    assert snapshots, "no snapshot was written"
    for path in snapshots:
        path.unlink()
    broker.start()
    first = read_all(broker, queue)
    used = recoveries(broker, queue)[-1]
    assert used["snapshot"] is not None, used
    broker.stop()
    shutil.rmtree(broker.data_dir)
    shutil.copytree(spare, broker.data_dir)
    broker.start()
    second = read_all(broker, queue)
    assert recoveries(broker, queue)[-1]["snapshot"] is None
    return first, second


@pytest.mark.parametrize("kind", ["quorum", "classic"])
def test_a_restart_after_sigterm_reads_the_snapshot_and_gives_back_the_same_queue(
        broker_process: BrokerProcess, tmp_path: Path, kind: str) -> None:
    queue = f"snap-{kind}"
    scenario(broker_process, queue, kind, range(3000), 60)
    assert broker_process.stop() == 0
    first, second = with_and_without(broker_process, queue, tmp_path / "spare")
    assert first == second
    used = recoveries(broker_process, queue)[-2]
    assert used["records_read"] == 0  # the snapshot was written at the close: no tail
    numbers = [int(body.split(b"-")[0][1:]) for body, *_rest in first]
    if kind == "quorum":
        # 60 taken: 24 acked, 12 rejected; 24 returned (counted), 5 of them left unacked
        assert len(first) == 3000 - 36
        # the priority 7 messages were taken first and acked; the rest is back in FIFO order
        assert numbers == sorted(numbers) and not any(n % 500 == 7 for n in numbers)
        returned = [row for row in first if row[1]]
        assert len(returned) == 24
        assert {row[3] for row in returned} == {1}  # acquired once
        # a failed delivery: basic.reject with requeue (12), the channel closed (5); not nack
        assert [row[2] for row in returned].count(1) == 12 + 5
    else:
        # transient messages (every third) are dropped; the first 60 were taken in order, the
        # first 36 settled, the other 24 returned (redelivered)
        assert numbers == [i for i in range(36, 3000) if i % 3]
        assert all(row[4] == 2 for row in first)
        assert [n for n, row in zip(numbers, first, strict=True) if row[1]] == [
            i for i in range(36, 60) if i % 3]
        assert numbers == sorted(numbers)


@pytest.mark.parametrize("kind", ["quorum", "classic"])
def test_a_restart_after_kill_9_reads_the_snapshot_and_the_tail_after_it(
        broker_process: BrokerProcess, tmp_path: Path, kind: str) -> None:
    """A snapshot at a clean stop, then more publishes and settlements of messages below
    its offset, then kill -9: the restart reads the snapshot and the records after it."""
    queue = f"snap-kill-{kind}"
    scenario(broker_process, queue, kind, range(3000), 60)
    broker_process.stop()
    broker_process.start()
    scenario(broker_process, queue, kind, range(3000, 3500), 300)
    broker_process.kill()
    first, second = with_and_without(broker_process, queue, tmp_path / "spare")
    assert first == second
    used = recoveries(broker_process, queue)[-2]
    assert 0 < used["records_read"] < 1000  # the tail, not the whole log
    returned = [row for row in first if row[1]]
    # returned before the kill: counted by a quorum queue; delivered when it came: the flag only
    assert returned and any(row[3] for row in returned) == (kind == "quorum")
