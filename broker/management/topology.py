"""Exchanges, queues and bindings: /api/exchanges, /api/queues, /api/bindings.

Reads show what the user may see; writes need a permission on the vhost and pass the user's
configure/write/read patterns to the model as its `check`. Declaring is idempotent with
RabbitMQ's equivalence rules (an inequivalent redeclare is a 400 with RabbitMQ's text).
Declarations and deletes go through `access_store`: in cluster mode into etcd, in force on every
node before the answer; a queue declared here is held by this node, and one held elsewhere is
checked for `if-unused`/`if-empty` against its holder's counts. Purges and gets of such a
queue run on its holder (asked over the node link, `cluster_views`).
Also: publish to an exchange and get from a queue, as rabbitmqadmin does them.
Runs on the event loop.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from leveret.amqp.content import Message
from leveret.amqp.properties import Properties
from leveret.broker.access import admin
from leveret.broker.access.access_store import access_store
from leveret.broker.management import cluster_views, messages, views
from leveret.broker.management.http import (
    ApiError,
    bad_request,
    body,
    broker_of,
    created_or_updated,
    exchange_name,
    listing,
    no_content,
    not_found,
    ok,
    vhost_for_read,
    vhost_for_write,
    visible_vhosts,
)
from leveret.broker.management.nodes import nodes_of
from leveret.broker.model.delayed_log import hidden
from leveret.broker.model.errors import PreconditionFailed

if TYPE_CHECKING:
    from leveret.broker.model.vhost import VHost


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


# -- exchanges --------------------------------------------------------------------------------


async def _exchanges(request: web.Request, vhosts: list[VHost]) -> list[dict[str, Any]]:
    """The exchanges' views, a delayed one's figures from the node that leads its log."""
    pairs = [(v, x) for v in vhosts for x in v.exchanges.values()]
    held = await nodes_of(request).delayed_figures(pairs)
    return [views.exchange_view(v, x, info) for (v, x), info in zip(pairs, held, strict=True)]


async def list_exchanges(request: web.Request) -> web.Response:
    return listing(request, await _exchanges(request, visible_vhosts(request)))


async def list_vhost_exchanges(request: web.Request) -> web.Response:
    vhosts = [vhost_for_read(request, request.match_info["vhost"])]
    return listing(request, await _exchanges(request, vhosts))


async def get_exchange(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if exchange is None:
        raise not_found()
    held = (await nodes_of(request).delayed_figures([(vhost, exchange)]))[0]
    return ok(views.exchange_view(vhost, exchange, held))


async def put_exchange(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    name = exchange_name(request.match_info["name"])
    created = await access_store(broker_of(request)).declare_exchange(vhost.name, name, data,
                                                                       check)
    return created_or_updated(created)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name = exchange_name(request.match_info["name"])
    if name not in vhost.exchanges:
        raise not_found()
    await access_store(broker_of(request)).delete_exchange(
        vhost.name, name, _flag(request, "if-unused"), check)
    return no_content()


async def exchange_bindings(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if exchange is None:
        raise not_found()
    items = _bindings(vhost)
    if request.match_info["side"] == "source":
        items = [b for b in items if b["source"] == exchange.name]
    else:
        items = [b for b in items
                 if b["destination_type"] == "exchange" and b["destination"] == exchange.name]
    return listing(request, items)


async def publish(request: web.Request) -> web.Response:
    """POST /api/exchanges/{vhost}/{name}/publish: routing_key, payload, payload_encoding
    (string or base64) and properties; answers {"routed": bool}."""
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    name = exchange_name(request.match_info["name"])
    exchange = vhost.exchange(name)
    check("write", "exchange", name)
    payload = data.get("payload", "")
    if data.get("payload_encoding", "string") == "base64":
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("payload is not valid base64") from None
    else:
        raw = str(payload).encode("utf-8")
    try:
        properties = Properties(**(data.get("properties") or {}))
    except (TypeError, ValueError) as exc:
        raise bad_request(f"invalid message properties: {exc}") from None
    message = Message.build(name, str(data.get("routing_key", "")), raw, properties)
    return ok({"routed": vhost.publish(exchange, message, None) > 0})


# -- queues -----------------------------------------------------------------------------------


def _consumer_details(request: web.Request, queue: Any) -> list[dict[str, Any]]:
    return [
        views.consumer_view(session, channel, consumer)
        for session in list(broker_of(request).connections)
        for channel in list(session.channels.values())
        for consumer in list(channel.consumers.values())
        if consumer.queue is queue
    ]


async def _queues(request: web.Request, vhosts: list[VHost]) -> list[dict[str, Any]]:
    """Every queue of `vhosts`, with its `node`: in cluster mode those held elsewhere too, with
    their holder's counts (the nodes port)."""
    queues = [q for v in vhosts for q in v.queues.values() if not hidden(q)]
    return await nodes_of(request).queue_views(queues)


async def list_queues(request: web.Request) -> web.Response:
    return listing(request, await _queues(request, visible_vhosts(request)))


async def list_vhost_queues(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    return listing(request, await _queues(request, [vhost]))


async def get_queue(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise not_found()
    view = (await nodes_of(request).queue_views([queue]))[0]
    view["consumer_details"] = _consumer_details(request, queue)
    return ok(view)


async def put_queue(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    created = await access_store(broker_of(request)).declare_queue(
        vhost.name, request.match_info["name"], data, check)
    return created_or_updated(created)


async def delete_queue(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name = request.match_info["name"]
    if name not in vhost.queues:
        raise not_found()
    if_unused, if_empty = _flag(request, "if-unused"), _flag(request, "if-empty")
    broker = broker_of(request)
    nodes = nodes_of(request)
    queue = vhost.queues[name]
    if nodes.is_remote(queue) and (if_unused or if_empty):
        view = (await nodes.queue_views([queue]))[0]  # its holder's counts
        if view["state"] == "down":
            raise ApiError(503, "service_unavailable",
                           f"{queue.resource}: its node {view['node']} does not answer")
        if if_unused and view["consumers"]:
            raise PreconditionFailed(f"{queue.resource} in use")
        if if_empty and view["messages"]:
            raise PreconditionFailed(f"{queue.resource} not empty")
    await access_store(broker).delete_queue(vhost.name, name, if_unused, if_empty, check)
    return no_content()


async def purge_queue(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name = request.match_info["name"]
    if name not in vhost.queues:
        raise not_found()
    broker = broker_of(request)
    queue = vhost.queues[name]
    nodes = nodes_of(request)
    if nodes.is_remote(queue):
        check("read", "queue", name)
        await nodes.on_holder(queue, cluster_views.PURGE, {})
    else:
        admin.purge_queue(broker, vhost.name, name, check)
    return no_content()


async def queue_bindings(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    name = request.match_info["name"]
    if name not in vhost.queues:
        raise not_found()
    return listing(request, [b for b in _bindings(vhost)
                             if b["destination_type"] == "queue" and b["destination"] == name])


async def get_messages(request: web.Request) -> web.Response:
    """POST /api/queues/{vhost}/{name}/get: count, ackmode, encoding (auto or base64); a queue
    held by another node is asked of its holder."""
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    queue = vhost.queue(request.match_info["name"])
    check("read", "queue", queue.name)
    ackmode = data.get("ackmode", "ack_requeue_true")
    if ackmode not in messages.ACK_MODES:
        raise bad_request(f"ackmode must be one of {', '.join(messages.ACK_MODES)}")
    try:
        count = int(data.get("count", 1))
    except (TypeError, ValueError):
        raise bad_request("count must be a number") from None
    encoding = str(data.get("encoding", "auto"))
    nodes = nodes_of(request)
    if nodes.is_remote(queue):
        return ok(await nodes.on_holder(queue, cluster_views.GET, {
            "count": count, "ackmode": ackmode, "encoding": encoding}))
    return ok(messages.take(queue, count, ackmode, encoding))


# -- bindings ---------------------------------------------------------------------------------


def _bindings(vhost: VHost) -> list[dict[str, Any]]:
    items = [views.default_binding_view(vhost.name, q) for q in vhost.queues.values()
             if not hidden(q)]
    for exchange in vhost.exchanges.values():
        items.extend(views.binding_view(vhost.name, b) for b in exchange.bindings.values())
    return items


async def list_bindings(request: web.Request) -> web.Response:
    return listing(request, [b for v in visible_vhosts(request) for b in _bindings(v)])


async def list_vhost_bindings(request: web.Request) -> web.Response:
    return listing(request, _bindings(vhost_for_read(request, request.match_info["vhost"])))


def _kind(letter: str) -> str:
    return "queue" if letter == "q" else "exchange"


def _pair(vhost: VHost, request: web.Request) -> list[dict[str, Any]]:
    info = request.match_info
    source, kind = exchange_name(info["source"]), _kind(info["kind"])
    table: dict[str, Any] = vhost.queues if kind == "queue" else vhost.exchanges
    if source not in vhost.exchanges or info["destination"] not in table:
        raise not_found()
    return [b for b in _bindings(vhost)
            if b["source"] == source and b["destination_type"] == kind
            and b["destination"] == info["destination"]]


async def list_pair_bindings(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    return listing(request, _pair(vhost, request))


async def post_binding(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    info = request.match_info
    source, kind = exchange_name(info["source"]), _kind(info["kind"])
    routing_key = data.get("routing_key", "")
    arguments = admin.parse_arguments(data.get("arguments"))
    await access_store(broker_of(request)).add_binding(
        vhost.name, source, kind, info["destination"], routing_key, arguments, check)
    key = views.properties_key(routing_key if isinstance(routing_key, str) else "", arguments)
    location = request.raw_path.split("?", 1)[0].rstrip("/") + "/" + quote(key, safe="")
    return web.Response(status=201, headers={"Location": location})


def _find(vhost: VHost, request: web.Request) -> dict[str, Any]:
    props = request.match_info["props"]
    for item in _pair(vhost, request):
        if item["properties_key"] == props or (not item["arguments"]
                                               and item["routing_key"] == props):
            return item
    raise not_found()


async def get_binding(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    return ok(_find(vhost, request))


async def delete_binding(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    item = _find(vhost, request)
    exchange = vhost.exchanges[item["source"]]
    for binding in exchange.bindings.values():
        if views.binding_view(vhost.name, binding) == item:
            await access_store(broker_of(request)).delete_binding(
                vhost.name, item["source"], item["destination_type"], item["destination"],
                binding.routing_key, binding.arguments, check)
            return no_content()
    raise not_found()


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/exchanges", list_exchanges)
    r.add_get("/api/exchanges/{vhost}", list_vhost_exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}",
              exchange_bindings)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_vhost_queues)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_put("/api/queues/{vhost}/{name}", put_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    r.add_get("/api/bindings", list_bindings)
    r.add_get("/api/bindings/{vhost}", list_vhost_bindings)
    pair = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
    r.add_get(pair, list_pair_bindings)
    r.add_post(pair, post_binding)
    r.add_get(pair + "/{props}", get_binding)
    r.add_delete(pair + "/{props}", delete_binding)
