"""Fixtures for the stream-protocol tests: a real `leveret serve` with its stream listener on a
free port (one per module: starting brokers is slow on a shared machine), and a raw client."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import npm
from support.brokers import BrokerProcess
from support.ports import free_port, wait_for_port

from .raw import RawStream


def resolves(name: str) -> set[str]:
    return {str(i[4][0]) for i in socket.getaddrinfo(name, 5552, type=socket.SOCK_STREAM)}


# What the test brokers (listening on 127.0.0.1) announce to a client over loopback
# (broker/streamproto/advertise.py), and so the host their rstream clients dial, as rstream's
# own tests dial `localhost`: a client that dials another name than Metadata announces opens
# other connections for its streams (and closes its first one).
LOOPBACK_NAME = "localhost" if resolves("localhost") == {"127.0.0.1"} else "127.0.0.1"


@dataclass
class StreamBroker:
    process: BrokerProcess
    stream_port: int

    @property
    def amqp_port(self) -> int:
        return self.process.port

    def raw(self, open_: bool = True) -> RawStream:
        client = RawStream(self.stream_port)
        if open_:
            client.handshake()
        return client


def start_stream_broker(data_dir: Path, *args: str) -> StreamBroker:
    port = free_port()
    process = BrokerProcess(data_dir, args=["--stream-port", str(port), *args]).start()
    wait_for_port(port, 30)
    return StreamBroker(process, port)


@pytest.fixture(scope="module")
def lev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamBroker]:
    broker = start_stream_broker(tmp_path_factory.mktemp("lev") / "data")
    yield broker
    broker.process.kill()


@pytest.fixture
def name() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


NODE_DIR = Path(__file__).parent / "node"


@pytest.fixture(scope="session")
def node_client() -> Path:
    """The Node stream client, installed from npm into node/ on first use (or a skip): the
    path of its scenario script."""
    npm.installed(NODE_DIR, "rabbitmq-stream-js-client")
    return NODE_DIR / "scenario.js"
