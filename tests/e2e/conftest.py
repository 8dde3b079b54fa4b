"""Fixtures for the classic-broker end-to-end tests: one client helper per broker.

`mq` runs a test against both targets (Leveret and the reference RabbitMQ, through the shared
`target` fixture); `lev` runs it against Leveret only. Both give an `Amqp`: pika connections
that are closed after the test, unique names (the reference broker is shared by the whole
session, so every name gets a uuid suffix and is deleted afterwards), helpers that capture a
broker's close code and text, and a raw frame-level client for what pika hides (the exact
order of frames, the multiple flag of confirms, empty consumer tags: support.rawamqp's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from support.brokers import InProcessBroker
from support.rawamqp import RawClient, open_client
from support.reference import Reference, running, start_consistent_hash_reference

T = TypeVar("T")


class Amqp:
    """One test's access to one broker."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self._connections: list[BlockingConnection] = []
        self._raw: list[RawClient] = []
        self._names: list[str] = []
        self._default: BlockingConnection | None = None

    @property
    def is_leveret(self) -> bool:
        return self.name == "leveret"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def uid(self, prefix: str = "t") -> str:
        """A name no other test uses; the queue or exchange is deleted after the test."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self._names.append(name)
        return name

    def connection(self) -> BlockingConnection:
        params = pika.ConnectionParameters(
            "127.0.0.1", self.port, blocked_connection_timeout=10, socket_timeout=10
        )
        conn = pika.BlockingConnection(params)
        self._connections.append(conn)
        return conn

    def channel(self, confirm: bool = False) -> BlockingChannel:
        """A new channel on the test's default connection (opened on first use)."""
        if self._default is None or not self._default.is_open:
            self._default = self.connection()
        ch = self._default.channel()
        if confirm:
            ch.confirm_delivery()
        return ch

    def raw(self) -> RawClient:
        """A raw frame-level client past the handshake, with channel 1 open."""
        client = open_client(self.port)
        self._raw.append(client)
        return client

    # -- assertions helpers -------------------------------------------------------------------

    @staticmethod
    def soft_error(call: Callable[[], Any]) -> tuple[int, str]:
        """Run a call that the broker must answer with channel.close; (code, text)."""
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            call()
        return info.value.reply_code, info.value.reply_text

    @staticmethod
    def hard_error(call: Callable[[], Any]) -> tuple[int, str]:
        """Run a call that the broker must answer with connection.close; (code, text)."""
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            call()
        return info.value.reply_code, info.value.reply_text

    @staticmethod
    def drain(ch: BlockingChannel, queue: str) -> list[bytes]:
        """Every ready message of a queue, by basic.get with auto-ack, in order."""
        bodies = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)

    @staticmethod
    def wait(probe: Callable[[], T], timeout: float = 3.0, interval: float = 0.02) -> T:
        """Poll until probe() returns something truthy; fail after the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
            time.sleep(interval)

    def ready(self, queue: str) -> int:
        """A queue's ready-message count, from a passive declare on a fresh channel."""
        return self.counts(queue)[0]

    def counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue, from a passive declare on a fresh channel.

        RabbitMQ answers a declare ahead of publishes, acks and requeues still on their way
        to the queue: poll with `wait` after anything asynchronous.
        """
        ch = self.channel()
        try:
            method = ch.queue_declare(queue, passive=True).method
            return int(method.message_count), int(method.consumer_count)
        finally:
            ch.close()

    def exists(self, kind: str, name: str) -> bool:
        ch = self.channel()
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            assert error.reply_code == 404, error
            return False
        ch.close()
        return True

    # -- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        for client in self._raw:
            client.close()
        for conn in self._connections:
            if conn.is_open:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - a broken connection is gone anyway
                    pass
        if self._names and not self.is_leveret:
            self._clean_up()

    def _clean_up(self) -> None:
        """Delete what the test may have left on the shared reference broker."""
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        try:
            ch = conn.channel()
            for name in self._names:
                ch.queue_delete(name)
                ch.exchange_delete(name)
        finally:
            conn.close()


@pytest.fixture
def mq(target: tuple[str, int]) -> Iterator[Amqp]:
    """A differential client: the test runs once against Leveret, once against RabbitMQ."""
    client = Amqp(*target)
    yield client
    client.close()


@pytest.fixture
def lev(broker: InProcessBroker) -> Iterator[Amqp]:
    """A client of a fresh in-process Leveret only."""
    client = Amqp("leveret", broker.port)
    yield client
    client.close()


# -- the hash exchanges' differential tests ------------------------------------------------------


@pytest.fixture(scope="session")
def chx_reference() -> Iterator[Reference]:
    """RabbitMQ 3.10 with its consistent-hash and sharding plugins (x-modulus-hash)."""
    yield from running(start_consistent_hash_reference)


class HashBroker:
    """One broker of a hash-exchange differential test: its client, and a restart that keeps
    its data (Leveret: a new in-process broker on the same folder; RabbitMQ: the node)."""

    def __init__(self, name: str, reference: Reference | None, data_dir: Any) -> None:
        self.name = name
        self._reference = reference
        self._data_dir = data_dir
        self._server: InProcessBroker | None = None
        if reference is None:
            self._server = InProcessBroker(data_dir).start()
        self.amqp = Amqp(name, self._port())

    def _port(self) -> int:
        return self._server.port if self._server is not None else self._reference.port  # type: ignore[union-attr]

    def restart(self) -> Amqp:
        """Restart the broker; the new client (the old one's connections are closed)."""
        names, self.amqp._names = self.amqp._names, []  # deleted after the test, not now
        self.amqp.close()
        if self._server is not None:
            self._server.stop()
            self._server = InProcessBroker(self._data_dir).start()
        else:
            self._reference.restart()  # type: ignore[union-attr]
        self.amqp = Amqp(self.name, self._port())
        self.amqp._names = names
        return self.amqp

    def close(self) -> None:
        self.amqp.close()
        if self._server is not None:
            self._server.stop()


@pytest.fixture(params=["leveret", "rabbitmq"])
def hash_broker(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[HashBroker]:
    """Leveret, then RabbitMQ 3.10 with the hash exchanges' plugins."""
    reference = request.getfixturevalue("chx_reference") if request.param == "rabbitmq" else None
    target = HashBroker(request.param, reference, tmp_path / "data")
    yield target
    target.close()


@pytest.fixture
def chx(hash_broker: HashBroker) -> Amqp:
    """The client of a hash-exchange differential test."""
    return hash_broker.amqp
