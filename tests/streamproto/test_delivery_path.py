"""The delivery path with big chunks (docs/STREAM-PROTOCOL.md, "Delivery path"): chunks over
128 KB are sent from the mapped segment with one writev, through a socket that cannot take
them at once, one chunk per credit, each with the CRC-32 clients check; an AMQP 0.9.1 consumer
of the same chunks afterwards still reads them; and output.Writer sends big pieces in order
whichever way it writes them."""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib
from collections.abc import Iterator

import pika
import pytest
from support.brokers import BrokerProcess
from support.ports import free_port, wait_for_port

from leveret.broker.streamproto import output

from .conftest import StreamBroker
from .raw import RawStream, s, strmap
from .test_raw_protocol import create_and_declare
from .test_stream_entries import amqp10, confirmed, publish_frame

MESSAGES = 1500  # ~ 190 KB of entries: a chunk over the reader's BIG_CHUNK_BYTES


@pytest.fixture(scope="module")
def lev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamBroker]:
    """A broker whose chunks start at 2,048 records (stream_chunk_min_records): each Publish
    frame of MESSAGES is one big chunk."""
    port = free_port()
    process = BrokerProcess(tmp_path_factory.mktemp("big") / "data",
                            args=["--stream-port", str(port)],
                            env={"LEVERET_STREAM_CHUNK_MIN_RECORDS": "2048"}).start()
    wait_for_port(port, 30)
    yield StreamBroker(process, port)
    process.kill()


def _deliver(client: RawStream) -> tuple[int, int, bytes]:
    """(first offset, entry count, data) of the next Deliver, its CRC checked."""
    frame = client.next(0x08)
    head = struct.unpack_from(">BBHIqQQIIIB3x", frame, 5)
    data = frame[5 + 48 : 5 + 48 + head[8]]
    assert zlib.crc32(data) == head[7]
    return head[6], head[2], data


def _entries(messages: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def test_big_chunks_one_per_credit_through_a_small_socket_buffer(lev: StreamBroker,
                                                                 name: str) -> None:
    publisher = lev.raw()
    create_and_declare(publisher, name)
    batches: list[list[bytes]] = []
    for b in range(4):
        messages = [amqp10(b"big-%d-%05d-" % (b, i) + b"y" * 100) for i in range(MESSAGES)]
        if b == 2:
            messages = [amqp10(b"small")]  # a small chunk among the big ones
        publish_frame(publisher, sum(map(len, batches)) + 1, messages)
        assert len(confirmed(publisher, len(messages))) == len(messages)
        batches.append(messages)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lev.amqp_port))
    connection.channel().basic_publish("", name, b"from 0.9.1")  # a USER chunk at the end
    connection.close()

    client = RawStream.__new__(RawStream)  # a receive buffer far smaller than one chunk
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", lev.stream_port))
    client.sock, client.buf, client.corr, client.open_properties = sock, b"", 0, {}
    client.handshake()
    client.request(0x07, struct.pack(">B", 1) + s(name) + struct.pack(">HH", 1, 1)
                   + strmap({}))  # credit 1
    assert client.response(0x07)[1] == 1
    got = []
    for _ in range(5):
        got.append(_deliver(client))
        # no credit left: the next frame is the answer to this request, not a Deliver
        client.request(0x0B, s("nobody") + s(name))  # QueryOffset
        frame = client.read_frame()
        assert struct.unpack(">H", frame[:2])[0] == 0x0B | 0x8000
        client.send(0x09, 1, struct.pack(">BH", 1, 1))  # Credit 1
    firsts = [0, MESSAGES, 2 * MESSAGES, 2 * MESSAGES + 1, 3 * MESSAGES + 1]
    assert [(first, count) for first, count, _ in got] == [
        (f, len(m)) for f, m in zip(firsts, [*batches, [b""]], strict=True)]
    for (_first, _count, data), messages in zip(got, batches, strict=False):
        assert data == _entries(messages)
    client.close()

    # an AMQP 0.9.1 consumer of the same chunks (now cached as views of the mapped segment)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", lev.amqp_port))
    ch = connection.channel()
    ch.basic_qos(prefetch_count=2000)
    bodies = []
    for method, _properties, body in ch.consume(name, arguments={"x-stream-offset": "first"},
                                                inactivity_timeout=10):
        assert method is not None
        bodies.append(body)
        ch.basic_ack(method.delivery_tag, multiple=True)
        if len(bodies) == 3 * MESSAGES + 2:
            break
    connection.close()
    assert bodies[0] == b"big-0-00000-" + b"y" * 100
    assert bodies[2 * MESSAGES] == b"small"
    assert bodies[-2] == b"big-3-%05d-" % (MESSAGES - 1) + b"y" * 100
    assert bodies[-1] == b"from 0.9.1"


class _Sink(asyncio.Protocol):
    """The server side of a connection: hands its transport to the test."""

    def __init__(self, ready: asyncio.Future[asyncio.Transport]) -> None:
        self.ready = ready

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ready.set_result(transport)  # type: ignore[arg-type]


def _send_through(tls: bool, pieces: list[bytes], *, queued: bytes = b"") -> bytes:
    """What a client reads after a Writer (tls: its fallback path) sends `pieces`, after
    `queued` was left in the transport's buffer."""

    async def run() -> bytes:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[asyncio.Transport] = loop.create_future()
        server = await loop.create_server(lambda: _Sink(ready), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.setblocking(False)
        transport = await ready
        transport.set_write_buffer_limits(high=1 << 30)  # everything stays queued
        if queued:
            transport.write(queued)
        total = output.Writer(transport, tls).write(pieces)
        assert total == sum(map(len, pieces))
        received = bytearray()
        expected = len(queued) + total
        while len(received) < expected:
            try:
                data = client.recv(1 << 16)
            except BlockingIOError:
                await asyncio.sleep(0)
                continue
            assert data
            received += data
        client.close()
        transport.close()
        server.close()
        await server.wait_closed()
        return bytes(received)

    return asyncio.run(run())


def test_the_writer_sends_big_and_small_pieces_in_order() -> None:
    pieces = [b"head-1", bytes(range(256)) * 2000, b"head-2", b"h3", b"z" * 700_000, b"tail"]
    expected = b"".join(pieces)
    assert _send_through(False, pieces) == expected  # one writev, the rest buffered
    assert _send_through(True, pieces) == expected  # big pieces alone, small ones joined
    queued = b"q" * 3_000_000  # the socket cannot take it: the writer must not jump it
    assert _send_through(False, pieces, queued=queued) == queued + expected
    assert _send_through(False, [memoryview(pieces[1])[5:]]) == pieces[1][5:]
