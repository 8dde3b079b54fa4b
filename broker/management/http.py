"""HTTP plumbing of the management API: errors, JSON bodies, access checks, list queries.

RabbitMQ's conventions: 201 for a PUT that creates, 204 for one that updates and for DELETE,
404 {"error": "Object Not Found", "reason": "Not Found"}, 400 {"error": "bad_request",
"reason": ...}, 401 {"error": "not_authorised", ...} with a WWW-Authenticate header, 503
{"error": "service_unavailable", ...} for a change while etcd is unreachable (cluster mode).
Lists honour `columns`, `sort`, `sort_reverse`, `name` (+ `use_regex`) and `page`/`page_size`.

Runs on the broker's event loop thread, inside aiohttp handlers.
"""

from __future__ import annotations

import contextvars
import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.access.access_store import TopologyUnavailable
from leveret.broker.access.admin import BadRequest, authorizer
from leveret.broker.model import errors as e

if TYPE_CHECKING:
    from leveret.broker.access.auth import User
    from leveret.broker.broker import Broker
    from leveret.broker.model.vhost import Authorize, VHost

REALM = 'Basic realm="RabbitMQ Management"'
BROKER: web.AppKey[Broker] = web.AppKey("broker")
AMQP_PORT: web.AppKey[int] = web.AppKey("amqp-port")
# the addresses the AMQP and HTTP listeners are bound to, for /api/overview's listeners:
# `::` for the default dual-stack listener, as RabbitMQ reports it
AMQP_HOST: web.AppKey[str] = web.AppKey("amqp-host")
HTTP_HOST: web.AppKey[str] = web.AppKey("http-host")
# the operator tools' local credential (local_token), when the node wrote one
CLI_TOKEN: web.AppKey[str] = web.AppKey("cli-token")
# The logged-in user of the request being handled: each request runs in its own task, so the
# authentication middleware's value is what that request's handler sees.
CURRENT_USER: contextvars.ContextVar[User] = contextvars.ContextVar("management_user")


class ApiError(Exception):
    """An HTTP error answer with RabbitMQ's JSON body."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason

    def response(self) -> web.Response:
        headers = {"WWW-Authenticate": REALM} if self.status == 401 else None
        return web.json_response(
            {"error": self.error, "reason": self.reason}, status=self.status, headers=headers
        )


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_authorised(reason: str) -> ApiError:
    return ApiError(401, "not_authorised", reason)


def from_domain(error: e.BrokerError) -> ApiError:
    """The model's domain errors as the management API reports them; a change the cluster's
    store (etcd) cannot take now is a 503, as RabbitMQ answers when its metadata store is
    unavailable."""
    if isinstance(error, TopologyUnavailable):
        return ApiError(503, "service_unavailable", error.text)
    if isinstance(error, e.NotFound):
        return ApiError(404, "not_found", error.text)
    if isinstance(error, e.AccessRefused):
        return not_authorised(error.text)
    if isinstance(error, BadRequest | e.PreconditionFailed | e.CommandInvalid | e.NotAllowed
                  | e.NotImplementedFeature | e.ResourceLocked):
        return bad_request(error.text)
    return ApiError(500, "internal_server_error", error.text)


# -- responses and bodies ---------------------------------------------------------------------


def ok(data: Any) -> web.Response:
    return web.json_response(data, dumps=lambda d: json.dumps(d, ensure_ascii=False))


def created_or_updated(created: bool) -> web.Response:
    return web.Response(status=201 if created else 204)


def no_content() -> web.Response:
    return web.Response(status=204)


async def body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; an empty body is {}."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


# -- who may do what --------------------------------------------------------------------------


def broker_of(request: web.Request) -> Broker:
    return request.app[BROKER]


def user_of(request: web.Request) -> User:
    return CURRENT_USER.get()


def is_admin(user: User) -> bool:
    return "administrator" in user.tags


def sees_everything(user: User) -> bool:
    """Administrators and monitoring users see every vhost's objects, as in RabbitMQ."""
    return is_admin(user) or "monitoring" in user.tags


def require_admin(request: web.Request) -> None:
    if not is_admin(user_of(request)):
        raise not_authorised("Not administrator user")


def require_policymaker(request: web.Request) -> None:
    user = user_of(request)
    if not (is_admin(user) or "policymaker" in user.tags):
        raise not_authorised("Not policymaker user")


def visible(request: web.Request, vhost: str) -> bool:
    user = user_of(request)
    return sees_everything(user) or vhost in user.permissions


def visible_vhosts(request: web.Request) -> list[VHost]:
    return [v for v in broker_of(request).vhosts.values() if visible(request, v.name)]


def vhost_for_read(request: web.Request, name: str) -> VHost:
    vhost = broker_of(request).vhosts.get(name)
    if vhost is None:
        raise not_found()
    if not visible(request, name):
        raise not_authorised("User not authorised to access virtual host")
    return vhost


def vhost_for_write(request: web.Request, name: str) -> tuple[VHost, Authorize]:
    """The vhost and the user's permission check on it; writes need a permission entry,
    administrators included, as RabbitMQ's is_authorized_vhost."""
    vhost = broker_of(request).vhosts.get(name)
    if vhost is None:
        raise ApiError(404, "not_found", "vhost_not_found")
    user = user_of(request)
    if name not in user.permissions:
        raise not_authorised("User not authorised to access virtual host")
    return vhost, authorizer(user, name)


def exchange_name(raw: str) -> str:
    """`amq.default` in a URL is the default exchange, whose name is ""."""
    return "" if raw == "amq.default" else raw


# -- list queries -----------------------------------------------------------------------------


def _pick(item: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in columns:
        path = column.split(".")
        value: Any = item
        for part in path:
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            target = out
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
    return out


def _sort_key(item: dict[str, Any], path: list[str]) -> tuple[int, Any]:
    value: Any = item
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return (0, "")
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def listing(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    """A list answer, filtered, sorted, paged and cut to columns as the request asks."""
    query = request.query
    total = len(items)
    name = query.get("name")
    if name:
        if query.get("use_regex") == "true":
            try:
                pattern = re.compile(name)
            except re.error as exc:
                raise bad_request(f"invalid regular expression: {exc}") from None
            items = [i for i in items if pattern.search(str(i.get("name", "")))]
        else:
            items = [i for i in items if name in str(i.get("name", ""))]
    sort = query.get("sort")
    if sort:
        path = sort.split(".")
        items = sorted(items, key=lambda i: _sort_key(i, path))
    if query.get("sort_reverse") == "true":
        items = list(reversed(items))
    columns = [c for c in query.get("columns", "").split(",") if c]
    if columns:
        items = [_pick(i, columns) for i in items]
    page = query.get("page")
    if page is None:
        return ok(items)
    try:
        number, size = int(page), int(query.get("page_size", "100"))
    except ValueError:
        raise bad_request("page and page_size must be numbers") from None
    if number < 1 or not 1 <= size <= 500:
        raise bad_request("page must be >= 1 and page_size between 1 and 500")
    filtered = len(items)
    return ok({
        "filtered_count": filtered,
        "item_count": len(items[(number - 1) * size:number * size]),
        "items": items[(number - 1) * size:number * size],
        "page": number,
        "page_count": max(1, -(-filtered // size)),
        "page_size": size,
        "total_count": total,
    })


def single(request: web.Request, item: dict[str, Any]) -> web.Response:
    """One object, cut to the `columns` the request asks for (rabbitmqadmin's `show`)."""
    columns = [c for c in request.query.get("columns", "").split(",") if c]
    return ok(_pick(item, columns) if columns else item)
