"""Message rates in the management API (`broker/management/rates.py`): cumulative counters
sampled on the broker's loop, shown as RabbitMQ's `message_stats` `*_details.rate` (and
`samples` with `msg_rates_age`/`msg_rates_incr`) in the overview, vhosts, queues, streams,
exchanges, channels and connections, and a consumer group's offset lag with its rate of
change. The UI's charts show them; these tests use the API alone, no browser.

Every kind RabbitMQ reports (ack, redeliver, return_unroutable, get, get_no_ack, deliver,
deliver_no_ack; publish_in/publish_out on exchanges; recv_oct/send_oct on connections) is
checked with a sampler of its own (its own clock, so the broker's 5-second timer cannot take
the growth first), the API's answers with the broker's; `collect_statistics = "none"` leaves
them out as RabbitMQ does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from support.brokers import InProcessBroker
from support.management import Http
from support.ports import free_port

from leveret.broker.management.rates import KEYS, QUEUE_KEYS, RATES, Sampler
from leveret.broker.process.config import ConfigError, load


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


KINDS = ("publish", "deliver_get", "deliver", "deliver_no_ack", "get", "get_no_ack", "ack",
         "redeliver")


def drive(url: str) -> pika.BlockingConnection:
    """A client that does every counted thing once or more, on queue `work` behind `x`."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare("x", "direct")
    channel.queue_declare("work")
    channel.queue_bind("work", "x", "k")
    returned: list[bytes] = []
    channel.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
    channel.basic_publish("x", "nowhere", b"lost", mandatory=True)  # return_unroutable
    for _ in range(10):
        channel.basic_publish("x", "k", b"m")
    method, _props, _body = channel.basic_get("work")  # get
    assert method is not None
    channel.basic_ack(method.delivery_tag)  # ack
    method, _props, _body = channel.basic_get("work")
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _props, _body = channel.basic_get("work", auto_ack=True)  # get_no_ack, redelivered
    assert method is not None and method.redelivered
    taken: list[int] = []
    channel.basic_qos(prefetch_count=3)
    tag = channel.basic_consume("work", lambda ch, m, _p, _b: taken.append(m.delivery_tag))
    deadline = time.monotonic() + 30
    while len(taken) < 3 and time.monotonic() < deadline:  # deliver
        connection.process_data_events(time_limit=0.2)
    channel.basic_ack(taken[-1], multiple=True)
    channel.basic_cancel(tag)
    free = connection.channel()
    got: list[int] = []
    free.basic_consume("work", lambda ch, m, _p, _b: got.append(1), auto_ack=True)
    while not got and time.monotonic() < deadline:  # deliver_no_ack
        connection.process_data_events(time_limit=0.2)
    assert returned == [b"lost"] and len(taken) >= 3 and got
    connection.process_data_events(time_limit=0.2)
    return connection


def test_every_kind_moves_while_a_client_does_it(managed_broker: InProcessBroker) -> None:
    sampler = Sampler(managed_broker.broker)
    managed_broker.call(lambda: sampler.sample(now=100.0))
    connection = drive(managed_broker.url)
    managed_broker.call(lambda: sampler.sample(now=102.0))

    overview = sampler.overview_rates(None)
    for kind in (*KINDS, "confirm"):
        if kind != "confirm":
            assert overview[kind] > 0, kind
    assert overview["return_unroutable"] == 0.5
    assert overview["confirm"] == 0.0  # no channel in confirm mode
    queue = sampler.queue_rates[("/", "work")]
    assert all(queue[kind] > 0 for kind in KINDS), queue
    assert sampler.vhost_rates["/"]["ack"] == overview["ack"]
    assert sampler.exchange_rates[("/", "x")] == {"publish_in": 5.5, "publish_out": 5.0}
    publishing = [r for r in sampler.channel_rates.values() if r["publish"]]
    assert len(publishing) == 1
    assert publishing[0]["return_unroutable"] == 0.5 and publishing[0]["ack"] > 0
    assert publishing[0]["get"] == 1.0 and publishing[0]["get_no_ack"] == 0.5
    assert publishing[0]["redeliver"] == 0.5 and publishing[0]["deliver"] > 0
    assert any(r["deliver_no_ack"] > 0 for r in sampler.channel_rates.values())
    (conn_rates,) = sampler.connection_rates.values()
    assert conn_rates["recv_oct"] > 0 and conn_rates["send_oct"] > 0

    # the API's counters add up to what the client did
    http = Http.of(managed_broker)
    stats = http.ok("/api/queues/%2F/work")["message_stats"]
    assert stats["publish"] == 10 and stats["get"] == 2 and stats["get_no_ack"] == 1
    assert stats["redeliver"] >= 1 and stats["ack"] >= 4  # pika nacks (requeue) at cancel
    assert stats["deliver_get"] == stats["deliver"] + stats["deliver_no_ack"] + 3
    exchange = http.ok("/api/exchanges/%2F/x")["message_stats"]
    assert exchange["publish_in"] == 11 and exchange["publish_out"] == 10
    assert http.ok("/api/overview")["message_stats"]["return_unroutable"] == 1
    channels = http.ok("/api/channels")
    assert sum(c["message_stats"]["publish"] for c in channels) == 11
    assert sum(c["message_stats"]["deliver_get"] for c in channels) == stats["deliver_get"]
    assert http.ok("/api/vhosts/%2F")["message_stats"]["ack"] == stats["ack"]
    connection.close()


def test_the_api_shows_each_objects_rates(managed_broker: InProcessBroker,
                                          busy: threading.Event) -> None:
    http = Http.of(managed_broker)

    def rate(path: str, pick: str, field: str = "message_stats") -> float:
        data = http.ok(path)
        items = data if isinstance(data, list) else [data]
        found = [i for i in items if (i[field] if field else i).get(f"{pick}_details")]
        return max(((i[field] if field else i)[f"{pick}_details"]["rate"] for i in found),
                   default=0.0)

    wait_for(lambda: rate("/api/vhosts/%2F", "publish") > 0, "a vhost's publish rate")
    wait_for(lambda: rate("/api/vhosts", "confirm") > 0, "a vhost's confirm rate")
    wait_for(lambda: rate("/api/exchanges/%2F/amq.default", "publish_in") > 0,
             "the default exchange's publish_in rate")
    wait_for(lambda: rate("/api/exchanges/%2F", "publish_out") > 0, "a publish_out rate")
    wait_for(lambda: rate("/api/channels", "publish") > 0, "a channel's publish rate")
    wait_for(lambda: rate("/api/connections", "recv_oct", field="") > 0,
             "a connection's recv_oct rate")
    with_samples = http.ok("/api/vhosts/%2F?msg_rates_age=60&msg_rates_incr=5")
    assert "samples" in with_samples["message_stats"]["publish_details"]


@pytest.fixture
def quiet_broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    server = InProcessBroker(tmp_path / "data", management_port=free_port(),
                             collect_statistics="none").start()
    yield server
    server.stop()


def test_statistics_none_leaves_the_message_stats_out(quiet_broker: InProcessBroker) -> None:
    drive(quiet_broker.url).close()
    http = Http.of(quiet_broker)
    overview = http.ok("/api/overview")
    assert overview["message_stats"] == {} and overview["rates_mode"] == "none"
    assert "message_stats" not in http.ok("/api/queues/%2F/work")
    assert all("message_stats" not in q for q in http.ok("/api/queues"))
    assert "message_stats" not in http.ok("/api/exchanges/%2F/x")
    assert "message_stats" not in http.ok("/api/vhosts/%2F")
    management = quiet_broker.server.management
    assert management is not None and management.runner is not None
    assert management.runner.app.get(RATES) is None  # no sampler runs


def test_a_bad_statistics_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="'collect_statistics': none, coarse or fine"):
        load(env={"LEVERET_COLLECT_STATISTICS": "lots"})
    assert load(env={}).collect_statistics == "coarse"
    assert load(env={"LEVERET_COLLECT_STATISTICS": "none"}).collect_statistics == "none"


def test_a_query_answer_fetched_with_ack_can_be_acked(managed_broker: InProcessBroker) -> None:
    """basic.get of a Leveret query (amq.leveret.*) in manual ack mode: its ack is counted on
    the channel, and the stand-in queue behind the answer takes the count too."""
    connection = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
    channel = connection.channel()
    channel.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
    method, _props, _body = channel.basic_get("amq.leveret.publisher-id?stream=s&publisher=p")
    assert method is not None
    channel.basic_ack(method.delivery_tag)
    assert channel.queue_declare("s", passive=True).method.queue == "s"  # the channel lives
    (listed,) = Http.of(managed_broker).ok("/api/channels")
    assert listed["message_stats"]["get"] == 1 and listed["message_stats"]["ack"] == 1
    connection.close()


def test_each_object_has_samples_with_msg_rates_age(managed_broker: InProcessBroker,
                                                     busy: threading.Event) -> None:
    """RabbitMQ's `samples`, `avg_rate` and `avg` on queues, exchanges, channels and
    connections: the object's own counter every `msg_rates_incr` seconds, newest first."""
    http = Http.of(managed_broker)
    ages = "msg_rates_age=60&msg_rates_incr=5"

    def two(path: str, pick: str, field: str = "message_stats") -> Any:
        def check() -> Any:
            data = http.ok(path)
            items = data if isinstance(data, list) else [data]
            for item in items:
                stats = item[field] if field else item
                details = stats.get(f"{pick}_details", {})
                if len(details.get("samples", [])) >= 2 and details["samples"][0]["sample"] \
                        > details["samples"][-1]["sample"]:
                    return details
            return None
        return wait_for(check, f"two growing samples of {pick} at {path}")

    queue = two(f"/api/queues/%2F/busy?{ages}", "publish")
    samples = queue["samples"]
    assert [sorted(s) for s in samples] == [["sample", "timestamp"]] * len(samples)
    assert samples == sorted(samples, key=lambda s: -s["timestamp"])
    assert queue["avg_rate"] > 0 and queue["avg"] > 0
    assert http.ok("/api/queues/%2F/busy")["message_stats"]["publish"] >= samples[0]["sample"]
    listed = http.ok(f"/api/queues?{ages}&page=1&page_size=10&name=busy")["items"][0]
    assert "samples" in listed["message_stats"]["publish_details"]
    assert two(f"/api/exchanges/%2F/amq.default?{ages}", "publish_in")["avg_rate"] > 0
    assert two(f"/api/channels?{ages}", "publish")["avg_rate"] > 0
    assert two(f"/api/connections?{ages}", "recv_oct", field="")["avg_rate"] > 0

    # without the parameters, or with ones that are not positive numbers: the rate alone
    for query in ("", "?msg_rates_age=sixty&msg_rates_incr=5", "?msg_rates_age=60",
                  "?msg_rates_age=0&msg_rates_incr=5"):
        details = http.ok(f"/api/queues/%2F/busy{query}")["message_stats"]["publish_details"]
        assert list(details) == ["rate"], query


def test_a_consumer_groups_lag_and_its_rate_of_change(managed_broker: InProcessBroker) -> None:
    """A single-active-consumer group on a stream: its lag is its active member's (the
    committed offset minus the member's last delivered offset), and the lag's change per
    second is in `offset_lag_details` (positive while the group falls behind)."""
    http = Http.of(managed_broker)
    sampler = Sampler(managed_broker.broker)
    connection = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("ledger", durable=True, arguments={"x-queue-type": "stream"})
    for _ in range(10):
        channel.basic_publish("", "ledger", b"x")
    members = []
    for _ in range(2):
        member = pika.BlockingConnection(pika.URLParameters(managed_broker.url))
        taking = member.channel()
        taking.basic_qos(prefetch_count=5)  # takes offsets 0 to 4 and never acks
        taking.basic_consume("ledger", lambda *args: None, consumer_tag="audit",
                             arguments={"x-single-active-consumer": True,
                                        "x-stream-offset": "first"})
        members.append(member)

    def group() -> dict[str, Any]:
        (found,) = [g for g in http.ok("/api/leveret/consumer-groups/%2F")
                    if g["stream"] == "ledger"]
        return found

    wait_for(lambda: group()["offset_lag"] == 5, "the group's lag at 5")
    shown = group()
    assert shown["reference"] == "audit" and shown["consumers"] == 2
    active = [m for m in shown["members"] if m["state"] == "active"]
    assert [(m["offset"], m["offset_lag"]) for m in active] == [(4, 5)]
    assert sorted(shown["offset_lag_details"]) == ["rate"]
    managed_broker.call(lambda: sampler.sample(now=100.0))
    assert sampler.group_rates == {}  # the first sample is the baseline

    for _ in range(10):  # the group stays at offset 4: it falls 10 further behind
        channel.basic_publish("", "ledger", b"x")
    wait_for(lambda: group()["offset_lag"] == 15, "the group's lag at 15")
    managed_broker.call(lambda: sampler.sample(now=102.0))
    assert sampler.group_rates == {("/", "ledger", "audit"): {"offset_lag": 5.0}}
    managed_broker.call(lambda: sampler.sample(now=104.0))
    assert sampler.group_rates == {("/", "ledger", "audit"): {"offset_lag": 0.0}}

    # the broker's own sampler (every 5 s): the group's lag samples through the API
    one = http.ok("/api/leveret/consumer-groups/%2F/ledger/audit?msg_rates_age=60"
                  "&msg_rates_incr=5")
    assert one["offset_lag"] == 15 and "samples" in one["offset_lag_details"]
    wait_for(lambda: http.ok("/api/leveret/consumer-groups?msg_rates_age=60&msg_rates_incr=5")[
        0]["offset_lag_details"]["samples"], "a sample of the group's lag")
    listed = http.ok("/api/leveret/consumer-groups?msg_rates_age=60&msg_rates_incr=5")[0]
    assert listed["offset_lag_details"]["samples"][0]["sample"] == 15
    for member in members:
        member.close()
    wait_for(lambda: not [g for g in http.ok("/api/leveret/consumer-groups/%2F")
                          if g["stream"] == "ledger"], "the group gone with its members")
    connection.close()


def test_statistics_none_leaves_a_groups_lag_rate_out(quiet_broker: InProcessBroker) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(quiet_broker.url))
    channel = connection.channel()
    channel.queue_declare("ledger", durable=True, arguments={"x-queue-type": "stream"})
    channel.basic_qos(prefetch_count=5)
    channel.basic_consume("ledger", lambda *args: None, consumer_tag="audit",
                          arguments={"x-single-active-consumer": True})
    (group,) = Http.of(quiet_broker).ok("/api/leveret/consumer-groups")
    assert group["offset_lag"] == 0 and "offset_lag_details" not in group
    connection.close()
