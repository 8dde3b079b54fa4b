"""Where a new queue lives: the one placement function and the one leader-locator reader.

`leader_locator` reads, as RabbitMQ does, the `queue-leader-locator` policy key, else the
`x-queue-leader-locator` argument, else the node's `queue_leader_locator` setting; the values
are the model's `args.LEADER_LOCATORS` (an unknown one is `client-local`: the argument was
checked at declaration).

`place` answers for every front end: an exclusive queue, and any queue placed `client-local`,
lives on the declaring node; a new stream gets its leader and members over the running nodes
(`cluster.running_nodes.place_new_stream`, which may wait for the links of its members); a
classic queue placed `balanced` (or the legacy locators) goes to the reachable node holding
the fewest queues (ties by name), since it must be served through the link at once.

It must not know etcd's wire, AMQP, the stream protocol or HTTP; it reads the cluster
runtime's running-node set and topology cache. Asyncio: one event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from leveret.broker.cluster import running_nodes
from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.model import args as qargs
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG
from leveret.broker.model.policy import effective
from leveret.broker.topology.port import Placement, QueueSpec

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.model.policy import Policy

LEADER_LOCATORS = qargs.LEADER_LOCATORS
# the replicated types: the argument that sizes a new one's members, and its default (None:
# every running node, as RabbitMQ's streams; 3 for a quorum queue, as RabbitMQ's)
REPLICATED_SIZES: dict[str, tuple[str, int | None]] = {
    "stream": ("x-initial-cluster-size", None),
    "quorum": ("x-quorum-initial-group-size", 3),
    DELAYED_LOG: ("x-quorum-initial-group-size", 3),  # a delayed exchange's (delayed_log.py)
}


def leader_locator(policies: dict[str, Policy], queue_type: str, name: str,
                   arguments: Mapping[str, Any], setting: str) -> str:
    """The locator that places a new queue (or stream leader) of this name and type."""
    policy = effective(policies, "queues", queue_type, name)
    found = policy.definition.get("queue-leader-locator") if policy is not None else None
    if found is None:
        found = arguments.get("x-queue-leader-locator")
    if found is None:
        found = setting
    text = qargs.text(found)
    return text if text in LEADER_LOCATORS else "client-local"


async def place(cluster: ClusterRuntime, vhost: str, policies: dict[str, Policy],
                spec: QueueSpec, setting: str) -> Placement:
    """The node (and a new stream's members) of a queue declared on this node."""
    if spec.exclusive:
        return Placement(cluster.node)
    locator = leader_locator(policies, spec.type, spec.name, spec.arguments, setting)
    if spec.type in REPLICATED_SIZES and spec.new:  # docs/REPLICATION.md, "Membership"
        key, default = REPLICATED_SIZES[spec.type]
        node, members = await running_nodes.place_new_stream(
            cluster, vhost, spec.name, spec.arguments.get(key, default), locator)
        return Placement(node, members)
    if locator == "client-local":
        return Placement(cluster.node)  # the others ask for balanced (RabbitMQ 3.10+)
    held = dict.fromkeys(running_nodes.reachable_nodes(cluster), 0)
    for record in cluster.cache.all("queues"):
        if isinstance(record, QueueRecord) and record.node in held:
            held[record.node] += 1
    return Placement(min(sorted(held), key=lambda node: held[node]))
