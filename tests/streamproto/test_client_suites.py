"""Scenarios of the stream clients' own test suites, run as they run them (rstream's
tests/test_consumer.py at rabbitmq-community/rstream 1.0.1, for the installed rstream; the Node
client's test/e2e/connection_closed_listener.test.ts), against one `leveret serve` with its
management API, and against RabbitMQ 3.10.8 where it has the feature.

- Single active consumers over a super stream (Leveret only: single active consumer came with
  RabbitMQ 3.11). rstream's test publishes 10,000 messages with `send` (batched every 0.5 s),
  then asserts after 1 s; that window is the client's CPU as much as the broker's, so here the
  check waits for the count, and the publishing client's connections are counted instead: it
  publishes on the connection it dialled (Metadata names `localhost`, test_advertised_host.py),
  where a second connection and a closed locator per partition cost it 0.4 s each.
- A consumer whose connection the management API closes (DELETE /api/connections/{name}), with
  rstream's recovery off and on: no frame, the socket closed, as RabbitMQ's stream reader
  closes it; the close handler runs, and with recovery the consumer comes back and goes on.
  RabbitMQ 3.10.8 too, except for a super stream (3.10.8 answers Partitions with the request's
  key, 0x0019, which rstream cannot decode) and single active consumer (3.11+).
- The Node client (Leveret only: it cannot talk to 3.10, which lacks ExchangeCommandVersions):
  every listener is told once, and `client.restart()` recovers.
- Two scenarios of the Node client's own suite (docs/STREAM-PROTOCOL.md, "The Node client's
  own suite"): single active consumers over a super stream made through the management API,
  as its helpers make them (Leveret only); listings asked for with a trailing slash.
- A client that stops reading does not keep a closed connection alive (RabbitMQ 3.10.8's DELETE
  itself does not return while its reader is blocked sending to such a client)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    EventContext,
    MessageContext,
    OffsetSpecification,
    OffsetType,
    OnClosedErrorInfo,
    Producer,
    Properties,
    RouteType,
    SuperStreamConsumer,
    SuperStreamProducer,
    amqp_decoder,
)
from rstream.client import Client
from rstream.recovery import BackOffRecoveryStrategy
from support.ports import free_port, wait_for_port
from support.reference import Reference

from .conftest import LOOPBACK_NAME, NODE_DIR, StreamBroker, start_stream_broker
from .raw import RawStream, s, strmap


@dataclass
class Target:
    kind: str
    host: str  # what the clients dial: the name the broker announces to them
    stream_port: int
    management_port: int

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self._request("GET", path), timeout=10) as response:
            return json.loads(response.read())

    def delete(self, path: str) -> int:
        with urllib.request.urlopen(self._request("DELETE", path), timeout=10) as response:
            return int(response.status)

    def send(self, method: str, path: str, body: Any) -> int:
        request = self._request(method, path)
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)

    def _request(self, method: str, path: str) -> urllib.request.Request:
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}{path}",
                                         method=method)
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        return request

    def connections(self, name: str) -> list[str]:
        """The management API's names of the connections whose client named them `name`."""
        return [c["name"] for c in self.get("/api/connections")
                if (c.get("client_properties") or {}).get("connection_name") == name]

    def close(self, connection: str) -> None:
        assert self.delete("/api/connections/" + urllib.parse.quote(connection, safe="")) == 204

    def listed(self, connection: str) -> bool:
        try:
            self.get("/api/connections/" + urllib.parse.quote(connection, safe=""))
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        return True


@pytest.fixture(scope="module")
def lev_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    port = free_port()
    broker: StreamBroker = start_stream_broker(tmp_path_factory.mktemp("lev") / "data",
                                               "--management-port", str(port))
    wait_for_port(port, 30)
    yield Target("leveret", LOOPBACK_NAME, broker.stream_port, port)
    broker.process.kill()


@pytest.fixture(params=["leveret", pytest.param("rabbitmq", marks=pytest.mark.reference)])
def target(request: pytest.FixtureRequest, lev_http: Target) -> Target:
    if request.param == "leveret":
        return lev_http
    reference: Reference = request.getfixturevalue("stream_reference")
    return Target("rabbitmq", "localhost", reference.stream_port, reference.management_port)


async def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


async def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """`wait_for` for a check that asks the management API (off the event loop)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


async def close_connections(target: Target, name: str) -> list[str]:
    """rstream's http_api_delete_connection_and_check: wait until the connection named `name`
    is listed, close it through the management API, and wait until it is gone."""
    await wait_until(lambda: bool(target.connections(name)))
    closed = await asyncio.to_thread(target.connections, name)
    for connection in closed:
        await asyncio.to_thread(target.close, connection)
    for connection in closed:
        await wait_until(lambda c=connection: not target.listed(c), 5)  # type: ignore[misc]
    return closed


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def clients(target: Target, cls: Any, **kwargs: Any) -> Any:
    return cls(target.host, port=target.stream_port, vhost="/", username="guest",
               password="guest", **kwargs)


# -- single active consumers over a super stream ------------------------------------------------

@pytest.fixture
async def super_stream(lev_http: Target) -> Any:
    """rstream's conftest fixture: three partitions, keys key1..key3, made by its Client."""
    name = unique("sss")
    client = Client(host=lev_http.host, port=lev_http.stream_port, frame_max=1024 * 1024,
                    heartbeat=60)
    await client.start()
    await client.authenticate(vhost="/", username="guest", password="guest")
    await client.create_super_stream(name, [f"{name}-{i}" for i in range(3)],
                                     ["key1", "key2", "key3"])
    try:
        yield name
    finally:
        await client.delete_super_stream(name)
        await client.close()


@pytest.fixture
def managed_super_stream(lev_http: Target) -> Iterator[str]:
    """The Node client's suite's super stream (its test/support/rabbit.ts createSuperStream),
    made through the management API: an exchange without the `x-super-stream` marker, three
    streams, bound with their index as key and as `x-stream-partition-order` (strings)."""
    name = unique("mss")
    lev_http.send("PUT", f"/api/exchanges/%2F/{name}", {
        "type": "direct", "durable": True, "auto_delete": False,
        "arguments": {"x-super-stream-enabled": "true"}})
    for i in range(3):
        lev_http.send("PUT", f"/api/queues/%2F/{name}-{i}", {
            "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "stream"}})
        lev_http.send("POST", f"/api/bindings/%2F/e/{name}/q/{name}-{i}", {
            "routing_key": str(i), "arguments": {"x-stream-partition-order": str(i)}})
    yield name
    lev_http.delete(f"/api/exchanges/%2F/{name}")
    for i in range(3):
        lev_http.delete(f"/api/queues/%2F/{name}-{i}")


async def routing_extractor(message: AMQPMessage) -> str:
    return "0"


async def routing_extractor_for_sac(message: AMQPMessage) -> str:
    return str(message.properties.message_id)


async def consumer_update_handler_first(is_active: bool,
                                        event_context: EventContext) -> OffsetSpecification:
    return OffsetSpecification(OffsetType.FIRST, 0)


async def run_consumer(consumer: SuperStreamConsumer, super_stream: str, streams: list[str],
                       listener: Any = None) -> None:
    """rstream's tests/util.py run_consumer, with the super stream's name as a parameter."""
    properties: dict[str, str] = defaultdict(str)
    properties["single-active-consumer"] = "true"
    properties["name"] = "consumer-group-1"
    properties["super-stream"] = super_stream
    await consumer.subscribe(
        callback=lambda message, message_context: streams.append(message_context.stream),
        decoder=amqp_decoder, properties=properties, consumer_update_listener=listener)


@pytest.mark.parametrize("members, listener", [(3, None), (4, consumer_update_handler_first)],
                         ids=["all_active", "one_non_active_with_listener"])
async def test_consume_superstream_with_sac(lev_http: Target, super_stream: str, members: int,
                                            listener: Any) -> None:
    """rstream's test_consume_superstream_with_sac_all_active, _one_non_active and
    _with_callback_first: each partition reaches exactly one member of the group, the three
    partitions three members; the fourth member receives nothing."""
    await consume_with_sac(lev_http, super_stream, members, listener)


async def test_consume_superstream_made_through_the_management_api_with_sac(
        lev_http: Target, managed_super_stream: str) -> None:
    """The Node client's "multiple composite consumers with same consumerRef": its super
    stream has no marker, so the members' `super-stream` property names the exchange whose
    bindings give each partition's index (rabbit_stream_manager:partition_index); before,
    one member got every partition."""
    await consume_with_sac(lev_http, managed_super_stream, 3, None)


async def consume_with_sac(lev_http: Target, super_stream: str, members: int,
                           listener: Any) -> None:
    tag = unique("sac")
    consumers = [clients(lev_http, SuperStreamConsumer, frame_max=1024 * 1024, heartbeat=60,
                         super_stream=super_stream, connection_name=f"{tag}-c{i}")
                 for i in range(members)]
    producer = clients(lev_http, SuperStreamProducer, frame_max=1024 * 1024, heartbeat=60,
                       routing=RouteType.Hash, routing_extractor=routing_extractor_for_sac,
                       super_stream=super_stream, connection_name=f"{tag}-p")
    lists: list[list[str]] = [[] for _ in consumers]
    try:
        for consumer in consumers:
            await consumer.start()
        await producer.start()
        for consumer, streams in zip(consumers, lists, strict=True):
            await run_consumer(consumer, super_stream, streams, listener)
        for i in range(10000):
            await producer.send(AMQPMessage(body=bytes(f"a:{i}", "utf-8"),
                                            properties=Properties(message_id=str(i))))
        await wait_for(lambda: sum(map(len, lists)) >= 10000, 20)
        # what arrived before the group changes (as members leave, the next ones take over)
        sets = [set(streams) for streams in lists]
        assert sum(map(len, lists)) == 10000
        # the producer published every partition on the one connection it dialled, and each
        # consumer read its partitions on its own
        assert len(await asyncio.to_thread(lev_http.connections, f"{tag}-p")) == 1
        for i in range(members):
            assert len(await asyncio.to_thread(lev_http.connections, f"{tag}-c{i}")) == 1
    finally:
        await producer.close()
        for consumer in consumers:
            await consumer.close()
    assert sorted(len(s_) for s_ in sets) == [0] * (members - 3) + [1, 1, 1]
    assert set().union(*sets) == {f"{super_stream}-{i}" for i in range(3)}


@pytest.mark.reference
async def test_a_producer_publishes_on_the_connection_it_dialled(target: Target) -> None:
    """A Producer of `localhost` (rstream's test host) publishing to a new stream keeps one
    connection: Metadata names the address it dialled, on both brokers."""
    name, stream = unique("one-conn"), unique("one-conn-s")
    async with clients(target, Producer, connection_name=name) as producer:
        await producer.create_stream(stream)
        try:
            await producer.send_wait(stream, AMQPMessage(body=b"x"))
            await wait_until(lambda: bool(target.connections(name)))
            assert len(await asyncio.to_thread(target.connections, name)) == 1
        finally:
            await producer.delete_stream(stream)


# -- a connection closed through the management API ------------------------------------------

async def test_consumer_connection_broke_with_recovery_disabled(target: Target) -> None:
    """rstream's test of that name: the close handler gets the stream (and closes the
    consumer, as its test does); nothing reconnects."""
    stream, conn_name = unique("broke"), unique("broke-conn")
    closed: list[str] = []
    handled = asyncio.Event()

    async def on_connection_closed(info: OnClosedErrorInfo) -> None:
        closed.extend(info.streams)
        await consumer.close()
        handled.set()

    consumer = clients(target, Consumer, on_close_handler=on_connection_closed,
                       connection_name=conn_name,
                       recovery_strategy=BackOffRecoveryStrategy(False))
    await consumer.start()
    await consumer.create_stream(stream)
    try:
        await consumer.subscribe(stream=stream, callback=lambda *_: None, decoder=amqp_decoder)
        running = asyncio.create_task(consumer.run())
        await close_connections(target, conn_name)
        await asyncio.wait_for(handled.wait(), 10)
        assert closed == [stream]
        await asyncio.wait_for(running, 5)
        assert await asyncio.to_thread(target.connections, conn_name) == []
    finally:
        if not handled.is_set():
            await consumer.close()
        async with clients(target, Producer) as admin:
            await admin.delete_stream(stream)


async def test_consumer_connection_broke_with_recovery_enabled(target: Target) -> None:
    """rstream's test of that name: the consumer reconnects by itself and reads on from where
    it was (offsets 0 then 1, nothing twice)."""
    stream, conn_name = unique("recover"), unique("recover-conn")
    closed: list[str] = []
    offsets: list[int] = []

    async def on_connection_closed(info: OnClosedErrorInfo) -> None:
        closed.extend(info.streams)

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        offsets.append(context.offset)

    async with clients(target, Producer) as producer:
        await producer.create_stream(stream)
        try:
            await producer.send_wait(stream, AMQPMessage(body=b"first"))
            consumer = clients(target, Consumer, on_close_handler=on_connection_closed,
                               connection_name=conn_name,
                               recovery_strategy=BackOffRecoveryStrategy(True, jitter=1))
            await consumer.start()
            try:
                await consumer.subscribe(stream=stream, callback=on_message,
                                         decoder=amqp_decoder)
                running = asyncio.create_task(consumer.run())
                await wait_for(lambda: offsets == [0])
                await close_connections(target, conn_name)
                await producer.send_wait(stream, AMQPMessage(body=b"second"))
                await wait_for(lambda: closed == [stream])
                await wait_until(lambda: len(target.connections(conn_name)) == 1)
                await wait_for(lambda: offsets == [0, 1])
            finally:
                await consumer.close()
            await asyncio.wait_for(running, 5)
            await wait_until(lambda: target.connections(conn_name) == [])
        finally:
            await producer.delete_stream(stream)


async def test_super_stream_consumer_connection_broke_with_recovery_enabled(
        lev_http: Target, super_stream: str) -> None:
    """rstream's test of that name (Leveret only: rstream cannot read 3.10.8's Partitions)."""
    conn_name = unique("ss-recover")
    closed: set[str] = set()
    offsets: list[int] = []

    async def on_connection_closed(info: OnClosedErrorInfo) -> None:
        closed.update(info.streams)

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        offsets.append(context.offset)

    async with clients(lev_http, SuperStreamProducer, routing=RouteType.Hash,
                       routing_extractor=routing_extractor, super_stream=super_stream) as producer:
        await producer.send(b"one")
        consumer = clients(lev_http, SuperStreamConsumer, on_close_handler=on_connection_closed,
                           connection_name=conn_name, super_stream=super_stream,
                           recovery_strategy=BackOffRecoveryStrategy(True, jitter=1))
        await consumer.start()
        try:
            await consumer.subscribe(callback=on_message, offset_specification=(
                ConsumerOffsetSpecification(OffsetType.FIRST, None)))
            running = asyncio.create_task(consumer.run())
            await close_connections(lev_http, conn_name)
            await producer.send(b"two")
            await wait_until(lambda: len(lev_http.connections(conn_name)) == 1)
            assert closed == {f"{super_stream}-{i}" for i in range(3)}
            await wait_for(lambda: offsets == [0, 1])
        finally:
            await consumer.close()
        await asyncio.wait_for(running, 5)
        await wait_until(lambda: lev_http.connections(conn_name) == [])


async def test_consume_with_sac_update_listener_should_be_called_after_kill(
        lev_http: Target) -> None:
    """rstream's test of that name (Leveret only: single active consumer is 3.11+): the
    recovered member is activated again, through its consumer update listener."""
    conn_name, stream = unique("sac-kill"), unique("sac-kill-s")
    consumer = clients(lev_http, Consumer, connection_name=conn_name,
                       recovery_strategy=BackOffRecoveryStrategy(True, jitter=1))
    await consumer.create_stream(stream)
    update_calls: list[bool] = []

    async def consumer_update_listener(is_active: bool, _: EventContext) -> OffsetSpecification:
        if is_active:
            update_calls.append(True)
            return OffsetSpecification(offset_type=OffsetType.OFFSET, offset=0)
        return OffsetSpecification(offset_type=OffsetType.FIRST, offset=0)

    try:
        async with consumer:
            await consumer.subscribe(
                stream=stream, properties={"single-active-consumer": "true", "name": "sac_name"},
                offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST),
                consumer_update_listener=consumer_update_listener, callback=lambda *_: None)
            running = asyncio.create_task(consumer.run())
            await wait_for(lambda: len(update_calls) == 1)
            await close_connections(lev_http, conn_name)
            await wait_for(lambda: len(update_calls) >= 2)
        await asyncio.wait_for(running, 5)
    finally:
        async with clients(lev_http, Producer) as admin:
            await admin.delete_stream(stream)


def test_node_client_close_listeners_and_restart(lev_http: Target, node_client: Path) -> None:
    """The Node client's "closed_connection listener is invoked by the server if it closes the
    connection", then its README's recovery (node/closed.js): the client's, the publisher's
    and the consumer's listeners each run once; restart() reopens the three connections and
    the consumer gets what is published then (and, resuming at its last offset, that one
    message again, as the client does)."""
    result = subprocess.run(["node", str(NODE_DIR / "closed.js"), str(lev_http.stream_port),
                             str(lev_http.management_port), unique("node-closed"),
                             lev_http.host],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"listed": 3, "afterClose": {"client": 1, "publisher": 1, "consumer": 1},
                    "received": ["before", "before", "after"], "reopened": 3}


def test_a_client_that_stops_reading_does_not_keep_its_closed_connection(
        lev_http: Target) -> None:
    """Closed through the management API while its socket is full, a subscriber that reads
    nothing leaves the listing within CLOSE_TIMEOUT_S: what was left to write is dropped (the
    kernel still sends what it holds, then FIN)."""
    name, stream = unique("stuck"), unique("stuck-s")
    publisher = RawStream(lev_http.stream_port, timeout=10)
    assert publisher.handshake() == 1
    publisher.request(0x0D, s(stream) + struct.pack(">i", 0))
    assert publisher.response(0x0D)[1] == 1
    publisher.request(0x01, struct.pack(">B", 1) + s("") + s(stream))
    assert publisher.response(0x01)[1] == 1
    body = b"\x00Su\xb0" + struct.pack(">I", 10000) + b"x" * 10000
    for batch in range(20):  # 20 MB, more than the sockets hold
        publisher.send(0x02, 1, struct.pack(">Bi", 1, 100) + b"".join(
            struct.pack(">QI", batch * 100 + i, len(body)) + body for i in range(100)))
        publisher.next(0x03)
    client = RawStream(lev_http.stream_port, timeout=10)
    client.request(0x11, strmap({"product": "raw", "connection_name": name}))
    assert client.response(0x11)[1] == 1
    client.request(0x12, b"")
    client.response(0x12)
    client.request(0x13, s("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest")
    assert client.response(0x13)[1] == 1
    tune = client.next(0x14)
    client.send(0x14, 1, tune[4:8] + struct.pack(">I", 0))
    client.request(0x15, s("/"))
    assert client.response(0x15)[1] == 1
    client.request(0x07, struct.pack(">B", 1) + s(stream) + struct.pack(">HH", 1, 100)
                   + struct.pack(">i", 0))
    try:
        connection = ""
        deadline = time.monotonic() + 10
        while not connection and time.monotonic() < deadline:
            connection = next(iter(lev_http.connections(name)), "")
            time.sleep(0.05)
        # its deliveries fill the sockets, then stop: what the broker wrote stays put
        path = "/api/connections/" + urllib.parse.quote(connection, safe="")
        sent = [-1, 0]
        while sent[-1] != sent[-2] or sent[-1] < 1 << 20:
            assert time.monotonic() < deadline + 10, sent
            time.sleep(0.2)
            sent.append(lev_http.get(path)["send_oct"])
        started = time.monotonic()
        lev_http.close(connection)
        while lev_http.listed(connection):
            assert time.monotonic() - started < 6, "still listed"
            time.sleep(0.05)
    finally:
        client.close()
        publisher.request(0x0E, s(stream))
        publisher.response(0x0E)
        publisher.close()


def test_listings_with_a_trailing_slash(target: Target) -> None:
    """The Node client's own suite asks for `/api/stream/consumers/%2F/` ("declaring a consumer
    on an existing stream with identifiers") and `/api/consumers/%2F/`: RabbitMQ's router
    ignores one trailing slash, so they answer as without it."""
    stream, identifier = unique("slash"), unique("id")
    client = RawStream(target.stream_port, timeout=10)
    assert client.handshake() == 1
    try:
        client.request(0x0D, s(stream) + struct.pack(">i", 0))
        assert client.response(0x0D)[1] == 1
        client.request(0x07, struct.pack(">B", 1) + s(stream) + struct.pack(">HH", 1, 10)
                       + strmap({"identifier": identifier}))
        assert client.response(0x07)[1] == 1

        def ours(path: str) -> list[dict[str, Any]]:
            return [c for c in target.get(path)
                    if (c.get("properties") or {}).get("identifier") == identifier
                    or (c.get("queue") or {}).get("name") == stream]

        deadline = time.monotonic() + 10
        while not ours("/api/stream/consumers/%2F"):  # RabbitMQ lists it within a second
            assert time.monotonic() < deadline, "the consumer is never listed"
            time.sleep(0.1)
        assert ours("/api/stream/consumers/%2F/") == ours("/api/stream/consumers/%2F")
        assert ours("/api/stream/consumers/%2F/")[0]["properties"]["identifier"] == identifier
        # (RabbitMQ 3.10.8 lists stream consumers in /api/stream/consumers only)
        assert ours("/api/consumers/%2F/") == ours("/api/consumers/%2F")
        assert target.get(f"/api/queues/%2F/{stream}/")["name"] == stream
    finally:
        client.request(0x0E, s(stream))
        client.response(0x0E)
        client.close()
