"""A crash-consistency harness: publish with confirms from several clients, kill -9 the broker
at a random moment, restart it, and check what users are promised.

Per round: threads publish persistent messages with confirms into a durable classic queue,
into a stream with publisher deduplication (each thread is a named publisher with increasing
publishing ids, and after a crash resends everything it had not seen confirmed), and into a
3-partition super stream; a consumer takes from the classic queue and acks; a tracked stream
consumer advances its stored offset. After the restart the invariants are checked:

- every confirmed message is present (streams: exactly once; classic: at least once, and the
  ones that come back after a delivery are flagged redelivered);
- streams have dense offsets and no duplicate (publisher, id), in publishing order per publisher;
- stored consumer offsets and publishers' last ids never go backwards;
- the topology (queues, exchanges, bindings) is intact.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from support.brokers import BrokerProcess

STREAM = "crash-stream"
QUEUE = "crash-queue"
SUPER = "crash-super"
PARTITIONS = [f"{SUPER}-{i}" for i in range(3)]
TRACKED = "crash-reader"


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, connection_attempts=3, retry_delay=0.2,
        blocked_connection_timeout=None))


def declare_topology(port: int) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream",
                                                      "x-stream-max-segment-size-bytes": 200_000})
    ch.exchange_declare(SUPER, "direct", durable=True, arguments={"x-super-stream": True})
    for index, name in enumerate(PARTITIONS):
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(name, SUPER, str(index), arguments={"x-stream-partition-order": index})
    conn.close()


@dataclass
class Ledger:
    """What the clients saw confirmed or acked, across rounds."""

    stream_confirmed: dict[str, int] = field(default_factory=dict)  # publisher -> highest id
    queue_confirmed: set[str] = field(default_factory=set)
    queue_acked: set[str] = field(default_factory=set)
    super_confirmed: set[str] = field(default_factory=set)
    last_ids: dict[str, int] = field(default_factory=dict)  # broker-reported, per publisher
    stored_offset: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)
    seq: int = 0

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq


def _publisher(port: int, name: str, ledger: Ledger, stop: threading.Event) -> None:
    """One client: stream with dedup ids, classic queue, super stream; stops at the crash."""
    try:
        conn = connect(port)
        ch = conn.channel()
        ch.confirm_delivery()
        next_id = ledger.stream_confirmed.get(name, 0) + 1
        while not stop.is_set():
            ch.basic_publish("", STREAM, f"{name}:{next_id}".encode(), pika.BasicProperties(
                delivery_mode=2, headers={"x-stream-publisher-name": name,
                                          "x-stream-publishing-id": next_id}))
            ledger.stream_confirmed[name] = next_id
            next_id += 1
            tag = f"{name}-{ledger.next_seq()}"
            ch.basic_publish("", QUEUE, tag.encode(), pika.BasicProperties(delivery_mode=2))
            ledger.queue_confirmed.add(tag)
            ch.basic_publish(SUPER, str(hash(tag) % 3), tag.encode(),
                             pika.BasicProperties(delivery_mode=2))
            ledger.super_confirmed.add(tag)
    except (pika.exceptions.AMQPError, OSError, AttributeError):
        return


def _queue_consumer(port: int, ledger: Ledger, stop: threading.Event) -> None:
    try:
        conn = connect(port)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)
        for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.05):
            if stop.is_set():
                return
            if method is None:
                continue
            ch.basic_ack(method.delivery_tag)
            ledger.queue_acked.add(body.decode())
    except (pika.exceptions.AMQPError, OSError, AttributeError):
        return


def _stream_consumer(port: int, stop: threading.Event) -> None:
    """A tracked consumer (a client-chosen tag and no x-stream-offset): it resumes after its
    stored offset in every round."""
    try:
        conn = connect(port)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        ch.basic_consume(STREAM, lambda c, m, p, b: c.basic_ack(m.delivery_tag),
                         consumer_tag=TRACKED,
                         arguments={"x-stream-automatic-offset-tracking": True})
        while not stop.is_set():
            conn.process_data_events(0.05)
    except (pika.exceptions.AMQPError, OSError, AttributeError, ValueError):
        return


def run_round(broker: BrokerProcess, ledger: Ledger, rng: random.Random, publishers: int = 3,
              max_seconds: float = 1.5) -> float:
    """Load, kill -9 at a random moment, restart; returns the restart time in seconds."""
    stop = threading.Event()
    threads = [threading.Thread(target=_publisher, args=(broker.port, f"p{i}", ledger, stop))
               for i in range(publishers)]
    threads.append(threading.Thread(target=_queue_consumer, args=(broker.port, ledger, stop)))
    threads.append(threading.Thread(target=_stream_consumer, args=(broker.port, stop)))
    for thread in threads:
        thread.daemon = True
        thread.start()
    time.sleep(rng.uniform(0.2, max_seconds))
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(10)
    started = time.monotonic()
    broker.restart()
    connect(broker.port).close()
    return time.monotonic() - started


def _read_stream(ch: Any, name: str) -> list[tuple[int, bytes]]:
    count = ch.queue_declare(name, passive=True).method.message_count
    if not count:
        return []
    got: list[tuple[int, bytes]] = []
    ch.basic_qos(prefetch_count=1000)
    for method, props, body in ch.consume(name, inactivity_timeout=2,
                                          arguments={"x-stream-offset": "first"}):
        if method is None:
            break
        got.append((props.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)
        if len(got) >= count:
            break
    ch.cancel()
    return got


def check(broker: BrokerProcess, ledger: Ledger) -> dict[str, Any]:
    """Assert every invariant; returns figures for the report."""
    conn = connect(broker.port)
    ch = conn.channel()
    # Topology intact.
    for name in [QUEUE, STREAM, *PARTITIONS]:
        ch.queue_declare(name, passive=True)
    ch.exchange_declare(SUPER, passive=True)

    # The stream: dense offsets, no duplicates, every confirmed id, order per publisher.
    entries = _read_stream(ch, STREAM)
    offsets = [o for o, _b in entries]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
    seen: dict[str, list[int]] = {}
    for _offset, body in entries:
        publisher, number = body.decode().split(":")
        seen.setdefault(publisher, []).append(int(number))
    for publisher, numbers in seen.items():
        assert numbers == sorted(set(numbers)), f"{publisher}: duplicates or disorder"
        assert numbers == list(range(1, len(numbers) + 1)), f"{publisher}: a gap"
    for publisher, highest in ledger.stream_confirmed.items():
        stored = seen.get(publisher, [])
        assert highest <= len(stored) + 1, f"{publisher}: confirmed {highest}, stored {stored[-1:]}"
        # the last publish may have been in flight: confirmed means stored
        query = "amq.leveret.publisher-id?" + urllib.parse.urlencode(
            {"stream": STREAM, "publisher": publisher})
        _m, props, _b = ch.basic_get(query, auto_ack=True)
        last = props.headers["x-stream-publishing-id"]
        assert last >= ledger.last_ids.get(publisher, 0), "a publisher id went backwards"
        assert last == len(stored)
        ledger.last_ids[publisher] = last
        ledger.stream_confirmed[publisher] = last  # resend from here next round

    # The tracked consumer's stored offset never goes backwards.
    method, props, _b = ch.basic_get(
        f"amq.leveret.consumer-offset?stream={STREAM}&consumer={TRACKED}", auto_ack=True)
    stored_offset = props.headers["x-stream-offset"] if method is not None else -1
    assert stored_offset >= ledger.stored_offset, "a stored consumer offset went backwards"
    ledger.stored_offset = stored_offset

    # Super stream partitions: every confirmed message present exactly once.
    in_super: list[str] = []
    for name in PARTITIONS:
        in_super += [b.decode() for _o, b in _read_stream(ch, name)]
    missing = ledger.super_confirmed - set(in_super)
    assert not missing, f"{len(missing)} confirmed super stream messages lost"
    assert len(in_super) == len(set(in_super)), "duplicates in the super stream"

    # The classic queue: every confirmed, un-acked message is there (at least once).
    present: list[str] = []
    redelivered: list[str] = []
    while True:
        method, _props, body = ch.basic_get(QUEUE, auto_ack=False)
        if method is None:
            break
        present.append(body.decode())
        if method.redelivered:
            redelivered.append(body.decode())
    ch.basic_recover(requeue=True)
    lost = ledger.queue_confirmed - ledger.queue_acked - set(present)
    assert not lost, f"{len(lost)} confirmed classic messages lost: {sorted(lost)[:5]}"
    conn.close()
    return {"stream_messages": len(entries), "queue_messages": len(present),
            "redelivered": len(redelivered), "super_messages": len(in_super),
            "stored_offset": stored_offset}


def report(figures: list[dict[str, Any]]) -> str:
    return json.dumps(figures)


# -- recovery time of a big log ------------------------------------------------------------------


def fill_big_stream(port: int, name: str, total_bytes: int, message_bytes: int = 1 << 20) -> int:
    """Publish `total_bytes` of large messages (with confirms) into a stream; returns how many
    were confirmed. Each message is one chunk of the log."""
    import asyncio

    from pamqp import commands as C
    from support.loadamqp import Publisher, connect, open_channel

    async def run() -> int:
        setup = await connect(port)
        await open_channel(setup)
        await setup.call(1, C.Queue.Declare(queue=name, durable=True,
                                            arguments={"x-queue-type": "stream"}))
        publisher = await Publisher(await connect(port), window=32).start()
        body = b"L" * message_bytes
        count = max(1, total_bytes // message_bytes)
        for number in range(count):
            await publisher.publish(name, number.to_bytes(8, "big") + body[8:])
        await publisher.drain(timeout=600)
        assert not publisher.nacked
        setup.close()
        publisher.conn.close()
        return len(publisher.acked)

    return asyncio.run(run())


def amqp_answers(port: int, timeout: float = 60.0) -> None:
    """Wait until the broker completes an AMQP handshake (not just accepts TCP)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connect(port).close()
            return
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def recovery_time(broker: BrokerProcess, name: str, total_bytes: int) -> dict[str, Any]:
    """Fill a stream log of `total_bytes`, kill -9 the broker, restart it and time until AMQP
    answers; then check that every confirmed message is there."""
    started = time.monotonic()
    confirmed = fill_big_stream(broker.port, name, total_bytes)
    fill_seconds = time.monotonic() - started
    size = sum(p.stat().st_size for p in broker.data_dir.rglob("*.segment"))
    broker.kill()
    started = time.monotonic()
    broker.start()
    amqp_answers(broker.port)
    restart = time.monotonic() - started
    conn = connect(broker.port)
    count = conn.channel().queue_declare(name, passive=True).method.message_count
    conn.close()
    assert count == confirmed, (count, confirmed)
    return {"log_bytes": size, "messages": confirmed, "fill_s": round(fill_seconds, 1),
            "restart_s": round(restart, 2)}
