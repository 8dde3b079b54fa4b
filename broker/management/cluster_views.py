"""The management API's cluster-wide views: what other nodes hold, asked over the node links.

Role: `ClusterNodes`, the cluster's implementation of the management API's port
`nodes.NodesView` (chosen once by `app.create_app`; `nodes.OneNodeView` is one node's). In
cluster mode `/api/queues` on any node lists every queue, and `/api/connections`,
`/api/channels` every node's. Each node answers three link requests about what it holds
(registered by `install`, before the links start):

- `mgmt.queue_stats` `{"queues": [[vhost, name], ...]}`: the holder's own view of each queue
  (counts, consumers, state), or null for a queue it does not hold;
- `mgmt.connections`, `mgmt.channels` and `mgmt.consumers` `{}`: its connections', channels'
  or consumers' views, each with its node (connections include its stream-protocol ones;
  `stream_connections` adds `mgmt.stream_publishers` and `mgmt.stream_consumers`);
- `mgmt.close_connection` `{"name", "reason"}`: close one of its connections with 320, or
  a stream-protocol one (the asking node has checked that the user may);
- `mgmt.purge` and `mgmt.get` `{"vhost", "name", ...}`: the API's purge and get of a queue it
  holds (the asking node has checked the user's permissions), through `on_holder`;
- `mgmt.delayed_figures`, `mgmt.delayed_list`, `mgmt.delayed_delete` (delayed.py): a delayed
  exchange's figures, listing and deletion of held messages on the node that leads its log
  (the hidden log queue's leader, as its record names it), through `delayed_figures` and
  `on_log_leader`. While that node does not answer (down, an election not over), the figures
  are null and a listing or deletion is refused with 503 (delayed.py).

A replicated stream (or quorum queue) is shown on every node as its leader shows it: `node`
and `leader` the leader, `members` as its queue record in etcd names them (the leader first,
what `stream_status` lists; a quorum queue's sorted, as RabbitMQ's), `online` those the leader
has a link to; a replica's node holds a copy
but asks the leader, as a node without one does. An asking node waits at most `ASK_TIMEOUT_S`
per node, all nodes at once. A queue whose node (a stream's leader) cannot answer (down, no
link, too slow) shows `state: "down"` with its node, leader and members but without message
counts or figures, as RabbitMQ shows a queue whose node is down; connections of such a node are
left out.

It must not know AMQP frames; it reads the model and the sessions as the other views do.
Runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypedDict

from leveret.broker.cluster.link import LinkError, RemoteError
from leveret.broker.cluster.stream_membership import REPLICATED
from leveret.broker.management import delayed, messages, quorum_queues, stream_connections, views
from leveret.broker.management.http import ApiError
from leveret.broker.management.nodes import ApiView
from leveret.broker.model.delayed_exchange import UNKNOWN, holds_delayed
from leveret.broker.model.delayed_log import log_name
from leveret.broker.model.errors import InternalError, NotFound
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.link import Link
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.queue import Queue
    from leveret.broker.model.vhost import VHost
    from leveret.broker.session.connection import Session

log = logs.get("leveret.management")
QUEUE_STATS = "mgmt.queue_stats"
CONNECTIONS = "mgmt.connections"
CHANNELS = "mgmt.channels"
CONSUMERS = "mgmt.consumers"
CLOSE = "mgmt.close_connection"
PURGE = "mgmt.purge"
GET = "mgmt.get"
ASK_TIMEOUT_S = 2.0
DOWN_DROPS = ("messages", "messages_ready", "messages_unacknowledged", "messages_details",
              "messages_ready_details", "messages_unacknowledged_details", "message_bytes",
              # a stream's figures: a replica's own copy is not the stream's view
              "readers", "first_offset", "last_offset", "committed_offset", "next_offset",
              "segments", "bytes")


def node_of(broker: Broker, queue: Queue) -> str:
    """The node that holds `queue`: a remote queue's holder, else this node."""
    return queue.holder or broker.config.node_name


def local_sessions(broker: Broker) -> list[Session]:
    """This node's client connections, opened in full, in connection order."""
    return sorted((s for s in broker.connections if s.vhost is not None), key=lambda s: s.id)


class QueueRequest(TypedDict):
    """`mgmt.purge`'s body: a queue this node holds."""

    vhost: str
    name: str


class GetRequest(QueueRequest):
    """`mgmt.get`'s body: the queue, and get_messages' options."""

    count: int
    ackmode: str
    encoding: str


def install(broker: Broker, cluster: ClusterRuntime) -> None:
    """Answer the other nodes' management requests about what this node holds."""
    handlers = cluster.links.handlers
    nodes = ClusterNodes(broker, cluster)

    async def queue_stats(_link: Link, body: object) -> list[dict[str, Any] | None]:
        wanted = body.get("queues") if isinstance(body, dict) else None
        if not isinstance(wanted, list):
            raise ValueError("mgmt.queue_stats takes {'queues': [[vhost, name], ...]}")
        out: list[dict[str, Any] | None] = []
        for item in wanted:
            vhost = broker.vhosts.get(str(item[0])) if isinstance(item, list) and item else None
            queue = vhost.queues.get(str(item[1])) if vhost is not None and len(item) > 1 \
                else None
            if queue is None or nodes.view_node(queue) != nodes.node:
                out.append(None)
            else:
                out.append(nodes.own_view(queue))
        return out

    async def connections(_link: Link, _body: object) -> list[dict[str, Any]]:
        return ([views.connection_view(s) for s in local_sessions(broker)]
                + stream_connections.local_connection_views(broker))

    async def channels(_link: Link, _body: object) -> list[dict[str, Any]]:
        return [views.channel_view(s, ch) for s in local_sessions(broker)
                for ch in sorted(s.channels.values(), key=lambda c: c.number)]

    def held(body: QueueRequest) -> Queue:
        vhost = broker.vhosts.get(str(body.get("vhost"))) if isinstance(body, dict) else None
        queue = vhost.queues.get(str(body.get("name"))) if vhost is not None else None
        if queue is None or nodes.is_remote(queue):
            raise NotFound(f"no queue '{body.get('name')}' in vhost '{body.get('vhost')}'")
        return queue

    async def purge(_link: Link, body: QueueRequest) -> int:
        return held(body).purge()

    async def get(_link: Link, body: GetRequest) -> list[dict[str, Any]]:
        return messages.take(held(body), int(body["count"]), str(body["ackmode"]),
                             str(body["encoding"]))

    async def consumers(_link: Link, _body: object) -> list[dict[str, Any]]:
        return [views.consumer_view(s, ch, consumer) for s in local_sessions(broker)
                for ch in sorted(s.channels.values(), key=lambda c: c.number)
                for consumer in ch.consumers.values()]

    async def close(_link: Link, body: object) -> bool:
        fields = body if isinstance(body, dict) else {}
        name = fields.get("name")
        for session in local_sessions(broker):
            if views.connection_name(session) == name:
                session.force_close(str(fields.get("reason") or "Closed via management plugin"))
                return True
        return stream_connections.close_local(broker, str(name))  # NotFound if none

    handlers.on_request(CONSUMERS, consumers)
    handlers.on_request(CLOSE, close)
    handlers.on_request(PURGE, purge)
    handlers.on_request(GET, get)
    handlers.on_request(QUEUE_STATS, queue_stats)
    handlers.on_request(CONNECTIONS, connections)
    handlers.on_request(CHANNELS, channels)
    stream_connections.install(broker, handlers)  # mgmt.stream_publishers, mgmt.stream_consumers
    quorum_queues.install(broker, handlers)  # mgmt.quorum_peek: the leader's peek
    delayed.install(broker, handlers)  # mgmt.delayed_*: a delayed exchange's log leader's


class ClusterNodes:
    """The management API's `nodes.NodesView` in a cluster: the topology's records name a
    replicated stream's leader and members, and the other nodes are asked over the links."""

    def __init__(self, broker: Broker, cluster: ClusterRuntime) -> None:
        self.broker = broker
        self.cluster = cluster

    @property
    def node(self) -> str:
        return self.broker.config.node_name

    def node_of(self, queue: Queue) -> str:
        return node_of(self.broker, queue)

    def is_remote(self, queue: Queue) -> bool:
        return self.node_of(queue) != self.node

    def stream_placement(self, queue: Queue) -> tuple[str, tuple[str, ...]] | None:
        """A replicated stream's or quorum queue's leader and members as its queue record in
        etcd names them (what `stream_status` and `quorum_status` answer on every node), or
        None for any other queue."""
        if queue.type not in REPLICATED:
            return None
        record = self.cluster.cache.queue(queue.vhost.name, queue.name)
        if record is None or not record.members:
            return None
        return record.node, record.members

    def view_node(self, queue: Queue) -> str:
        """The node whose view of `queue` the API shows: a replicated stream's leader (a
        replica's node holds a copy, but the leader's is the stream's view), else the queue's
        holder."""
        placed = self.stream_placement(queue)
        return placed[0] if placed is not None else self.node_of(queue)

    def own_view(self, queue: Queue) -> ApiView:
        """This node's view of `queue`, named after `view_node`; a replicated stream's with its
        members and those online (this node and the members it has a link to)."""
        placed = self.stream_placement(queue)
        if placed is None:
            return views.queue_view(queue, self.node_of(queue))
        leader, members = placed
        this = self.node
        online = [m for m in members
                  if m == this or self.cluster.links.link_to(m) is not None]
        return views.queue_view(queue, leader, members=members, online=online)

    async def _ask_all(self, ask: Callable[[str, Link], Awaitable[Any]],
                       nodes: list[str]) -> dict[str, Any]:
        """Each node's answer (by name), asked all at once; a node without a link or that
        fails or times out is missing from the result."""
        pending: dict[str, Awaitable[Any]] = {}
        for node in nodes:
            link = self.cluster.links.link_to(node)
            if link is not None and not link.closed:
                pending[node] = asyncio.wait_for(ask(node, link), ASK_TIMEOUT_S)
        results = await asyncio.gather(*pending.values(), return_exceptions=True)
        answers: dict[str, Any] = {}
        for node, result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("a node did not answer a management request", node=node,
                            error=str(result) or type(result).__name__)
            else:
                answers[node] = result
        return answers

    async def queue_views(self, queues: list[Queue]) -> list[ApiView]:
        """The views of `queues`: this node's from its model, the others' from their holders
        (a replicated stream's from its leader, as every node shows it the same)."""
        this = self.node
        holders = {id(queue): self.view_node(queue) for queue in queues}
        remote: dict[str, list[Queue]] = {}
        for queue in queues:
            if holders[id(queue)] != this:
                remote.setdefault(holders[id(queue)], []).append(queue)

        async def ask(node: str, link: Link) -> Any:
            names = [[q.vhost.name, q.name] for q in remote[node]]
            return await link.call(QUEUE_STATS, {"queues": names})

        answers = await self._ask_all(ask, sorted(remote))
        found: dict[int, ApiView] = {}
        for node, held in remote.items():
            answer = answers.get(node)
            if isinstance(answer, list) and len(answer) == len(held):
                for queue, view in zip(held, answer, strict=True):
                    if isinstance(view, dict):
                        found[id(queue)] = view
        out = []
        for queue in queues:
            if holders[id(queue)] == this:
                out.append(self.own_view(queue))
            elif id(queue) in found:
                out.append(found[id(queue)])
            else:  # its holder (leader) does not answer: its identity without counts
                view = self.own_view(queue)
                for key in DOWN_DROPS:
                    view.pop(key, None)
                view["state"] = "down"
                out.append(view)
        return out

    async def queue_totals(self, queues: list[Queue]) -> dict[str, int]:
        """The overview's totals from every holder's view of `queues`."""
        queue_views = await self.queue_views(queues)
        return {key: sum(int(q.get(key, 0)) for q in queue_views)
                for key in views.queue_totals(queues)}

    async def on_holder(self, queue: Queue, kind: str, body: ApiView) -> object:
        """Run `kind` (PURGE, GET) on the node that holds `queue`: its answer, 404 if it no
        longer has the queue, 503 if it cannot be asked."""
        node = self.node_of(queue)
        link = self.cluster.links.link_to(node)
        if link is None or link.closed:
            raise ApiError(503, "service_unavailable",
                           f"{queue.resource}: its node {node} does not answer")
        try:
            return await link.call(kind, {**body, "vhost": queue.vhost.name, "name": queue.name},
                                   timeout=ASK_TIMEOUT_S)
        except RemoteError as exc:
            raise _refusal(node, exc) from None
        except LinkError:
            raise ApiError(503, "service_unavailable",
                           f"{queue.resource}: its node {node} does not answer") from None

    def log_leader(self, vhost: VHost, exchange: Exchange) -> str | None:
        """The node that leads a delayed exchange's log, as its record names it (an old
        leader until the election's winner puts it); None: no log record."""
        queue = vhost.queues.get(log_name(vhost.name, exchange.name))
        placed = self.stream_placement(queue) if queue is not None else None
        return placed[0] if placed is not None else None

    async def delayed_figures(self, exchanges: list[tuple[VHost, Exchange]]) -> list[ApiView]:
        """Each delayed exchange's figures from its log's leader (asked once per node, all
        at once); nulls where no leader answers."""
        this = self.node
        leaders = [self.log_leader(v, x) if holds_delayed(x) else this for v, x in exchanges]
        remote: dict[str, list[list[str]]] = {}
        for (vhost, exchange), leader in zip(exchanges, leaders, strict=True):
            if leader is not None and leader != this:
                remote.setdefault(leader, []).append([vhost.name, exchange.name])

        async def ask(node: str, link: Link) -> Any:
            return await link.call(delayed.FIGURES, {"exchanges": remote[node]})

        answers = await self._ask_all(ask, sorted(remote))
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        for node, wanted in remote.items():
            answer = answers.get(node)
            if isinstance(answer, list) and len(answer) == len(wanted):
                found.update(((node, v, x), info) for (v, x), info in zip(wanted, answer,
                                                                            strict=True)
                             if isinstance(info, dict))
        out: list[ApiView] = []
        for (vhost, exchange), leader in zip(exchanges, leaders, strict=True):
            info = (exchange.held_info() if leader == this
                    else found.get((str(leader), vhost.name, exchange.name)))
            out.append(info or (dict(UNKNOWN) if holds_delayed(exchange) else {}))
        return out

    async def on_log_leader(self, vhost: VHost, exchange: Exchange, kind: str, body: ApiView,
                            local: Callable[[], object]) -> object:
        """`local()` if this node leads the exchange's log, else `kind` asked of the node
        that does; None if there is none or it does not answer."""
        leader = self.log_leader(vhost, exchange)
        if leader == self.node:
            return local()
        link = self.cluster.links.link_to(leader) if leader is not None else None
        if link is None or link.closed:
            return None
        try:
            return await link.call(kind, {**body, "vhost": vhost.name, "name": exchange.name},
                                   timeout=ASK_TIMEOUT_S)
        except LinkError as exc:  # RemoteError included: the leader could not answer
            log.warning("a delayed exchange's log leader did not answer", node=leader,
                        error=str(exc) or type(exc).__name__)
            return None

    async def close_remote(self, node: str, name: str, reason: str) -> None:
        """Close a connection another node holds: 404 if it has no such connection any more,
        503 if it cannot be asked."""
        link = self.cluster.links.link_to(node)
        try:
            if link is None or link.closed:
                raise LinkError(f"no link to {node}")
            await link.call(CLOSE, {"name": name, "reason": reason}, timeout=ASK_TIMEOUT_S)
        except RemoteError as exc:
            raise _refusal(node, exc) from None
        except LinkError:
            raise ApiError(503, "service_unavailable",
                           f"connection '{name}': its node {node} does not answer") from None

    async def remote_items(self, kind: str) -> list[ApiView]:
        """Every other running node's connections (`mgmt.connections`), channels or
        consumers."""
        async def ask(_node: str, link: Link) -> Any:
            return await link.call(kind, {})

        answers = await self._ask_all(ask, sorted(self.cluster.links.links))
        return [item for node in sorted(answers) if isinstance(answers[node], list)
                for item in answers[node] if isinstance(item, dict)]

    def running_nodes(self) -> dict[str, str]:
        """This node and every node it has a link to."""
        running = {self.node: "running"}
        running.update((name, "running") for name in self.cluster.links.links)
        return running

    def metric_labels(self) -> dict[str, str]:
        """A `node` label naming this node, as Leveret's own names carry."""
        return {"node": self.node}


def _refusal(node: str, exc: RemoteError) -> NotFound | InternalError:
    """Another node's refusal as this node answers it: its 404 stays a 404, anything else is
    an internal error that names the node."""
    if exc.error_type == "NotFound":
        return NotFound(exc.remote_message)
    return InternalError(f"{node}: {exc.remote_message}")
