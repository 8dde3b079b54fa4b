"""A wire worker: the process that reads client sockets for the main process.

`python -m leveret.broker.workers.worker DATA_FD CONTROL_FD FRAME_MAX asyncio|uvloop` is
started by the main process (pool.py), never by hand (docs/WORKERS.md). Accepted client
sockets arrive on the control socket (`ipc.take_socket`); this process reads them and passes
what the clients send to the main process on the data socket (split into frames by split.py).
It writes nothing to a client: the main process keeps its own descriptor of each socket and
writes to it itself (transport.py). Each turn's output to the main process leaves in one write.

The main process's PAUSE_READING stops reading one client (a resource alarm), and CLOSE and
ABORT close this process's descriptor. When the main process reads too slowly, every client
socket stops being read until it catches up.

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
MAX_READ = 256 * 1024  # a read of one client's socket, as asyncio's transports read
MORE = 4096  # bytes left to split after a piece that make it worth sending that piece at once


class Client:
    """One client socket, read for the main process as connection `conn`.

    It never writes (the main process writes through its own descriptor), so it is the read
    half of a socket transport only: read when readable, EOF and errors reported, reading
    paused and resumed. Not asyncio's transport: an idle connection costs a worker about
    1.9 KB with one and 0.8 KB without, and the worker's memory counts against each connection
    (docs/WORKERS.md)."""

    __slots__ = ("at_eof", "conn", "fd", "paused_by_main", "reading", "sock", "splitter",
                 "worker")

    def __init__(self, worker: Worker, conn: int, sock: socket.socket) -> None:
        self.worker = worker
        self.conn = conn
        self.sock = sock
        self.fd = sock.fileno()
        self.splitter = Splitter(worker.frame_max)
        self.paused_by_main = False
        self.at_eof = False  # the client half-closed: nothing more to read
        self.reading = False

    def follow(self) -> None:
        """Read while neither the main process nor a full link says stop, until EOF."""
        reading = not (self.paused_by_main or self.worker.reading_paused or self.at_eof)
        if reading != self.reading and self.fd >= 0:
            self.reading = reading
            if reading:
                self.worker.loop.add_reader(self.fd, self.readable)
            else:
                self.worker.loop.remove_reader(self.fd)

    def readable(self) -> None:
        if self.fd < 0:
            return
        try:
            data = self.sock.recv(MAX_READ)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(exc, report=True)
            return
        if not data:
            # The client sends no more, but it may still read what the main process writes:
            # keep the descriptor; the main process closes the connection (CLOSE) when done.
            self.at_eof = True
            self.follow()
            self.worker.send(ipc.EOF, self.conn)
            return
        splitter = self.splitter
        for kind, payload in splitter.pieces(data):
            self.worker.send(kind, self.conn, payload)
            if len(splitter.frames) >= MORE:  # a big read: the main process starts on this
                self.worker.flush()           # piece while the next one is split

    def order(self, kind: int) -> None:
        """What the main process asks of this client's socket."""
        if kind == ipc.CLOSE or kind == ipc.ABORT:
            self.close(None, report=False)  # the main process knows
        elif kind == ipc.PAUSE_READING or kind == ipc.RESUME_READING:
            self.paused_by_main = kind == ipc.PAUSE_READING
            self.follow()

    def close(self, exc: Exception | None, report: bool) -> None:
        if self.fd < 0:
            return
        if self.reading:
            self.worker.loop.remove_reader(self.fd)
            self.reading = False
        self.fd = -1
        self.sock.close()
        self.worker.lost(self.conn, exc, report)


class MainLink(asyncio.Protocol):
    """The data socket to the main process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.decoder = ipc.Decoder()

    def data_received(self, data: bytes) -> None:
        for kind, conn, _payload in self.decoder.feed(data):
            self.worker.order(kind, conn)

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
        self.early: dict[int, list[int]] = {}  # orders for a socket not yet here
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

    def lost(self, conn: int, exc: Exception | None, report: bool = True) -> None:
        if self.clients.pop(conn, None) is not None and report:
            self.send(ipc.LOST, conn, str(exc or "").encode())

    def order(self, kind: int, conn: int) -> None:
        client = self.clients.get(conn)
        if client is not None:
            client.order(kind)
        elif conn > self.last_taken:  # its socket is still on its way on the control socket
            self.early.setdefault(conn, []).append(kind)

    def set_reading(self, on: bool) -> None:
        self.reading_paused = not on
        for client in list(self.clients.values()):
            client.follow()

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
        client = Client(self, conn, sock)
        self.clients[conn] = client
        for kind in self.early.pop(conn, ()):
            client.order(kind)
        client.follow()

    async def run(self, data: socket.socket) -> None:
        self.link, _ = await self.loop.connect_accepted_socket(lambda: MainLink(self), data)
        self.link.set_write_buffer_limits(high=HIGH_WATER)
        self.control.setblocking(False)
        self.loop.add_reader(self.control, self.take)
        await self.done.wait()
        for client in list(self.clients.values()):
            client.close(None, report=False)


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
