"""connection.update-secret with real clients (issues 13 and 29), on Leveret and the reference
RabbitMQ alike.

A client that renews its credentials mid-stream sends connection.update-secret on channel 0 and
waits for update-secret-ok; its channels, consumers and any content on its way stay as they
were. RabbitMQ hands the new secret only to the auth backends whose credentials expire
(rabbit_access_control:update_state skips those whose expiry is `never`), and closes the
connection with 530 "New secret was refused by one of the backends" when one refuses it. Its
internal user database never expires, so for an internal user any secret is taken, even one that
is not the password; Leveret's users are that database, and both brokers answer the same.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import aio_pika
import pika
import pytest
from pamqp import commands, frame
from pamqp.header import ContentHeader
from support.brokers import InProcessBroker
from support.rawamqp import FRAME_BODY, RawClient, raw_frame

from leveret.broker.access.auth import Permission

if TYPE_CHECKING:
    from e2e.conftest import Amqp
    from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

pytestmark = pytest.mark.reference


class Consumer:
    """A pika consumer on its own channel, and what it received."""

    def __init__(self, conn: BlockingConnection, queue: str) -> None:
        self.conn = conn
        self.channel: BlockingChannel = conn.channel()
        self.bodies: list[bytes] = []
        self.tag = self.channel.basic_consume(queue, self._on_message, auto_ack=True)

    def _on_message(self, _ch: object, _method: object, _props: object, body: bytes) -> None:
        self.bodies.append(body)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while len(self.bodies) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"got {self.bodies!r}, expected {count} messages")
            self.conn.process_data_events(time_limit=0.1)
        return self.bodies


def consuming(mq: Amqp) -> tuple[BlockingConnection, Consumer, BlockingChannel, str]:
    """A connection with a consumer on one channel and a publisher on another; one message
    has gone through already."""
    conn = mq.connection()
    publisher = conn.channel()
    queue = mq.uid("secret")
    publisher.queue_declare(queue, auto_delete=True)
    consumer = Consumer(conn, queue)
    publisher.basic_publish("", queue, b"before")
    assert consumer.wait_for(1) == [b"before"]
    return conn, consumer, publisher, queue


def test_pika_consumer_keeps_receiving_after_update_secret(mq: Amqp) -> None:
    conn, consumer, publisher, queue = consuming(mq)
    conn.update_secret("guest", "credentials rotated")
    publisher.basic_publish("", queue, b"after")
    assert consumer.wait_for(2) == [b"before", b"after"]
    assert consumer.channel.is_open and publisher.is_open
    conn.update_secret("guest", "and again")  # any number of times
    publisher.basic_publish("", queue, b"again")
    assert consumer.wait_for(3) == [b"before", b"after", b"again"]
    assert mq.counts(queue) == (0, 1)  # still the one consumer, nothing left behind


def test_pika_any_secret_of_an_internal_user_is_taken(mq: Amqp) -> None:
    """Not the password, and not even a password: update-secret-ok, and the connection, its
    consumer and its publisher go on (a client that refreshes a token keeps its connection)."""
    conn, consumer, publisher, queue = consuming(mq)
    conn.update_secret("not-the-password", "r")
    publisher.basic_publish("", queue, b"after")
    assert consumer.wait_for(2) == [b"before", b"after"]
    conn.update_secret("", "an empty secret too")
    publisher.basic_publish("", queue, b"again")
    assert consumer.wait_for(3) == [b"before", b"after", b"again"]
    assert conn.is_open and consumer.channel.is_open and publisher.is_open
    assert mq.counts(queue) == (0, 1)


async def test_aio_pika_consumer_keeps_receiving_after_update_secret(
    target: tuple[str, int],
) -> None:
    _name, port = target
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("", exclusive=True)
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await received.put(message.body)
            await message.ack()

        await queue.consume(on_message)
        publisher = await connection.channel()
        await publisher.default_exchange.publish(aio_pika.Message(b"before"), queue.name)
        assert await asyncio.wait_for(received.get(), 5) == b"before"
        reply = await connection.update_secret("guest", reason="token refreshed")
        assert isinstance(reply, commands.Connection.UpdateSecretOk)
        await publisher.default_exchange.publish(aio_pika.Message(b"after"), queue.name)
        assert await asyncio.wait_for(received.get(), 5) == b"after"
        assert not channel.is_closed


@pytest.fixture(params=["leveret", "rabbitmq"])
def rotor(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, int, str, Callable[[str], None]]]:
    """(broker name, port, user, change_password(new)): a new user with password 'old' and
    every permission on '/', on Leveret or on the reference RabbitMQ."""
    user = f"rotor-{uuid.uuid4().hex[:8]}"
    if request.param == "rabbitmq":
        ref = request.getfixturevalue("reference")
        ref.ctl("add_user", user, "old")
        ref.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
        yield "rabbitmq", ref.port, user, lambda new: ref.ctl("change_password", user, new)
        ref.ctl("delete_user", user)
        return
    server = InProcessBroker(tmp_path / "data").start()

    def add() -> None:
        server.broker.add_user(user, "old")
        server.broker.set_permissions(user, "/", Permission())

    server.call(add)
    yield "leveret", server.port, user, lambda new: server.call(
        lambda: server.broker.add_user(user, new)
    )
    server.stop()


def test_secret_after_a_password_change(
    rotor: tuple[str, int, str, Callable[[str], None]],
) -> None:
    """The password changes while the client is connected, and it renews with the new one;
    then it sends the old one: both brokers take both, and the connection goes on."""
    _name, port, user, change_password = rotor
    credentials = pika.PlainCredentials(user, "old")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, "/", credentials))
    try:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        change_password("new")
        conn.update_secret("new", "rotated")
        channel.basic_publish("", queue, b"m")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"m"
        conn.update_secret("old", "stale")
        assert channel.basic_get(queue, auto_ack=True)[0] is None
        channel.basic_publish("", queue, b"still")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"still"
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.parametrize("secret", ["guest", "wrong"])
def test_update_secret_between_a_content_header_and_its_body(
    target: tuple[str, int], secret: str
) -> None:
    """Channel 0 frames may come between a publish's frames: the publish completes."""
    _name, port = target
    with RawClient(port) as client:
        client.handshake()
        client.open_channel(1)
        client.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        queue = client.expect(commands.Queue.DeclareOk, 1).queue
        client.send(
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
            + frame.marshal(ContentHeader(0, 4, commands.Basic.Properties()), 1)
        )
        client.send_method(0, commands.Connection.UpdateSecret(new_secret=secret, reason="r"))
        client.expect(commands.Connection.UpdateSecretOk, 0)
        client.send(raw_frame(FRAME_BODY, 1, b"body"))
        client.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        assert client.expect(commands.Basic.GetOk, 1).routing_key == queue
        assert client.next_frame().type == 2  # the content header, then the body
        assert client.next_frame().payload == b"body"
        client.close_connection()
