"""Cross-site request forgery guard of the management API's state-changing requests.

A browser that once logged in to the API through its own basic-auth dialog sends those
credentials with any later request to the same host, even one a page on another site makes. A
page on another site can only make a "simple" request without the server's consent (CORS,
which this server never grants): a form or a no-cors fetch, methods GET or POST, content type
`application/x-www-form-urlencoded`, `multipart/form-data`, `text/plain`, or none. So a
POST, PUT, DELETE or PATCH under `/api/` is refused:

- 415 `unsupported_media_type` when it carries a body whose type is not `application/json`
  (or no type), or any of those three form types, as RabbitMQ's API (cowboy_rest) refuses a
  non-JSON body: rabbitmqadmin, curl with `-H content-type:application/json` and the web UI
  are unaffected;
- 403 `forbidden` when the browser says it comes from another site (`Sec-Fetch-Site:
  cross-site` or `same-site`, or, from a browser that sends no `Sec-Fetch-Site`, an `Origin`
  that is not this server's). Clients that are not browsers send neither header.

Knows HTTP only. Runs on the broker's event loop, before authentication.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from leveret.broker.management.http import ApiError

CHANGES = frozenset({"POST", "PUT", "DELETE", "PATCH"})
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data",
                        "text/plain"})


def _cross_site(request: web.Request) -> bool:
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("cross-site", "same-site")
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower()


def check(request: web.Request) -> None:
    """Raise the API error that refuses `request`, if it is a change a forged page could
    make."""
    if request.method not in CHANGES or not request.path.startswith("/api/"):
        return
    if _cross_site(request):
        raise ApiError(403, "forbidden", "cross-site requests may not change the broker")
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    mime = request.content_type if declared is not None else None
    if mime in FORM_TYPES or (request.body_exists and mime != "application/json"):
        raise ApiError(415, "unsupported_media_type",
                       "a request that changes the broker must send its body as "
                       "Content-Type: application/json")


@web.middleware
async def guard(request: web.Request,
                handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    check(request)
    return await handler(request)
