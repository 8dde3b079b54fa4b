"""This node's stream-protocol connections as the management API shows them: the sessions a
user may see, and their connection, publisher and consumer views in RabbitMQ's shape (the
connection_created items of rabbit_stream_reader), for `/api/stream/*`, `/api/connections` and
`/api/consumers`; and, in cluster mode, the answers to the other nodes' `mgmt.stream_publishers`
and `mgmt.stream_consumers` (`install`).

It is the lower half of `stream_protocol` (the HTTP handlers): `live` and `cluster_views` list
and close stream connections through it, so none of the three imports another that imports it.
Must not know: stream frames (it reads the sessions' state), other nodes' views or the HTTP
routes. Runs on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.management import views
from leveret.broker.management.http import broker_of, sees_everything, user_of
from leveret.broker.model.errors import NotFound
from leveret.broker.streamproto import registry

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.link import Handlers, Link
    from leveret.broker.streamproto.publisher import Publisher
    from leveret.broker.streamproto.session import StreamSession
    from leveret.broker.streamproto.subscription import Subscription

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
    host, port = views.local_address(session)
    name = views.connection_name(session)
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
    return {"name": views.connection_name(session),
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


def publisher_views(sessions: list[StreamSession]) -> list[dict[str, Any]]:
    return [publisher_view(s, p) for s in sessions
            for p in sorted(s.publishers.values(), key=lambda p: p.id)]


def consumer_views(sessions: list[StreamSession]) -> list[dict[str, Any]]:
    return [consumer_view(s, sub) for s in sessions
            for sub in sorted(s.subscriptions.values(), key=lambda sub: sub.id)]


def local_connection_views(broker: Broker) -> list[dict[str, Any]]:
    """For the other nodes' `mgmt.connections`: this node's stream connections."""
    return [connection_view(s) for s in local_sessions(broker)]


def close_local(broker: Broker, name: str) -> bool:
    """For the other nodes' `mgmt.close_connection`: close this node's stream connection, or
    NotFound."""
    for session in local_sessions(broker):
        if views.connection_name(session) == name:
            session.abort()
            return True
    raise NotFound(f"no connection '{name}'")


def install(broker: Broker, handlers: Handlers) -> None:
    """Cluster mode (`cluster_views.install`): answer the other nodes' questions about this
    node's stream publishers and consumers, on the cluster links' `handlers` (once: a second
    install for the same broker finds them installed)."""
    if STREAM_PUBLISHERS in handlers.requests:
        return

    async def publishers(_link: Link, _body: object) -> list[dict[str, Any]]:
        return publisher_views(local_sessions(broker))

    async def consumers(_link: Link, _body: object) -> list[dict[str, Any]]:
        return consumer_views(local_sessions(broker))

    handlers.on_request(STREAM_PUBLISHERS, publishers)
    handlers.on_request(STREAM_CONSUMERS, consumers)


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
        if views.connection_name(session) == name:
            return session
    return None
