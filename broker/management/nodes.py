"""The other nodes, as the management API sees them: the port where one node and a cluster
differ for the HTTP API.

`NodesView` answers what the views would otherwise ask the cluster: which node holds a queue
and shows its view, the views of a list of queues (another node's from that node), the other
nodes' connections, channels and consumers, a purge or get or close run on the node that holds
the object, a delayed exchange's figures and its listing and deletion of held messages from
the node that leads its log, the running nodes a vhost lists, and the labels every `/metrics`
series carries.

Two implementations, chosen once when the management app is built (`app.create_app`, the one
place that asks whether the broker runs in a cluster; the views reach it with `nodes_of`):
`OneNodeView` here (every queue and connection is this node's; nothing else answers) and
`cluster_views.ClusterNodes` (the topology's records, the node links). The views call the port
and never ask which mode they run in.

Must not know: the cluster's links or etcd (that is `cluster_views`). Runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from aiohttp import web

from leveret.broker.management import views
from leveret.broker.management.http import ApiError

if TYPE_CHECKING:
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.queue import Queue
    from leveret.broker.model.vhost import VHost

ApiView: TypeAlias = dict[str, Any]  # one object as the API shows it, in RabbitMQ's names


class NodesView(Protocol):
    @property
    def node(self) -> str:
        """This node's name."""

    def node_of(self, queue: Queue) -> str:
        """The node that holds `queue`: a remote queue's holder, else this node."""

    def is_remote(self, queue: Queue) -> bool:
        """Whether another node holds `queue` (its purge and get run there: `on_holder`)."""

    async def queue_views(self, queues: list[Queue]) -> list[ApiView]:
        """The views of `queues`, each as the node that holds it shows it."""

    async def queue_totals(self, queues: list[Queue]) -> dict[str, int]:
        """/api/overview's queue totals of `queues`, with the holders' counts."""

    async def on_holder(self, queue: Queue, kind: str, body: ApiView) -> object:
        """Run `kind` (`cluster_views.PURGE`, `GET`) on the node that holds `queue`."""

    async def close_remote(self, node: str, name: str, reason: str) -> None:
        """Close a connection that another node holds."""

    async def delayed_figures(self, exchanges: list[tuple[VHost, Exchange]]) -> list[ApiView]:
        """Each exchange's delayed figures (`Exchange.held_info`) as the node that leads its
        log has them: {} for a plain exchange, `delayed_exchange.UNKNOWN` (nulls) for a
        delayed one while no leader answers."""

    async def on_log_leader(self, vhost: VHost, exchange: Exchange, kind: str, body: ApiView,
                            local: Callable[[], object]) -> object:
        """`local()` on the node that leads the delayed exchange's log: run here if this node
        leads it, else `kind` (`delayed.LIST`, `DELETE`, with `body`) asked of the leader's
        node, which runs the same. None when no leader answers (or the one asked leads no
        longer)."""

    async def remote_items(self, kind: str) -> list[ApiView]:
        """Every other running node's connections, channels or consumers (`kind`: one of
        `cluster_views`' request kinds)."""

    def running_nodes(self) -> dict[str, str]:
        """A vhost's `cluster_state`: each running node, "running"."""

    def metric_labels(self) -> dict[str, str]:
        """The labels every `/metrics` sample carries besides its own."""


class OneNodeView:
    """A broker without a cluster: every queue and connection is this node's, and no other
    node answers (what a request for one would meet: 503, as a node that does not answer)."""

    def __init__(self, node: str) -> None:
        self._node = node

    @property
    def node(self) -> str:
        return self._node

    def node_of(self, queue: Queue) -> str:
        return queue.holder or self._node

    def is_remote(self, queue: Queue) -> bool:
        return False

    async def queue_views(self, queues: list[Queue]) -> list[ApiView]:
        return [views.queue_view(queue, self.node_of(queue)) for queue in queues]

    async def queue_totals(self, queues: list[Queue]) -> dict[str, int]:
        return views.queue_totals(queues)

    async def on_holder(self, queue: Queue, kind: str, body: ApiView) -> object:
        raise ApiError(503, "service_unavailable",
                       f"{queue.resource}: its node {self.node_of(queue)} does not answer")

    async def close_remote(self, node: str, name: str, reason: str) -> None:
        raise ApiError(503, "service_unavailable",
                       f"connection '{name}': its node {node} does not answer")

    async def remote_items(self, kind: str) -> list[ApiView]:
        return []

    async def delayed_figures(self, exchanges: list[tuple[VHost, Exchange]]) -> list[ApiView]:
        return [exchange.held_info() for _vhost, exchange in exchanges]

    async def on_log_leader(self, vhost: VHost, exchange: Exchange, kind: str, body: ApiView,
                            local: Callable[[], object]) -> object:
        return local()  # each delayed exchange leads its own log

    def running_nodes(self) -> dict[str, str]:
        return {self._node: "running"}

    def metric_labels(self) -> dict[str, str]:
        return {}


NODES: web.AppKey[NodesView] = web.AppKey("nodes-view")


def nodes_of(request: web.Request) -> NodesView:
    """The port the management app was built with."""
    return request.app[NODES]
