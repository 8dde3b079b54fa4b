"""The transport a session in the main process sees for a client held by a wire worker.

It stands where asyncio's socket transport stands (`Session.connection_made`), with the same
methods and the same contract: `write` sends bytes to the worker's socket for this client
(counted as buffered until the worker says the socket took them, against the same high and low
marks as a socket transport's),
`close` closes it once they are written, `abort` at once, `pause_reading` stops reading the
client, and the session's `connection_lost` comes when the worker reports the socket closed.
Bytes that arrive while reading is paused (they were on their way) are held and handed over on
`resume_reading`, so the session never gets data while paused, as with a socket. The session is
told to pause writing while the client's socket is full or the link to the worker is.

It must not know AMQP or the session's insides: it calls the asyncio.Protocol methods only.
Asyncio: the main process's event loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from leveret.broker.workers import ipc

if TYPE_CHECKING:
    from leveret.broker.workers.pool import WorkerHandle


_GONE = asyncio.Protocol()  # what a lost transport's protocol is


class WorkerTransport(asyncio.Transport):
    __slots__ = ("_buffered", "_client_full", "_closing", "_eof_held", "_held", "_high",
                 "_link_full", "_lost", "_low", "_paused", "_reading", "conn", "protocol",
                 "worker")

    def __init__(self, worker: WorkerHandle, conn: int, protocol: asyncio.Protocol,
                 peername: Any, sockname: Any) -> None:
        super().__init__()
        self.worker = worker
        self.conn = conn
        self.protocol = protocol
        self._extra = {"peername": peername, "sockname": sockname}
        self._closing = False
        self._lost = False
        self._reading = True
        self._held: list[bytes | tuple[Any, int]] = []
        self._buffered = 0  # written, and not yet taken by the client's socket
        self._high, self._low = 64 * 1024, 16 * 1024  # asyncio's defaults, until the session's
        self._client_full = False  # the bytes buffered for the client went over the high mark
        self._link_full = False  # the link to the worker is
        self._paused = False
        self._eof_held = False

    # -- what the session calls ---------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self.worker.send(ipc.DATA, self.conn, data)
        self._buffered += len(data)
        if self._buffered > self._high and not self._client_full:
            self._client_full = True  # at once, as asyncio's transport pauses in write()
            self._follow()

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self.worker.send(ipc.CLOSE, self.conn)

    def abort(self) -> None:
        if not self._lost:
            self._closing = True
            self.worker.send(ipc.ABORT, self.conn)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """As asyncio's: high defaults to 64 KiB, low to a quarter of high."""
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        """Bytes written for the client that its socket has not yet taken (they are in the
        pipe to the worker or in the worker's buffer)."""
        return self._buffered

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
            asyncio.get_running_loop().call_soon(self._hand_over_held)

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
            self._held.append(data)

    def received_split(self, items: Any, size: int) -> None:
        if self._closing:
            return
        if self._reading and not self._held:
            self.protocol.split_received(items, size)  # type: ignore[attr-defined]
        else:
            self._held.append((items, size))

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
        if self._lost:
            return
        self._lost = self._closing = True
        self._held.clear()
        protocol, self.protocol = self.protocol, _GONE
        protocol.connection_lost(ConnectionResetError(reason) if reason else None)
        # The session and this transport refer to each other: let go, as asyncio's transport
        # does, so that reference counting frees both (the cyclic collector runs rarely).

    def written(self, count: int) -> None:
        """The worker says the client's socket took `count` more bytes."""
        self._buffered -= count
        if self._client_full and self._buffered <= self._low:
            self._client_full = False
            self._follow()

    def link_full(self, full: bool) -> None:
        self._link_full = full
        self._follow()

    def _follow(self) -> None:
        paused = self._client_full or self._link_full
        if paused == self._paused or self._lost:
            return
        self._paused = paused
        if paused:
            self.protocol.pause_writing()
        else:
            self.protocol.resume_writing()
