"""RabbitMQ's Prometheus names (`broker/management/prometheus_names.py`): at `/metrics`
aggregated beside Leveret's own names, at `/metrics/per-object` per queue; their types, and
values that match what a pika client did and what the management API counts."""

from __future__ import annotations

from typing import Any

import pika
from prometheus_client.parser import text_string_to_metric_families
from support.brokers import InProcessBroker
from support.management import Http

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: Http, path: str) -> tuple[dict[str, str], Samples]:
    """The family types by name, and every sample by (name, labels)."""
    reply = http.get(path, auth=False)
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
    families = list(text_string_to_metric_families(reply.text))
    return ({f.name: f.type for f in families},
            {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in families for s in f.samples})


def traffic(url: str) -> pika.BlockingConnection:
    """5 confirmed publishes to `jobs`, 1 returned unroutable, 1 dropped; a get (manual ack,
    acked), a nack with requeue, an auto-ack get of the redelivered message, an empty get."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("jobs")
    channel.queue_declare("empty")
    for _ in range(5):
        channel.basic_publish("", "jobs", b"j")
    try:
        channel.basic_publish("", "nowhere", b"r", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    channel.basic_publish("", "nowhere", b"d")
    method, _p, _b = channel.basic_get("jobs")
    assert method is not None
    channel.basic_ack(method.delivery_tag)
    method, _p, _b = channel.basic_get("jobs")
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _p, _b = channel.basic_get("jobs", auto_ack=True)
    assert method is not None and method.redelivered
    assert channel.basic_get("empty")[0] is None
    return connection


AMQP = (("protocol", "amqp091"),)
CLASSIC = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))


def test_rabbitmq_names_aggregated(managed_broker: InProcessBroker) -> None:
    connection = traffic(managed_broker.url)
    http = Http.of(managed_broker)
    types, values = scrape(http, "/metrics")
    assert values[("leveret_connections", ())] == 1  # Leveret's names stay
    for name in ("rabbitmq_connections", "rabbitmq_channels", "rabbitmq_queues",
                 "rabbitmq_consumers", "rabbitmq_queue_messages_ready",
                 "rabbitmq_queue_messages_unacked", "rabbitmq_process_resident_memory_bytes",
                 "rabbitmq_global_publishers", "rabbitmq_global_consumers"):
        assert types[name] == "gauge", name
    for name in ("rabbitmq_global_messages_received", "rabbitmq_global_messages_confirmed",
                 "rabbitmq_global_messages_delivered", "rabbitmq_global_messages_acknowledged",
                 "rabbitmq_global_messages_redelivered", "rabbitmq_global_messages_routed"):
        assert types[name] == "counter", name
    assert types["rabbitmq_identity_info"] == "unknown"  # `untyped` in the text format

    assert values[("rabbitmq_connections", ())] == 1
    assert values[("rabbitmq_channels", ())] == 1
    assert values[("rabbitmq_queues", ())] == 2
    assert values[("rabbitmq_queue_messages_ready", ())] == 3
    assert values[("rabbitmq_queue_messages_unacked", ())] == 0
    assert values[("rabbitmq_global_messages_received_total", AMQP)] == 7
    assert values[("rabbitmq_global_messages_received_confirm_total", AMQP)] == 7
    assert values[("rabbitmq_global_messages_routed_total", AMQP)] == 5
    assert values[("rabbitmq_global_messages_unroutable_returned_total", AMQP)] == 1
    assert values[("rabbitmq_global_messages_unroutable_dropped_total", AMQP)] == 1
    assert values[("rabbitmq_global_messages_confirmed_total", AMQP)] == 7
    assert values[("rabbitmq_global_messages_delivered_total", CLASSIC)] == 3
    assert values[("rabbitmq_global_messages_delivered_get_manual_ack_total", CLASSIC)] == 2
    assert values[("rabbitmq_global_messages_delivered_get_auto_ack_total", CLASSIC)] == 1
    assert values[("rabbitmq_global_messages_get_empty_total", CLASSIC)] == 1
    assert values[("rabbitmq_global_messages_redelivered_total", CLASSIC)] == 1
    assert values[("rabbitmq_global_messages_acknowledged_total", CLASSIC)] == 1
    assert values[("rabbitmq_global_publishers", AMQP)] == 1
    assert values[("rabbitmq_connections_opened_total", ())] == 1
    assert values[("rabbitmq_connections_closed_total", ())] == 0
    assert values[("rabbitmq_channels_opened_total", ())] == 1
    identity = [labels for (name, labels) in values if name == "rabbitmq_identity_info"]
    node = http.ok("/api/overview")["node"]
    assert dict(identity[0])["rabbitmq_node"] == node
    assert dict(identity[0])["rabbitmq_endpoint"] == "aggregated"

    # the same counts as the API's
    overview = http.ok("/api/overview")
    stats = overview["message_stats"]
    assert values[("rabbitmq_global_messages_confirmed_total", AMQP)] == stats["confirm"]
    assert values[("rabbitmq_global_messages_delivered_total", CLASSIC)] == stats["deliver_get"]
    assert values[("rabbitmq_global_messages_acknowledged_total", CLASSIC)] == stats["ack"]
    assert values[("rabbitmq_connections", ())] == overview["object_totals"]["connections"]
    assert values[("rabbitmq_queue_messages_ready", ())] == \
        overview["queue_totals"]["messages_ready"]

    # counters never go back when their queue and channel go
    connection.channel().queue_delete("jobs")
    connection.close()
    _types, after = scrape(http, "/metrics")
    assert after[("rabbitmq_global_messages_received_total", AMQP)] == 7
    assert after[("rabbitmq_global_messages_delivered_total", CLASSIC)] == 3
    assert after[("rabbitmq_connections", ())] == 0
    assert after[("rabbitmq_connections_opened_total", ())] == 1
    assert after[("rabbitmq_connections_closed_total", ())] == 1
    assert after[("rabbitmq_channels_opened_total", ())] == 2  # the one that deleted `jobs`
    assert after[("rabbitmq_channels_closed_total", ())] == 2


def test_rabbitmq_names_per_object(managed_broker: InProcessBroker) -> None:
    connection = traffic(managed_broker.url)
    http = Http.of(managed_broker)
    types, values = scrape(http, "/metrics/per-object")
    assert not any(name.startswith("leveret_") for name in types)
    jobs = (("queue", "jobs"), ("vhost", "/"))
    api: Any = http.ok("/api/queues/%2F/jobs")
    assert values[("rabbitmq_queue_messages_ready", jobs)] == api["messages_ready"] == 3
    assert values[("rabbitmq_queue_messages", jobs)] == api["messages"]
    assert values[("rabbitmq_queue_consumers", jobs)] == 0
    assert types["rabbitmq_queue_get_ack"] == "counter"
    assert values[("rabbitmq_queue_get_ack_total", jobs)] == api["message_stats"]["get"] == 2
    assert values[("rabbitmq_queue_get_total", jobs)] == 1
    assert values[("rabbitmq_queue_messages_redelivered_total", jobs)] == 1
    assert values[("rabbitmq_queue_messages_acked_total", jobs)] == 1
    assert values[("rabbitmq_queue_messages_ready", (("queue", "empty"), ("vhost", "/")))] == 0
    identity = [dict(labels) for (name, labels) in values if name == "rabbitmq_identity_info"]
    assert identity[0]["rabbitmq_endpoint"] == "per-object"
    connection.close()
