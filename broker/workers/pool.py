"""The main process's side of `--workers N`: N - 1 wire workers, and the listener that feeds them.

`WorkerPool.start()` starts the worker processes (`python -m leveret.broker.workers.worker`),
each with a data socket (ipc.py's messages) and a control socket (accepted sockets, as
SCM_RIGHTS). `listen(sockets)` accepts on the AMQP listener in this process and hands each
accepted socket to the worker with the fewest connections, which reads it. This process keeps its
own descriptor of the socket and writes to it: the connection's session is made here, on a
`WorkerTransport`, so every session, channel, queue and stream stays in this one process and
behaves exactly as with one process, and what the session sends leaves from here. With no
worker able to take a socket (all restarting, or a control socket full), this process serves the
client itself.

A worker that dies (its data socket closes) loses its clients: each of their sessions gets
`connection_lost`, as if its socket had closed, so exclusive queues go, unacked deliveries are
requeued and nothing it held leaks; the pool then starts a new worker in its place, backing off
when workers keep dying at once. `stop()` (after the sessions are closed) closes the data
sockets, which ends the workers, and waits for them.

It must not know AMQP: sessions are made by the factory it is given. Asyncio: the main event
loop; the pool's sockets are used from it only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import marshal
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from leveret.broker.process import logs
from leveret.broker.workers import ipc
from leveret.broker.workers.transport import WorkerTransport

log = logs.get("leveret.workers")

ACCEPT_PER_TURN = 64
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)
STOP_TIMEOUT_S = 5.0
PIPE_BUFFER = 4 * 1024 * 1024  # SO_SNDBUF of each end of a worker's data socket


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's cpuset, `taskset`),
    else the machine's count. `workers = 0`, the default, runs one process per core."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class WorkerHandle:
    """One worker process, its two sockets and the connections it holds."""

    def __init__(self, pool: WorkerPool, number: int) -> None:
        self.pool = pool
        self.number = number
        self.process: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.link: asyncio.Transport | None = None
        self.conns: dict[int, WorkerTransport] = {}
        self.started_at = 0.0
        self.deaths = 0  # quick deaths in a row, for the back-off
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.alive = False

    async def start(self, frame_max: int, loop_name: str) -> None:
        data, child_data = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (data, child_data):  # a turn's output in one write (the kernel may cap it)
            with contextlib.suppress(OSError):
                end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER)
        control, child_control = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = (child_data.fileno(), child_control.fileno())
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "leveret.broker.workers.worker", str(fds[0]),
                 str(fds[1]), str(frame_max), loop_name],
                pass_fds=fds, stdin=subprocess.DEVNULL,
            )
        except OSError:
            data.close()
            control.close()
            raise
        finally:
            child_data.close()
            child_control.close()
        control.setblocking(False)
        self.control = control
        loop = asyncio.get_running_loop()
        self.link, _ = await loop.connect_accepted_socket(lambda: _Link(self), data)
        self.started_at = time.monotonic()
        self.alive = True
        log.info("worker started", worker=self.number, pid=self.process.pid)

    def send(self, kind: int, conn: int) -> None:
        """An order for one client's socket (ipc.py: CLOSE, ABORT, PAUSE_READING,
        RESUME_READING), which has no payload: what clients are sent never crosses here."""
        if not self.alive:
            return
        self._out.append(ipc.HEAD.pack(kind, conn, 0))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.link is not None and not self.link.is_closing():
            self.link.write(b"".join(out))

    def adopt(self, conn: int, sock: socket.socket) -> bool:
        """Hand an accepted socket over; False if the control socket cannot take it now."""
        if not self.alive or self.control is None:
            return False
        try:
            ipc.pass_socket(self.control, conn, sock)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            log.warning("cannot hand a socket to a worker", worker=self.number, error=str(exc))
            return False
        return True

    def received(self, kind: int, conn: int, payload: bytes) -> None:
        transport = self.conns.get(conn)
        if transport is None:
            return
        if kind == ipc.FRAMES:
            transport.received_split(marshal.loads(memoryview(payload)[4:]),
                                     ipc.COUNT.unpack_from(payload)[0])
        elif kind == ipc.DATA:
            transport.received(payload)
        elif kind == ipc.EOF:
            transport.eof()
        elif kind == ipc.LOST:
            transport.lost(payload.decode("utf-8", "replace"))

    def gone(self, reason: str) -> None:
        """The data socket closed: every client of this worker is lost."""
        if not self.alive:
            return
        self.alive = False
        self._out.clear()
        if self.control is not None:
            self.control.close()
            self.control = None
        conns, self.conns = self.conns, {}
        for transport in conns.values():
            transport.lost(reason)
        self.pool.worker_gone(self)

    def reap(self, grace_s: float = 0.0) -> int | None:
        """The process's exit code, once it has exited: given `grace_s` to end by itself, then
        killed."""
        process = self.process
        if process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()
        return process.returncode


class _Link(asyncio.Protocol):
    """The main process's end of one worker's data socket."""

    def __init__(self, worker: WorkerHandle) -> None:
        self.worker = worker
        self.decoder = ipc.Decoder()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.decoder.feed(data)
        except ipc.IPCError as exc:
            log.error("worker sent a malformed message; stopping it", worker=self.worker.number,
                      error=str(exc))
            if self.transport is not None:
                self.transport.abort()
            return
        received = self.worker.received
        for kind, conn, payload in messages:
            received(kind, conn, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.gone("the worker process holding this connection exited")


class Listener:
    """The AMQP listener's sockets, accepted on here; shaped as the asyncio.Server the server
    keeps (`sockets`, `close`, `wait_closed`)."""

    def __init__(self, pool: WorkerPool, sockets: list[socket.socket]) -> None:
        self.pool = pool
        self.sockets = sockets
        self.loop = asyncio.get_running_loop()
        for sock in sockets:
            sock.listen(4096)
            sock.setblocking(False)
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_PER_TURN):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the client waits in the backlog
                log.warning("accept failed", error=str(exc))
                return
            self.pool.place(conn)

    def close(self) -> None:
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
                sock.close()

    async def wait_closed(self) -> None:
        return None


class WorkerPool:
    def __init__(self, workers: int, session_factory: Callable[[], asyncio.Protocol],
                 frame_max: int, loop_name: str = "asyncio") -> None:
        self.size = workers
        self.frame_max = frame_max
        self.session_factory = session_factory
        self.loop_name = loop_name
        self.workers: list[WorkerHandle] = []
        self._ids = itertools.count(1)
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()  # restarts, and clients served here

    async def start(self) -> None:
        for number in range(1, self.size + 1):
            worker = WorkerHandle(self, number)
            await worker.start(self.frame_max, self.loop_name)
            self.workers.append(worker)

    def listen(self, sockets: list[socket.socket]) -> Listener:
        return Listener(self, sockets)

    def place(self, sock: socket.socket) -> None:
        """An accepted client: to the worker with the fewest connections, else served here."""
        try:
            peername, sockname = sock.getpeername(), sock.getsockname()
        except OSError:  # reset before we looked
            sock.close()
            return
        loop = asyncio.get_running_loop()
        conn = next(self._ids)
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # as asyncio's transports do
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for worker in sorted((w for w in self.workers if w.alive), key=lambda w: len(w.conns)):
            if worker.adopt(conn, sock):
                # The worker reads through its own descriptor; this one stays, for writing.
                session = self.session_factory()
                transport = WorkerTransport(worker, conn, session, sock, peername, sockname)
                worker.conns[conn] = transport
                session.connection_made(transport)
                return
        task = loop.create_task(self._serve_here(sock))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_here(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().connect_accepted_socket(self.session_factory, sock)

    def pids(self) -> list[int]:
        """The running workers' process ids (their memory counts towards the memory alarm)."""
        return [w.process.pid for w in self.workers if w.alive and w.process is not None]

    def worker_gone(self, worker: WorkerHandle) -> None:
        if self._stopping:
            return
        code = worker.reap()
        quick = time.monotonic() - worker.started_at < 10.0
        worker.deaths = worker.deaths + 1 if quick else 1
        delay = RESTART_BACKOFF_S[min(worker.deaths - 1, len(RESTART_BACKOFF_S) - 1)]
        log.error("worker exited; starting a new one", worker=worker.number, exit_code=code,
                  restart_in_s=delay)
        task = asyncio.get_running_loop().create_task(self._restart(worker, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, old: WorkerHandle, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stopping:
            return
        worker = WorkerHandle(self, old.number)
        worker.deaths = old.deaths
        # In the list before it starts (nothing uses it until it is alive), so that a start
        # that fails leaves in the list the handle that the next attempt replaces.
        self.workers[self.workers.index(old)] = worker
        try:
            await worker.start(self.frame_max, self.loop_name)
        except OSError as exc:
            log.error("cannot start a worker", worker=old.number, error=str(exc))
            worker.started_at = time.monotonic()  # a quick death: the back-off grows
            self.worker_gone(worker)

    async def stop(self) -> None:
        """Close the data sockets (the workers end) and wait for every worker to exit."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for worker in self.workers:
            worker._flush()
            worker.alive = False
            if worker.link is not None:
                worker.link.close()
            if worker.control is not None:
                worker.control.close()
                worker.control = None
        for worker in self.workers:
            await asyncio.to_thread(worker.reap, STOP_TIMEOUT_S)
