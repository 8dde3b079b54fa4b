"""Failure detection on the node-to-node link, over real loopback sockets: a peer process paused
with SIGSTOP is dropped once the heartbeat timeout has passed with nothing received; a busy link
(chunks flowing, no heartbeats) and a reader held up by a slow handler are not; a stall of this
node's own loop does not drop the peer whose frames it has not read yet."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from leveret.broker.cluster.link import Chunk, Handlers, Link, LinkConfig, LinkServer, connect

SECRET = b"liveness-secret"
SERVER = LinkConfig(cluster="live", node="a", secret=SECRET, heartbeat_interval_s=0.1,
                    heartbeat_timeout_s=0.4)
QUIET = replace(SERVER, node="b", heartbeat_interval_s=60.0, heartbeat_timeout_s=600.0)

# a peer node in its own process: links to the server, then heartbeats until it is stopped
PEER = """
import asyncio, sys
from leveret.broker.cluster.link import Handlers, LinkConfig, connect

async def main() -> None:
    config = LinkConfig("live", "peer", b"liveness-secret", heartbeat_interval_s=0.1,
                        heartbeat_timeout_s=600.0)
    link = await connect("127.0.0.1", int(sys.argv[1]), config, Handlers())
    print("linked", flush=True)
    await link.wait_closed()

asyncio.run(main())
"""


class Accepted:
    """A LinkServer on loopback that keeps the links it accepts."""

    def __init__(self, config: LinkConfig, handlers: Handlers) -> None:
        self.links: list[Link] = []
        self.server = LinkServer(config, handlers, self._on_link, host="127.0.0.1")

    async def _on_link(self, link: Link) -> None:
        self.links.append(link)

    async def one(self) -> Link:
        async with asyncio.timeout(10):
            while not self.links:
                await asyncio.sleep(0.01)
        return self.links[0]


@pytest.fixture
async def serve() -> AsyncIterator[list[Accepted]]:
    started: list[Accepted] = []
    yield started
    for accepted in started:
        await accepted.server.close()


async def start(serve: list[Accepted], config: LinkConfig = SERVER,
                handlers: Handlers | None = None) -> Accepted:
    accepted = Accepted(config, handlers or Handlers())
    await accepted.server.start()
    serve.append(accepted)
    return accepted


async def closed_within(link: Link, timeout_s: float) -> float:
    """Seconds until `link` closes (fails the test after `timeout_s`)."""
    began = time.monotonic()
    async with asyncio.timeout(timeout_s):
        await link.wait_closed()
    return time.monotonic() - began


async def test_a_paused_peer_process_is_dropped_after_the_timeout(
        serve: list[Accepted]) -> None:
    config = replace(SERVER, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0)
    accepted = await start(serve, config)
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, str(accepted.server.port), stdout=asyncio.subprocess.PIPE)
    try:
        assert peer.stdout is not None
        async with asyncio.timeout(30):
            assert await peer.stdout.readline() == b"linked\n"
        link = await accepted.one()
        await asyncio.sleep(2.0)  # twice the timeout: the peer's heartbeats keep it up
        assert not link.closed
        peer.send_signal(signal.SIGSTOP)
        # its last heartbeat left at most 0.1 s before the pause
        elapsed = await closed_within(link, 5.0)
        assert 0.85 <= elapsed <= 1.5, elapsed
        assert link.close_reason == "nothing received for 1 s (heartbeat timeout)"
    finally:
        peer.kill()  # SIGKILL ends a stopped process too
        await peer.wait()


async def test_any_frame_counts_as_life_not_only_heartbeats(serve: list[Accepted]) -> None:
    received: list[Chunk] = []
    handlers = Handlers()

    async def on_chunk(_link: Link, chunk: Chunk) -> None:
        received.append(chunk)

    handlers.on_chunk(on_chunk)
    accepted = await start(serve, handlers=handlers)
    sender = await connect("127.0.0.1", accepted.server.port, QUIET, Handlers())
    link = await accepted.one()
    began = time.monotonic()
    while time.monotonic() - began < 1.6:  # four timeouts of chunks, and no heartbeat at all
        await sender.send_chunk("s", 1, b"x" * 1000)
        await asyncio.sleep(0.05)
    assert not link.closed and len(received) > 20
    elapsed = await closed_within(link, 3.0)  # the chunks stop: it is silence now
    assert 0.3 <= elapsed <= 0.8, elapsed
    await sender.close()


async def test_a_reader_held_up_by_a_slow_handler_is_not_the_peers_silence(
        serve: list[Accepted]) -> None:
    handling = asyncio.Event()
    handled = asyncio.Event()
    handlers = Handlers()

    async def slow(_link: Link, _chunk: Chunk) -> None:
        handling.set()
        await asyncio.sleep(1.2)  # three timeouts, while the peer sends nothing
        handled.set()

    handlers.on_chunk(slow)
    accepted = await start(serve, handlers=handlers)
    sender = await connect("127.0.0.1", accepted.server.port, QUIET, Handlers())
    link = await accepted.one()
    await sender.send_chunk("s", 1, b"one")
    async with asyncio.timeout(5):
        await handled.wait()
    assert handling.is_set() and not link.closed
    elapsed = await closed_within(link, 3.0)  # silence counts from when it reads again
    assert 0.3 <= elapsed <= 0.8, elapsed
    await sender.close()


async def test_a_stall_of_this_nodes_loop_does_not_drop_its_peers(
        serve: list[Accepted]) -> None:
    accepted = await start(serve)
    client = await connect("127.0.0.1", accepted.server.port, replace(SERVER, node="b"),
                           Handlers())
    link = await accepted.one()
    await asyncio.sleep(0.3)
    time.sleep(1.0)  # the point: this loop (both ends of the link) stalls 2.5 timeouts
    await asyncio.sleep(0.5)  # each side gets an interval to read what the other sends
    assert not link.closed and not client.closed, (link.close_reason, client.close_reason)
    await client.close()
