"""Connections, channels and consumers: /api/connections, /api/channels, /api/consumers.

A management user sees its own connections (and their channels and consumers); monitoring
users and administrators see all of them, as in RabbitMQ. DELETE on a connection closes it
with 320 CONNECTION_FORCED and RabbitMQ's text, or the `X-Reason` header's. In cluster mode
the lists and GETs take in every running node's connections and channels (each with its
`node`, asked over the node links: `cluster_views`), and so do the consumers; closing another
node's connection asks that node to close it.
Runs on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.management import cluster_views, stream_connections, views
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
)
from leveret.broker.management.nodes import nodes_of

if TYPE_CHECKING:
    from leveret.broker.session.connection import Session


def sessions(request: web.Request, vhost: str | None = None) -> list[Session]:
    """Open connections the user may see, in connection order."""
    user = user_of(request)
    everything = sees_everything(user)
    found = [
        s
        for s in broker_of(request).connections
        if s.vhost is not None
        and (vhost is None or s.vhost.name == vhost)
        and (everything or s.username == user.name)
    ]
    return sorted(found, key=lambda s: s.id)


def _connections(request: web.Request, vhost: str | None = None) -> list[dict[str, Any]]:
    return ([views.connection_view(s) for s in sessions(request, vhost)]
            + stream_connections.stream_connection_views(request, vhost))


async def _cluster_wide(request: web.Request, kind: str, local: list[dict[str, Any]],
                        vhost: str | None = None) -> list[dict[str, Any]]:
    """`local` (this node's items), then every other node's that the user may see."""
    user = user_of(request)
    everything = sees_everything(user)
    remote = await nodes_of(request).remote_items(kind)
    return local + [item for item in remote
                    if (vhost is None or item.get("vhost") == vhost)
                    and (everything or item.get("user") == user.name)]


def _channels(request: web.Request, vhost: str | None = None,
              session_list: list[Session] | None = None) -> list[dict[str, Any]]:
    chosen = sessions(request, vhost) if session_list is None else session_list
    return [
        views.channel_view(s, ch)
        for s in chosen
        for ch in sorted(s.channels.values(), key=lambda c: c.number)
    ]


def consumers(request: web.Request, vhost: str | None = None) -> list[dict[str, Any]]:
    return [
        views.consumer_view(s, ch, consumer)
        for s in sessions(request, vhost)
        for ch in sorted(s.channels.values(), key=lambda c: c.number)
        for consumer in ch.consumers.values()
    ]


def find_session(request: web.Request) -> Session:
    name = request.match_info["name"]
    for session in sessions(request):
        if views.connection_name(session) == name:
            return session
    raise not_found()


async def list_connections(request: web.Request) -> web.Response:
    return listing(request, await _cluster_wide(request, cluster_views.CONNECTIONS,
                                                _connections(request)))


async def list_vhost_connections(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return listing(request, await _cluster_wide(request, cluster_views.CONNECTIONS,
                                                _connections(request, name), name))


async def get_connection(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for session in sessions(request):
        if views.connection_name(session) == name:
            return ok(views.connection_view(session))
    stream = stream_connections.find_stream_connection(request, name)
    if stream is not None:
        return ok(stream_connections.connection_view(stream))
    for item in await _cluster_wide(request, cluster_views.CONNECTIONS, []):
        if item.get("name") == name:
            return ok(item)
    raise not_found()


async def delete_connection(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    user = user_of(request)
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    for session in sessions(request):
        if views.connection_name(session) == name:
            if not is_admin(user) and session.username != user.name:
                raise not_authorised("Not administrator user")
            session.force_close(reason)
            return no_content()
    stream = stream_connections.find_stream_connection(request, name)
    if stream is not None:
        if not is_admin(user) and stream.username != user.name:
            raise not_authorised("Not administrator user")
        stream.abort()
        return no_content()
    for item in await _cluster_wide(request, cluster_views.CONNECTIONS, []):
        if item.get("name") == name:  # another node's: it closes it
            if not is_admin(user) and item.get("user") != user.name:
                raise not_authorised("Not administrator user")
            await nodes_of(request).close_remote(str(item["node"]), name, reason)
            return no_content()
    raise not_found()


async def connection_channels(request: web.Request) -> web.Response:
    return listing(request, _channels(request, session_list=[find_session(request)]))


async def list_channels(request: web.Request) -> web.Response:
    return listing(request, await _cluster_wide(request, cluster_views.CHANNELS,
                                                _channels(request)))


async def list_vhost_channels(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return listing(request, await _cluster_wide(request, cluster_views.CHANNELS,
                                                _channels(request, name), name))


async def get_channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for item in await _cluster_wide(request, cluster_views.CHANNELS, _channels(request)):
        if item["name"] == name:
            return ok(item)
    raise not_found()


async def _all_consumers(request: web.Request, vhost: str | None = None) -> list[dict[str, Any]]:
    user = user_of(request)
    everything = sees_everything(user)
    remote = await nodes_of(request).remote_items(cluster_views.CONSUMERS)
    local = consumers(request, vhost) + stream_connections.api_consumer_views(request, vhost)
    return local + [
        c for c in remote
        if (vhost is None or c.get("queue", {}).get("vhost") == vhost)
        and (everything or c.get("channel_details", {}).get("user") == user.name)]


async def list_consumers(request: web.Request) -> web.Response:
    return listing(request, await _all_consumers(request))


async def list_vhost_consumers(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return listing(request, await _all_consumers(request, name))


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", delete_connection)
    r.add_get("/api/connections/{name}/channels", connection_channels)
    r.add_get("/api/vhosts/{vhost}/connections", list_vhost_connections)
    r.add_get("/api/vhosts/{vhost}/channels", list_vhost_channels)
    r.add_get("/api/channels", list_channels)
    r.add_get("/api/channels/{name}", get_channel)
    r.add_get("/api/consumers", list_consumers)
    r.add_get("/api/consumers/{vhost}", list_vhost_consumers)
