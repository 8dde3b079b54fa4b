"""RabbitMQ's Prometheus names (those of the rabbitmq_prometheus plugin) for what Leveret has.

So that RabbitMQ's Grafana dashboards work on Leveret: `GET /metrics` offers them aggregated
(one series each, no per-object labels, as RabbitMQ's default endpoint), beside Leveret's own
`leveret_*` names; `GET /metrics/per-object` offers them with `vhost` and `queue` labels per
queue (RabbitMQ's per-object endpoint), without the `leveret_*` ones. The dashboards join every
series with `rabbitmq_identity_info`, which names the node, the cluster and the endpoint.

The global counters (`rabbitmq_global_messages_*_total`, labelled `protocol="amqp091"`, and
`queue_type` for deliveries; `rabbitmq_global_messages_dead_lettered_delivery_limit_total` by
`queue_type` and `dead_letter_strategy`, a quorum queue's) add up the queues' and channels'
counters; what an object counted
is kept when it goes (sampled every few seconds and at each scrape), so they never go back.
Only this node's queues and connections are counted (RabbitMQ's metrics are per node too). The
per-object endpoint adds `rabbitmq_raft_*` for this node's member of each quorum queue, as
Ra reports each member on its node, and `rabbitmq_queue_info` (each queue here, its type and
whether this node's member leads or follows).

Knows the model's counters and prometheus-client; not AMQP. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from leveret.broker.broker import VERSION
from leveret.broker.management import quorum_ops, views
from leveret.broker.management.http import BROKER
from leveret.broker.management.nodes import NODES
from leveret.broker.management.overview import RABBITMQ_COMPAT_VERSION, cluster_name, node_view

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

PROTOCOL = "amqp091"
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue",
               "stream": "rabbit_stream_queue"}
SAMPLE_S = 5.0

# (name, help): rabbitmq_global_<name>_total{protocol, queue_type}, from each queue
DELIVERY_COUNTERS = (
    ("messages_delivered", "Total number of messages delivered to consumers"),
    ("messages_delivered_consume_manual_ack", "Total number of messages delivered to "
     "consumers using basic.consume with manual acknowledgment"),
    ("messages_delivered_consume_auto_ack", "Total number of messages delivered to consumers "
     "using basic.consume with automatic acknowledgment"),
    ("messages_delivered_get_manual_ack", "Total number of messages delivered to consumers "
     "using basic.get with manual acknowledgment"),
    ("messages_delivered_get_auto_ack", "Total number of messages delivered to consumers "
     "using basic.get with automatic acknowledgment"),
    ("messages_get_empty", "Total number of times basic.get operations fetched no message"),
    ("messages_redelivered", "Total number of messages redelivered to consumers"),
    ("messages_acknowledged", "Total number of messages acknowledged by consumers"),
)
# rabbitmq_global_<name>_total{protocol}, from each channel
PUBLISH_COUNTERS = (
    ("messages_received", "Total number of messages received from publishers"),
    ("messages_received_confirm", "Total number of messages received from publishers "
     "expecting confirmations"),
    ("messages_routed", "Total number of messages routed to queues or streams"),
    ("messages_unroutable_dropped", "Total number of messages published as non-mandatory into "
     "an exchange and dropped as unroutable"),
    ("messages_unroutable_returned", "Total number of messages published as mandatory into an "
     "exchange and returned to the publisher as unroutable"),
    ("messages_confirmed", "Total number of messages confirmed to publishers"),
)
# per queue (per-object only): rabbitmq_queue_<name>_total{vhost, queue}
QUEUE_COUNTERS = (
    ("get_ack", "get", "Total number of messages fetched from a queue with basic.get in "
     "manual acknowledgement mode"),
    ("get", "get_no_ack", "Total number of messages fetched from a queue with basic.get in "
     "automatic acknowledgement mode"),
    ("messages_delivered_ack", "deliver", "Total number of messages delivered from a queue to "
     "consumers in manual acknowledgement mode"),
    ("messages_delivered", "deliver_no_ack", "Total number of messages delivered from a queue "
     "to consumers in automatic acknowledgement mode"),
    ("messages_redelivered", "redeliver", "Total number of messages redelivered from a queue "
     "to consumers"),
    ("messages_acked", "ack", "Total number of messages acknowledged by consumers on a queue"),
)


DEAD_LETTER_STRATEGIES = ("disabled", "at_most_once", "at_least_once")
RAFT_GAUGES = (("term", "Current term"), ("snapshot_index", "Current snapshot index"),
               ("last_applied", "Last applied index. Can go backwards if a ra server is "
                "restarted"), ("commit_index", "Current commit index"),
               ("last_written_index", "Last fully written and fsynced index of the log"))


def dead_letter_strategy(queue: Any) -> str:
    """RabbitMQ's `dead_letter_strategy` label of a queue's dead-lettering (the strategy the
    queue applies: at-least-once falls back to at-most-once without reject-publish)."""
    if getattr(queue, "dlx", None) is None:
        return "disabled"
    return "at_least_once" if getattr(queue, "at_least_once", False) else "at_most_once"


def raft_figures(queue: Any) -> dict[str, int]:
    """This node's member of a quorum queue in Raft's figures (quorum_status's mapping)."""
    log = queue.log
    bound = queue.commit_bound
    commit = bound if bound is not None else log.committed_offset
    return {"term": max(log.tail[0] if log.next_offset else log.epoch, log.epoch),
            "snapshot_index": quorum_ops.snapshot_index(queue), "last_applied": commit,
            "commit_index": commit, "last_written_index": log.committed_offset}


def queue_values(queue: Any) -> tuple[int, ...]:
    counts = views.queue_counts(queue)
    return (counts["deliver_get"], counts["deliver"], counts["deliver_no_ack"], counts["get"],
            counts["get_no_ack"], int(queue.stats_get_empty), counts["redeliver"],
            counts["ack"])


def channel_values(channel: Any) -> tuple[int, ...]:
    confirms = channel.confirms
    published = channel.stats_publish
    returned, dropped = channel.stats_return_unroutable, channel.stats_unroutable_dropped
    return (published, confirms.seq if confirms is not None else 0,
            max(0, published - returned - dropped), dropped, returned,
            confirms.confirmed if confirms is not None else 0)


class Monotonic:
    """Counters summed per group over objects that come and go, which never go back."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.seen: dict[int, tuple[Any, str, tuple[int, ...]]] = {}
        self.retired: dict[str, list[int]] = {}

    def update(self, rows: Iterable[tuple[Any, str, tuple[int, ...]]]) -> dict[str, list[int]]:
        current = {id(obj): (obj, group, values) for obj, group, values in rows}
        for key, (obj, group, values) in self.seen.items():
            now = current.get(key)
            if now is None or now[0] is not obj:  # gone: keep what it counted
                kept = self.retired.setdefault(group, [0] * self.width)
                for i, value in enumerate(values):
                    kept[i] += value
        self.seen = current
        out = {group: list(kept) for group, kept in self.retired.items()}
        for _obj, group, values in current.values():
            summed = out.setdefault(group, [0] * self.width)
            for i, value in enumerate(values):
                summed[i] += value
        return out


class RabbitTotals:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.queues = Monotonic(len(DELIVERY_COUNTERS))
        self.channels = Monotonic(len(PUBLISH_COUNTERS))
        self.dead_lettered = Monotonic(1)  # a quorum queue's, at its delivery limit
        self.dead_lettered_counts: dict[str, list[int]] = {}  # by strategy, the last sample

    def local_queues(self) -> list[Any]:
        here = self.broker.config.node_name
        return [q for v in self.broker.vhosts.values() for q in v.queues.values()
                if (q.holder or here) == here]

    def channels_of(self) -> list[Any]:
        return [c for s in list(self.broker.connections) for c in s.channels.values()]

    def sample(self, queues: list[Any] | None = None, channels: list[Any] | None = None
               ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        queues = self.local_queues() if queues is None else queues
        channels = self.channels_of() if channels is None else channels
        self.dead_lettered_counts = self.dead_lettered.update(
            (q, dead_letter_strategy(q), (int(q.stats_delivery_limit),))
            for q in queues if q.type == "quorum" and hasattr(q, "stats_delivery_limit"))
        return (self.queues.update((q, QUEUE_TYPES.get(q.type, f"rabbit_{q.type}_queue"),
                                    queue_values(q)) for q in queues),
                self.channels.update((c, PROTOCOL, channel_values(c)) for c in channels))


def node_labelled(labels: dict[str, str], metrics: Iterator[Metric]) -> Iterator[Metric]:
    """`metrics` with `labels` added to each sample: the port's `nodes.NodesView.metric_labels`,
    none on a single node, a `node` label naming this node in cluster mode."""
    if not labels:
        yield from metrics
        return
    for metric in metrics:
        metric.samples = [s._replace(labels={**s.labels, **labels}) for s in metric.samples]
        yield metric


def gauge(name: str, doc: str, value: float | None = None,
           labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, labels=labels)


def every(interval_s: float, step: Callable[[], object]) -> Callable[
        [web.Application], AsyncIterator[None]]:
    """A cleanup context that calls `step` on the broker's loop every `interval_s` seconds
    while the management app runs (the samplers of cumulative counters)."""
    async def context(_app: web.Application) -> AsyncIterator[None]:
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_s)
                step()

        task = asyncio.get_running_loop().create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


class RabbitCollector:
    """RabbitMQ's names, aggregated or per object (`per_object`)."""

    def __init__(self, broker: Broker, totals: RabbitTotals, per_object: bool,
                 labels: dict[str, str]) -> None:
        self.broker = broker
        self.totals = totals
        self.per_object = per_object
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        """In cluster mode every series also carries a `node` label, as Leveret's own names do
        (the dashboards join on instance and job, so an extra label does not matter)."""
        return node_labelled(self.labels, self._collect())

    def _collect(self) -> Iterator[Metric]:
        broker = self.broker
        sessions = list(broker.connections)
        channels = [c for s in sessions for c in s.channels.values()]
        queues = self.totals.local_queues()
        by_type, by_protocol = self.totals.sample(queues, channels)
        consumers = sum(len(c.consumers) for c in channels)

        for i, (name, doc) in enumerate(PUBLISH_COUNTERS):
            family = CounterMetricFamily(f"rabbitmq_global_{name}", doc, labels=["protocol"])
            family.add_metric([PROTOCOL], by_protocol.get(PROTOCOL, [0] * 6)[i])
            yield family
        for i, (name, doc) in enumerate(DELIVERY_COUNTERS):
            family = CounterMetricFamily(f"rabbitmq_global_{name}", doc,
                                         labels=["protocol", "queue_type"])
            for queue_type in sorted({*QUEUE_TYPES.values(), *by_type}):
                values = by_type.get(queue_type)
                family.add_metric([PROTOCOL, queue_type], values[i] if values else 0)
            yield family
        publishers = gauge("rabbitmq_global_publishers", "Current number of publishers",
                            labels=["protocol"])
        publishers.add_metric([PROTOCOL], sum(1 for c in channels if c.stats_publish))
        yield publishers
        consuming = gauge("rabbitmq_global_consumers", "Current number of consumers",
                           labels=["protocol"])
        consuming.add_metric([PROTOCOL], consumers)
        yield consuming

        opened, channels_opened = broker.connections_opened_total, broker.channels_opened_total
        yield CounterMetricFamily("rabbitmq_connections_opened",
                                  "Total number of connections opened", value=opened)
        yield CounterMetricFamily("rabbitmq_connections_closed",
                                  "Total number of connections closed or terminated",
                                  value=max(0, opened - len(sessions)))
        yield CounterMetricFamily("rabbitmq_channels_opened", "Total number of channels opened",
                                  value=channels_opened)
        yield CounterMetricFamily("rabbitmq_channels_closed", "Total number of channels closed",
                                  value=max(0, channels_opened - len(channels)))
        yield gauge("rabbitmq_connections", "Connections currently open", len(sessions))
        yield gauge("rabbitmq_channels", "Channels currently open", len(channels))
        yield gauge("rabbitmq_consumers", "Consumers currently connected", consumers)
        yield gauge("rabbitmq_queues", "Queues available", len(queues))
        yield from self._queues(queues)
        yield from self._quorum(queues)

        node = node_view(broker)
        yield gauge("rabbitmq_process_open_fds", "Open file descriptors", node["fd_used"])
        yield gauge("rabbitmq_process_max_fds", "Open file descriptors limit",
                     node["fd_total"])
        yield gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes",
                     node["mem_used"])
        yield gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes",
                     node["mem_limit"])
        yield gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes",
                     node["disk_free"])
        yield gauge("rabbitmq_disk_space_available_limit_bytes",
                     "Free disk space low watermark in bytes", node["disk_free_limit"])
        yield gauge("rabbitmq_erlang_uptime_seconds", "Node uptime", node["uptime"] / 1000)

        build = UnknownMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                    labels=["product_name", "product_version",
                                            "rabbitmq_version", "erlang_version"])
        build.add_metric(["Leveret", VERSION, RABBITMQ_COMPAT_VERSION, ""], 1)
        yield build
        identity = UnknownMetricFamily("rabbitmq_identity_info",
                                       "RabbitMQ node & cluster identity info",
                                       labels=["rabbitmq_node", "rabbitmq_cluster",
                                               "rabbitmq_endpoint"])
        identity.add_metric([broker.config.node_name, cluster_name(broker),
                             "per-object" if self.per_object else "aggregated"], 1)
        yield identity

    def _queues(self, queues: list[Any]) -> Iterator[Metric]:
        labels = ["vhost", "queue"] if self.per_object else None
        gauges = {
            "ready": gauge("rabbitmq_queue_messages_ready",
                            "Messages ready to be delivered to consumers", labels=labels),
            "unacked": gauge("rabbitmq_queue_messages_unacked",
                              "Messages delivered to consumers but not yet acknowledged",
                              labels=labels),
            "messages": gauge("rabbitmq_queue_messages",
                               "Sum of ready and unacknowledged messages - total queue depth",
                               labels=labels),
            "consumers": gauge("rabbitmq_queue_consumers", "Consumers on a queue",
                                labels=labels),
        }
        rows = []
        for queue in queues:
            unacked = queue.unacked
            rows.append(([queue.vhost.name, queue.name], {
                "ready": queue.message_count, "unacked": unacked,
                "messages": queue.message_count + unacked, "consumers": len(queue.consumers)}))
        if not self.per_object:
            for key, family in gauges.items():
                family.add_metric([], sum(values[key] for _labels, values in rows))
            yield from gauges.values()
            return
        for labels_of, values in rows:
            for key, family in gauges.items():
                family.add_metric(labels_of, values[key])
        yield from gauges.values()
        for name, kind, doc in QUEUE_COUNTERS:
            counter = CounterMetricFamily(f"rabbitmq_queue_{name}", doc, labels=labels)
            for queue in queues:
                counter.add_metric([queue.vhost.name, queue.name],
                                   views.queue_counts(queue)[kind])
            yield counter


    def _quorum(self, queues: list[Any]) -> Iterator[Metric]:
        """The delivery-limit dead-letter counter (rabbit_global_counters' labels), and, per
        object, this node's member of each quorum queue in rabbitmq_raft_*'s names (the
        mapping of quorum_status: docs/QUORUM-QUEUES.md)."""
        counts = self.totals.dead_lettered_counts  # (sampled with the others, just before)
        limit = CounterMetricFamily(
            "rabbitmq_global_messages_dead_lettered_delivery_limit",
            "Total number of messages dead-lettered due to delivery-limit exceeded",
            labels=["queue_type", "dead_letter_strategy"])
        for strategy in DEAD_LETTER_STRATEGIES:
            limit.add_metric(["rabbit_quorum_queue", strategy], counts.get(strategy, [0])[0])
        yield limit
        if not self.per_object:
            return
        info = gauge("rabbitmq_queue_info", "A metric with a constant '1' value and labels that "
                     "provide some queue details",
                     labels=["vhost", "queue", "queue_type", "membership"])
        for queue in queues:  # this node's member of each (a replica's: follower)
            membership = "follower" if getattr(queue, "role", "") == "replica" else "leader"
            info.add_metric([queue.vhost.name, queue.name,
                             QUEUE_TYPES.get(queue.type, f"rabbit_{queue.type}_queue"),
                             membership], 1)
        yield info
        members = [q for q in queues if q.type == "quorum" and getattr(q, "log", None)]
        labels = ["vhost", "queue"]
        families = {key: gauge(f"rabbitmq_raft_{key}", doc, labels=labels)
                    for key, doc in RAFT_GAUGES}
        for queue in members:
            figures = raft_figures(queue)
            for key, family in families.items():
                family.add_metric([queue.vhost.name, queue.name], figures[key])
        yield from families.values()


TOTALS: web.AppKey[RabbitTotals] = web.AppKey("rabbit-metric-totals")
PER_OBJECT: web.AppKey[CollectorRegistry] = web.AppKey("rabbit-per-object-registry")


async def get_per_object(request: web.Request) -> web.Response:
    data = generate_latest(request.app[PER_OBJECT])
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application, aggregated: CollectorRegistry) -> None:
    """Add the aggregated names to `/metrics`'s registry, and serve `/metrics/per-object`."""
    broker = app[BROKER]
    labels = app[NODES].metric_labels()
    totals = RabbitTotals(broker)
    aggregated.register(RabbitCollector(broker, totals, per_object=False, labels=labels))
    per_object = CollectorRegistry(auto_describe=False)
    per_object.register(RabbitCollector(broker, totals, per_object=True, labels=labels))
    app[TOTALS] = totals
    app[PER_OBJECT] = per_object
    app.cleanup_ctx.append(every(SAMPLE_S, totals.sample))
    app.router.add_get("/metrics/per-object", get_per_object)
