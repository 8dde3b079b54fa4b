"""Which nodes are running, for a declaration, and a new stream's members placed on them.

Role: the one answer to "which nodes are running" for every way a queue is declared in cluster
mode (queue.declare, the management API and definitions, the stream protocol's Create). As
RabbitMQ places a stream on the running nodes of its cluster membership, the running nodes are
this one and every node whose record is live in etcd, less those this node has lost: nodes it
was linked to since their record appeared and whose link is down now (unreachable from here,
as RabbitMQ does not count a node across a partition as running). A node whose record is live
but whose link is not up yet is starting, and it counts.

`place_new_stream` places a new replicated stream on them (`stream_placement.place_stream`:
`x-initial-cluster-size`, the leader locator) and waits, at most `PLACEMENT_WAIT_S`, until
this node has a link to each chosen member, so that the declaration settles on every member
before its -ok and the stream gets the members it was declared with. A member still without a
link after that is left out: the stream is placed again on the nodes this node reaches (as on
RabbitMQ, where a node that is not running is not a member), and a warning names the nodes
left out. Classic queues placed `balanced` go to `reachable_nodes`: they must be served
through the link at once.

It knows the cluster runtime's links and topology cache; nothing of AMQP or the model.
Asyncio: one event loop.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from leveret.broker.cluster import stream_placement
from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

log = logs.get("leveret.cluster.placement")
# how long a declaration waits for the links of a new stream's members (nodes still starting:
# a starting peer is dialed every 0.2 s, so its link is up within a moment of its start)
PLACEMENT_WAIT_S = 5.0


def lost_nodes(cluster: ClusterRuntime) -> set[str]:
    """Nodes live in etcd that this node was linked to since their record appeared, and whose
    link is down now."""
    links = cluster.links
    return {node for node in links.records
            if node in links.ever_linked and links.link_to(node) is None}


def running_nodes(cluster: ClusterRuntime) -> set[str]:
    """This node and every node live in etcd, less the nodes this node has lost."""
    return ({cluster.node} | set(cluster.links.records)) - lost_nodes(cluster)


def reachable_nodes(cluster: ClusterRuntime) -> set[str]:
    """The running nodes this node has a link to now (and itself)."""
    links = cluster.links
    return {node for node in running_nodes(cluster)
            if node == cluster.node or links.link_to(node) is not None}


async def place_new_stream(cluster: ClusterRuntime, vhost: str, name: str, size_argument: object,
                           locator: str, wait_s: float = PLACEMENT_WAIT_S,
                           ) -> tuple[str, tuple[str, ...]]:
    """(leader, members with the leader first) of a new stream declared on this node; the
    members are () when it has one (a stream as on one node, nothing replicated)."""
    with contextlib.suppress(EtcdException):  # (etcd away: the watch's view, as before)
        await cluster.links.read_new_records()
    records = [r for r in cluster.cache.all("queues") if isinstance(r, QueueRecord)]
    running = running_nodes(cluster)
    leader, members = stream_placement.place_stream(cluster.node, running, records,
                                                    size_argument, locator)
    missing = await cluster.links.wait_linked(members, wait_s)
    if missing:
        leader, members = stream_placement.place_stream(cluster.node, running - missing,
                                                        records, size_argument, locator)
    live = {cluster.node} | set(cluster.links.records)
    wanted = stream_placement.cluster_size(size_argument, len(live))
    if len(members) < wanted:
        left_out = sorted(live - set(members))
        log.warning("a new stream has fewer members than asked: nodes whose link is down or "
                    "did not come up in time are left out", vhost=vhost, stream=name,
                    members=list(members), asked=wanted, left_out=left_out,
                    waited_s=wait_s if missing else 0)
    return leader, (members if len(members) > 1 else ())
