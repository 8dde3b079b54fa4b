"""What a node holds in cluster mode, in one place: its etcd client, membership, links to the
other nodes, and the topology's store (etcd transactions) and cache (the watched copy).

`Broker.cluster` is one of these in cluster mode and None on a single node. The server builds
it once the node has joined; each layer that takes part (the topology's sync into the model,
forwarding to other nodes, access control and definitions) registers its cache callbacks and
link handlers on it in its own `install(broker)` before the cache's first load.

It must not know AMQP or the sessions. Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.link import Link
from leveret.broker.cluster.membership import Membership
from leveret.broker.cluster.peers import ClusterLinks
from leveret.broker.cluster.topology import TopologyStore
from leveret.broker.cluster.topology_cache import TopologyCache
from leveret.broker.process import logs

log = logs.get("leveret.cluster")
WAIT = "topology.wait"  # a peer asks: tell me once your cache has applied this revision
SETTLE_TIMEOUT_S = 10.0


@dataclass
class ClusterRuntime:
    node: str  # this node's name (--node-name)
    cluster: str  # --cluster-name
    client: EtcdClient
    membership: Membership
    links: ClusterLinks
    store: TopologyStore
    cache: TopologyCache

    def __post_init__(self) -> None:
        self.links.handlers.on_request(WAIT, self._answer_wait)

    async def settle(self, revision: int, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Return once this node's cache and every linked peer's have applied `revision`: a
        change is then visible on every running node. A peer that cannot answer in time (going
        down, cut off) is logged and not waited for; its cache catches up from etcd."""
        await self.cache.wait_for(revision, timeout_s)
        links = [link for link in self.links.links.values() if not link.closed]
        if not links:
            return
        results = await asyncio.gather(
            *(link.call(WAIT, revision, timeout=timeout_s) for link in links),
            return_exceptions=True)
        for link, result in zip(links, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("a peer did not confirm a topology change", peer_node=link.peer_node,
                            revision=revision, error=str(result))

    async def _answer_wait(self, _link: Link, body: object) -> int:
        if not isinstance(body, int) or isinstance(body, bool):
            raise ValueError("topology.wait takes a revision")
        await self.cache.wait_for(body, SETTLE_TIMEOUT_S)
        return self.cache.revision
