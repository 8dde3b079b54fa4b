"""The broker's state: configuration, users, vhosts and live connections.

Broker is what every Session shares. It creates the default vhost and user from the config,
answers connection-level questions (server properties, limits) and cleans up after a
connection (its exclusive queues). It does no network I/O itself; `server` runs it.
"""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker import logs
from leveret.broker.auth import Permission, Users
from leveret.broker.config import Config
from leveret.broker.model.vhost import VHost

if TYPE_CHECKING:
    from leveret.broker.session.connection import Session

VERSION = "0.1.0"
log = logs.get("leveret.broker")


class AsyncioScheduler:
    """The model's clock and timers, on the running asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_later(delay_ms / 1000, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)


class Broker:
    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.scheduler = AsyncioScheduler(self.loop)
        self.users = Users()
        self.vhosts: dict[str, VHost] = {}
        self.connections: set[Session] = set()
        self.login_failures = 0
        self.started_at = time.time()
        self.add_vhost(config.default_vhost)
        if config.default_user:
            self.users.add(config.default_user, config.default_pass, tags=["administrator"])
            self.users.set_permissions(config.default_user, config.default_vhost, Permission())

    def add_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = VHost(name, self.scheduler)
            self.vhosts[name] = vhost
        return vhost

    def server_properties(self) -> dict[str, Any]:
        return {
            "product": "Leveret",
            "version": VERSION,
            "platform": f"Python {platform.python_version()}",
            "copyright": "Leveret contributors",
            "information": "An AMQP 0.9.1 broker in Python; see the README",
            "cluster_name": f"leveret@{platform.node()}",
            "capabilities": {
                "publisher_confirms": True,
                "exchange_exchange_bindings": True,
                "basic.nack": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "consumer_priorities": True,
                "authentication_failure_close": True,
                "per_consumer_qos": True,
                "direct_reply_to": False,
            },
        }

    def connection_opened(self, session: Session) -> None:
        self.connections.add(session)

    def connection_closed(self, session: Session) -> None:
        self.connections.discard(session)
        for vhost in self.vhosts.values():
            owned = [q for q in vhost.queues.values() if q.exclusive_owner is session]
            for queue in owned:
                vhost.delete_queue(queue)

    def too_many_connections(self, session: Session) -> bool:
        limit = self.config.max_connections
        return bool(limit) and len(self.connections) > limit

    def login_failed(self) -> None:
        self.login_failures += 1
