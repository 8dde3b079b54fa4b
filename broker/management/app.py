"""The management HTTP server: an aiohttp Application on the broker's own event loop.

`create_app(broker)` builds the application: basic authentication (users tagged
administrator, monitoring, policymaker or management may log in, as in RabbitMQ; the loopback
users only from localhost), RabbitMQ's error bodies, and the routes of every resource module.
`/metrics` (Prometheus) and the web UI's static pages (`ui`, at `/` and `/ui/`) need no
login; `csrf` refuses the state changes a cross-site page could send; one trailing slash in a
path is ignored, as RabbitMQ ignores it (`trailing_slash`). `ManagementServer`
starts and stops the listener: on the default host `::`, one socket for IPv4 and IPv6, as the
AMQP listener (see `listen`).

Every handler runs on the broker's event loop thread and calls the model directly: no locks,
no threads. The only broad `except` here turns an unexpected error into a 500 for that one
request; the broker carries on.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from leveret.broker.access.admin import MANAGEMENT_TAGS
from leveret.broker.access.auth import Permission, User
from leveret.broker.management import (
    access,
    csrf,
    defs,
    delayed,
    live,
    local_token,
    metrics,
    nodes,
    overview,
    policies,
    quorum_queues,
    rates,
    stream_messages,
    streams,
    topology,
    trailing_slash,
    ui,
)
from leveret.broker.management.cluster_views import ClusterNodes
from leveret.broker.management.http import (
    AMQP_HOST,
    AMQP_PORT,
    BROKER,
    CLI_TOKEN,
    CURRENT_USER,
    HTTP_HOST,
    ApiError,
    from_domain,
    not_authorised,
)
from leveret.broker.model.errors import BrokerError
from leveret.broker.process import listen, logs

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

log = logs.get("leveret.management")
PUBLIC_PATHS = ("/metrics", "/metrics/per-object")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host == "localhost"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def authenticate(broker: Broker, request: web.Request) -> User:
    header = request.headers.get("Authorization", "")
    if local_token.matches(header, request.app.get(CLI_TOKEN)) and _loopback(request.remote):
        # the operator tools on the node's machine (local_token): an administrator everywhere
        return User(local_token.USER, "", ["administrator"],
                    {name: Permission() for name in broker.vhosts})
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise not_authorised("Login failed")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise not_authorised("Login failed") from None
    name, _, password = decoded.partition(":")
    user = broker.users.authenticate(name, password)
    if user is None:
        broker.login_failed()
        raise not_authorised("Login failed")
    if name in broker.config.loopback_users and not _loopback(request.remote):
        raise not_authorised("User can only log in via localhost")
    if not any(tag in MANAGEMENT_TAGS for tag in user.tags):
        raise not_authorised("Not management user")
    return user


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except BrokerError as error:
        return from_domain(error).response()
    except web.HTTPNotFound:
        return ApiError(404, "Object Not Found", "Not Found").response()
    except web.HTTPMethodNotAllowed as exc:
        return web.json_response(
            {"error": "Method Not Allowed", "reason": f"{request.method} is not allowed here"},
            status=405,
            headers={"Allow": ", ".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("management request failed", method=request.method, path=request.path)
        return ApiError(500, "internal_server_error", str(exc) or type(exc).__name__).response()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path not in PUBLIC_PATHS and not ui.is_public(request.path):
        CURRENT_USER.set(authenticate(request.app[BROKER], request))
    return await handler(request)


def create_app(broker: Broker, amqp_port: int | None = None, amqp_host: str | None = None,
               http_host: str | None = None, cli_token: str | None = None) -> web.Application:
    app = web.Application(middlewares=[ui.quiet_401, errors_middleware, csrf.guard,
                                       auth_middleware, rates.fill, trailing_slash.retry],
                          client_max_size=64 * 1024 * 1024)
    config = broker.config
    app[BROKER] = broker
    if cli_token is not None:
        app[CLI_TOKEN] = cli_token
    app[AMQP_PORT] = amqp_port if amqp_port is not None else config.port
    app[AMQP_HOST] = amqp_host if amqp_host is not None else config.host
    app[HTTP_HOST] = http_host if http_host is not None else config.management_host or config.host
    # the one place the API asks which mode it runs in: the views call the port (nodes.py)
    app[nodes.NODES] = (nodes.OneNodeView(config.node_name) if broker.cluster is None
                        else ClusterNodes(broker, broker.cluster))
    for module in (overview, access, policies, topology, live, defs, streams, stream_messages,
                   quorum_queues, delayed, metrics, ui, rates):
        module.setup(app)
    return app


class ManagementServer:
    """The management API's listener on the broker's loop."""

    def __init__(self, broker: Broker, host: str, port: int, amqp_port: int | None = None,
                 amqp_host: str | None = None, cli_token: str | None = None) -> None:
        self.broker = broker
        self.cli_token = cli_token
        self.amqp_port = amqp_port
        self.amqp_host = amqp_host
        self.host = host
        self.address = host  # where it is bound: `0.0.0.0` when `::` fell back to IPv4
        self.requested_port = port
        self.runner: web.AppRunner | None = None
        self.site: web.BaseSite | None = None

    async def start(self) -> None:
        sock = listen.socket_for(self.host, self.requested_port)
        self.address = listen.address_of(self.host, sock)
        self.runner = web.AppRunner(
            create_app(self.broker, self.amqp_port, self.amqp_host, self.address,
                       self.cli_token),
            access_log=None, handle_signals=False,
        )
        await self.runner.setup()
        if sock is None:
            self.site = web.TCPSite(self.runner, self.host, self.requested_port,
                                    reuse_address=True)
        else:
            self.site = web.SockSite(self.runner, sock)
        try:
            await self.site.start()
        except OSError:
            await self.runner.cleanup()
            self.runner = None
            if sock is not None:
                sock.close()
            raise
        log.info("management API listening", host=self.address, port=self.port)

    @property
    def port(self) -> int:
        server = self.site._server if self.site is not None else None
        sockets = getattr(server, "sockets", None)
        if sockets:
            return int(sockets[0].getsockname()[1])
        return self.requested_port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
