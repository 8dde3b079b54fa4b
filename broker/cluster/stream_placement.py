"""Where a new replicated stream (or quorum queue) lives: its members and its first leader.

`x-initial-cluster-size` says how many nodes hold the stream (default: every running node, as
RabbitMQ; capped at the running nodes). The leader is placed by the leader locator
(`client-local`: the declaring node; `balanced`, and the legacy `random`, `least-leaders`,
`min-masters` as RabbitMQ 3.10+ reads them: the running node that leads the fewest streams,
ties by name). The other members are the running nodes holding the fewest streams (ties by
name), so that storage spreads as streams are added.

It must not know etcd, the links, the model or AMQP: it reads plain queue records.
Plain functions: any thread.
"""

from __future__ import annotations

from collections.abc import Iterable

from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG


def cluster_size(argument: object, running: int) -> int:
    """The number of members: the argument (already checked as a positive integer by the
    model's argument checks) capped at the running nodes, or every running node."""
    if isinstance(argument, int) and not isinstance(argument, bool) and argument > 0:
        return max(1, min(argument, running))
    return max(1, running)


def place_stream(this_node: str, running: Iterable[str], records: Iterable[QueueRecord],
                 size_argument: object, locator: str) -> tuple[str, tuple[str, ...]]:
    """(leader, members with the leader first) for a new stream declared on `this_node`."""
    nodes = sorted(set(running) | {this_node})
    leaders = dict.fromkeys(nodes, 0)
    held = dict.fromkeys(nodes, 0)
    for record in records:
        if record.type not in ("stream", "quorum", DELAYED_LOG):
            continue
        if record.node in leaders:
            leaders[record.node] += 1
        for member in record.members or (record.node,):
            if member in held:
                held[member] += 1
    if locator == "client-local":
        leader = this_node
    else:
        leader = min(nodes, key=lambda node: (leaders[node], node))
    size = cluster_size(size_argument, len(nodes))
    others = sorted((n for n in nodes if n != leader), key=lambda node: (held[node], node))
    return leader, (leader, *others[:size - 1])
