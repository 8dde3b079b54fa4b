"""The JSON shapes of the management API: RabbitMQ's field names for Leveret's objects.

Each function turns one model or session object into the dict RabbitMQ's management plugin
returns for it (the fields tools read; rates are reported as 0.0, as a broker with statistics
collection in `none` mode would). Streams add their offsets, segments and bytes. Pure
functions of the state they are given; no I/O except a stream's in-memory log summary.

Runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import json
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote_plus

from leveret.broker.management import quorum_ops
from leveret.broker.model.superstream import SuperStreamExchange
from leveret.broker.process import listen

if TYPE_CHECKING:
    from leveret.broker.access.auth import Permission, User
    from leveret.broker.model.binding import Binding
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.policy import Policy
    from leveret.broker.model.queue import Queue
    from leveret.broker.model.vhost import VHost
    from leveret.broker.session.channel import Channel
    from leveret.broker.session.connection import Session

RATE = {"rate": 0.0}


def jsonable(value: Any) -> Any:
    """An AMQP field value as JSON: bytes as text, timestamps as seconds, decimals as float."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def with_details(values: dict[str, Any]) -> dict[str, Any]:
    """Add RabbitMQ's `<key>_details: {"rate": 0.0}` beside each numeric counter."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out[key] = value
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{key}_details"] = dict(RATE)
    return out


# -- vhosts, users, permissions, policies ------------------------------------------------------


def queue_totals(queues: list[Queue]) -> dict[str, int]:
    ready = sum(q.message_count for q in queues)
    unacked = sum(q.unacked for q in queues)
    return {
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    }


def queue_counts(queue: Any) -> dict[str, int]:
    """A queue's message statistics in RabbitMQ's kinds: `deliver_get` is every delivery and
    get, `deliver` those to consumers that ack."""
    delivered = int(queue.stats_delivered)
    get, get_no_ack = queue.stats_get, queue.stats_get_no_ack
    no_ack = queue.stats_deliver_no_ack
    return {
        "publish": queue.stats_published,
        "deliver_get": delivered,
        "deliver": max(0, delivered - get - get_no_ack - no_ack),
        "deliver_no_ack": no_ack,
        "get": get,
        "get_no_ack": get_no_ack,
        "ack": queue.stats_ack,
        "redeliver": queue.stats_redeliver,
    }


def sum_counts(queues: list[Any]) -> dict[str, int]:
    out = dict.fromkeys(("publish", "deliver_get", "deliver", "deliver_no_ack", "get",
                         "get_no_ack", "ack", "redeliver"), 0)
    for queue in queues:
        for key, value in queue_counts(queue).items():
            out[key] += value
    return out


def channel_counts(channel: Channel) -> dict[str, int]:
    """A channel's message statistics: each delivery took a delivery tag, so `deliver_get`
    is the last tag given."""
    delivered = channel.next_tag - 1
    get, get_no_ack = channel.stats_get, channel.stats_get_no_ack
    no_ack = channel.stats_deliver_no_ack
    confirms = channel.confirms
    return {
        "publish": channel.stats_publish,
        "confirm": confirms.confirmed if confirms is not None else 0,
        "return_unroutable": channel.stats_return_unroutable,
        "deliver_get": delivered,
        "deliver": max(0, delivered - get - get_no_ack - no_ack),
        "deliver_no_ack": no_ack,
        "get": get,
        "get_no_ack": get_no_ack,
        "ack": channel.stats_ack,
        "redeliver": channel.stats_redeliver,
    }


def vhost_view(vhost: VHost, description: str, tags: list[str],
               cluster_state: dict[str, str]) -> dict[str, Any]:
    return {
        "name": vhost.name,
        "description": description,
        "tags": list(tags),
        "default_queue_type": vhost.default_queue_type,
        "metadata": {"description": description, "tags": list(tags),
                     "default_queue_type": vhost.default_queue_type},
        "tracing": False,
        "cluster_state": cluster_state,
        **with_details(queue_totals(list(vhost.queues.values()))),
        # confirm and return_unroutable are counted by channels: the rates sampler fills them
        "message_stats": with_details({**sum_counts(list(vhost.queues.values())),
                                       "confirm": 0, "return_unroutable": 0}),
    }


def user_view(user: User, algorithm: str) -> dict[str, Any]:
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": algorithm,
        "tags": list(user.tags),
        "limits": {},
    }


def permission_view(user: str, vhost: str, permission: Permission) -> dict[str, Any]:
    return {
        "user": user,
        "vhost": vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


def policy_view(vhost: str, policy: Policy) -> dict[str, Any]:
    return {
        "vhost": vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "definition": jsonable(policy.definition),
        "priority": policy.priority,
    }


# -- exchanges, queues, bindings ----------------------------------------------------------------


def exchange_view(vhost: VHost, exchange: Exchange,
                  held: dict[str, Any] | None = None) -> dict[str, Any]:
    """An exchange as the API shows it; `held`: a delayed exchange's figures as its log's
    leader has them (nodes.NodesView.delayed_figures; by default this node's)."""
    policy = vhost.policy_for("exchanges", exchange.name) if exchange.name else None
    view: dict[str, Any] = {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": jsonable(exchange.arguments),
        "user_who_performed_action": "",
        "policy": policy.name if policy is not None else None,
        "message_stats": with_details({"publish_in": exchange.stats_publish_in,
                                       "publish_out": exchange.stats_publish_out}),
    }
    view.update(exchange.held_info() if held is None else held)  # delayed_exchange.py
    if isinstance(exchange, SuperStreamExchange):
        view["super_stream"] = {"partitions": [q.name for q in exchange.partitions()]}
    return view


def stream_extras(queue: Any, node: str, members: Sequence[str] | None = None,
                  online: Sequence[str] | None = None) -> dict[str, Any]:
    """A stream's leader, members and online members (`node` leads it; by default its only
    member), and, from the queue's own log when it has one here, its offsets, segments and
    bytes (Leveret's additions to RabbitMQ's fields)."""
    listed = list(members) if members else [node]
    extras: dict[str, Any] = {
        "leader": node,
        "members": listed,
        "online": list(online) if online is not None else listed,
    }
    if getattr(queue, "log", None) is None:  # held elsewhere, and not answering
        return extras
    summary = queue.log.summary()
    readers = sum(
        1 for c in queue.consumers if c.state is not None and c.state.reader is not None
    )
    extras.update({
        "readers": {node: readers},
        "first_offset": summary["first_offset"],
        "last_offset": summary["last_offset"],
        "committed_offset": summary["committed_offset"],
        "next_offset": summary["next_offset"],
        "segments": len(summary["segments"]),
        "bytes": summary["bytes"],
        "message_bytes": summary["bytes"],
    })
    index = queue.partition_index()
    if index >= 0:
        for exchange in queue.vhost.exchanges.values():
            if isinstance(exchange, SuperStreamExchange) and exchange.index_of(queue) >= 0:
                extras["super_stream"] = exchange.name
                extras["partition_index"] = index
                break
    return extras


def queue_view(queue: Queue, node: str, consumers: list[dict[str, Any]] | None = None,
               members: Sequence[str] | None = None,
               online: Sequence[str] | None = None) -> dict[str, Any]:
    """A queue held on `node` (this one, or a remote queue's holder); a replicated stream's
    or quorum queue's `node` is its leader, with its `members` and those `online`."""
    vhost = queue.vhost
    policy = vhost.policy_for("queues", queue.name)
    unacked = queue.unacked
    exclusive_tag = next((c.tag for c in queue.consumers if c.exclusive), None)
    sac_tag = None
    if queue.type == "classic" and queue.single_active and queue.consumers:
        sac_tag = queue.consumers[0].tag
    view: dict[str, Any] = {
        "name": queue.name,
        "vhost": vhost.name,
        "type": queue.type,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "arguments": jsonable(queue.arguments),
        "node": node,
        "state": "running",
        **with_details(
            {
                "messages": queue.message_count + unacked,
                "messages_ready": queue.message_count,
                "messages_unacknowledged": unacked,
            }
        ),
        "consumers": len(queue.consumers),
        "policy": policy.name if policy is not None else None,
        "operator_policy": None,
        "effective_policy_definition": jsonable(policy.definition) if policy else {},
        "exclusive_consumer_tag": exclusive_tag,
        "single_active_consumer_tag": sac_tag,
        "message_bytes": queue.message_bytes,
        "message_stats": with_details(queue_counts(queue)),
    }
    if queue.type == "stream":
        view.update(stream_extras(queue, node, members, online))
    elif queue.type == "quorum":
        view.update(quorum_ops.quorum_extras(queue, node, members, online))
    if consumers is not None:
        view["consumer_details"] = consumers
    return view


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's binding key for URLs: `~` for an empty key without arguments, the quoted
    key, and `~` plus a hash of the arguments when there are any. (RabbitMQ hashes the
    arguments with erlang:phash2; Leveret uses CRC-32 of their JSON, so keys differ from
    RabbitMQ's, but clients take them from the listings.)"""
    quoted = quote_plus(routing_key).replace("~", "%7E")
    if not arguments:
        return quoted or "~"
    text = json.dumps(jsonable(arguments), sort_keys=True, separators=(",", ":"))
    digest = zlib.crc32(text.encode()).to_bytes(4, "big")
    return quoted + "~" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def binding_view(vhost: str, binding: Binding) -> dict[str, Any]:
    return {
        "source": binding.source.name,
        "vhost": vhost,
        "destination": binding.destination.name,
        "destination_type": binding.destination.kind,
        "routing_key": binding.routing_key,
        "arguments": jsonable(binding.arguments),
        "properties_key": properties_key(binding.routing_key, binding.arguments),
    }


def default_binding_view(vhost: str, queue: Queue) -> dict[str, Any]:
    """The implicit binding of every queue to the default exchange, as RabbitMQ lists it."""
    return {
        "source": "",
        "vhost": vhost,
        "destination": queue.name,
        "destination_type": "queue",
        "routing_key": queue.name,
        "arguments": {},
        "properties_key": properties_key(queue.name, {}),
    }


# -- connections, channels, consumers ------------------------------------------------------------


class Addressed(Protocol):
    """A client connection of either protocol (an AMQP Session, a StreamSession), as far as
    its name and local address go."""

    @property
    def peer(self) -> tuple[str, int]: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...


def connection_name(session: Addressed) -> str:
    """`peer:port -> local:port`, an IPv6 address in brackets, as RabbitMQ names it."""
    return listen.connection_name(session.peer, session.transport)


def local_address(session: Addressed) -> tuple[str, int]:
    return listen.local_address(session.transport)


def connection_view(session: Session) -> dict[str, Any]:
    host, port = local_address(session)
    vhost = session.vhost.name if session.vhost is not None else None
    return {
        "name": connection_name(session),
        "node": session.broker.config.node_name,
        "user": session.username,
        "user_who_performed_action": session.username,
        "vhost": vhost,
        "channels": len(session.channels),
        "state": "blocked" if session.blocked else "running",
        "protocol": "AMQP 0-9-1",
        "type": "network",
        "ssl": bool(session.tls),
        "peer_host": session.peer[0],
        "peer_port": session.peer[1],
        "host": host,
        "port": port,
        "client_properties": jsonable(session.client_properties),
        "connected_at": int(session.connected_at * 1000),
        "timeout": session.heartbeat,
        "frame_max": session.frame_max,
        "channel_max": session.broker.config.channel_max,
        **with_details({"recv_oct": session.bytes_received, "send_oct": session.bytes_sent}),
    }


def channel_name(session: Session, channel: Channel) -> str:
    return f"{connection_name(session)} ({channel.number})"


def channel_view(session: Session, channel: Channel) -> dict[str, Any]:
    stats = with_details(channel_counts(channel))
    confirms = channel.confirms
    return {
        "name": channel_name(session, channel),
        "number": channel.number,
        "node": session.broker.config.node_name,
        "user": session.username,
        "user_who_performed_action": session.username,
        "vhost": channel.vhost.name if channel.vhost is not None else None,
        "connection_details": {
            "name": connection_name(session),
            "peer_host": session.peer[0],
            "peer_port": session.peer[1],
        },
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": len(confirms.outstanding) if confirms is not None else 0,
        "messages_uncommitted": len(channel.tx) if channel.tx is not None else 0,
        "acks_uncommitted": 0,
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.global_prefetch,
        "confirm": confirms is not None,
        "transactional": channel.tx is not None,
        "state": "running",
        "message_stats": stats,
    }


def channel_details(session: Session, channel: Channel) -> dict[str, Any]:
    return {
        "name": channel_name(session, channel),
        "number": channel.number,
        "connection_name": connection_name(session),
        "peer_host": session.peer[0],
        "peer_port": session.peer[1],
        "user": session.username,
        "node": session.broker.config.node_name,
    }


def consumer_activity(consumer: Consumer) -> tuple[bool, str]:
    """(active, activity_status) as RabbitMQ reports them: up, single_active or waiting."""
    queue = consumer.queue
    if queue.type == "stream":
        cursor = consumer.state
        sac = consumer.arguments.get("x-single-active-consumer") is True
        active = bool(cursor is not None and cursor.active)
        if sac:
            return active, "single_active" if active else "waiting"
        return active, "up"
    if queue.single_active:
        active = bool(queue.consumers) and queue.consumers[0] is consumer
        return active, "single_active" if active else "waiting"
    return True, "up"


def stream_consumer_fields(consumer: Consumer) -> dict[str, Any]:
    """A stream consumer's position: its reference, last delivered and stored offsets."""
    queue = consumer.queue
    cursor = consumer.state
    if cursor is None:
        return {}
    stored = queue.stored_offset(cursor.name) if cursor.tracking else None
    committed = queue.log.committed_offset
    return {
        "reference": cursor.name.decode("utf-8", "replace"),
        "offset_tracking": cursor.tracking,
        "offset": cursor.delivered,
        "stored_offset": stored if stored is None or stored >= 0 else None,
        "offset_lag": max(0, committed - cursor.delivered),
        "credits": max(0, consumer.prefetch - consumer.unacked) if consumer.prefetch else 0,
    }


def consumer_view(session: Session, channel: Channel, consumer: Consumer) -> dict[str, Any]:
    active, status = consumer_activity(consumer)
    view: dict[str, Any] = {
        "consumer_tag": consumer.tag,
        "channel_details": channel_details(session, channel),
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "arguments": jsonable(consumer.arguments),
        "active": active,
        "activity_status": status,
    }
    if consumer.queue.type == "stream":
        view["stream"] = stream_consumer_fields(consumer)
    return view
