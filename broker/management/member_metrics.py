"""Per-member gauges of replicated streams for GET /metrics (prometheus-client).

  leveret_stream_member_offset{vhost, stream, node, role}            last offset the member holds
  leveret_stream_member_committed_offset{vhost, stream, node, role}  its commit point
  leveret_stream_member_lag{vhost, stream, node, role}               writer's offset minus it
  leveret_stream_member_epoch{vhost, stream, node, role}             the epoch it follows

`node` is the member's node and `role` writer or replica. Only the leader's node reports a
stream's members (it knows every member's acknowledged offset), so one series per member
exists across the cluster; a replica's node reports none of them. A replica not synced yet has
no offset series. A collector of its own, beside metrics.py's, so that the `node` label is the
member's, not the scraped node's.

It knows the model's stream queues and their replication's `member_rows` (stream_status's
rows); runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from leveret.broker.management import streamops

LABELS = ["vhost", "stream", "node", "role"]
FIELDS = {
    "offset": "Last offset a member of a replicated stream holds (acknowledged, for a replica)",
    "committed_offset": "Commit point of a member of a replicated stream",
    "lag": "How far a member's offset is behind the writer's",
    "epoch": "Epoch a member of a replicated stream follows",
}


class MemberCollector:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        families = {field: GaugeMetricFamily(f"leveret_stream_member_{field}", doc,
                                             labels=LABELS) for field, doc in FIELDS.items()}
        node = self.broker.config.node_name
        for vhost in list(self.broker.vhosts.values()):
            for queue in list(vhost.queues.values()):
                if getattr(queue, "role", "") != "leader" or not hasattr(queue, "log"):
                    continue
                for row in streamops.status(queue, node)["members"]:
                    labels = [vhost.name, queue.name, str(row["node"]), str(row["role"])]
                    for field, family in families.items():
                        if row.get(field) is not None:
                            family.add_metric(labels, row[field])
        yield from families.values()
