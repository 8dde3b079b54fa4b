"""A wire worker: the process that holds client sockets and moves their bytes.

`python -m leveret.broker.workers.worker DATA_FD CONTROL_FD FRAME_MAX asyncio|uvloop` is
started by the main process (pool.py), never by hand (docs/WORKERS.md). Accepted client
sockets arrive on the control socket (`ipc.take_socket`); this process reads them and passes
what the clients send to the main process on the data socket (split into frames by split.py),
and writes to each client what the main process sends back. Each
turn's output to the main process leaves in one write.

Flow control follows the sockets: the bytes a client's socket has taken are reported (WRITTEN),
so that the main process counts what is still buffered for it and pauses its deliveries as a
socket's write buffer would, and the main process's PAUSE_READING stops reading one client
(a resource alarm). When the main process reads too
slowly, every client socket stops being read until it catches up.

When the data socket closes (the main process stopped or died), the worker closes every
client socket and exits.

It must not know AMQP, sessions or the model: bytes and ids only. Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

from leveret.broker.workers import ipc
from leveret.broker.workers.split import Splitter

HIGH_WATER = 4 * 1024 * 1024  # of output waiting for the main process: stop reading clients
TAKEN_EVERY_S = 0.002  # how often a socket that holds bytes back reports what it took


class Client(asyncio.Protocol):
    """One client socket, relayed to the main process as connection `conn`."""

    __slots__ = ("conn", "full", "paused_by_main", "ready", "reported", "splitter", "timer",
                 "transport", "worker", "written_total")

    def __init__(self, worker: Worker, conn: int) -> None:
        self.worker = worker
        self.conn = conn
        self.splitter = Splitter(worker.frame_max)
        self.transport: asyncio.Transport | None = None
        self.paused_by_main = False
        self.ready = False  # the orders that came before the socket was adopted are done
        self.written_total = 0  # bytes written to the socket
        self.reported = 0  # of which the main process was told the socket took them
        self.full = False  # the socket holds bytes back
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # Told of every byte the socket cannot take at once (high 0), and when it took all:
        # the main process keeps the client's write buffer mark itself (WRITTEN).
        self.transport.set_write_buffer_limits(high=0)  # type: ignore[union-attr]
        if self.worker.reading_paused or self.paused_by_main:
            self.transport.pause_reading()  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        messages = self.splitter.feed(data)
        for kind, payload in messages:
            self.worker.send(kind, self.conn, payload)
            if len(messages) > 1:  # a big read: the main process starts on this piece now
                self.worker.flush()

    def eof_received(self) -> bool | None:
        # The client sends no more, but its replies may still be on their way from the main
        # process: keep the socket open for them; the main process closes it (as a session
        # closes its socket on EOF) behind what it wrote.
        self.worker.send(ipc.EOF, self.conn)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.worker.lost(self.conn, exc)

    def pause_writing(self) -> None:
        self.full = True
        if self.timer is None:
            self.timer = self.worker.loop.call_later(TAKEN_EVERY_S, self.poll)

    def resume_writing(self) -> None:
        self.full = False
        self.taken()

    def poll(self) -> None:
        """While the socket holds bytes back, report what it takes as it takes it, so that the
        main process's count falls below its low mark before the socket runs dry."""
        self.timer = None
        self.taken()
        if self.full and self.transport is not None and not self.transport.is_closing():
            self.timer = self.worker.loop.call_later(TAKEN_EVERY_S, self.poll)

    def taken(self) -> None:
        transport = self.transport
        left = transport.get_write_buffer_size() if transport is not None else 0
        count = self.written_total - left - self.reported
        if count > 0:
            self.reported += count
            self.worker.send(ipc.WRITTEN, self.conn, ipc.COUNT.pack(count))

    def order(self, kind: int, payload: bytes) -> None:
        """What the main process asks of this client's socket."""
        transport = self.transport
        assert transport is not None
        if kind == ipc.DATA:
            if not transport.is_closing():
                transport.write(payload)
                self.written_total += len(payload)
                self.taken()
        elif kind == ipc.CLOSE:
            transport.close()
        elif kind == ipc.ABORT:
            transport.abort()
        elif kind == ipc.PAUSE_READING:
            self.paused_by_main = True
            if not self.worker.reading_paused and not transport.is_closing():
                transport.pause_reading()
        elif kind == ipc.RESUME_READING:
            self.paused_by_main = False
            if not self.worker.reading_paused and not transport.is_closing():
                transport.resume_reading()


class MainLink(asyncio.Protocol):
    """The data socket to the main process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.decoder = ipc.Decoder()

    def data_received(self, data: bytes) -> None:
        for kind, conn, payload in self.decoder.feed(data):
            self.worker.order(kind, conn, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.done.set()

    def pause_writing(self) -> None:
        self.worker.set_reading(False)

    def resume_writing(self) -> None:
        self.worker.set_reading(True)


class Worker:
    def __init__(self, control: socket.socket, frame_max: int) -> None:
        self.loop = asyncio.get_event_loop()
        self.frame_max = frame_max
        self.control = control
        self.clients: dict[int, Client] = {}
        self.early: dict[int, list[tuple[int, bytes]]] = {}  # orders for a socket not yet here
        self.last_taken = 0  # ids grow: an order for a lower id not in `clients` is for one gone
        self.link: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.reading_paused = False
        self.done = asyncio.Event()

    def send(self, kind: int, conn: int, payload: bytes = b"") -> None:
        self.out.append(ipc.message(kind, conn, payload))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.link is not None and not self.link.is_closing():
            self.link.write(b"".join(self.out))
        self.out.clear()

    def lost(self, conn: int, exc: Exception | None) -> None:
        if self.clients.pop(conn, None) is not None:
            self.send(ipc.LOST, conn, str(exc or "").encode())

    def order(self, kind: int, conn: int, payload: bytes) -> None:
        client = self.clients.get(conn)
        if client is not None and client.ready:
            client.order(kind, payload)
        elif client is not None or conn > self.last_taken:
            self.early.setdefault(conn, []).append((kind, payload))

    def set_reading(self, on: bool) -> None:
        self.reading_paused = not on
        for client in self.clients.values():
            transport = client.transport
            if transport is None or transport.is_closing() or client.paused_by_main:
                continue
            if on:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def take(self) -> None:
        """The control socket is readable: adopt the socket the main process accepted."""
        try:
            taken = ipc.take_socket(self.control)
        except BlockingIOError:
            return
        if taken is None:
            self.done.set()
            return
        conn, sock = taken
        self.last_taken = conn
        sock.setblocking(False)
        client = Client(self, conn)
        self.clients[conn] = client
        self.loop.create_task(self._adopt(client, sock))

    async def _adopt(self, client: Client, sock: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: client, sock)
        except OSError as exc:
            self.early.pop(client.conn, None)
            self.lost(client.conn, exc)
            return
        for kind, payload in self.early.pop(client.conn, ()):
            client.order(kind, payload)
        client.ready = True

    async def run(self, data: socket.socket) -> None:
        self.link, _ = await self.loop.connect_accepted_socket(lambda: MainLink(self), data)
        self.link.set_write_buffer_limits(high=HIGH_WATER)
        self.control.setblocking(False)
        self.loop.add_reader(self.control, self.take)
        await self.done.wait()
        for client in list(self.clients.values()):
            if client.transport is not None:
                client.transport.abort()


def main(argv: list[str]) -> int:
    data = socket.socket(fileno=int(argv[0]))
    control = socket.socket(fileno=int(argv[1]))
    frame_max = int(argv[2])
    run = asyncio.run
    if argv[3] == "uvloop":
        import uvloop  # the main process checked that it is installed
        run = uvloop.run
    # Ctrl-C and SIGTERM reach the whole process group: the main process closes every
    # connection (320) through this worker first, then closes the data socket, which ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    async def serve() -> None:
        await Worker(control, frame_max).run(data)

    run(serve())
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
