"""The management web UI: static pages served by the management listener at `/`.

`setup(app)` serves `static/index.html` at `/` and the rest of `static/` (the UI's own
modules and stylesheet, and the vendored Preact, htm and uPlot with their licences) under
`/ui/`. These paths need no login (`is_public`): they hold no data. Every datum comes from
`/api`, fetched by the page with the user's basic credentials (kept in the tab's
sessionStorage) and the `X-Requested-With: leveret-ui` header; `quiet_401` answers such a
request's 401 without `WWW-Authenticate`, so the browser shows the UI's login page instead of
its own dialog (whose cached credentials a forged cross-site request could reuse).

Knows HTTP and its own files only: the pages use the API and nothing else of the broker.
Runs on the broker's event loop thread.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).resolve().parent / "static"
POLICY: web.AppKey[str] = web.AppKey("ui-policy")
UI_HEADER = "X-Requested-With"
UI_VALUE = "leveret-ui"
PREFIX = "/ui/"


def _policy() -> str:
    """The page's Content-Security-Policy: scripts from this server only, plus the inline
    import map of index.html (allowed by its hash)."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    found = re.search(r'<script type="importmap">(.*?)</script>', page, re.S)
    digest = hashlib.sha256(found.group(1).encode() if found else b"").digest()
    import_map = f"'sha256-{base64.b64encode(digest).decode()}'"
    return (f"default-src 'self'; script-src 'self' {import_map}; img-src 'self' data:; "
            "style-src 'self' 'unsafe-inline'; object-src 'none'; "
            "base-uri 'none'; frame-ancestors 'none'; form-action 'none'")


HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


def is_public(path: str) -> bool:
    return path == "/" or path.startswith(PREFIX)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html",
                            headers={**HEADERS, "Content-Security-Policy": request.app[POLICY]})


@web.middleware
async def quiet_401(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
    response = await handler(request)
    if response.status == 401 and request.headers.get(UI_HEADER) == UI_VALUE:
        response.headers.popall("WWW-Authenticate", None)
    return response


def setup(app: web.Application) -> None:
    app[POLICY] = _policy()
    app.router.add_get("/", index)
    app.router.add_static(PREFIX, STATIC, append_version=False)
