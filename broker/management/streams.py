"""Streams over HTTP: RabbitMQ's stream management paths and Leveret's /api/leveret extras.

RabbitMQ's (rabbitmq_stream_management): PUT /api/stream/super-streams/{vhost}/{name}
({"partitions": N} or {"binding-keys": "a,b"}, plus "arguments"); the stream connections,
publishers and consumers are `stream_protocol`'s.

Leveret's (what `leveret-streams` needs and RabbitMQ's API lacks), under /api/leveret:
  GET    /super-streams[/{vhost}[/{name}]]               super streams and their partitions
  PUT    /super-streams/{vhost}/{name}                   add (as RabbitMQ's PUT)
  DELETE /super-streams/{vhost}/{name}                   delete the exchange and partitions
  GET    /streams/{vhost}/{name}/status                  stream_status rows and tracking
  PUT    /streams/{vhost}/{name}/replicas/{node}         add_replica (stream_members.py)
  DELETE /streams/{vhost}/{name}/replicas/{node}         delete_replica
  POST   /streams/{vhost}/{name}/restart                 restart_stream: {"leader": node}
  POST   /streams/{vhost}/{name}/reset-offset            {"reference": R}
  GET    /streams/{vhost}/{name}/tracking                publishers and stored offsets
  GET    /consumer-groups[/{vhost}[/{stream}/{reference}]]   single-active-consumer groups
Runs on the event loop.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from leveret.broker.access.access_store import access_store
from leveret.broker.access.admin import BadRequest
from leveret.broker.management import stream_members, stream_protocol, streamops
from leveret.broker.management.http import (
    ApiError,
    bad_request,
    body,
    broker_of,
    listing,
    no_content,
    not_found,
    ok,
    vhost_for_read,
    vhost_for_write,
    visible_vhosts,
)
from leveret.broker.model.errors import NotFound


def _vhosts(request: web.Request) -> list[Any]:
    name = request.match_info.get("vhost")
    return [vhost_for_read(request, name)] if name is not None else visible_vhosts(request)


def _stream(request: web.Request, refusal: str = "{name} is not a stream") -> Any:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    try:
        return streamops.stream_of(broker_of(request), vhost.name, request.match_info["name"],
                                   refusal)
    except NotFound as exc:
        raise ApiError(404, "not_found", exc.text) from None


# -- RabbitMQ's stream plugin paths -------------------------------------------------------------


def _partitions(data: dict[str, Any]) -> tuple[int | None, list[str] | None]:
    raw_parts = data.get("partitions")
    raw_keys = data.get("binding-keys", data.get("binding_keys"))
    if raw_parts is None and raw_keys is None:
        raise bad_request("Must specify partitions or binding keys")
    if raw_parts is not None and raw_keys is not None:
        raise bad_request("Specify partitions or binding keys, not both")
    if raw_keys is not None:
        keys = raw_keys.split(",") if isinstance(raw_keys, str) else [str(k) for k in raw_keys]
        return None, [k.strip() for k in keys if k.strip()]
    try:
        partitions = int(str(raw_parts))
    except (TypeError, ValueError):
        raise bad_request("The partitions must be a number") from None
    if partitions < 1:
        raise bad_request("The partition number must be greater than 0")
    return partitions, None


async def put_super_stream(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    name = request.match_info["name"]
    partitions, keys = _partitions(data)
    arguments = data.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be an object")
    check("configure", "exchange", name)
    # in cluster mode through etcd, each partition placed over the nodes (access_store)
    await access_store(broker_of(request)).add_super_stream(
        vhost.name, name, partitions=partitions, binding_keys=keys,
        arguments=streamops.stream_arguments(arguments))
    return web.Response(status=201)


# -- Leveret's extras ---------------------------------------------------------------------------


async def list_super_streams(request: web.Request) -> web.Response:
    return listing(request, [s for v in _vhosts(request) for s in streamops.super_streams(v)])


async def get_super_stream(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    for item in streamops.super_streams(vhost):
        if item["name"] == request.match_info["name"]:
            return ok(item)
    raise not_found()


async def delete_super_stream(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    name = request.match_info["name"]
    check("configure", "exchange", name)
    try:
        await access_store(broker_of(request)).delete_super_stream(vhost.name, name)
    except NotFound as exc:
        raise ApiError(404, "not_found", exc.text) from None
    return no_content()


async def stream_status(request: web.Request) -> web.Response:
    stream = _stream(request, "Cannot get stream status of {what}")
    return ok(await stream_members.status(broker_of(request), stream))  # from any node


async def restart_stream(request: web.Request) -> web.Response:
    _vhost, check = vhost_for_write(request, request.match_info["vhost"])
    stream = _stream(request, "Cannot restart {what}: only streams can be restarted")
    check("configure", "queue", stream.name)
    return ok({"leader": streamops.restart(stream, broker_of(request).config.node_name)})


async def reset_offset(request: web.Request) -> web.Response:
    vhost, check = vhost_for_write(request, request.match_info["vhost"])
    data = await body(request)
    reference = data.get("reference")
    if not isinstance(reference, str) or not reference:
        raise bad_request("reference is missing")
    check("read", "queue", request.match_info["name"])
    try:
        streamops.reset_offset(broker_of(request), vhost.name, request.match_info["name"],
                               reference)
    except NotFound as exc:
        raise ApiError(404, "not_found", exc.text) from None
    except BadRequest as exc:
        raise bad_request(exc.text) from None
    return no_content()


async def stream_tracking(request: web.Request) -> web.Response:
    stream = _stream(request, "Cannot list the tracking of {what}")
    return ok({"publishers": streamops.publishers(stream),
               "consumers": streamops.stored_offsets(stream)})


async def consumer_groups(request: web.Request) -> web.Response:
    return listing(request, [g for v in _vhosts(request) for s in streamops.streams(v)
                             for g in streamops.groups(s)])


async def consumer_group(request: web.Request) -> web.Response:
    vhost = vhost_for_read(request, request.match_info["vhost"])
    stream = vhost.queues.get(request.match_info["stream"])
    if stream is not None and stream.type == "stream":
        for group in streamops.groups(stream):
            if group["reference"] == request.match_info["reference"]:
                return ok(group)
    raise ApiError(404, "not_found", "The group does not exist")


def setup(app: web.Application) -> None:
    r = app.router
    r.add_put("/api/stream/super-streams/{vhost}/{name}", put_super_stream)
    stream_protocol.setup(app)  # connections, publishers, consumers
    stream_members.setup(app)  # add_replica, delete_replica: PUT/DELETE .../replicas/{node}
    base = "/api/leveret"
    r.add_get(base + "/super-streams", list_super_streams)
    r.add_get(base + "/super-streams/{vhost}", list_super_streams)
    r.add_get(base + "/super-streams/{vhost}/{name}", get_super_stream)
    r.add_put(base + "/super-streams/{vhost}/{name}", put_super_stream)
    r.add_delete(base + "/super-streams/{vhost}/{name}", delete_super_stream)
    r.add_get(base + "/streams/{vhost}/{name}/status", stream_status)
    r.add_post(base + "/streams/{vhost}/{name}/restart", restart_stream)
    r.add_post(base + "/streams/{vhost}/{name}/reset-offset", reset_offset)
    r.add_get(base + "/streams/{vhost}/{name}/tracking", stream_tracking)
    r.add_get(base + "/consumer-groups", consumer_groups)
    r.add_get(base + "/consumer-groups/{vhost}", consumer_groups)
    r.add_get(base + "/consumer-groups/{vhost}/{stream}/{reference}", consumer_group)
