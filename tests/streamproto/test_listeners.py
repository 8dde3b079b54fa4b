"""The stream listeners' settings: TLS on stream_tls_port with the broker's certificate,
the advertised host and port that Open and Metadata announce, and a disabled listener."""

from __future__ import annotations

import asyncio
import ssl
import struct
import subprocess
from pathlib import Path

import pytest
from rstream import AMQPMessage, Consumer, MessageContext, Producer, amqp_decoder
from support.brokers import BrokerProcess
from support.ports import free_port, wait_for_port

from .conftest import start_stream_broker
from .raw import RawStream, s


def self_signed(directory: Path) -> tuple[Path, Path]:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem",
         "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        cwd=directory, check=True, capture_output=True)
    return directory / "cert.pem", directory / "key.pem"


@pytest.mark.asyncio
async def test_tls_listener(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    process = BrokerProcess(tmp_path / "data", args=[
        "--stream-port", str(free_port()), "--stream-tls-port", str(tls_port),
        "--stream-advertised-host", "localhost"],
        env={"LEVERET_TLS_CERTFILE": str(cert), "LEVERET_TLS_KEYFILE": str(key)}).start()
    try:
        wait_for_port(tls_port, 30)
        context = ssl.create_default_context(cafile=str(cert))
        got: list[bytes] = []

        async def on(message: AMQPMessage, context_: MessageContext) -> None:
            got.append(bytes(message.body))

        async with Producer("localhost", port=tls_port, ssl_context=context,
                            username="guest", password="guest") as p:
            await p.create_stream("secure")
            await p.send_wait("secure", AMQPMessage(body=b"over tls"))
        async with Consumer("localhost", port=tls_port, ssl_context=context,
                            username="guest", password="guest") as c:
            await c.subscribe("secure", on, decoder=amqp_decoder)
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.05)
        assert got == [b"over tls"]
    finally:
        process.kill()


def test_advertised_host_and_port(tmp_path: Path) -> None:
    broker = start_stream_broker(tmp_path / "data", "--stream-advertised-host", "streams.example",
                                 "--stream-advertised-port", "15552")
    try:
        client = RawStream(broker.stream_port)
        assert client.handshake() == 1
        assert client.open_properties == {"advertised_host": "streams.example",
                                          "advertised_port": "15552"}
        client.request(0x0F, struct.pack(">i", 1) + s("nothing"))
        frame = client.next(0x800F)
        count, ref, size = struct.unpack(">iHh", frame[8:16])
        host = frame[16 : 16 + size].decode()
        port = struct.unpack(">I", frame[16 + size : 20 + size])[0]
        assert (count, ref, host, port) == (1, 0, "streams.example", 15552)
        rest = frame[20 + size :]
        assert struct.unpack(">i", rest[:4])[0] == 1
        assert struct.unpack(">H", rest[4 + 2 + 7 : 4 + 2 + 7 + 2])[0] == 2  # no such stream
    finally:
        broker.process.kill()


def test_zero_disables_the_listener(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data").start()  # the test brokers pass --stream-port 0
    try:
        log = process.log()
        assert "listening for the stream protocol" not in log
    finally:
        process.kill()
