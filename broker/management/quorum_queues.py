"""Quorum queues over HTTP: what `leveret-queues` (RabbitMQ's `rabbitmq-queues`) calls.

RabbitMQ's paths (rabbitmq_management), served as RabbitMQ serves them:
  POST   /api/queues/quorum/{vhost}/{name}/replicas/add       {"node"}: add_member (204)
  DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete    {"node"}: delete_member (202)
  POST   /api/queues/quorum/replicas/on/{node}/grow           {"strategy": "all"|"even",
         "vhost_pattern", "queue_pattern", "membership"}: grow; Leveret answers 200 with the
         rows rabbitmq-queues prints (vhost, name, size, result), RabbitMQ 204
  DELETE /api/queues/quorum/replicas/on/{node}/shrink         shrink; 202 with the rows
  GET    /api/queues/quorum/{vhost}/{name}/status             quorum_status rows
  GET    /api/health/checks/node-is-quorum-critical           200 {"status": "ok"} or 503
         {"status": "failed", "reason", "queues"}; Leveret adds "node"
  POST   /api/rebalance/queues                                rebalance all (204, at once)
Leveret's (RabbitMQ's CLI calls the node itself), under /api/leveret:
  POST   /queues/{vhost}/{name}/transfer-leadership           {"node"}: {"leader"}
  GET    /queues/{vhost}/{name}/peek/{position}               {"message": [[key, value]...]}
  POST   /rebalance/{type}                                    {"vhost_pattern",
         "queue_pattern"}: the rows rabbitmq-queues prints (type: all, quorum, stream)

A missing queue is 404 (Not Found, as RabbitMQ's resource_exists); a refusal is 400 with
RabbitMQ's text (its reason word first where RabbitMQ prints only that: `last_node: ...`), a
node that cannot be asked 503. Member changes, grow, shrink, rebalance and transfers need an
administrator (RabbitMQ's is_authorized_admin); status and peek a user who sees the vhost.

In a cluster the members are the queue record's (etcd), member changes and transfers go
through the replication's membership (broker/cluster/stream_membership.py, shared with the
streams' add_replica), and status and peek are the leader's: another node asks it over the
node link (`stream.status`, `mgmt.quorum_peek`). On one node a quorum queue has one member,
this node.

Runs on the event loop; knows the management helpers, quorum_ops and the cluster's membership
seam, nothing of etcd or AMQP.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from leveret.broker.cluster.link import Link, LinkError, RemoteError
from leveret.broker.cluster.stream_membership import (
    NOT_RUNNING_TEXT,
    TEXTS,
    UNKNOWN_MEMBER_TEXT,
    MembershipError,
)
from leveret.broker.cluster.stream_replication import replication_of
from leveret.broker.management import quorum_ops
from leveret.broker.management.http import (
    ApiError,
    bad_request,
    body,
    broker_of,
    ok,
    require_admin,
    vhost_for_read,
)
from leveret.broker.management.nodes import nodes_of
from leveret.broker.management.quorum_ops import Refused, not_found_text
from leveret.broker.process import logs

log = logs.get("leveret.management")
PEEK = "mgmt.quorum_peek"
ASK_TIMEOUT_S = 5.0
CRITICAL_TEXT = ("There are quorum queues that would lose their quorum if the target node is "
                 "shut down")
CLASSIC_TEXT = {"members": "Cannot add members to a classic queue",
                "status": "Cannot get quorum status of a classic queue",
                "peek": "Cannot peek into a classic queue",
                "transfer": "Cannot transfer leadership of a non-quorum queue"}
STREAM_TEXT = {"members": "not_quorum_queue: queue '{name}' in vhost '{vhost}' is a stream; "
                          "use leveret-streams add_replica or delete_replica",
               "status": "not_quorum_queue: queue '{name}' in vhost '{vhost}' is a stream; "
                         "use leveret-streams stream_status",
               "peek": "not_quorum_queue: queue '{name}' in vhost '{vhost}' is a stream",
               "transfer": CLASSIC_TEXT["transfer"]}
STRATEGIES = ("all", "even")
MEMBERSHIPS = ("promotable", "non_voter", "voter")
TYPES = ("all", "quorum", "stream")


# -- finding the queue and the cluster --------------------------------------------------------


def _quorum(request: web.Request, what: str, write: bool = False) -> Any:
    """The quorum queue named in the path (404 if none, RabbitMQ's refusal for another type)."""
    if write:
        require_admin(request)
    vhost = vhost_for_read(request, request.match_info["vhost"])
    name = request.match_info["name"]
    queue = vhost.queues.get(name)
    if queue is None:
        raise ApiError(404, "Object Not Found", "Not Found")
    if queue.type == "stream":
        raise bad_request(STREAM_TEXT[what].format(name=name, vhost=vhost.name))
    if queue.type != "quorum":
        raise bad_request(CLASSIC_TEXT[what])
    return queue


def _this(broker: Any) -> str:
    return str(broker.config.node_name)


def _running(broker: Any) -> set[str]:
    """This node and the running nodes it reaches: a node whose link is down (killed, cut
    off) is not counted while its record waits for its lease to expire."""
    replication = replication_of(broker)
    if replication is None:
        return {_this(broker)}
    links = broker.cluster.links
    return {n for n in replication.membership.running()
            if n == _this(broker) or links.link_to(n) is not None}


def _placement(broker: Any, queue: Any) -> tuple[str, tuple[str, ...]]:
    """(leader, members) of a replicated queue: its record's in a cluster, else this node."""
    record = broker.cluster.cache.queue(queue.vhost.name, queue.name) \
        if replication_of(broker) is not None else None
    if record is None:
        return _this(broker), (_this(broker),)
    return record.node, tuple(record.members or (record.node,))


def _refused(exc: MembershipError | Refused) -> ApiError:
    if exc.status == 404:
        return ApiError(404, "Object Not Found", "Not Found")
    error = {400: "bad_request", 409: "conflict"}.get(exc.status, "service_unavailable")
    return ApiError(exc.status, error, exc.text)


# -- member changes ---------------------------------------------------------------------------


async def _node_of(request: web.Request) -> str:
    data = await body(request)
    node = data.get("node")
    if not isinstance(node, str) or not node:
        raise bad_request("node is missing")
    membership = data.get("membership", "promotable")
    if membership not in MEMBERSHIPS:
        raise bad_request(f"voter status '{membership}' is not recognised.")
    return node


async def change_member(broker: Any, queue: Any, node: str, add: bool) -> bool:
    """add_member or delete_member of `queue` on `node`: True if the members changed."""
    replication = replication_of(broker)
    if replication is None:  # one node: its only member is this node
        if add:
            if node != _this(broker):
                raise Refused(NOT_RUNNING_TEXT.format(node=node), reason="node_not_running")
            return False
        if node != _this(broker):
            return False
        raise Refused(TEXTS["quorum"]["last"], reason="last_node")
    membership = replication.membership
    vhost, name = queue.vhost.name, queue.name
    if add:
        return await membership.add(vhost, name, node, ("quorum",))
    return await membership.delete(vhost, name, node, ("quorum",))


async def add_member(request: web.Request) -> web.Response:
    return await _member_change(request, add=True, status=204)


async def delete_member(request: web.Request) -> web.Response:
    return await _member_change(request, add=False, status=202)


async def _member_change(request: web.Request, *, add: bool, status: int) -> web.Response:
    """A member added on, or removed from, the node the request names (RabbitMQ's 204, 202)."""
    queue = _quorum(request, "members", write=True)
    node = await _node_of(request)
    try:
        await change_member(broker_of(request), queue, node, add)
    except (MembershipError, Refused) as exc:
        raise _refused(exc) from None
    return web.Response(status=status)


def _matching(broker: Any, vhost_pattern: str, queue_pattern: str,
              types: tuple[str, ...] = ("quorum",)) -> list[Any]:
    try:
        vhost_re, queue_re = re.compile(vhost_pattern), re.compile(queue_pattern)
    except re.error as exc:
        raise bad_request(f"invalid pattern: {exc}") from None
    return [q for v in sorted(broker.vhosts.values(), key=lambda v: v.name)
            if vhost_re.search(v.name) for q in sorted(v.queues.values(), key=lambda q: q.name)
            if q.type in types and queue_re.search(q.name)]


def _row(queue: Any, size: int, error: str | None) -> dict[str, Any]:
    return {"vhost": queue.vhost.name, "name": queue.name, "size": size,
            "result": "ok" if error is None else f"error: {error}"}


async def grow(request: web.Request) -> web.Response:
    """Add a member on the node to every matching quorum queue that has none there (`even`:
    only those with an even number of members)."""
    require_admin(request)
    broker, node = broker_of(request), request.match_info["node"]
    data = await body(request)
    strategy = str(data.get("strategy", "all"))
    if strategy not in STRATEGIES:
        raise bad_request(f"strategy '{strategy}' is not recognised.")
    if data.get("membership", "promotable") not in MEMBERSHIPS:
        raise bad_request(f"voter status '{data.get('membership')}' is not recognised.")
    if node not in _running(broker):
        raise bad_request(NOT_RUNNING_TEXT.format(node=node))
    rows = []
    for queue in _matching(broker, str(data.get("vhost_pattern", ".*")),
                           str(data.get("queue_pattern", ".*"))):
        _leader, members = _placement(broker, queue)
        if node in members or (strategy == "even" and len(members) % 2):
            continue
        try:
            await change_member(broker, queue, node, True)
            rows.append(_row(queue, len(members) + 1, None))
        except (MembershipError, Refused) as exc:
            rows.append(_row(queue, len(members), exc.text))
    return ok(rows)


async def shrink(request: web.Request) -> web.Response:
    """Delete the member on the node of every quorum queue that has one there."""
    require_admin(request)
    broker, node = broker_of(request), request.match_info["node"]
    rows = []
    for queue in _matching(broker, ".*", ".*"):
        _leader, members = _placement(broker, queue)
        if node not in members:
            continue
        try:
            await change_member(broker, queue, node, False)
            rows.append(_row(queue, len(members) - 1, None))
        except (MembershipError, Refused) as exc:
            rows.append(_row(queue, len(members),
                             "the last node cannot be removed" if exc.reason == "last_node"
                             else exc.text))
    return web.json_response(rows, status=202)


# -- leadership -------------------------------------------------------------------------------


async def transfer(broker: Any, queue: Any, node: str) -> str:
    """transfer_leadership of a quorum queue or a stream to `node`: the new leader."""
    replication = replication_of(broker)
    if replication is None:
        if node == _this(broker):
            raise Refused("The target node is already the leader of this queue",
                          reason="already_leader")
        raise Refused(UNKNOWN_MEMBER_TEXT.format(node=node, what="queue", name=queue.name),
                      reason="unknown_member")
    return await replication.membership.transfer(queue.vhost.name, queue.name, node,
                                                 (queue.type,))


async def transfer_leadership(request: web.Request) -> web.Response:
    queue = _quorum(request, "transfer", write=True)
    node = await _node_of(request)
    try:
        return ok({"leader": await transfer(broker_of(request), queue, node)})
    except (MembershipError, Refused) as exc:
        raise _refused(exc) from None


async def run_rebalance(broker: Any, queue_type: str, vhost_pattern: str, queue_pattern: str,
                        nodes: Any) -> list[dict[str, Any]]:
    types = ("quorum", "stream") if queue_type == "all" else (queue_type,)
    queues = [q for q in _matching(broker, vhost_pattern, queue_pattern, types)
              if q.type != "stream" or replication_of(broker) is None
              or broker.cluster.cache.queue(q.vhost.name, q.name) is not None]
    lengths = {id(q): int(view.get("messages", 0) or 0) for q, view in
               zip(queues, await nodes.queue_views(queues), strict=True)}
    placed = [(q, q.type, *_placement(broker, q), lengths[id(q)]) for q in queues]

    async def move(queue: Any, destination: str) -> str | None:
        try:
            return await transfer(broker, queue, destination)
        except (MembershipError, Refused) as exc:
            log.warning("rebalance: a leader did not move", queue=queue.name,
                        vhost=queue.vhost.name, node=destination, error=exc.text)
            return None

    return await quorum_ops.rebalance(placed, _running(broker), move)


def _patterns(data: dict[str, Any]) -> tuple[str, str]:
    return str(data.get("vhost_pattern", ".*")), str(data.get("queue_pattern", ".*"))


async def rebalance(request: web.Request) -> web.Response:
    require_admin(request)
    queue_type = request.match_info["type"]
    if queue_type not in TYPES:
        raise bad_request(f"type {queue_type} is not supported. Try one of all, quorum, stream.")
    return ok(await run_rebalance(broker_of(request), queue_type,
                                  *_patterns(await body(request)), nodes_of(request)))


_rebalancing: set[asyncio.Task[Any]] = set()


async def rebalance_all(request: web.Request) -> web.Response:
    """RabbitMQ's: starts the rebalance of every replicated queue and answers at once."""
    require_admin(request)
    task = asyncio.get_running_loop().create_task(
        run_rebalance(broker_of(request), "all", ".*", ".*", nodes_of(request)))
    _rebalancing.add(task)
    task.add_done_callback(_rebalancing.discard)
    return web.Response(status=204)


# -- status, peek and the quorum-critical check -----------------------------------------------


async def status_rows(broker: Any, queue: Any) -> list[dict[str, Any]]:
    """quorum_status: every member's row, as the leader knows them (another node's leader is
    asked; a member whose leader cannot be asked answers its own row)."""
    leader, members = _placement(broker, queue)
    replication, this = replication_of(broker), _this(broker)
    rows = None
    if replication is not None and leader != this:
        record = broker.cluster.cache.queue(queue.vhost.name, queue.name)
        answer = await replication.membership.status(record) if record is not None else None
        rows = answer.get("members") if isinstance(answer, dict) else None
    if rows is None and hasattr(queue, "log"):
        rows = quorum_ops.member_rows(queue, this)
    if rows is None:
        raise ApiError(503, "service_unavailable",
                       f"queue '{queue.name}': its leader {leader} cannot be reached")
    return quorum_ops.status_rows(rows, members, _running(broker))


async def quorum_status(request: web.Request) -> web.Response:
    queue = _quorum(request, "status")
    return ok(await status_rows(broker_of(request), queue))


def _local_peek(broker: Any, vhost: str, name: str, position: int) -> list[list[Any]] | None:
    model = broker.vhosts.get(vhost)
    queue = model.queues.get(name) if model is not None else None
    if queue is None or queue.type != "quorum" or not hasattr(queue, "log"):
        raise LookupError(not_found_text(vhost, name))
    found = quorum_ops.peek(queue, position)
    return [list(item) for item in found] if found is not None else None


async def peek(request: web.Request) -> web.Response:
    queue = _quorum(request, "peek")
    broker = broker_of(request)
    try:
        position = int(request.match_info["position"])
    except ValueError:
        position = 0
    if position < 1:
        raise bad_request("position value must be a positive integer")
    leader, _members = _placement(broker, queue)
    if leader == _this(broker):
        found = _local_peek(broker, queue.vhost.name, queue.name, position)
    else:
        cluster = broker.cluster
        link = cluster.links.link_to(leader) if cluster is not None else None
        try:
            if link is None or link.closed:
                raise LinkError(f"no link to {leader}")
            found = await link.call(PEEK, {"vhost": queue.vhost.name, "name": queue.name,
                                           "position": position}, timeout=ASK_TIMEOUT_S)
        except RemoteError as exc:
            raise ApiError(503, "service_unavailable", exc.remote_message) from None
        except (LinkError, TimeoutError):
            raise ApiError(503, "service_unavailable",
                           f"queue '{queue.name}': its leader {leader} cannot be reached") \
                from None
    if found is None:
        raise bad_request("Target queue does not have a message at that position")
    return ok({"node": _this(broker), "message": found})


def critical_queues(broker: Any) -> list[dict[str, str]]:
    """The replicated queues this node is critical for (quorum_ops.critical)."""
    this = _this(broker)
    placed = []
    for vhost in sorted(broker.vhosts.values(), key=lambda v: v.name):
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name):
            if queue.type not in ("quorum", "stream"):
                continue
            record = broker.cluster.cache.queue(vhost.name, queue.name)
            if record is None or (queue.type == "stream" and not record.members):
                continue
            placed.append((vhost.name, queue.name, queue.type,
                           tuple(record.members or (record.node,))))
    return quorum_ops.critical(this, placed, _running(broker))


def _single_node(broker: Any) -> bool:
    """No cluster, or one whose only node is this one: no other node runs, and no queue has a
    member on another (RabbitMQ's rabbit_nodes:is_single_node_cluster)."""
    this = _this(broker)
    if replication_of(broker) is None:
        return True
    return _running(broker) == {this} and all(
        _placement(broker, q)[1] == (this,) for v in broker.vhosts.values()
        for q in v.queues.values() if q.type in ("quorum", "stream"))


async def node_is_quorum_critical(request: web.Request) -> web.Response:
    broker = broker_of(request)
    this = _this(broker)
    if _single_node(broker):
        return ok({"status": "ok", "reason": "single node cluster", "node": this})
    queues = critical_queues(broker)
    if not queues:
        return ok({"status": "ok", "node": this})
    return web.json_response({"status": "failed", "reason": CRITICAL_TEXT, "queues": queues,
                              "node": this}, status=503)


# -- wiring -----------------------------------------------------------------------------------


def install(broker: Any, handlers: Any) -> None:
    """Answer other nodes' peeks at the quorum queues this node leads (cluster_views.install,
    before the links start)."""
    async def answer(_link: Link, request: object) -> list[list[Any]] | None:
        fields = request if isinstance(request, dict) else {}
        return _local_peek(broker, str(fields.get("vhost")), str(fields.get("name")),
                           int(fields.get("position", 0)))

    handlers.on_request(PEEK, answer)


def setup(app: web.Application) -> None:
    r = app.router
    base = "/api/queues/quorum"
    r.add_post(base + "/replicas/on/{node}/grow", grow)
    r.add_delete(base + "/replicas/on/{node}/shrink", shrink)
    r.add_post(base + "/{vhost}/{name}/replicas/add", add_member)
    r.add_delete(base + "/{vhost}/{name}/replicas/delete", delete_member)
    r.add_get(base + "/{vhost}/{name}/status", quorum_status)
    r.add_get("/api/health/checks/node-is-quorum-critical", node_is_quorum_critical)
    r.add_post("/api/rebalance/queues", rebalance_all)
    r.add_post("/api/leveret/queues/{vhost}/{name}/transfer-leadership", transfer_leadership)
    r.add_get("/api/leveret/queues/{vhost}/{name}/peek/{position}", peek)
    r.add_post("/api/leveret/rebalance/{type}", rebalance)
