"""Running the broker: the listener, signal handling and an orderly shutdown.

`run(config)` starts the AMQP listener on the configured host and port, logs one line when it
listens, and on SIGINT or SIGTERM stops accepting, closes every connection with 320
CONNECTION_FORCED, flushes what must reach the disk, and returns 0. A port that is taken
raises ServerError with one clear sentence.
"""

from __future__ import annotations

import asyncio
import errno
import signal
from collections.abc import Awaitable, Callable

from leveret.broker import logs
from leveret.broker.broker import Broker
from leveret.broker.config import Config
from leveret.broker.session.connection import Session

log = logs.get("leveret.server")


class ServerError(Exception):
    """The broker cannot start; the message is one line for the operator."""


class Server:
    """A started broker: its listeners and state, stoppable from the same loop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.broker: Broker | None = None
        self.listeners: list[asyncio.Server] = []
        self.stopped = asyncio.Event()
        self.on_stop: list[Callable[[], Awaitable[None]]] = []

    @property
    def port(self) -> int:
        sock = self.listeners[0].sockets[0]
        return int(sock.getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(
                f"cannot create data directory {config.data_dir}: {exc.strerror}"
            ) from None
        self.broker = Broker(config, loop)
        broker = self.broker
        try:
            server = await loop.create_server(
                lambda: Session(broker),
                config.host,
                config.port,
                reuse_address=True,
                backlog=4096,
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServerError(
                    f"port {config.port} on {config.host} is already in use; "
                    "stop the other broker or pass --port"
                ) from None
            raise ServerError(
                f"cannot listen on {config.host}:{config.port}: {exc.strerror}"
            ) from None
        self.listeners.append(server)
        log.info("listening", host=config.host, port=self.port, data_dir=str(config.data_dir))

    async def stop(self) -> None:
        """Stop accepting, close connections with 320, flush, and finish."""
        if self.stopped.is_set():
            return
        for listener in self.listeners:
            listener.close()
        broker = self.broker
        if broker is not None:
            for session in list(broker.connections):
                session.force_close()
            deadline = asyncio.get_running_loop().time() + 2.0
            while broker.connections and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            for session in list(broker.connections):
                session.abort()
        for callback in self.on_stop:
            await callback()
        for listener in self.listeners:
            await listener.wait_closed()
        self.stopped.set()
        log.info("stopped")


async def serve(config: Config) -> int:
    """Run until SIGINT or SIGTERM; returns the process exit code."""
    server = Server(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    return 0
