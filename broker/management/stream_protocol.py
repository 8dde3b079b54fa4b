"""RabbitMQ's stream management paths (rabbitmq_stream_management): stream connections, their
publishers and consumers, over the stream protocol and over AMQP 0.9.1.

  GET         /api/stream/connections[/{vhost}]
  GET, DELETE /api/stream/connections/{vhost}/{name}          (DELETE closes it)
  GET         /api/stream/connections/{vhost}/{name}/publishers | /consumers
  GET         /api/stream/publishers[/{vhost}[/{stream}]]
  GET         /api/stream/consumers[/{vhost}]

A stream-protocol connection (`broker/streamproto`) is shown in RabbitMQ's shape: the
connection_created items of rabbit_stream_reader (`protocol: "stream"`), a publisher with its
`publisher_id`, `reference`, `published`, `confirmed`, `errored` and `connection_details`, a
consumer with its `subscription_id`, `credits`, `consumed`, `offset`, `offset_lag`, `active`,
`activity_status` and `properties`. Leveret also lists, as before, what AMQP 0.9.1 does with
streams: a connection with a consumer on a stream, its consumers (consumer tag as
subscription id), and named publishers (x-stream-publisher-name) from the tracking records.

Who sees what, as RabbitMQ: a management user sees its own connections and their publishers and
consumers, monitoring users and administrators all of them; closing needs an administrator or
the connection's own user. In cluster mode every running node's stream-protocol connections,
publishers and consumers are listed (each with its `node`), asked over the node links
(`mgmt.connections` carries them with the AMQP ones, `mgmt.stream_publishers` and
`mgmt.stream_consumers` are installed by `stream_connections`, which holds this node's
sessions and their views); another node's connection is closed by it.
Must not know: stream frames (it reads the sessions' state). Runs on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.management import cluster_views, streamops, views
from leveret.broker.management.http import (
    broker_of,
    is_admin,
    listing,
    no_content,
    not_authorised,
    not_found,
    ok,
    sees_everything,
    user_of,
    vhost_for_read,
    visible_vhosts,
)
from leveret.broker.management.live import consumers as amqp_consumer_views
from leveret.broker.management.live import sessions as amqp_sessions
from leveret.broker.management.nodes import nodes_of
from leveret.broker.management.stream_connections import (
    STREAM_CONSUMERS,
    STREAM_PUBLISHERS,
    all_stream_sessions,
    connection_view,
    consumer_views,
    publisher_views,
    stream_sessions,
)
from leveret.broker.model.errors import NotFound
from leveret.broker.model.stream import StreamQueue

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession


# -- AMQP 0.9.1's stream connections, consumers and named publishers -----------------------------


def amqp_connections(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    """AMQP 0.9.1 connections with a consumer on a stream."""
    items = []
    for session in amqp_sessions(request, vhost):
        count = sum(1 for ch in session.channels.values() for c in ch.consumers.values()
                    if c.queue.type == "stream")
        if count:
            view = views.connection_view(session)
            view["conn_name"] = view["name"]
            view["subscriptions"] = count
            items.append(view)
    return items


def amqp_consumers(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    items = []
    for item in amqp_consumer_views(request, vhost):
        if "stream" not in item:
            continue
        details = item["channel_details"]
        items.append({
            "subscription_id": item["consumer_tag"],
            "stream": item["queue"]["name"],
            "vhost": item["queue"]["vhost"],
            "queue": item["queue"],
            "connection_details": {"name": details["connection_name"],
                                   "node": details["node"],
                                   "peer_host": details["peer_host"],
                                   "peer_port": details["peer_port"],
                                   "user": details["user"]},
            "channel_details": details,
            "active": item["active"],
            "activity_status": item["activity_status"],
            "properties": item["arguments"],
            **item["stream"],
        })
    return items


def tracked_publishers(request: web.Request, vhost: str | None, stream: str | None,
                       live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Named publishers of the tracking records that no live stream-protocol publisher shows."""
    shown = {(p["vhost"], p["stream"], p["reference"]) for p in live if p["reference"]}
    vhosts = [vhost_for_read(request, vhost)] if vhost is not None else visible_vhosts(request)
    return [p for v in vhosts for s in streamops.streams(v)
            if isinstance(s, StreamQueue) and (stream is None or s.name == stream)
            for p in streamops.publishers(s)
            if (p["vhost"], p["stream"], p["reference"]) not in shown]


# -- handlers -----------------------------------------------------------------------------------


def _owner(item: dict[str, Any]) -> object:
    user = item.get("user")
    return user if user is not None else item.get("connection_details", {}).get("user")


def _vhost_of(item: dict[str, Any]) -> object:
    vhost = item.get("vhost")
    return vhost if vhost is not None else item.get("queue", {}).get("vhost")


async def remote(request: web.Request, kind: str, vhost: str | None) -> list[dict[str, Any]]:
    """Other nodes' stream connections (kind CONNECTIONS), publishers or consumers that this
    user may see."""
    user = user_of(request)
    everything = sees_everything(user)
    items = await nodes_of(request).remote_items(kind)
    if kind == cluster_views.CONNECTIONS:
        items = [i for i in items if i.get("protocol") == "stream"]
    return [i for i in items if (vhost is None or _vhost_of(i) == vhost)
            and (everything or _owner(i) == user.name)]


def _vhost(request: web.Request) -> str | None:
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        vhost_for_read(request, vhost)
    return vhost


async def list_connections(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    items = [connection_view(s) for s in stream_sessions(request, vhost)]
    items += await remote(request, cluster_views.CONNECTIONS, vhost)
    return listing(request, items + amqp_connections(request, vhost))


def _authorised(request: web.Request, owner: str) -> None:
    """401 for another user's connection unless monitoring (or, to close it, administrator),
    as RabbitMQ's is_authorized_user."""
    user = user_of(request)
    allowed = is_admin(user) if request.method == "DELETE" else sees_everything(user)
    if not allowed and owner != user.name:
        raise not_authorised("User not authorised to access object")


async def _find(request: web.Request) -> StreamSession | dict[str, Any]:
    """The stream connection of the path: this node's session, or another node's view."""
    vhost = vhost_for_read(request, request.match_info["vhost"]).name
    name = request.match_info["name"]
    for session in all_stream_sessions(request, vhost):
        if views.connection_name(session) == name:
            _authorised(request, session.username)
            return session
    for item in await nodes_of(request).remote_items(cluster_views.CONNECTIONS):
        if (item.get("protocol") == "stream" and item.get("name") == name
                and item.get("vhost") == vhost):
            _authorised(request, str(item.get("user")))
            return item
    raise not_found()


async def get_connection(request: web.Request) -> web.Response:
    found = await _find(request)
    return ok(found if isinstance(found, dict) else connection_view(found))


async def delete_connection(request: web.Request) -> web.Response:
    """RabbitMQ's stream reader stops on the management's shutdown: the socket closes."""
    found = await _find(request)
    if not isinstance(found, dict):
        found.abort()
        return no_content()
    try:  # another node's: it closes it
        await nodes_of(request).close_remote(str(found["node"]), str(found["name"]),
                                             "Closed via management plugin")
    except NotFound:
        raise not_found() from None
    return no_content()


async def _of_connection(request: web.Request, kind: str) -> list[dict[str, Any]]:
    found = await _find(request)
    if not isinstance(found, dict):
        return (publisher_views if kind == STREAM_PUBLISHERS else consumer_views)([found])
    items = await nodes_of(request).remote_items(kind)
    return [i for i in items if i.get("connection_details", {}).get("name") == found["name"]]


async def connection_publishers(request: web.Request) -> web.Response:
    return listing(request, await _of_connection(request, STREAM_PUBLISHERS))


async def connection_consumers(request: web.Request) -> web.Response:
    return listing(request, await _of_connection(request, STREAM_CONSUMERS))


async def list_publishers(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    stream = request.match_info.get("name")
    if stream is not None:
        assert vhost is not None
        queue = broker_of(request).vhosts[vhost].queues.get(stream)
        if queue is None:
            raise not_found()
    live = [p for p in publisher_views(stream_sessions(request, vhost))
            + await remote(request, STREAM_PUBLISHERS, vhost)
            if stream is None or p["stream"] == stream]
    return listing(request, live + tracked_publishers(request, vhost, stream, live))


async def list_consumers(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    return listing(request, consumer_views(stream_sessions(request, vhost))
                   + await remote(request, STREAM_CONSUMERS, vhost)
                   + amqp_consumers(request, vhost))


def setup(app: web.Application) -> None:
    r = app.router
    base = "/api/stream/connections"
    r.add_get(base, list_connections)
    r.add_get(base + "/{vhost}", list_connections)
    r.add_get(base + "/{vhost}/{name}", get_connection)
    r.add_delete(base + "/{vhost}/{name}", delete_connection)
    r.add_get(base + "/{vhost}/{name}/publishers", connection_publishers)
    r.add_get(base + "/{vhost}/{name}/consumers", connection_consumers)
    for path in ("/api/stream/publishers", "/api/stream/publishers/{vhost}",
                 "/api/stream/publishers/{vhost}/{name}"):
        r.add_get(path, list_publishers)
    r.add_get("/api/stream/consumers", list_consumers)
    r.add_get("/api/stream/consumers/{vhost}", list_consumers)
