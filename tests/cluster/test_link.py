"""The node-to-node link over real loopback sockets: handshake, calls, chunks, and every way a
link is closed (bad frames, a silent peer, a refused secret) closing that link only."""

from __future__ import annotations

import asyncio
import os
import select
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leveret.broker.cluster import link_frames as lf
from leveret.broker.cluster.link import (
    AuthenticationFailed,
    CallTimeout,
    Chunk,
    ClusterMismatch,
    Handlers,
    HandshakeError,
    Link,
    LinkClosed,
    LinkConfig,
    LinkServer,
    NodeNameRejected,
    RemoteError,
    connect,
)
from leveret.broker.cluster.link_frames import FrameDecoder, FrameError, FrameType
from leveret.broker.cluster.link_handshake import PROTOCOL_VERSION, hello, proof
from leveret.broker.remote.tunnel_server import TunnelTransport

SECRET = b"s3cret-shared-by-the-nodes"
SERVER = LinkConfig(cluster="c1", node="a", secret=SECRET)
CLIENT = LinkConfig(cluster="c1", node="b", secret=SECRET)
WAIT_S = 5.0
FAST_BEATS = {"heartbeat_interval_s": 0.05, "heartbeat_timeout_s": 0.15}


class Server:
    """A LinkServer on loopback that records the links it accepts and the peers it refuses."""

    def __init__(self, config: LinkConfig, handlers: Handlers) -> None:
        self.links: list[Link] = []
        self.refused: list[HandshakeError] = []
        self.server = LinkServer(config, handlers, self._on_link,
                                 on_refused=self.refused.append)

    async def _on_link(self, link: Link) -> None:
        self.links.append(link)

    @property
    def port(self) -> int:
        return self.server.port

    async def link_count(self, n: int) -> list[Link]:
        async with asyncio.timeout(WAIT_S):
            while len(self.links) < n:
                await asyncio.sleep(0.01)
        return self.links


def echo_handlers() -> Handlers:
    handlers = Handlers()

    async def echo(link: Link, body: Any) -> Any:
        await asyncio.sleep(body.get("delay", 0) if isinstance(body, dict) else 0)
        return {"from": link.config.node, "caller": link.peer_node, "body": body}

    async def fail(link: Link, body: Any) -> Any:
        raise ValueError("no such thing")

    handlers.on_request("echo", echo)
    handlers.on_request("fail", fail)
    return handlers


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(config: LinkConfig = SERVER, handlers: Handlers | None = None) -> Server:
        server = Server(config, handlers or echo_handlers())
        await server.server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.server.close()


async def open_link(server: Server, config: LinkConfig = CLIENT,
                    handlers: Handlers | None = None) -> Link:
    return await connect("127.0.0.1", server.port, config, handlers or echo_handlers())


class RawPeer:
    """A hand-driven client: completes the handshake with the link's own pieces, then sends
    whatever bytes a test wants (or nothing at all)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.received = bytearray()

    @classmethod
    async def open(cls, port: int, config: LinkConfig = CLIENT) -> RawPeer:
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        nonce = os.urandom(32)
        peer.writer.write(lf.encode_json(FrameType.HELLO, hello(config, nonce)))
        server_hello = lf.decode_json(await peer.frame())
        answer = proof(config.secret, b"client", bytes.fromhex(server_hello["nonce"]),
                       config.node, server_hello["node"], config.cluster)
        peer.writer.write(lf.encode_json(FrameType.AUTH, {"proof": answer.hex()}))
        assert (await peer.frame()).type is FrameType.READY
        return peer

    async def frame(self) -> lf.Frame:
        async with asyncio.timeout(WAIT_S):
            while True:
                data = await self.reader.read(65536)
                assert data, "connection closed"
                self.received += data
                frames = self.decoder.feed(data)
                if frames:
                    return frames[0]

    async def wait_eof(self) -> None:
        async with asyncio.timeout(WAIT_S):
            while data := await self.reader.read(65536):
                self.received += data


# -- handshake


async def test_handshake_names_both_sides(start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    link = await open_link(server)
    [accepted] = await server.link_count(1)
    assert link.peer_node == "a"
    assert accepted.peer_node == "b"
    assert await link.call("echo", {"x": 1}) == {"from": "a", "caller": "b", "body": {"x": 1}}
    assert await accepted.call("echo", [1, 2]) == {"from": "b", "caller": "a", "body": [1, 2]}
    await link.close()


async def test_wrong_secret_is_refused_on_both_sides(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    with pytest.raises(AuthenticationFailed) as refused:
        await open_link(server, replace(CLIENT, secret=b"another secret"))
    assert "cluster secrets differ" in str(refused.value)
    assert "\n" not in str(refused.value)
    async with asyncio.timeout(WAIT_S):
        while not server.refused:
            await asyncio.sleep(0.01)
    assert isinstance(server.refused[0], AuthenticationFailed)
    assert server.links == []


async def test_the_secret_never_crosses_the_wire(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    peer = await RawPeer.open(server.port)
    await server.link_count(1)
    await server.links[0].close()
    await peer.wait_eof()
    assert SECRET not in peer.received
    assert SECRET.hex().encode() not in peer.received


async def test_wrong_cluster_name_is_refused(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    with pytest.raises(ClusterMismatch, match="cluster 'c2'"):
        await open_link(server, replace(CLIENT, cluster="c2"))
    async with asyncio.timeout(WAIT_S):
        while not server.refused:
            await asyncio.sleep(0.01)
    assert isinstance(server.refused[0], ClusterMismatch)


async def test_own_node_name_is_refused(start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    with pytest.raises(NodeNameRejected):
        await open_link(server, replace(CLIENT, node="a"))


async def test_other_protocol_version_is_refused(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    newer = {**hello(CLIENT, os.urandom(32)), "version": PROTOCOL_VERSION + 1}
    writer.write(lf.encode_json(FrameType.HELLO, newer))
    peer = RawPeer(reader, writer)
    close = lf.decode_json(await peer.frame())
    assert close["code"] == "version"
    await peer.wait_eof()
    writer.close()


async def test_an_amqp_client_on_the_cluster_port_is_dropped(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server(replace(SERVER, handshake_timeout_s=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"AMQP\x00\x00\x09\x01")  # 8 bytes, then the client waits for an answer
    await RawPeer(reader, writer).wait_eof()
    assert "no handshake within 0.3 s" in str(server.refused[0])
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n")  # a length header of 1.2 GB: refused at once
    await RawPeer(reader, writer).wait_eof()
    assert "exceeds the limit" in str(server.refused[1])
    writer.close()


# -- calls and chunks


async def test_many_concurrent_calls_correlate(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    link = await open_link(server)
    bodies = [{"n": n, "delay": (n * 7 % 10) / 1000} for n in range(500)]
    replies = await asyncio.gather(*(link.call("echo", body) for body in bodies))
    assert [reply["body"] for reply in replies] == bodies
    assert link.outstanding_calls == 0
    await link.close()


async def test_remote_failures_and_timeouts_are_typed(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    link = await open_link(server)
    with pytest.raises(RemoteError) as failed:
        await link.call("fail")
    assert failed.value.error_type == "ValueError"
    with pytest.raises(RemoteError, match="no handler"):
        await link.call("nobody-answers-this")
    with pytest.raises(CallTimeout):
        await link.call("echo", {"delay": 1}, timeout=0.05)
    assert (await link.call("echo", 1))["body"] == 1  # the late reply is dropped
    await link.close()


async def test_one_way_messages_arrive_in_order(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    handlers = echo_handlers()
    got: list[Any] = []

    async def note(link: Link, body: Any) -> None:
        got.append(body)

    handlers.on_message("note", note)
    server = await start_server(handlers=handlers)
    link = await open_link(server)
    for n in range(200):
        await link.send("note", n)
    await link.call("echo")  # after every message before it
    assert got == list(range(200))
    await link.close()


async def test_a_tunnel_flushed_now_is_on_the_socket_before_the_turn_ends(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    """A tunnel's bytes wait for the end of the turn, unless flushed (a replicated quorum
    queue's deliveries to a forwarded consumer, written in the callback that committed them:
    a process stopped after it must not send them on waking, issue 28)."""
    server = await start_server()
    peer = await RawPeer.open(server.port)
    (link,) = await server.link_count(1)
    fd = peer.writer.get_extra_info("socket").fileno()

    def readable() -> bool:
        return bool(select.select([fd], [], [], 0.2)[0])

    transport = TunnelTransport(link, 5, lambda: None)
    transport.write(b"deliveries")  # no await from here on: the loop's turn goes on
    assert not readable()  # queued for the end of the turn
    transport.flush()
    assert readable()
    frame = await peer.frame()
    assert frame.type is FrameType.TUNNEL
    await link.close()


async def test_what_one_turn_sends_leaves_in_one_write_in_order(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    """Acknowledgements, commit points and chunks of many logs to one peer in one turn of the
    loop: one write to the socket at the end of the turn, the frames in the order sent, and a
    close right after still delivers them first."""
    handlers = echo_handlers()
    got: list[Any] = []

    async def note(link: Link, body: Any) -> None:
        got.append(body)

    async def on_chunk(link: Link, chunk: Chunk) -> None:
        got.append(chunk.data)

    handlers.on_message("note", note)
    handlers.on_chunk(on_chunk)
    server = await start_server(handlers=handlers)
    link = await open_link(server)
    writes: list[int] = []
    transport_write = link._writer.write  # (a spy: the real write still runs)

    def write(data: bytes) -> None:
        writes.append(len(data))
        transport_write(data)

    link._writer.write = write  # type: ignore[method-assign]
    for n in range(300):  # one turn: no await between them but send_chunk's (not paused)
        link.post("note", n)
        await link.send_chunk("s", 1, b"c%d" % n)
    assert writes == []  # held for the end of the turn
    await asyncio.sleep(0)
    assert len(writes) == 1
    await link.call("echo")
    assert got == [item for n in range(300) for item in (n, b"c%d" % n)]
    got.clear()
    for n in range(3):
        link.post("note", n)
    await link.close()  # what was posted goes before the close
    async with asyncio.timeout(5):
        while len(got) < 3:
            await asyncio.sleep(0.01)
    assert got == [0, 1, 2]


async def test_a_chunk_arrives_byte_identical(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    handlers = echo_handlers()
    chunks: list[Chunk] = []

    async def on_chunk(link: Link, chunk: Chunk) -> None:
        chunks.append(chunk)

    handlers.on_chunk(on_chunk)
    server = await start_server(handlers=handlers)
    link = await open_link(server)
    data = [os.urandom(size) for size in (0, 1, 100_000, 4 * 1024 * 1024 + 3)]
    for epoch, payload in enumerate(data):
        await link.send_chunk("stream-ü", epoch, payload)
    await link.call("echo")
    assert chunks == [Chunk(epoch, "stream-ü", payload) for epoch, payload in enumerate(data)]
    with pytest.raises(ValueError, match="frame limit"):
        await link.send_chunk("s", 1, bytes(CLIENT.max_payload))
    await link.close()


# -- bad frames close that link only


BAD_FRAMES = {  # the bytes, and what the closed link's reason says
    "malformed": (lf.encode(FrameType.REQUEST, b"{not json"), "not JSON"),
    "nested too deep": (lf.encode(FrameType.MESSAGE, b"[" * 100_000), "not JSON"),
    "request without id": (lf.encode_json(FrameType.REQUEST, {"kind": "echo"}),
                           "lacks a valid 'id'"),
    "handshake frame later": (lf.encode_json(FrameType.HELLO, {}), "HELLO frame after"),
    "unknown type": (b"\x00\x00\x00\x02\x63" + b"\x00" * 4 + b"hi", "unknown frame type 99"),
    "too large": ((2**31).to_bytes(4, "big") + bytes([FrameType.CHUNK]) + b"\x00" * 4,
                  "2147483648 bytes exceeds the limit"),
    "bad crc": (lf.encode_json(FrameType.MESSAGE, {"kind": "x"})[:-2] + b"y}", "bad CRC"),
}


@pytest.mark.parametrize("bad", BAD_FRAMES, ids=str)
async def test_a_bad_frame_closes_that_link_only(
        start_server: Callable[..., Awaitable[Server]], bad: str) -> None:
    server = await start_server()
    good = await open_link(server)
    peer = await RawPeer.open(server.port)
    [_, accepted] = await server.link_count(2)
    data, reason = BAD_FRAMES[bad]
    peer.writer.write(data)  # a too-large header comes with no body at all
    await peer.wait_eof()
    async with asyncio.timeout(WAIT_S):
        await accepted.wait_closed()
    assert reason in str(accepted.close_reason)
    assert b'"code":"frame"' in peer.received  # the peer is told why
    assert (await good.call("echo", "still here"))["body"] == "still here"
    assert len(server.server.links) == 1
    await good.close()


async def test_a_silent_peer_is_dropped(start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server(replace(SERVER, **FAST_BEATS))
    peer = await RawPeer.open(server.port)
    [accepted] = await server.link_count(1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await peer.wait_eof()  # the raw peer never sends a heartbeat
    assert 0.15 <= loop.time() - started < 2
    assert "heartbeat" in str(accepted.close_reason)
    assert lf.encode(FrameType.HEARTBEAT) in peer.received


async def test_heartbeats_keep_an_idle_link_up(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server(replace(SERVER, **FAST_BEATS))
    link = await open_link(server, replace(CLIENT, **FAST_BEATS))
    await asyncio.sleep(0.6)
    assert not link.closed
    assert (await link.call("echo", 1))["body"] == 1
    await link.close()


async def test_outstanding_calls_fail_with_link_closed(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    handlers = echo_handlers()
    never = asyncio.Event()

    async def hang(link: Link, body: Any) -> Any:
        await never.wait()

    handlers.on_request("hang", hang)
    server = await start_server(handlers=handlers)
    link = await open_link(server)
    [accepted] = await server.link_count(1)
    calls = [asyncio.create_task(link.call("hang")) for _ in range(20)]
    async with asyncio.timeout(WAIT_S):
        while link.outstanding_calls < 20:
            await asyncio.sleep(0.01)
    await accepted.close("going away")
    for call in calls:
        with pytest.raises(LinkClosed, match="going away"):
            await call
    with pytest.raises(LinkClosed):
        await link.call("echo")

    local = await open_link(server)
    pending = asyncio.create_task(local.call("hang"))
    await asyncio.sleep(0.05)
    await local.close()
    with pytest.raises(LinkClosed):
        await pending


async def test_a_slow_reader_holds_the_sender_back(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    handlers = echo_handlers()
    received = 0

    async def slow(link: Link, chunk: Chunk) -> None:
        nonlocal received
        received += len(chunk.data)
        await asyncio.sleep(0.01)

    handlers.on_chunk(slow)
    server = await start_server(handlers=handlers)
    high_water = 256 * 1024
    link = await open_link(server, replace(CLIENT, write_high_water=high_water))
    [accepted] = await server.link_count(1)
    data = bytes(64 * 1024)
    frame = len(lf.encode_chunk(0, "s", data))
    sent = 0
    most_buffered = most_received_buffered = 0

    async def send_forever() -> None:
        nonlocal sent, most_buffered
        while True:
            await link.send_chunk("s", 0, data)
            sent += len(data)
            most_buffered = max(most_buffered, link.buffered_bytes)

    sender = asyncio.create_task(send_forever())
    for _ in range(100):
        await asyncio.sleep(0.01)
        most_buffered = max(most_buffered, link.buffered_bytes)
        most_received_buffered = max(most_received_buffered, accepted.buffered_bytes)
    sender.cancel()
    # at about 6.4 MB/s read, 1 s: a sender with no backpressure would be far beyond this
    assert most_buffered <= high_water + frame
    assert most_received_buffered <= 2 * frame + 256 * 1024
    assert sent - received < 32 * 1024 * 1024, "the kernel's buffers and ours, no more"
    assert received > 0
    await link.close()


# -- the sans-IO decoder


def valid_stream(sizes: list[int]) -> tuple[bytes, list[lf.Frame]]:
    frames = [lf.Frame(FrameType.MESSAGE, bytes([n % 256]) * n) for n in sizes]
    frames.append(lf.Frame(FrameType.HEARTBEAT, b""))
    return b"".join(lf.encode(f.type, f.payload) for f in frames), frames


@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
@settings(max_examples=300, deadline=None)
def test_random_bytes_only_ever_give_a_typed_error(data: bytes, step: int) -> None:
    decoder = FrameDecoder(max_payload=1024)
    for at in range(0, len(data), step):
        for frame in decoder.feed(data[at:at + step]):
            for parse in (lf.decode_json, lambda f: lf.decode_chunk(f.payload)):
                try:
                    parse(frame)
                except FrameError:
                    pass
    assert decoder.error is None or isinstance(decoder.error, FrameError)
    assert len(decoder) <= 1024 + lf.HEADER_SIZE + step


@given(st.binary(max_size=300))
def test_random_payloads_only_ever_give_a_typed_error(payload: bytes) -> None:
    for frame_type in FrameType:
        frame = lf.Frame(frame_type, payload)
        for parse in (lf.decode_json, lambda f: lf.decode_chunk(f.payload)):
            try:
                parse(frame)
            except FrameError:
                pass


@given(st.lists(st.integers(min_value=0, max_value=300), max_size=8), st.data())
def test_a_valid_stream_decodes_the_same_in_any_pieces(sizes: list[int], data: Any) -> None:
    stream, frames = valid_stream(sizes)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    got: list[lf.Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += decoder.feed(stream[start:end])
    assert got == frames
    assert decoder.error is None
    assert len(decoder) == 0


def test_an_oversized_length_is_refused_before_its_body() -> None:
    decoder = FrameDecoder(max_payload=100)
    header = (101).to_bytes(4, "big") + bytes([FrameType.MESSAGE]) + b"\x00" * 4
    frames = decoder.feed(lf.encode(FrameType.HEARTBEAT) + header)  # no body follows
    assert frames == [lf.Frame(FrameType.HEARTBEAT, b"")]
    assert isinstance(decoder.error, lf.FrameTooLarge)
    assert decoder.feed(b"anything") == []
    assert len(decoder) == 0


def test_a_chunk_frame_round_trips() -> None:
    data = os.urandom(1000)
    [frame] = FrameDecoder().feed(lf.encode_chunk(2**40, "s/1", memoryview(data)))
    assert lf.decode_chunk(frame.payload) == Chunk(2**40, "s/1", data)


async def test_a_server_that_never_answers_times_the_handshake_out() -> None:
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(WAIT_S)
        writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with pytest.raises(HandshakeError, match=r"no handshake within 0\.2 s"):
        await connect("127.0.0.1", port, replace(CLIENT, handshake_timeout_s=0.2), Handlers())
    server.close()


async def test_closing_a_link_whose_peer_reads_nothing_does_not_hang(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server(replace(SERVER, close_grace_s=0.3))
    peer = await RawPeer.open(server.port)  # and then it reads nothing
    [accepted] = await server.link_count(1)

    async def flood() -> None:
        while True:
            await accepted.send_chunk("s", 0, bytes(1024 * 1024))

    sender = asyncio.create_task(flood())
    await asyncio.sleep(0.3)
    assert not sender.done()  # held back by the peer's full window
    async with asyncio.timeout(2):
        await accepted.close()
    with pytest.raises(LinkClosed):
        await sender
    peer.writer.close()


async def test_calls_and_requests_in_flight_are_bounded(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    handlers = echo_handlers()
    release = asyncio.Event()
    running = most_running = 0

    async def hold(link: Link, body: Any) -> Any:
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        await release.wait()
        running -= 1
        return body

    handlers.on_request("hold", hold)
    server = await start_server(replace(SERVER, max_concurrent_requests=3), handlers)
    link = await open_link(server, replace(CLIENT, max_outstanding_calls=5))
    calls = [asyncio.create_task(link.call("hold", n)) for n in range(20)]
    await asyncio.sleep(0.2)
    assert link.outstanding_calls == 5  # the other 15 wait for a slot before sending
    assert most_running == 3  # the peer reads no more requests while 3 are running
    release.set()
    assert await asyncio.gather(*calls) == list(range(20))
    assert most_running == 3
    await link.close()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this host")
async def test_the_default_listener_takes_ipv6_and_ipv4(
        start_server: Callable[..., Awaitable[Server]]) -> None:
    server = await start_server()
    assert server.server.host == "::"
    for host in ("::1", "127.0.0.1"):
        try:
            link = await connect(host, server.port, CLIENT, echo_handlers())
        except OSError as exc:  # a container may have IPv6 sockets but no ::1
            if host == "::1":
                continue
            raise exc
        assert (await link.call("echo", host))["body"] == host
        await link.close()
