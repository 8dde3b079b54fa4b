"""What a node holds in cluster mode, in one place: its etcd client, membership, links to the
other nodes, and the topology's store (etcd transactions) and cache (the watched copy).

`Broker.cluster` is one of these in cluster mode and None on a single node. The server builds
it once the node has joined; each layer that takes part (the topology's sync into the model,
forwarding to other nodes, access control and definitions) registers its cache callbacks and
link handlers on it in its own `install(broker)` before the cache's first load.

It must not know AMQP or the sessions. Asyncio: one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.membership import Membership
from leveret.broker.cluster.peers import ClusterLinks
from leveret.broker.cluster.topology import TopologyStore
from leveret.broker.cluster.topology_cache import TopologyCache


@dataclass
class ClusterRuntime:
    node: str  # this node's name (--node-name)
    cluster: str  # --cluster-name
    client: EtcdClient
    membership: Membership
    links: ClusterLinks
    store: TopologyStore
    cache: TopologyCache
