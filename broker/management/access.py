"""Vhosts, users and permissions: /api/vhosts, /api/users, /api/permissions.

Listing vhosts shows a management user the vhosts it has permissions in; everything else here
is for administrators, as in RabbitMQ. Writes go through `access_store` (SQLite on a single
node; etcd in cluster mode, applied on every node before the answer, 503 when etcd cannot be
reached); reads come from this node's copy. Runs on the event loop.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.access import admin
from leveret.broker.access.access_store import access_store
from leveret.broker.management import views
from leveret.broker.management.http import (
    body,
    broker_of,
    created_or_updated,
    listing,
    no_content,
    not_found,
    ok,
    require_admin,
    user_of,
    vhost_for_read,
    visible,
)
from leveret.broker.management.nodes import nodes_of
from leveret.broker.model import default_type

# -- vhosts -----------------------------------------------------------------------------------


def _vhost_views(request: web.Request, names: list[str] | None = None) -> list[dict[str, Any]]:
    broker = broker_of(request)
    meta = access_store(broker).vhost_metadata()
    running = nodes_of(request).running_nodes()
    return [
        views.vhost_view(vhost, *meta.get(vhost.name, ("", [])), running)
        for vhost in broker.vhosts.values()
        if (names is None or vhost.name in names) and visible(request, vhost.name)
    ]


async def list_vhosts(request: web.Request) -> web.Response:
    return listing(request, _vhost_views(request))


async def get_vhost(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return ok(_vhost_views(request, [name])[0])


async def put_vhost(request: web.Request) -> web.Response:
    require_admin(request)
    data = await body(request)
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    description = data.get("description", metadata.get("description", "")) or ""
    tags = admin.parse_tags(data.get("tags", metadata.get("tags")))
    # RabbitMQ 4.3 reads default_queue_type, else 3.11's name for it (defaultqueuetype)
    queue_type = default_type.parse(data.get("default_queue_type", data.get("defaultqueuetype")),
                                    broker_of(request).queue_kinds)
    created = await access_store(broker_of(request)).put_vhost(
        request.match_info["vhost"],
        str(description),
        tags,
        acting_user=user_of(request).name,
        default_queue_type=queue_type,
    )
    return created_or_updated(created)


async def delete_vhost(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["vhost"]
    if name not in broker_of(request).vhosts:
        raise not_found()
    await access_store(broker_of(request)).delete_vhost(name)
    return no_content()


async def vhost_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return listing(request, [p for p in _permissions(request) if p["vhost"] == name])


# -- users ------------------------------------------------------------------------------------


def _user_views(request: web.Request) -> list[dict[str, Any]]:
    return [
        views.user_view(user, admin.algorithm_of(user.password_hash))
        for user in broker_of(request).users.users.values()
    ]


async def list_users(request: web.Request) -> web.Response:
    require_admin(request)
    return listing(request, _user_views(request))


async def list_users_without_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    users = broker_of(request).users.users
    return listing(request, [u for u in _user_views(request) if not users[u["name"]].permissions])


async def get_user(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["user"]
    found = [u for u in _user_views(request) if u["name"] == name]
    if not found:
        raise not_found()
    return ok(found[0])


async def put_user(request: web.Request) -> web.Response:
    require_admin(request)
    data = await body(request)
    created = await access_store(broker_of(request)).put_user(
        request.match_info["user"],
        password=data.get("password"),
        password_hash=data.get("password_hash"),
        hashing_algorithm=data.get("hashing_algorithm"),
        tags=data.get("tags"),
    )
    return created_or_updated(created)


async def delete_user(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["user"]
    if name not in broker_of(request).users.users:
        raise not_found()
    await access_store(broker_of(request)).delete_user(name)
    return no_content()


async def user_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["user"]
    if name not in broker_of(request).users.users:
        raise not_found()
    return listing(request, [p for p in _permissions(request) if p["user"] == name])


# -- permissions ------------------------------------------------------------------------------


def _permissions(request: web.Request) -> list[dict[str, Any]]:
    return [
        views.permission_view(user.name, vhost, permission)
        for user in broker_of(request).users.users.values()
        for vhost, permission in user.permissions.items()
    ]


async def list_permissions(request: web.Request) -> web.Response:
    require_admin(request)
    return listing(request, _permissions(request))


async def get_permission(request: web.Request) -> web.Response:
    require_admin(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    found = [p for p in _permissions(request) if p["vhost"] == vhost and p["user"] == user]
    if not found:
        raise not_found()
    return ok(found[0])


async def put_permission(request: web.Request) -> web.Response:
    require_admin(request)
    data = await body(request)
    created = await access_store(broker_of(request)).set_permissions(
        request.match_info["user"],
        request.match_info["vhost"],
        data.get("configure", ""),
        data.get("write", ""),
        data.get("read", ""),
    )
    return created_or_updated(created)


async def delete_permission(request: web.Request) -> web.Response:
    require_admin(request)
    broker = broker_of(request)
    user = broker.users.users.get(request.match_info["user"])
    if user is None or request.match_info["vhost"] not in user.permissions:
        raise not_found()
    await access_store(broker).clear_permissions(user.name, request.match_info["vhost"])
    return no_content()


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/vhosts", list_vhosts)
    r.add_get("/api/vhosts/{vhost}", get_vhost)
    r.add_put("/api/vhosts/{vhost}", put_vhost)
    r.add_delete("/api/vhosts/{vhost}", delete_vhost)
    r.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/without-permissions", list_users_without_permissions)
    r.add_get("/api/users/{user}", get_user)
    r.add_put("/api/users/{user}", put_user)
    r.add_delete("/api/users/{user}", delete_user)
    r.add_get("/api/users/{user}/permissions", user_permissions)
    r.add_get("/api/permissions", list_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", get_permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
