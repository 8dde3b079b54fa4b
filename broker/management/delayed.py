"""A delayed exchange's held messages: /api/leveret/exchanges/{vhost}/{name}/delayed.

GET lists the first `count` (default 20, at most 1000) held messages in due order, each with
its `id` (its offset in the exchange's log), `due_ms` and the message as published (the
fields of messages.message_view); DELETE .../delayed/{id} drops one (204; 404 if the exchange
holds no such message). Reading needs the vhost's read access, deleting configure permission
on the exchange. The counts (`messages_delayed`, `next_due_ms`, `delayed_routed`,
`delayed_unroutable`) are in the exchange's own view (views.exchange_view).

Knows the exchange's `store` (delayed_store.py) through the model; not AMQP or the storage
engine. Runs on the event loop.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web

from leveret.broker.management.http import (
    bad_request,
    exchange_name,
    no_content,
    not_found,
    ok,
    vhost_for_read,
    vhost_for_write,
)
from leveret.broker.management.messages import message_view

DEFAULT_COUNT = 20
MAX_COUNT = 1000


def _store(vhost: Any, request: web.Request) -> Any:
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    store = getattr(exchange, "store", None) if exchange is not None else None
    if store is None:
        raise not_found()
    return store


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{what} must be an integer") from None
    if value < 0:
        raise bad_request(f"{what} must not be negative")
    return value


async def list_delayed(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    store = _store(vhost, request)
    count = min(_int(request.query.get("count", str(DEFAULT_COUNT)), "count"), MAX_COUNT)
    encoding = request.query.get("encoding", "auto")
    items = []
    for offset, due, message in store.first(count):
        view = message_view(SimpleNamespace(message=message, redelivered=False), encoding)
        del view["redelivered"]
        items.append({"id": offset, "due_ms": due, **view})
    return ok(items)


async def delete_delayed(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    store = _store(vhost, request)
    check("configure", "exchange", exchange_name(request.match_info["name"]))
    if not store.delete(_int(request.match_info["id"], "id")):
        raise not_found()
    return no_content()


def setup(app: web.Application) -> None:
    app.router.add_get("/api/leveret/exchanges/{vhost}/{name}/delayed", list_delayed)
    app.router.add_delete("/api/leveret/exchanges/{vhost}/{name}/delayed/{id}", delete_delayed)
