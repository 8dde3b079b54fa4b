"""The transport a session in the main process sees for a client whose socket a wire worker reads.

It stands where asyncio's socket transport stands (`Session.connection_made`), with the same
methods and the same contract. The client's socket is open in both processes: the worker reads
it (and splits what arrives into frames), and this transport writes to it, from this process,
so that what the session sends never crosses the pipe to the worker.

- Writing is asyncio's: send at once, keep what the socket cannot take and send it when the
  socket is writable, and tell the session to pause writing above the high mark (4 MiB, the
  session's) and to resume at the low mark.
- Reading is the worker's: `pause_reading` and `resume_reading` are orders to it, and what it
  reads arrives through `received` and `received_split`. Bytes that arrive while reading is
  paused (they were on their way) are held and handed over on `resume_reading`, so the session
  never gets data while paused, as with a socket.
- Closing: `close` has the worker stop reading and close its descriptor at once, and closes this
  process's descriptor once what is buffered is written (the kernel closes the connection when
  both are closed); `abort` closes both at once. The session's `connection_lost` follows, as
  with asyncio's transport, in a later callback. The worker's report that the client closed or
  reset (`lost`), the worker's death and a failed send close both at once.

Why not asyncio's own transport for the writing half: it starts reading the socket after
`connection_made` on uvloop, whatever the protocol asks, and a byte read here is a byte the
worker's frame splitter never sees. This is the write half of it, and only that.

It must not know AMQP or the session's insides: it calls the asyncio.Protocol methods only.
Asyncio: the main process's event loop.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

from leveret.broker.workers import ipc


class Worker(Protocol):
    """What a transport needs of the worker that reads its socket (`pool.WorkerHandle`): a
    Protocol, so that this module does not import the pool that imports it."""

    conns: dict[int, WorkerTransport]

    def send(self, kind: int, conn: int) -> None: ...


_GONE = asyncio.Protocol()  # what a closed transport's protocol is


class WorkerTransport(asyncio.Transport):
    # Slots, and no dict of extra info: a thousand idle connections pay for every field.
    __slots__ = ("_closing", "_eof_held", "_fd", "_held", "_high", "_loop", "_lost", "_low",
                 "_out", "_paused", "_peername", "_reading", "_sock", "_sockname", "conn",
                 "protocol", "worker")

    def __init__(self, worker: Worker, conn: int, protocol: asyncio.Protocol,
                 sock: socket.socket, peername: Any, sockname: Any) -> None:
        super().__init__()
        self.worker = worker
        self.conn = conn
        self.protocol = protocol
        self._sock = sock  # non-blocking; this process's descriptor of the client's socket
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._peername = peername
        self._sockname = sockname
        self._closing = False
        self._lost = False
        self._reading = True
        self._held: list[bytes | tuple[Any, int]] | None = None  # made when first needed
        self._out = bytearray()  # written, and not yet taken by the socket
        self._high, self._low = 64 * 1024, 16 * 1024  # asyncio's defaults, until the session's
        self._paused = False
        self._eof_held = False

    # -- what the session calls ---------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        out = self._out
        if not out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._fail(exc)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        out += data
        if len(out) > self._high and not self._paused:
            self._paused = True
            self.protocol.pause_writing()

    def _write_ready(self) -> None:
        out = self._out
        try:
            sent = self._sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        del out[:sent]
        if self._paused and len(out) <= self._low:
            self._paused = False
            self.protocol.resume_writing()
        if not out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._finish(None)

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.worker.send(ipc.CLOSE, self.conn)
        if not self._out:
            self._finish(None)

    def abort(self) -> None:
        if self._lost:
            return
        self.worker.send(ipc.ABORT, self.conn)
        self._finish(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peername
        if name == "sockname":
            return self._sockname
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """As asyncio's: high defaults to 64 KiB, low to a quarter of high."""
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        return len(self._out)

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self.worker.send(ipc.PAUSE_READING, self.conn)

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self.worker.send(ipc.RESUME_READING, self.conn)
        if self._held:
            self._loop.call_soon(self._hand_over_held)

    def is_reading(self) -> bool:
        return self._reading

    def can_write_eof(self) -> bool:
        return False

    # -- what the worker reports --------------------------------------------------------------

    def received(self, data: bytes) -> None:
        if self._closing:  # a closed socket is read no more
            return
        if self._reading and not self._held:
            self.protocol.data_received(data)
        else:
            self._hold(data)

    def received_split(self, items: Any, size: int) -> None:
        if self._closing:
            return
        if self._reading and not self._held:
            self.protocol.split_received(items, size)  # type: ignore[attr-defined]
        else:
            self._hold((items, size))

    def _hold(self, what: bytes | tuple[Any, int]) -> None:
        if self._held is None:
            self._held = []
        self._held.append(what)

    def _hand_over_held(self) -> None:
        while self._held and self._reading and not self._closing:
            held = self._held.pop(0)
            if isinstance(held, tuple):
                self.protocol.split_received(*held)  # type: ignore[attr-defined]
            else:
                self.protocol.data_received(held)
        if self._eof_held and not self._held and self._reading:
            self._eof_held = False
            self.eof()

    def eof(self) -> None:
        """The client half-closed: as asyncio does, close unless the protocol keeps it open
        (after the bytes held while reading is paused, as a paused socket reads no EOF)."""
        if self._closing:
            return
        if not self._reading or self._held:
            self._eof_held = True
            return
        if not self.protocol.eof_received():
            self.close()

    def lost(self, reason: str) -> None:
        """The worker's descriptor is gone: the client closed or reset, or the worker died."""
        self._finish(ConnectionResetError(reason) if reason else None)

    # -- the end ------------------------------------------------------------------------------

    def _fail(self, exc: OSError) -> None:
        """A send failed (the client reset): the worker closes its descriptor too."""
        self.worker.send(ipc.ABORT, self.conn)
        self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = self._closing = True
        self._held = None
        if self._out:
            self._loop.remove_writer(self._fd)
            self._out.clear()
        self._sock.close()
        self.worker.conns.pop(self.conn, None)
        # The session and this transport refer to each other: let go, as asyncio's transport
        # does, so that reference counting frees both (the cyclic collector runs rarely).
        protocol, self.protocol = self.protocol, _GONE
        self._loop.call_soon(protocol.connection_lost, exc)
