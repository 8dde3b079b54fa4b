"""The fsync policies (`stream_fsync`, `queue_fsync`) as a confirming publisher sees them.

For a stream and for a durable classic queue with persistent messages, a lone publish is
confirmed: at once with `never` (and nothing is fsynced), after the fsync of its chunk with
`always`, and with every N ms within N ms plus a margin, after the fsync that covers it (a timer
fsyncs; nothing else has to be written). fsyncs are observed by wrapping os.fdatasync in this
process (the broker runs in a thread here) and keeping those of the queue's segment files.
These are behaviour tests with generous bounds, not timing benchmarks.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from pamqp import commands
from support.brokers import InProcessBroker

POLICIES = ["never", "always", "200"]
KINDS = ["stream", "durable"]
CONFIRM_WITHIN_S = {"never": 1.0, "always": 1.0, "200": 1.0}  # 200 ms plus a generous margin


class FsyncSpy:
    """os.fdatasync, recording when each call on a segment file under `root` returned."""

    def __init__(self, root: Path, real: Callable[[int], None]) -> None:
        self.root = str(root)
        self.real = real
        self.calls: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        self.real(fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if path.startswith(self.root) and path.endswith(".segment"):
            with self.lock:
                self.calls.append((time.monotonic(), path))

    def between(self, start: float, end: float) -> list[str]:
        with self.lock:
            return [path for when, path in self.calls if start <= when <= end]


@pytest.fixture
def spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FsyncSpy:
    recorder = FsyncSpy(tmp_path / "data" / "queues", os.fdatasync)
    monkeypatch.setattr(os, "fdatasync", recorder)
    return recorder


def start(tmp_path: Path, policy: str) -> InProcessBroker:
    return InProcessBroker(tmp_path / "data", stream_fsync=policy, queue_fsync=policy).start()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[[str], InProcessBroker]]:
    started: list[InProcessBroker] = []

    def make(policy: str) -> InProcessBroker:
        started.append(start(tmp_path, policy))
        return started[-1]

    yield make
    for broker in started:
        broker.stop()


def queue_arguments(kind: str) -> dict[str, Any] | None:
    return {"x-queue-type": "stream"} if kind == "stream" else None


def persistent(body: bytes) -> aio_pika.Message:
    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


async def open_channel(broker: InProcessBroker, kind: str, name: str) -> Any:
    connection = await aio_pika.connect(broker.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(name, durable=True, arguments=queue_arguments(kind))
    return connection, channel


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", POLICIES)
async def test_a_lone_publish_is_confirmed_after_the_fsync_its_policy_asks_for(
    brokers: Callable[[str], InProcessBroker], spy: FsyncSpy, kind: str, policy: str
) -> None:
    broker = brokers(policy)
    connection, channel = await open_channel(broker, kind, "lone")
    try:
        # The second publish comes right after the first was confirmed, so within N ms of the
        # fsync that confirmed it: only a timer can fsync it.
        for body in (b"first", b"second"):
            started = time.monotonic()
            confirm = await asyncio.wait_for(
                channel.default_exchange.publish(persistent(body), "lone"), timeout=5
            )
            confirmed = time.monotonic()
            assert isinstance(confirm, commands.Basic.Ack)
            assert confirmed - started < CONFIRM_WITHIN_S[policy], (body, confirmed - started)
            fsyncs = spy.between(started, confirmed)
            if policy == "never":
                assert fsyncs == []
            else:  # the fsync of the queue's segment came before the confirm
                assert fsyncs, f"{body!r} was confirmed before any fsync of its log"
    finally:
        await connection.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_publishes_within_the_interval_share_fsyncs(
    brokers: Callable[[str], InProcessBroker], spy: FsyncSpy, kind: str
) -> None:
    broker = brokers("200")
    connection, channel = await open_channel(broker, kind, "grouped")
    try:
        started = time.monotonic()
        pending = []
        for i in range(10):  # ten chunks, 10 ms apart
            pending.append(asyncio.ensure_future(
                channel.default_exchange.publish(persistent(b"m%d" % i), "grouped")))
            await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*pending), timeout=5)
        confirmed = time.monotonic()
        assert confirmed - started < 1.5
        assert 1 <= len(spy.between(started, confirmed)) <= 5  # `always` would fsync ten times
    finally:
        await connection.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stop_fsyncs_and_confirms_what_the_timer_has_not_yet(
    tmp_path: Path, spy: FsyncSpy, kind: str
) -> None:
    broker = start(tmp_path, "60000")  # the timer would fire only after a minute
    try:
        _connection, channel = await open_channel(broker, kind, "stopped")
        publish = asyncio.ensure_future(
            channel.default_exchange.publish(persistent(b"pending"), "stopped"))
        await asyncio.sleep(0.3)
        assert not publish.done()  # written, not yet fsynced: not confirmed
        started = time.monotonic()
        await asyncio.to_thread(broker.stop)
        confirm = await asyncio.wait_for(publish, timeout=5)
        assert isinstance(confirm, commands.Basic.Ack)
        assert spy.between(started, time.monotonic())
    finally:
        broker.stop()


@pytest.mark.parametrize("kind", KINDS)
async def test_deleting_a_queue_cancels_its_fsync_timer(
    brokers: Callable[[str], InProcessBroker], kind: str
) -> None:
    broker = brokers("60000")
    connection, channel = await open_channel(broker, kind, "deleted")
    try:
        queue = broker.call(lambda: broker.broker.vhosts["/"].queues["deleted"])
        publish = asyncio.ensure_future(
            channel.default_exchange.publish(persistent(b"pending"), "deleted"))
        await asyncio.sleep(0.3)
        assert not publish.done()
        assert broker.call(lambda: queue.writer.timer_armed)
        await channel.queue_delete("deleted")
        await asyncio.wait_for(publish, timeout=5)  # settled as its log closed, not left waiting
        assert not broker.call(lambda: queue.writer.timer_armed)
    finally:
        await connection.close()
