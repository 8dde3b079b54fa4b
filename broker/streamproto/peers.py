"""The other nodes as the stream protocol sees them: where a stream's leader and replicas are,
the stream endpoint a node announces, the link that asks a leader's node, and the questions
other nodes ask this one.

Two implementations, chosen once when the listeners start (`peers_of`, the one place that asks
whether the broker runs in a cluster, as `Broker.topology` is chosen once): `OneNode` (every
stream is here, and there is no other node) and `ClusterPeers` (the topology's records, the
nodes' records in etcd, the cluster links). Metadata (cluster.py) and the queries of a stream
held elsewhere (tracking.py) call this and never ask which.
Must not know: frames, AMQP, etcd's wire. Single-threaded, on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.link import Link, MessageHandler, RequestHandler
    from leveret.broker.cluster.runtime import ClusterRuntime

DEFAULT_STREAM_PORT = 5552
Endpoint = tuple[str, int]


class Peers(Protocol):
    @property
    def node(self) -> str:
        """This node's name."""

    def placement(self, vhost: str, name: str, holder: str | None) -> tuple[str, list[str]]:
        """(leader node, replica nodes) of a stream; `holder`: the node the model names."""

    def endpoint(self, node: str) -> Endpoint | None:
        """The stream endpoint another running node announces; None when it is down."""

    def own_host(self) -> str:
        """The host this node is announced at whoever asks ("" on one node: each connection
        is told the host that suits it, advertise.py)."""

    def link_to(self, node: str) -> Link | None:
        """The link that asks another node; None when there is none (or it is this one)."""

    def announced(self, here: Endpoint, involved: set[Endpoint]) -> list[Endpoint]:
        """The endpoints Metadata lists, given this node's and those of the nodes involved in
        the streams it found."""

    def serve(self, requests: Mapping[str, RequestHandler],
              messages: Mapping[str, MessageHandler]) -> None:
        """Answer the other nodes' requests and messages of these kinds (once: a second
        listener of the same broker finds them served)."""


class OneNode:
    """A broker without a cluster: every stream is here, and no other node asks anything."""

    def __init__(self, node: str) -> None:
        self._node = node

    @property
    def node(self) -> str:
        return self._node

    def placement(self, vhost: str, name: str, holder: str | None) -> tuple[str, list[str]]:
        return self._node, []

    def endpoint(self, node: str) -> Endpoint | None:
        return None

    def own_host(self) -> str:
        return ""

    def link_to(self, node: str) -> Link | None:
        return None

    def announced(self, here: Endpoint, involved: set[Endpoint]) -> list[Endpoint]:
        return [here]  # always itself, a stream found or not (RabbitMQ lists none if none)

    def serve(self, requests: Mapping[str, RequestHandler],
              messages: Mapping[str, MessageHandler]) -> None:
        return None


class ClusterPeers:
    """A cluster's nodes: a stream's record names its leader (`node`) and, for a replicated
    stream, its members; each node's record in etcd carries its stream endpoint
    (`stream_host`, `stream_port`; records of older nodes: `advertise_host` and 5552). This
    node announces itself as the others announce it: its `advertise_host` (its
    `stream_advertised_host`, when set, is announced before this is asked)."""

    def __init__(self, cluster: ClusterRuntime, advertise_host: str = "") -> None:
        self.cluster = cluster
        self.advertise_host = advertise_host

    @property
    def node(self) -> str:
        return self.cluster.node

    def placement(self, vhost: str, name: str, holder: str | None) -> tuple[str, list[str]]:
        record = self.cluster.cache.queue(vhost, name)
        if record is not None and record.type == "stream" and record.node:
            return record.node, [m for m in record.members if m != record.node]
        return (holder or self.cluster.node), []

    def endpoint(self, node: str) -> Endpoint | None:
        record = self.cluster.links.records.get(node)
        if record is None:
            return None
        host = record.get("stream_host") or record.get("advertise_host") or ""
        port = record.get("stream_port")
        if not isinstance(port, int) or isinstance(port, bool) or port <= 0:
            port = DEFAULT_STREAM_PORT
        return (str(host), port) if host else None

    def own_host(self) -> str:
        return self.advertise_host

    def link_to(self, node: str) -> Link | None:
        return self.cluster.links.link_to(node) if node != self.cluster.node else None

    def announced(self, here: Endpoint, involved: set[Endpoint]) -> list[Endpoint]:
        return sorted(involved)  # as RabbitMQ: the nodes involved, sorted

    def serve(self, requests: Mapping[str, RequestHandler],
              messages: Mapping[str, MessageHandler]) -> None:
        handlers = self.cluster.links.handlers
        if any(kind in handlers.requests for kind in requests):
            return
        for kind, request in requests.items():
            handlers.on_request(kind, request)
        for kind, message in messages.items():
            handlers.on_message(kind, message)


def peers_of(broker: Broker) -> Peers:
    """The broker's peers, for its stream listeners."""
    cluster = broker.cluster
    if cluster is None:
        return OneNode(broker.topology.node)
    return ClusterPeers(cluster, broker.config.advertise_host)
