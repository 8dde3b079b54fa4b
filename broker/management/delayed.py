"""A delayed exchange's held messages: /api/leveret/exchanges/{vhost}/{name}/delayed.

GET lists the first `count` (default 20, at most 1000) held messages in due order, each with
its `id` (its offset in the exchange's log), `due_ms` and the message as published (the
fields of messages.message_view); DELETE .../delayed/{id} drops one (204; 404 if the exchange
holds no such message). Reading needs the vhost's read access, deleting configure permission
on the exchange. The counts (`messages_delayed`, `next_due_ms`, `delayed_routed`,
`delayed_unroutable`, `delayed_refused`) are in the exchange's own view (views.exchange_view,
through the port's `delayed_figures`).

Only the node that leads the exchange's log knows them (a replica keeps no index): any node
runs the listing and the deletion there, through the management port's `on_log_leader`
(nodes.py; in a cluster the node links, `cluster_views`), and answers 503 while no leader
answers (an election, its node down). `install` registers what the leader's node answers
over the links: `mgmt.delayed_figures` `{"exchanges": [[vhost, name], ...]}` (each one's
figures, or null where this node does not lead its log), `mgmt.delayed_list`
`{"vhost", "name", "count", "encoding"}` (the items, or null) and `mgmt.delayed_delete`
`{"vhost", "name", "id"}` (true, false if not held, or null).

Knows the exchange's `store` (delayed_store.py) through the model; not AMQP, the storage
engine or the cluster's links. Runs on the event loop.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web

from leveret.broker.management.http import (
    ApiError,
    bad_request,
    broker_of,
    exchange_name,
    no_content,
    not_found,
    ok,
    vhost_for_read,
    vhost_for_write,
)
from leveret.broker.management.messages import message_view
from leveret.broker.management.nodes import nodes_of
from leveret.broker.model.delayed_exchange import holds_delayed

DEFAULT_COUNT = 20
MAX_COUNT = 1000
FIGURES = "mgmt.delayed_figures"
LIST = "mgmt.delayed_list"
DELETE = "mgmt.delayed_delete"


# -- what the log's leader answers (here, or asked over a link) -------------------------------


def _led_store(broker: Any, vhost: str, name: str) -> Any:
    """The store of the exchange's log if this node leads it, else None."""
    found = broker.vhosts.get(vhost)
    exchange = found.exchanges.get(name) if found is not None else None
    store = getattr(exchange, "store", None) if exchange is not None else None
    return store if store is not None and store.leading else None


def held_messages(broker: Any, vhost: str, name: str, count: int,
                  encoding: str) -> list[dict[str, Any]] | None:
    """The first `count` held messages in due order; None if this node does not lead the
    exchange's log."""
    store = _led_store(broker, vhost, name)
    if store is None:
        return None
    items = []
    for offset, due, message in store.first(count):
        view = message_view(SimpleNamespace(message=message, redelivered=False), encoding)
        del view["redelivered"]
        items.append({"id": offset, "due_ms": due, **view})
    return items


def drop_held(broker: Any, vhost: str, name: str, ident: int) -> bool | None:
    """Drop one held message: whether it was held; None if this node does not lead the
    exchange's log."""
    store = _led_store(broker, vhost, name)
    return None if store is None else bool(store.delete(ident))


def figures(broker: Any, vhost: str, name: str) -> dict[str, Any] | None:
    """The exchange's figures if this node leads its log, else None."""
    found = broker.vhosts.get(vhost)
    exchange = found.exchanges.get(name) if found is not None else None
    info: dict[str, Any] = exchange.held_info() if exchange is not None else {}
    return info or None


def install(broker: Any, handlers: Any) -> None:
    """Answer other nodes' requests about the delayed logs this node leads
    (cluster_views.install, before the links start)."""

    def fields(body: object) -> dict[str, Any]:
        return body if isinstance(body, dict) else {}

    async def answer_figures(_link: Any, body: object) -> list[dict[str, Any] | None]:
        wanted = fields(body).get("exchanges")
        return [figures(broker, str(item[0]), str(item[1])) for item in wanted or ()]

    async def answer_list(_link: Any, body: object) -> list[dict[str, Any]] | None:
        f = fields(body)
        return held_messages(broker, str(f.get("vhost")), str(f.get("name")),
                             int(f.get("count", DEFAULT_COUNT)), str(f.get("encoding", "auto")))

    async def answer_delete(_link: Any, body: object) -> bool | None:
        f = fields(body)
        return drop_held(broker, str(f.get("vhost")), str(f.get("name")), int(f.get("id", -1)))

    handlers.on_request(FIGURES, answer_figures)
    handlers.on_request(LIST, answer_list)
    handlers.on_request(DELETE, answer_delete)


# -- the HTTP API (any node) ------------------------------------------------------------------


def _delayed_exchange(vhost: Any, request: web.Request) -> Any:
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if exchange is None or not holds_delayed(exchange):
        raise not_found()
    return exchange


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{what} must be an integer") from None
    if value < 0:
        raise bad_request(f"{what} must not be negative")
    return value


def _no_leader(vhost: Any, exchange: Any) -> ApiError:
    return ApiError(503, "service_unavailable",
                    f"delayed exchange '{exchange.name}' in vhost '{vhost.name}': no leader "
                    "of its log answers (an election, or its node is down); try again")


async def list_delayed(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    exchange = _delayed_exchange(vhost, request)
    count = min(_int(request.query.get("count", str(DEFAULT_COUNT)), "count"), MAX_COUNT)
    encoding = request.query.get("encoding", "auto")
    broker = broker_of(request)
    items = await nodes_of(request).on_log_leader(
        vhost, exchange, LIST, {"count": count, "encoding": encoding},
        lambda: held_messages(broker, vhost.name, exchange.name, count, encoding))
    if items is None:
        raise _no_leader(vhost, exchange)
    return ok(items)


async def delete_delayed(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    exchange = _delayed_exchange(vhost, request)
    check("configure", "exchange", exchange.name)
    ident = _int(request.match_info["id"], "id")
    broker = broker_of(request)
    dropped = await nodes_of(request).on_log_leader(
        vhost, exchange, DELETE, {"id": ident},
        lambda: drop_held(broker, vhost.name, exchange.name, ident))
    if dropped is None:
        raise _no_leader(vhost, exchange)
    if not dropped:
        raise not_found()
    return no_content()


def setup(app: web.Application) -> None:
    app.router.add_get("/api/leveret/exchanges/{vhost}/{name}/delayed", list_delayed)
    app.router.add_delete("/api/leveret/exchanges/{vhost}/{name}/delayed/{id}", delete_delayed)
