"""GET /metrics: the broker's state in Prometheus text format (prometheus-client).

Global counters (`leveret_messages_published_total`, `..._delivered_total`,
`..._confirmed_total`) add up the per-queue and per-channel counts; so that they never go back
when a queue or channel goes away, a sampler keeps what each object had counted when it was
last seen (every scrape, and every few seconds in the background). Per-queue and per-stream
series carry `vhost` and `queue`/`stream` labels. The figures are this node's only; in cluster
mode every series also carries a `node` label (`--node-name`), so that one Prometheus can scrape
every node (a single node's series stay as they were). No login is needed, as with RabbitMQ's
Prometheus endpoint. RabbitMQ's own names (rabbitmq_prometheus's) are added beside these by
prometheus_names.py, which also serves `/metrics/per-object`.

Runs on the event loop; a scrape walks the vhosts, queues and connections once.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from leveret.broker.broker import VERSION
from leveret.broker.management import prometheus_names
from leveret.broker.management.http import BROKER
from leveret.broker.management.member_metrics import MemberCollector
from leveret.broker.management.nodes import NODES
from leveret.broker.management.overview import alarm_state
from leveret.broker.management.prometheus_names import every
from leveret.broker.management.prometheus_names import gauge as _gauge
from leveret.broker.process.alarms import resident_memory_bytes

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

SAMPLE_INTERVAL_S = 5.0


class Totals:
    """A counter summed over objects that come and go, which never decreases."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[object, int]] = {}
        self.retired = 0

    def update(self, counts: Iterable[tuple[object, int]]) -> int:
        current = {id(obj): (obj, value) for obj, value in counts}
        for key, (_obj, value) in self.seen.items():
            if key not in current:
                self.retired += value
        self.seen = current
        return self.retired + sum(value for _obj, value in current.values())


class BrokerTotals:
    """The three global message counters."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.published = Totals()
        self.delivered = Totals()
        self.confirmed = Totals()
        self.values = (0, 0, 0)

    def sample(self) -> tuple[int, int, int]:
        queues = [q for v in self.broker.vhosts.values() for q in v.queues.values()]
        channels = [c for s in self.broker.connections for c in s.channels.values()]
        self.values = (
            self.published.update((q, q.stats_published) for q in queues),
            self.delivered.update((q, q.stats_delivered) for q in queues),
            self.confirmed.update(
                (c, c.confirms.confirmed) for c in channels if c.confirms is not None
            ),
        )
        return self.values


class BrokerCollector:
    def __init__(self, broker: Broker, totals: BrokerTotals, labels: dict[str, str]) -> None:
        self.broker = broker
        self.totals = totals
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        return prometheus_names.node_labelled(self.labels, self._collect())

    def _collect(self) -> Iterator[Metric]:
        broker = self.broker
        published, delivered, confirmed = self.totals.sample()
        sessions = list(broker.connections)
        channels = [c for s in sessions for c in s.channels.values()]
        vhosts = list(broker.vhosts.values())
        info = _gauge("leveret_build_info", "Leveret's version", labels=["version"])
        info.add_metric([VERSION], 1)
        yield info
        yield _gauge("leveret_uptime_seconds", "Seconds since the broker started",
                     time.time() - broker.started_at)
        yield _gauge("leveret_connections", "Open AMQP connections", len(sessions))
        yield _gauge("leveret_worker_processes",
                     "Wire worker processes running beside this one (--workers N runs N - 1)",
                     len(broker.alarms.worker_pids()))
        yield _gauge("leveret_channels", "Open AMQP channels", len(channels))
        yield _gauge("leveret_consumers", "Consumers on all channels",
                     sum(len(c.consumers) for c in channels))
        yield _gauge("leveret_vhosts", "Virtual hosts", len(vhosts))
        yield _gauge("leveret_queues", "Queues, streams included",
                     sum(len(v.queues) for v in vhosts))
        yield _gauge("leveret_exchanges", "Exchanges, predeclared ones included",
                     sum(len(v.exchanges) for v in vhosts))
        yield CounterMetricFamily("leveret_messages_published",
                                  "Messages taken by queues (one per queue routed to)",
                                  value=published)
        yield CounterMetricFamily("leveret_messages_delivered",
                                  "Messages delivered to consumers or fetched with basic.get",
                                  value=delivered)
        yield CounterMetricFamily("leveret_messages_confirmed",
                                  "Publishes confirmed (acked or nacked) to publishers",
                                  value=confirmed)
        yield CounterMetricFamily("leveret_login_failures", "Refused logins",
                                  value=broker.login_failures)
        mem_alarm, disk_alarm = alarm_state(broker)
        alarm = _gauge("leveret_alarm", "1 while a resource alarm is in effect",
                       labels=["resource"])
        alarm.add_metric(["memory"], int(mem_alarm))
        alarm.add_metric(["disk"], int(disk_alarm))
        yield alarm
        yield _gauge("leveret_memory_used_bytes", "Resident memory of the broker",
                     resident_memory_bytes(broker.alarms.worker_pids()))
        try:
            free = shutil.disk_usage(broker.config.data_dir).free
        except OSError:
            free = 0
        yield _gauge("leveret_disk_free_bytes", "Free space of the data directory", free)
        yield from self._queues(vhosts)
        yield from self._delayed(vhosts)

    @staticmethod
    def _delayed(vhosts: list[Any]) -> Iterator[Metric]:
        """Each delayed exchange's held messages and what it routed, found no queue for or
        dropped after its targets kept refusing it at their due time, on
        the node that leads its log only (held_info is {} elsewhere), as a queue's series
        come from the node that hosts its leader."""
        labels = ["vhost", "exchange"]
        held = _gauge("leveret_exchange_messages_delayed", "Messages a delayed exchange holds",
                      None, labels)
        routed = CounterMetricFamily("leveret_exchange_delayed_routed",
                                     "Held messages routed at their due time", labels=labels)
        unroutable = CounterMetricFamily("leveret_exchange_delayed_unroutable",
                                         "Held messages that found no queue at their due time",
                                         labels=labels)
        refused = CounterMetricFamily("leveret_exchange_delayed_refused",
                                      "Held messages dropped after their targets refused "
                                      "every retry", labels=labels)
        for vhost in vhosts:
            for exchange in vhost.exchanges.values():
                info = exchange.held_info()
                if info:
                    key = [vhost.name, exchange.name]
                    held.add_metric(key, info["messages_delayed"])
                    routed.add_metric(key, info["delayed_routed"])
                    unroutable.add_metric(key, info["delayed_unroutable"])
                    refused.add_metric(key, info["delayed_refused"])
        yield from (held, routed, unroutable, refused)

    def _queues(self, vhosts: list[Any]) -> Iterator[Metric]:
        labels = ["vhost", "queue", "type"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "messages": _gauge("leveret_queue_messages", "Messages ready and unacked", None,
                               labels),
            "ready": _gauge("leveret_queue_messages_ready", "Messages ready", None, labels),
            "unacked": _gauge("leveret_queue_messages_unacked", "Messages delivered, not "
                              "acknowledged", None, labels),
            "consumers": _gauge("leveret_queue_consumers", "Consumers", None, labels),
            "published": CounterMetricFamily("leveret_queue_messages_published",
                                             "Messages the queue took", labels=labels),
            "delivered": CounterMetricFamily("leveret_queue_messages_delivered",
                                             "Messages the queue delivered", labels=labels),
        }
        stream_labels = ["vhost", "stream"]
        streams = {
            "first_offset": _gauge("leveret_stream_first_offset",
                                   "First offset still on disk", None, stream_labels),
            "last_offset": _gauge("leveret_stream_last_offset", "Last offset written", None,
                                  stream_labels),
            "committed_offset": _gauge("leveret_stream_committed_offset",
                                       "Highest offset readers may see", None, stream_labels),
            "segments": _gauge("leveret_stream_segments", "Segment files", None,
                               stream_labels),
            "bytes": _gauge("leveret_stream_bytes", "Bytes in segment files", None,
                            stream_labels),
        }
        here = self.broker.config.node_name
        for vhost in vhosts:
            for queue in vhost.queues.values():
                if (queue.holder or here) != here:
                    continue  # held by another node: its own /metrics reports it
                key = [vhost.name, queue.name, queue.type]
                unacked = queue.unacked
                families["messages"].add_metric(key, queue.message_count + unacked)
                families["ready"].add_metric(key, queue.message_count)
                families["unacked"].add_metric(key, unacked)
                families["consumers"].add_metric(key, len(queue.consumers))
                families["published"].add_metric(key, queue.stats_published)
                families["delivered"].add_metric(key, queue.stats_delivered)
                if queue.type == "stream":
                    summary = queue.log.summary()
                    skey = [vhost.name, queue.name]
                    for field in ("first_offset", "last_offset", "committed_offset", "bytes"):
                        streams[field].add_metric(skey, summary[field])
                    streams["segments"].add_metric(skey, len(summary["segments"]))
        yield from families.values()
        yield from streams.values()


TOTALS: web.AppKey[BrokerTotals] = web.AppKey("metric-totals")
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("metric-registry")


async def get_metrics(request: web.Request) -> web.Response:
    data = generate_latest(request.app[REGISTRY])
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application) -> None:
    totals = BrokerTotals(app[BROKER])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(app[BROKER], totals, app[NODES].metric_labels()))
    registry.register(MemberCollector(app[BROKER]))  # replicated streams' members
    app[TOTALS] = totals
    app[REGISTRY] = registry
    app.cleanup_ctx.append(every(SAMPLE_INTERVAL_S, totals.sample))
    app.router.add_get("/metrics", get_metrics)
    prometheus_names.setup(app, registry)  # RabbitMQ's names too, and /metrics/per-object
