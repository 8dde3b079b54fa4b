"""The worker pool's own failures, with a real worker process and real sockets, and a session
that only records what it is told: a worker that sends what no worker sends, a worker that
cannot be started again, and the write half of `WorkerTransport` (a client that stops reading,
a client that resets).

The sessions here are recorders, not AMQP: what is under test is the pool and the transport,
which must not know AMQP. tests/e2e/test_workers.py covers the same failures' effect on real
AMQP clients.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from leveret.broker.workers import pool as pool_module
from leveret.broker.workers.pool import WorkerPool
from leveret.broker.workers.transport import WorkerTransport

HEADER = b"AMQP\x00\x00\x09\x01"


class Recorder(asyncio.Protocol):
    """A session that answers the protocol header with `reply` and records the rest."""

    reply = b"hello"

    def __init__(self) -> None:
        self.transport: WorkerTransport | None = None
        self.received = b""
        self.lost: list[Exception | None] = []
        self.paused = 0
        self.resumed = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=256 * 1024)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.received == HEADER and self.transport is not None:
            self.transport.write(self.reply)

    def split_received(self, items: Any, size: int) -> None:
        raise AssertionError("a recorder is sent no frames")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1


async def until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Served:
    def __init__(self) -> None:
        self.sessions: list[Recorder] = []
        listening = socket.create_server(("127.0.0.1", 0))
        self.port = listening.getsockname()[1]
        self.pool = WorkerPool(1, self.make, frame_max=131072)
        self.listening = listening

    def make(self) -> Recorder:
        session = Recorder()
        self.sessions.append(session)
        return session

    async def client(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Recorder]:
        count = len(self.sessions)
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(HEADER)
        await until(lambda: len(self.sessions) > count, what="the session")
        return reader, writer, self.sessions[count]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    served = Served()
    await served.pool.start()
    listener = served.pool.listen([served.listening])
    yield served
    listener.close()
    await served.pool.stop()


def worker_pid(served: Served) -> int:
    pid, = served.pool.pids()
    return pid


async def test_the_main_process_writes_and_the_worker_reads(served: Served) -> None:
    reader, writer, session = await served.client()
    assert await reader.readexactly(5) == b"hello"
    assert isinstance(session.transport, WorkerTransport)
    assert session.received == HEADER
    writer.close()
    await until(lambda: session.lost == [None], what="connection_lost")


async def test_a_client_that_stops_reading_pauses_its_session_and_resumes_it(
        served: Served) -> None:
    reader, writer, session = await served.client()
    assert await reader.readexactly(5) == b"hello"
    transport = session.transport
    assert transport is not None
    piece = b"x" * 65536
    while not session.paused:  # the client reads nothing meanwhile
        transport.write(piece)
        await asyncio.sleep(0)
    assert transport.get_write_buffer_size() > 256 * 1024
    written = transport.get_write_buffer_size()
    got = 0
    while session.resumed == 0:
        got += len(await reader.read(1 << 20))
    assert session.resumed == 1
    assert transport.get_write_buffer_size() <= 64 * 1024  # the low mark, a quarter of high
    transport.close()
    got += len(await reader.read())  # until EOF: everything buffered is written before close
    assert got >= written
    await until(lambda: session.lost == [None], what="connection_lost")
    writer.close()


async def test_a_client_that_resets_ends_its_session_with_an_error(served: Served) -> None:
    _reader, writer, session = await served.client()
    await until(lambda: session.transport is not None and session.received == HEADER)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST
    await until(lambda: bool(session.lost), what="connection_lost")
    transport = session.transport
    assert transport is not None
    transport.write(b"after")  # a write after the end is dropped, as asyncio's is
    assert session.lost[0] is not None and transport.is_closing()
    assert served.pool.workers[0].conns == {}


async def test_a_worker_that_sends_what_no_worker_sends_is_replaced(served: Served) -> None:
    reader, _writer, session = await served.client()
    assert await reader.readexactly(5) == b"hello"
    old = worker_pid(served)
    link = served.pool.workers[0].link
    assert link is not None
    link.get_protocol().data_received(b"\xff" * 9)  # a head no worker writes
    await until(lambda: bool(session.lost), what="the session's end")
    assert isinstance(session.lost[0], ConnectionResetError)
    assert await reader.read() == b""  # the client's connection is closed
    await until(lambda: served.pool.pids() not in ([], [old]), what="a new worker")
    reader2, _w, second = await served.client()
    assert await reader2.readexactly(5) == b"hello"
    assert isinstance(second.transport, WorkerTransport)


async def test_a_worker_that_cannot_restart_is_tried_again_and_meanwhile_the_main_process_serves(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "RESTART_BACKOFF_S", (0.0, 0.2, 0.2, 0.2, 0.2))
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # the restart's exec fails
    os.kill(worker_pid(served), signal.SIGKILL)
    await until(lambda: not served.pool.pids(), what="the worker's death")
    await asyncio.sleep(0.5)  # a few restarts tried, and refused
    assert not served.pool.pids()
    reader, _writer, session = await served.client()
    assert await reader.readexactly(5) == b"hello"  # served by the main process itself
    assert not isinstance(session.transport, WorkerTransport)
    monkeypatch.undo()
    await until(lambda: len(served.pool.pids()) == 1, what="a worker started at last")
    reader2, _w, second = await served.client()
    assert await reader2.readexactly(5) == b"hello"
    assert isinstance(second.transport, WorkerTransport)
