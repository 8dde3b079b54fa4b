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
`mgmt.stream_consumers` are installed here); another node's connection is closed by it.
Must not know: stream frames (it reads the sessions' state). Runs on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.management import cluster_views, streamops, views
from leveret.broker.management.http import (
    BROKER,
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
from leveret.broker.model.errors import NotFound
from leveret.broker.model.stream import StreamQueue
from leveret.broker.streamproto import registry

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.link import Link
    from leveret.broker.streamproto.consuming import Subscription
    from leveret.broker.streamproto.publishing import Publisher
    from leveret.broker.streamproto.session import StreamSession


# -- stream-protocol sessions --------------------------------------------------------------------


STREAM_PUBLISHERS = "mgmt.stream_publishers"
STREAM_CONSUMERS = "mgmt.stream_consumers"


def local_sessions(broker: Broker, vhost: str | None = None) -> list[StreamSession]:
    """This node's open (past Open) stream-protocol connections, in connection order."""
    server = registry.server_of(broker)
    if server is None:
        return []
    found = [s for s in server.sessions
             if s.step == "opened" and s.vhost is not None
             and (vhost is None or s.vhost.name == vhost)]
    return sorted(found, key=lambda s: s.id)


def all_stream_sessions(request: web.Request, vhost: str | None = None) -> list[StreamSession]:
    return local_sessions(broker_of(request), vhost)


def stream_sessions(request: web.Request, vhost: str | None = None) -> list[StreamSession]:
    """The stream-protocol connections this user may see."""
    user = user_of(request)
    everything = sees_everything(user)
    return [s for s in all_stream_sessions(request, vhost)
            if everything or s.username == user.name]


def _cert_info(session: StreamSession) -> dict[str, Any]:
    cert = session.peer_cert or {}
    return {
        "peer_cert_subject": cert.get("subject"),
        "peer_cert_issuer": cert.get("issuer"),
        "peer_cert_serial_number": cert.get("serial_number"),
        "peer_cert_validity": cert.get("validity"),
    }


def _ssl_info(session: StreamSession) -> dict[str, Any]:
    transport = session.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return {"ssl": False, "ssl_protocol": None, "ssl_key_exchange": None,
                "ssl_cipher": None, "ssl_hash": None}
    cipher = ssl_object.cipher() or (None, None, None)
    return {"ssl": True, "ssl_protocol": ssl_object.version(), "ssl_key_exchange": None,
            "ssl_cipher": cipher[0], "ssl_hash": None}


def connection_view(session: StreamSession) -> dict[str, Any]:
    """rabbit_stream_reader's connection items, as the management API shows them."""
    host, port = views.local_address(session)  # type: ignore[arg-type]
    name = views.connection_name(session)  # type: ignore[arg-type]
    view: dict[str, Any] = {
        "name": name,
        "conn_name": name,
        "node": session.broker.config.node_name,
        "user": session.username,
        "user_who_performed_action": session.username,
        "vhost": session.vhost.name,
        "protocol": "stream",
        "host": host,
        "port": port,
        "peer_host": session.peer[0],
        "peer_port": session.peer[1],
        **_ssl_info(session),
        **_cert_info(session),
        "auth_mechanism": session.auth_mechanism,
        "timeout": session.heartbeat,
        "heartbeat": session.heartbeat,
        "frame_max": session.frame_max,
        "channel_max": 0,
        "channels": 0,
        "client_properties": dict(session.client_properties),
        "connected_at": int(session.connected_at * 1000),
        "state": "blocked" if session.blocked else "running",
        "connection_state": "blocked" if session.blocked else "running",
        "subscriptions": len(session.subscriptions),
        **views.with_details({"recv_oct": session.bytes_received,
                              "send_oct": session.bytes_sent}),
    }
    user_name = session.client_properties.get("connection_name")
    if user_name:
        view["user_provided_name"] = user_name
    return view


def connection_details(session: StreamSession) -> dict[str, Any]:
    return {"name": views.connection_name(session),  # type: ignore[arg-type]
            "user": session.username, "node": session.broker.config.node_name,
            "peer_port": session.peer[1], "peer_host": session.peer[0]}


def publisher_view(session: StreamSession, publisher: Publisher) -> dict[str, Any]:
    queue = publisher.queue
    reference = publisher.reference or ""
    last = queue.last_publishing_id(reference.encode("utf-8")) if reference else 0
    return {
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
        "stream": queue.name,
        "vhost": queue.vhost.name,
        "publisher_id": publisher.id,
        "reference": reference,
        "published": publisher.published,
        "confirmed": publisher.confirmed,
        "errored": publisher.errored,
        "last_publishing_id": max(0, last),
        "connection_details": connection_details(session),
    }


def consumer_view(session: StreamSession, sub: Subscription) -> dict[str, Any]:
    consumer = sub.consumer
    active, status = views.consumer_activity(consumer) if consumer else (False, "waiting")
    fields = views.stream_consumer_fields(consumer) if consumer is not None else {}
    return {
        "queue": {"name": sub.queue.name, "vhost": sub.queue.vhost.name},
        "stream": sub.queue.name,
        "vhost": sub.queue.vhost.name,
        "subscription_id": sub.id,
        "credits": sub.credit_left,
        "consumed": sub.delivered,
        "offset": max(0, fields.get("offset", 0)),  # RabbitMQ shows 0 before any delivery
        "offset_lag": fields.get("offset_lag", 0),
        "stored_offset": fields.get("stored_offset"),
        "reference": sub.properties.get("name"),
        "active": active,
        "activity_status": status,
        "properties": dict(sub.properties),
        "connection_details": connection_details(session),
    }


def _publishers(sessions: list[StreamSession]) -> list[dict[str, Any]]:
    return [publisher_view(s, p) for s in sessions
            for p in sorted(s.publishers.values(), key=lambda p: p.id)]


def _consumers(sessions: list[StreamSession]) -> list[dict[str, Any]]:
    return [consumer_view(s, sub) for s in sessions
            for sub in sorted(s.subscriptions.values(), key=lambda sub: sub.id)]


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


def local_connection_views(broker: Broker) -> list[dict[str, Any]]:
    """For the other nodes' `mgmt.connections`: this node's stream connections."""
    return [connection_view(s) for s in local_sessions(broker)]


def close_local(broker: Broker, name: str) -> bool:
    """For the other nodes' `mgmt.close_connection`: close this node's stream connection, or
    NotFound."""
    for session in local_sessions(broker):
        if views.connection_name(session) == name:  # type: ignore[arg-type]
            session.abort()
            return True
    raise NotFound(f"no connection '{name}'")


def install(broker: Broker) -> None:
    """Cluster mode: answer the other nodes' questions about this node's stream publishers and
    consumers (once: a second management app of the same broker finds them installed)."""
    cluster = broker.cluster
    if cluster is None or STREAM_PUBLISHERS in cluster.links.handlers.requests:
        return

    async def publishers(_link: Link, _body: Any) -> list[dict[str, Any]]:
        return _publishers(local_sessions(broker))

    async def consumers(_link: Link, _body: Any) -> list[dict[str, Any]]:
        return _consumers(local_sessions(broker))

    cluster.links.handlers.on_request(STREAM_PUBLISHERS, publishers)
    cluster.links.handlers.on_request(STREAM_CONSUMERS, consumers)


def _owner(item: dict[str, Any]) -> Any:
    user = item.get("user")
    return user if user is not None else item.get("connection_details", {}).get("user")


def _vhost_of(item: dict[str, Any]) -> Any:
    vhost = item.get("vhost")
    return vhost if vhost is not None else item.get("queue", {}).get("vhost")


async def remote(request: web.Request, kind: str, vhost: str | None) -> list[dict[str, Any]]:
    """Other nodes' stream connections (kind CONNECTIONS), publishers or consumers that this
    user may see."""
    user = user_of(request)
    everything = sees_everything(user)
    items = await cluster_views.remote_items(broker_of(request), kind)
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
        if views.connection_name(session) == name:  # type: ignore[arg-type]
            _authorised(request, session.username)
            return session
    for item in await cluster_views.remote_items(broker_of(request), cluster_views.CONNECTIONS):
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
        await cluster_views.close_remote(broker_of(request), str(found["node"]),
                                         str(found["name"]), "Closed via management plugin")
    except NotFound:
        raise not_found() from None
    return no_content()


async def _of_connection(request: web.Request, kind: str) -> list[dict[str, Any]]:
    found = await _find(request)
    if not isinstance(found, dict):
        return (_publishers if kind == STREAM_PUBLISHERS else _consumers)([found])
    items = await cluster_views.remote_items(broker_of(request), kind)
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
    live = [p for p in _publishers(stream_sessions(request, vhost))
            + await remote(request, STREAM_PUBLISHERS, vhost)
            if stream is None or p["stream"] == stream]
    return listing(request, live + tracked_publishers(request, vhost, stream, live))


async def list_consumers(request: web.Request) -> web.Response:
    vhost = _vhost(request)
    return listing(request, _consumers(stream_sessions(request, vhost))
                   + await remote(request, STREAM_CONSUMERS, vhost)
                   + amqp_consumers(request, vhost))


def stream_connection_views(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    """For /api/connections: RabbitMQ lists stream connections there too."""
    return [connection_view(s) for s in stream_sessions(request, vhost)]


def api_consumer_views(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    """For /api/consumers: RabbitMQ lists stream subscriptions there too, as consumers of a
    channel 0 with the tag `stream.subid-N`."""
    items = []
    for session in stream_sessions(request, vhost):
        for sub in sorted(session.subscriptions.values(), key=lambda sub: sub.id):
            details = connection_details(session)
            active, status = (views.consumer_activity(sub.consumer) if sub.consumer
                              else (False, "waiting"))
            items.append({
                "consumer_tag": f"stream.subid-{sub.id}",
                "channel_details": {"connection_name": details["name"], "name": "",
                                    "number": 0, "node": details["node"],
                                    "peer_host": details["peer_host"],
                                    "peer_port": details["peer_port"],
                                    "user": details["user"]},
                "queue": {"name": sub.queue.name, "vhost": sub.queue.vhost.name},
                "ack_required": False, "exclusive": False, "prefetch_count": 0,
                "arguments": dict(sub.properties), "active": active,
                "activity_status": status,
            })
    return items


def find_stream_connection(request: web.Request, name: str) -> StreamSession | None:
    for session in stream_sessions(request):
        if views.connection_name(session) == name:  # type: ignore[arg-type]
            return session
    return None


def setup(app: web.Application) -> None:
    install(app[BROKER])
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
