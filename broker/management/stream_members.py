"""A stream's members over HTTP: add_replica, delete_replica, and stream_status read from any
node.

  PUT    /api/leveret/streams/{vhost}/{name}/replicas/{node}   add_replica: {"added": bool}
  DELETE /api/leveret/streams/{vhost}/{name}/replicas/{node}   delete_replica: {"deleted": bool}

(RabbitMQ's management API has neither: `rabbitmq-streams` calls the node itself. `added` or
`deleted` is false when nothing changed: the node already was, or was not, a member, which
RabbitMQ also answers with success.) Refusals are RabbitMQ's texts (400), a missing stream 404
"The stream does not exist", a single node 400 with why it cannot.

`stream_status` of a stream held by another node (its leader, for a replicated stream) is
asked of that node over the node link (broker/cluster/stream_membership.py): every node answers
the same rows, one per member. If that node cannot be asked, a member answers its own row. The
same link request answers a quorum queue's member rows (`leveret-queues quorum_status`:
quorum_queues.py); its member changes are quorum_queues.py's too.

Runs on the event loop. It knows the management helpers, streamops and the cluster's
membership seam; nothing of etcd or the links.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.cluster.stream_membership import MembershipError
from leveret.broker.cluster.stream_replication import replication_of
from leveret.broker.management import quorum_ops, streamops
from leveret.broker.management.http import (
    BROKER,
    ApiError,
    broker_of,
    ok,
    vhost_for_write,
)

ADD_TYPE_TEXT = {"classic": "Cannot add replicas to classic queues",
                 "quorum": "Cannot add replicas to quorum queues"}
DELETE_TYPE_TEXT = {"classic": "Cannot delete replicas from a classic queue",
                    "quorum": "Cannot delete replicas from a quorum queue"}


def single_node_text(node: str, stream: str, replica: str, add: bool) -> str:
    verb = (f"have a replica on node '{replica}'" if add else
            f"lose a replica on node '{replica}' (Cannot delete the last member of a stream)")
    return (f"Leveret runs as a single node ({node}): stream '{stream}' has one member, the "
            f"writer, and cannot {verb}.")


async def _change(request: web.Request, add: bool) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name, node = request.match_info["name"], request.match_info["node"]
    broker = broker_of(request)
    queue = vhost.queues.get(name)
    if queue is None:
        raise ApiError(404, "not_found", "The stream does not exist")
    if queue.type != "stream":
        texts = ADD_TYPE_TEXT if add else DELETE_TYPE_TEXT
        raise ApiError(400, "bad_request", texts.get(
            queue.type, f"{name} is a {queue.type} queue, not a stream"))
    check("configure", "queue", name)
    replication = replication_of(broker)
    if replication is None:
        raise ApiError(400, "bad_request",
                       single_node_text(broker.config.node_name, name, node, add))
    membership = replication.membership
    try:
        if add:
            return ok({"added": await membership.add(vhost.name, name, node)})
        return ok({"deleted": await membership.delete(vhost.name, name, node)})
    except MembershipError as exc:
        raise ApiError(exc.status, "not_found" if exc.status == 404 else "bad_request",
                       exc.text) from None


async def add_replica(request: web.Request) -> web.Response:
    return await _change(request, True)


async def delete_replica(request: web.Request) -> web.Response:
    return await _change(request, False)


async def status(broker: Any, stream: Any) -> dict[str, Any]:
    """stream_status of `stream` (a queue of type stream in this node's model): this node's,
    or, for one held by another node, that node's answer (every member's row)."""
    node = broker.config.node_name
    replication = replication_of(broker)
    local = hasattr(stream, "log")
    if replication is None:
        return streamops.status(stream, node)
    record = broker.cluster.cache.queue(stream.vhost.name, stream.name)
    if record is None or record.node == node:
        if not local:
            raise ApiError(404, "not_found", "The stream does not exist")
        return streamops.status(stream, node)
    answer = await replication.membership.status(record)
    if answer is not None:
        return answer
    if local:  # a replica whose leader cannot be asked: its own row
        return streamops.status(stream, node)
    raise ApiError(503, "service_unavailable",
                   f"the node holding stream '{stream.name}' ({record.node}) cannot be reached")


def _local_status(broker: Any) -> Any:
    """What this node answers another's `stream.status`: a stream's status, or a quorum
    queue's member rows (quorum_ops.member_rows, which quorum_status maps to RabbitMQ's
    columns), for a queue this node leads."""
    def read(vhost_name: str, name: str) -> dict[str, Any] | None:
        vhost = broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if queue is None or queue.type not in ("stream", "quorum") or not hasattr(queue, "log"):
            return None
        if getattr(queue, "role", "") == "replica":
            return None  # the leader answers for every member
        if queue.type == "quorum":
            return {"members": quorum_ops.member_rows(queue, broker.config.node_name)}
        return streamops.status(queue, broker.config.node_name)
    return read


def setup(app: web.Application) -> None:
    broker = app[BROKER]
    replication = replication_of(broker)
    if replication is not None:  # this node answers other nodes' stream_status
        replication.membership.local_status = _local_status(broker)
    base = "/api/leveret/streams/{vhost}/{name}/replicas/{node}"
    app.router.add_put(base, add_replica)
    app.router.add_delete(base, delete_replica)
