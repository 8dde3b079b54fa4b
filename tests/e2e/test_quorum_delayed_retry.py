"""Delayed retry of a quorum queue's returned messages (RabbitMQ 4.3: `x-delayed-retry-type`,
`-min`, `-max` and their policy keys), with pika against a real Leveret: which returns wait,
for how long (`min(min * delivery_count, max)`), what the counts and the management API show
while they wait, a purge, the policy's texts, and a `kill -9` restart with a retry waiting.
RabbitMQ 3.10.8 has no delayed retry (it ignores the arguments as unknown keys): Leveret only,
as docs/QUORUM-QUEUES.md says."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest
from support.amqp import connect
from support.brokers import BrokerProcess, InProcessBroker
from support.management import Http, q

QUORUM = {"x-queue-type": "quorum"}


def declare(ch: Any, name: str, **arguments: Any) -> None:
    ch.queue_declare(name, durable=True, arguments={**QUORUM, **arguments})


def publish(ch: Any, name: str, body: bytes) -> None:
    ch.confirm_delivery()
    ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))


def take(ch: Any, name: str, timeout: float = 10.0) -> tuple[Any, Any, bytes, float]:
    """basic.get until a message comes: (method, properties, body, seconds waited)."""
    began = time.monotonic()
    while True:
        method, props, body = ch.basic_get(name)
        if method is not None:
            return method, props, body, time.monotonic() - began
        assert time.monotonic() - began < timeout, f"nothing in {name} after {timeout} s"
        time.sleep(0.02)


def count(ch: Any, name: str) -> int:
    return int(ch.queue_declare(name, passive=True).method.message_count)


@pytest.mark.parametrize("settle", ["reject", "nack"])
@pytest.mark.parametrize("kind", ["all", "failed", "returned", "disabled"])
def test_which_returns_wait(broker: InProcessBroker, kind: str, settle: str) -> None:
    """basic.reject with requeue is a failed delivery, basic.nack with requeue a return that
    is not (RabbitMQ 4.3): `failed` delays the first, `returned` the second, `all` both."""
    waits = kind == "all" or (kind, settle) in (("failed", "reject"), ("returned", "nack"))
    conn = connect(broker.port)
    ch = conn.channel()
    name = f"retry-{kind}-{settle}"
    declare(ch, name, **{"x-delayed-retry-type": kind, "x-delayed-retry-min": 800})
    publish(ch, name, b"m")
    method, *_ = take(ch, name)
    if settle == "reject":
        ch.basic_reject(method.delivery_tag, requeue=True)
    else:
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert count(ch, name) == (0 if waits else 1)  # waiting is not ready
    method, props, body, waited = take(ch, name)
    assert body == b"m" and method.redelivered
    assert props.headers["x-acquired-count"] == 1
    assert (waited >= 0.6) == waits, waited
    conn.close()


def test_the_wait_grows_with_the_delivery_count_up_to_the_max(broker: InProcessBroker) -> None:
    """min(min * delivery_count, max): 500 ms after the first failed delivery, then 600 ms
    (1,000 capped), then 600 ms again (1,500 capped)."""
    conn = connect(broker.port)
    ch = conn.channel()
    declare(ch, "grows", **{"x-delayed-retry-type": "failed", "x-delayed-retry-min": 500,
                            "x-delayed-retry-max": 600})
    publish(ch, "grows", b"m")
    method, *_ = take(ch, "grows")
    waits = []
    for _ in range(3):
        ch.basic_reject(method.delivery_tag, requeue=True)
        method, _props, _body, waited = take(ch, "grows")
        waits.append(waited)
    assert waits[0] >= 0.45 and waits[1] >= 0.55 and waits[2] >= 0.55, waits
    assert waits[1] < 1.0 and waits[2] < 1.0, waits  # capped: 1.0 s and 1.5 s without max
    conn.close()


def test_a_policy_sets_it_and_the_api_shows_what_waits(managed_broker: InProcessBroker) -> None:
    """The policy's keys apply to a queue declared without arguments (its type wins over an
    argument's); the management API shows the retry, the messages waiting and the next due
    time; a purge takes what waits too."""
    http = Http.of(managed_broker)
    conn = connect(managed_broker.port)
    ch = conn.channel()
    declare(ch, "by-policy", **{"x-delayed-retry-type": "failed"})
    assert http.put(f"/api/policies/{q('/')}/retry", {
        "pattern": "^by-policy$", "apply-to": "quorum_queues",
        "definition": {"delayed-retry-type": "returned", "delayed-retry-min": 30_000,
                       "delayed-retry-max": 60_000}}).status in (201, 204)
    view = http.ok(f"/api/queues/{q('/')}/by-policy")
    assert view["delayed_retry"] == "returned (min: 30000ms, max: 60000ms)"
    publish(ch, "by-policy", b"m")
    publish(ch, "by-policy", b"n")
    first, *_ = take(ch, "by-policy")
    ch.basic_nack(first.delivery_tag, requeue=True)  # returned: the policy's type
    second, *_ = take(ch, "by-policy")
    ch.basic_reject(second.delivery_tag, requeue=True)  # failed: not the policy's type
    assert count(ch, "by-policy") == 1  # (a round trip: both returns are taken by now)
    before = int(time.time() * 1000)
    view = http.ok(f"/api/queues/{q('/')}/by-policy")
    assert view["messages_delayed"] == 1 and view["messages_ready"] == 1
    assert before + 25_000 <= view["next_delayed_at"] <= before + 31_000
    assert ch.queue_purge("by-policy").method.message_count == 2
    assert http.ok(f"/api/queues/{q('/')}/by-policy")["messages_delayed"] == 0
    conn.close()


@pytest.mark.parametrize(("definition", "text"), [
    ({"delayed-retry-type": "soon", "delayed-retry-min": 5},
     '<<"soon">> is not a valid delayed retry type. Must be one of: all, failed, returned, '
     "disabled"),
    ({"delayed-retry-type": "all", "delayed-retry-min": 0},
     "0 is not a valid delayed retry minimum delay. Must be a positive integer"),
    ({"delayed-retry-type": "all", "delayed-retry-min": 5, "delayed-retry-max": "x"},
     '<<"x">> is not a valid delayed retry maximum delay. Must be a positive integer'),
    ({"delayed-retry-type": "failed"},
     "delayed-retry-min is required when delayed-retry-type is failed"),
    ({"delayed-retry-min": 10, "delayed-retry-max": 5},
     "delayed-retry-max (5) must not be smaller than delayed-retry-min (10)"),
])  # fmt: skip
def test_a_policy_with_bad_values_is_refused_with_rabbitmqs_texts(
        managed_broker: InProcessBroker, definition: dict[str, Any], text: str) -> None:
    reply = Http.of(managed_broker).put(f"/api/policies/{q('/')}/bad", {
        "pattern": ".*", "apply-to": "quorum_queues", "definition": definition})
    assert reply.status == 400
    assert reply.body["reason"] == f"Validation failed\n\n{text}\n"


def test_a_retry_waiting_at_a_kill_still_waits_after_the_restart(
        broker_process: BrokerProcess) -> None:
    """The due time is in the log (the return's record): a `kill -9` and a restart neither
    make the message ready early nor lose it."""
    conn = connect(broker_process.port)
    ch = conn.channel()
    declare(ch, "kept", **{"x-delayed-retry-type": "failed", "x-delayed-retry-min": 6000})
    publish(ch, "kept", b"m")
    method, *_ = take(ch, "kept")
    ch.basic_reject(method.delivery_tag, requeue=True)
    assert count(ch, "kept") == 0  # a round trip: the return is written
    rejected = time.monotonic()
    broker_process.kill()
    broker_process.start()
    conn = connect(broker_process.port)
    ch = conn.channel()
    assert count(ch, "kept") == 0 or time.monotonic() - rejected >= 5.5
    method, props, body, _waited = take(ch, "kept", timeout=30)
    assert body == b"m" and method.redelivered
    assert time.monotonic() - rejected >= 5.5
    assert props.headers["x-delivery-count"] == 1
    conn.close()
