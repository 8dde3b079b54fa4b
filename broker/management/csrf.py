"""Cross-site request forgery guard of the management API's state-changing requests.

A browser that once logged in to the API through its own basic-auth dialog sends those
credentials with any later request to the same host, even one that a page on another site
makes. Without the server's consent (CORS, which this server never grants) such a page can only
make a "simple" request: GET, HEAD or POST, with a form content type or none, from a form or a
no-cors fetch. A PUT, DELETE or PATCH, or a request with another content type or a header of
its own, needs a CORS preflight, which this server never answers with consent, so the browser
never sends it; a GET changes nothing. A forged change is therefore a POST, and browsers say
where a POST comes from: `Origin` with every POST (the Fetch standard; `null` from an opaque
origin or under a referrer policy that hides it), and `Sec-Fetch-Site` too over HTTPS or to
localhost. A POST, PUT, DELETE or PATCH under `/api/` is refused with 403 `forbidden` when the
browser says it comes from another site: `Sec-Fetch-Site: cross-site` or `same-site`, or, with
no `Sec-Fetch-Site`, an `Origin` that is not this server's. Clients that are not browsers (curl,
rabbitmqadmin, scripts) send neither header, and may send their JSON with any content type, as
RabbitMQ's API allows (docs/MANAGEMENT.md says what this leaves out).

Knows HTTP only. Runs on the broker's event loop, before authentication.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from leveret.broker.management.http import ApiError

CHANGES = frozenset({"POST", "PUT", "DELETE", "PATCH"})


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


@web.middleware
async def guard(request: web.Request,
                handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    check(request)
    return await handler(request)
