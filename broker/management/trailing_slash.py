"""One trailing slash in an API path is ignored, as RabbitMQ's management API (cowboy's
router) ignores it: `/api/stream/consumers/%2F/` answers as `/api/stream/consumers/%2F`.

cowboy splits a path into segments and drops the empty one after a final `/` (only that one),
so every route matches with or without it; the Node stream client's own tests ask for
`/api/stream/consumers/%2F/` and `/api/consumers/%2F/`. Here `retry` is the innermost
middleware: a request that no route took (404) and whose path ends with `/` is resolved again
without it, and that route's handler answers; the middlewares around it (authentication,
errors, rates) have run on the request as it came. Paths that a route takes with the slash
(the web UI's `/ui/`) are answered by that route, as before.

Knows aiohttp's routing only. Runs on the broker's event loop thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from yarl import URL

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def retry(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.rel_url.raw_path
    if (len(path) < 2 or not path.endswith("/")
            or not isinstance(request.match_info.http_exception, web.HTTPNotFound)):
        return await handler(request)
    stripped = request.clone(rel_url=URL.build(
        path=path[:-1], query_string=request.rel_url.raw_query_string, encoded=True))
    match = await request.app.router.resolve(stripped)
    if isinstance(match.http_exception, web.HTTPNotFound):
        return await handler(request)
    match.add_app(request.app)
    match.freeze()
    stripped._match_info = match  # as aiohttp's own normalize_path_middleware sets it
    return await match.handler(stripped)
