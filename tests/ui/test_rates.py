"""Message rates in the management API (`broker/management/rates.py`): cumulative counters
sampled on the broker's loop, shown as RabbitMQ's `message_stats` `*_details.rate` (and
`samples` with `msg_rates_age`/`msg_rates_incr`) in the overview and the queues. The UI's
overview chart shows them; these tests use the API alone, no browser."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from support.brokers import InProcessBroker
from support.management import Http

from leveret.broker.management.rates import KEYS, QUEUE_KEYS, Sampler


def publish(url: str, queue: str, count: int, confirm: bool = True) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    if confirm:
        channel.confirm_delivery()
    channel.queue_declare(queue)
    for _ in range(count):
        channel.basic_publish("", queue, b"x")
    connection.close()


def test_rates_are_the_growth_of_the_last_interval(managed_broker: InProcessBroker) -> None:
    """A sampler of its own, with its own clock: 2 seconds between samples."""
    sampler = Sampler(managed_broker.broker)
    publish(managed_broker.url, "orders", 10)
    managed_broker.call(lambda: sampler.sample(now=100.0))
    assert sampler.overview_rates(None)["publish"] == 0.0  # the first sample is the baseline

    connection = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(10):
        channel.basic_publish("", "orders", b"x")
    assert channel.basic_get("orders", auto_ack=True)[0] is not None
    managed_broker.call(lambda: sampler.sample(now=102.0))
    none = dict.fromkeys(KEYS, 0.0)
    assert sampler.overview_rates(None) == {**none, "publish": 5.0, "deliver_get": 0.5,
                                            "get_no_ack": 0.5, "confirm": 5.0}
    assert sampler.overview_rates({"other"})["publish"] == 0.0
    assert sampler.queue_rates[("/", "orders")] == {
        **dict.fromkeys(QUEUE_KEYS, 0.0), "publish": 5.0, "deliver_get": 0.5,
        "get_no_ack": 0.5}
    totals = dict(sampler.totals["/"])
    assert totals == {**dict.fromkeys(KEYS, 0), "publish": 10, "deliver_get": 1,
                      "get_no_ack": 1, "confirm": 10}

    channel.queue_delete("orders")  # the queue and the channel go: the totals stay
    connection.close()
    managed_broker.call(lambda: sampler.sample(now=104.0))
    assert sampler.totals["/"] == totals
    assert sampler.overview_rates(None) == dict.fromkeys(totals, 0.0)
    assert ("/", "orders") not in sampler.queue_rates

    publish(managed_broker.url, "orders", 4, confirm=False)  # a new queue counts from 0
    managed_broker.call(lambda: sampler.sample(now=106.0))
    assert sampler.overview_rates(None)["publish"] == 2.0
    assert sampler.totals["/"]["publish"] == 14


@pytest.fixture
def busy(managed_broker: InProcessBroker) -> Iterator[threading.Event]:
    """A pika client publishing to `busy` (with confirms) until the event is set."""
    stop = threading.Event()
    started = threading.Event()

    def run() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("busy")
        started.set()
        while not stop.is_set():
            channel.basic_publish("", "busy", b"x")
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    yield stop
    stop.set()
    thread.join(30)


def wait_for(check: Any, what: str, limit_s: float = 60.0) -> Any:
    """Poll `check` until it answers something truthy (the sampler ticks every 5 s)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"never saw {what}")


def test_the_api_shows_rates_while_a_client_publishes(
        managed_broker: InProcessBroker, busy: threading.Event) -> None:
    http = Http.of(managed_broker)
    wait_for(lambda: http.ok("/api/overview")["message_stats"]["publish_details"]["rate"] > 0,
             "a publish rate in the overview")
    overview = http.ok("/api/overview")
    assert overview["rates_mode"] == "basic"
    picked = http.ok("/api/overview?columns=message_stats.publish_details")
    assert list(picked) == ["message_stats"]  # the columns asked for, and no rates_mode
    assert list(picked["message_stats"]) == ["publish_details"]
    assert picked["message_stats"]["publish_details"]["rate"] >= 0.0
    assert overview["message_stats"]["confirm_details"]["rate"] > 0
    wait_for(lambda: http.ok("/api/queues/%2F/busy")["message_stats"]["publish_details"][
        "rate"] > 0, "a publish rate on the queue")
    listed = http.ok("/api/queues?page=1&page_size=10&name=busy")["items"][0]
    assert listed["message_stats"]["publish_details"]["rate"] >= 0.0

    # RabbitMQ's samples: totals every msg_rates_incr seconds, newest first
    stats = wait_for(lambda: (lambda s: s if len(s["publish_details"]["samples"]) >= 2 else None)(
        http.ok("/api/overview?msg_rates_age=60&msg_rates_incr=5")["message_stats"]),
        "two samples")
    samples = stats["publish_details"]["samples"]
    assert [sorted(s) for s in samples] == [["sample", "timestamp"]] * len(samples)
    assert samples == sorted(samples, key=lambda s: -s["timestamp"])
    assert samples[0]["sample"] > samples[-1]["sample"]
    assert stats["publish_details"]["avg_rate"] > 0

    # a user who sees only another vhost sees none of it
    assert http.put("/api/vhosts/quiet", {}).status == 201
    assert http.put("/api/users/watcher", {"password": "w", "tags": "management"}).status == 201
    assert http.put("/api/permissions/quiet/watcher",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    watched = http.as_user("watcher", "w").ok("/api/overview")["message_stats"]
    assert watched["publish_details"]["rate"] == 0.0

    busy.set()  # publishing stops: the rate falls back to 0.0
    wait_for(lambda: http.ok("/api/overview")["message_stats"]["publish_details"]["rate"]
             == 0.0, "the rate back to 0.0")
