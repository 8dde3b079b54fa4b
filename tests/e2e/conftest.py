"""Fixtures for the classic-broker end-to-end tests: one client helper per broker.

`mq` runs a test against both targets (Leveret and the reference RabbitMQ, through the shared
`target` fixture); `lev` runs it against Leveret only. Both give an `Amqp`: pika connections
that are closed after the test, unique names (the reference broker is shared by the whole
session, so every name gets a uuid suffix and is deleted afterwards), helpers that capture a
broker's close code and text, and a raw frame-level client for what pika hides (the exact
order of frames, the multiple flag of confirms, empty consumer tags).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pika
import pytest
from pamqp import commands, frame, header
from pamqp import exceptions as pamqp_exceptions
from pamqp.body import ContentBody
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from support.brokers import InProcessBroker

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
        client = RawClient(self.port)
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


class RawClient:
    """A frame-level AMQP client on a plain socket, built with pamqp.

    It opens connection and channel 1 on construction; `send` writes methods, `publish`
    writes a publish with its content, `next` reads one (channel, frame) pair.
    """

    def __init__(self, port: int, capabilities: dict[str, Any] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buffer = b""
        self.sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
        self.expect(commands.Connection.Start)
        caps = {
            "publisher_confirms": True,
            "consumer_cancel_notify": True,
            "basic.nack": True,
            "authentication_failure_close": True,
        }
        caps.update(capabilities or {})
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "leveret-raw-test", "capabilities": caps},
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
        )
        tune = self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self.send(0, commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def send(self, channel: int, method: Any) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        mandatory: bool = False,
        immediate: bool = False,
        channel: int = 1,
        properties: commands.Basic.Properties | None = None,
    ) -> None:
        """Send one publish with its content."""
        data = self.publish_frames(
            exchange,
            routing_key,
            body,
            mandatory=mandatory,
            immediate=immediate,
            channel=channel,
            properties=properties,
        )
        self.sock.sendall(data)

    @staticmethod
    def publish_frames(
        exchange: str,
        routing_key: str,
        body: bytes,
        *,
        mandatory: bool = False,
        immediate: bool = False,
        channel: int = 1,
        properties: commands.Basic.Properties | None = None,
    ) -> bytes:
        """The frames of one publish (method, header, body), to send in a batch."""
        method = commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        )
        content = header.ContentHeader(0, len(body), properties or commands.Basic.Properties())
        return b"".join(
            (
                frame.marshal(method, channel),
                frame.marshal(content, channel),
                frame.marshal(ContentBody(body), channel) if body else b"",
            )
        )

    def next(self, timeout: float = 3.0) -> tuple[int, Any]:
        """The next frame (heartbeats skipped), as (channel, frame value)."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 7:
                size = struct.unpack_from(">I", self.buffer, 3)[0]
                if len(self.buffer) >= size + 8:
                    try:
                        used, channel, value = frame.unmarshal(self.buffer)
                    except pamqp_exceptions.UnmarshalingException as exc:
                        raise AssertionError(f"undecodable frame: {exc}") from None
                    self.buffer = self.buffer[used:]
                    if value.name == "Heartbeat":
                        continue
                    return channel, value
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the broker")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the socket")
            self.buffer += chunk

    def expect(self, kind: type[T], timeout: float = 3.0) -> T:
        _channel, value = self.next(timeout)
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        return value

    def methods(self, count: int, timeout: float = 3.0) -> list[Any]:
        """The next `count` method frames, skipping content headers and bodies."""
        out: list[Any] = []
        while len(out) < count:
            _channel, value = self.next(timeout)
            if isinstance(value, commands.Basic.Properties | header.ContentHeader):
                continue
            if isinstance(value, ContentBody):
                continue
            out.append(value)
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
