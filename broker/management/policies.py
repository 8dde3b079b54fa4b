"""Policies: /api/policies[/{vhost}[/{name}]].

Listing needs visibility of the vhost; setting and clearing need the policymaker or
administrator tag and a permission on the vhost, as in RabbitMQ. A stream re-reads its
max-age and max-length-bytes when policies change (the vhost tells its queues).
Runtime parameters, operator policies, vhost limits and topic permissions are not supported:
their listings are empty. Writes go through `access_store` (etcd in cluster mode).
Runs on the event loop.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

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
    require_policymaker,
    vhost_for_read,
    vhost_for_write,
    visible_vhosts,
)


def _policies(request: web.Request, vhost: str | None = None) -> list[dict[str, Any]]:
    return [
        views.policy_view(v.name, policy)
        for v in visible_vhosts(request)
        if vhost is None or v.name == vhost
        for policy in v.policies.values()
    ]


async def list_policies(request: web.Request) -> web.Response:
    return listing(request, _policies(request))


async def list_vhost_policies(request: web.Request) -> web.Response:
    name = request.match_info["vhost"]
    vhost_for_read(request, name)
    return listing(request, _policies(request, name))


async def get_policy(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    policy = vhost.policies.get(request.match_info["name"])
    if policy is None:
        raise not_found()
    return ok(views.policy_view(vhost.name, policy))


async def put_policy(request: web.Request) -> web.Response:
    require_policymaker(request)
    vhost, _check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    created = await access_store(broker_of(request)).set_policy(
        vhost.name,
        request.match_info["name"],
        pattern=data.get("pattern"),
        definition=data.get("definition"),
        priority=data.get("priority", 0),
        apply_to=data.get("apply-to", "all"),
    )
    return created_or_updated(created)


async def delete_policy(request: web.Request) -> web.Response:
    require_policymaker(request)
    vhost, _check = vhost_for_write(request, request.match_info["vhost"])
    if request.match_info["name"] not in vhost.policies:
        raise not_found()
    await access_store(broker_of(request)).clear_policy(vhost.name, request.match_info["name"])
    return no_content()


async def nothing(request: web.Request) -> web.Response:
    """What Leveret does not support lists as empty, so that list tools work."""
    return listing(request, [])


def setup(app: web.Application) -> None:
    r = app.router
    for path in ("/api/parameters", "/api/global-parameters", "/api/operator-policies",
                 "/api/vhost-limits", "/api/topic-permissions"):
        r.add_get(path, nothing)
    r.add_get("/api/policies", list_policies)
    r.add_get("/api/policies/{vhost}", list_vhost_policies)
    r.add_get("/api/policies/{vhost}/{name}", get_policy)
    r.add_put("/api/policies/{vhost}/{name}", put_policy)
    r.add_delete("/api/policies/{vhost}/{name}", delete_policy)
