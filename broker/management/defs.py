"""Definitions over HTTP: GET and POST /api/definitions and /api/definitions/{vhost}.

GET exports in RabbitMQ's format (`?download=<file>` adds a Content-Disposition header, as
RabbitMQ's UI asks); POST imports a document, or a `file` field of a multipart form. Both are
for administrators. Unlike the API's other changes, which take a JSON body whatever its content
type, an import must say `application/json` or `multipart/form-data`, or gets 415, as
RabbitMQ's definitions endpoint answers. In cluster mode an import goes through etcd (etcd
unreachable: 503). Runs on the event loop.
"""

from __future__ import annotations

import json

from aiohttp import web

from leveret.broker.access import definitions
from leveret.broker.management.http import (
    ApiError,
    bad_request,
    broker_of,
    no_content,
    not_found,
    require_admin,
)


def _export(request: web.Request, data: object) -> web.Response:
    headers = {}
    download = request.query.get("download")
    if download:
        headers["Content-Disposition"] = f'attachment; filename="{download}"'
    return web.json_response(data, headers=headers)


async def get_all(request: web.Request) -> web.Response:
    require_admin(request)
    return _export(request, definitions.export_all(broker_of(request)))


async def get_vhost(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["vhost"]
    if name not in broker_of(request).vhosts:
        raise not_found()
    return _export(request, definitions.export_vhost(broker_of(request), name))


async def _document(request: web.Request) -> object:
    # aiohttp reads a request without Content-Type as application/octet-stream: refused too
    if request.content_type not in ("application/json", "multipart/form-data"):
        raise ApiError(415, "unsupported_media_type",
                       "definitions are imported as Content-Type: application/json, or as the "
                       "file field of a multipart/form-data upload")
    if request.content_type == "multipart/form-data":
        form = await request.post()
        field = form.get("file")
        raw = field.file.read() if isinstance(field, web.FileField) else str(field or "").encode()
    else:
        raw = await request.read()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"failed to decode JSON: {exc}") from None


async def post(request: web.Request) -> web.Response:
    require_admin(request)
    vhost = request.match_info.get("vhost")
    if vhost is not None and vhost not in broker_of(request).vhosts:
        raise not_found()
    document = await _document(request)
    try:
        await definitions.import_definitions(broker_of(request), document, vhost)
    except definitions.DefinitionsError as exc:
        raise bad_request(str(exc)) from None
    return no_content()


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/definitions", get_all)
    r.add_post("/api/definitions", post)
    r.add_get("/api/definitions/{vhost}", get_vhost)
    r.add_post("/api/definitions/{vhost}", post)
