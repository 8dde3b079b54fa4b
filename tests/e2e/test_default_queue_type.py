"""A vhost's default queue type (`default_queue_type`): a declaration without `x-queue-type`
gets it, except an exclusive, auto-delete or non-durable one, which stays classic.

The AMQP side runs against Leveret and RabbitMQ 3.10.8 alike (`dq`: a vhost made with
`rabbitmqctl add_vhost --default-queue-type quorum` on the reference, through the admin
operations on Leveret), with pika, aio-pika and kombu. Where RabbitMQ 4.3 differs from 3.10.8
(setting it on an existing vhost, the HTTP API's field, definitions, the server-wide setting)
the test runs against Leveret only and says what 3.10.8 does.

A queue's type shows over AMQP in what a redeclaration is compared with: a quorum queue
refuses `x-queue-type: classic`, a classic one takes it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import kombu
import pika
import pytest
from e2e.conftest import Amqp
from support.brokers import InProcessBroker
from support.management import Http, q
from support.ports import free_port

from leveret.broker.access import admin
from leveret.broker.process.config import ConfigError, load

QUORUM = {"x-queue-type": "quorum"}
CLASSIC = {"x-queue-type": "classic"}


class VhostAmqp(Amqp):
    """An Amqp client of one vhost (deleted with everything in it after the test)."""

    def __init__(self, name: str, port: int, vhost: str) -> None:
        super().__init__(name, port)
        self.vhost = vhost

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{quote(self.vhost, safe='')}"

    def connection(self) -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", self.port, virtual_host=self.vhost,
                                           blocked_connection_timeout=10, socket_timeout=10)
        conn = pika.BlockingConnection(params)
        self._connections.append(conn)
        return conn

    def _clean_up(self) -> None:
        return None  # the vhost goes, and its queues with it

    def refused(self, name: str, **kwargs: Any) -> tuple[int, str]:
        ch = self.channel()
        return self.soft_error(lambda: ch.queue_declare(name, **kwargs))

    def declared(self, name: str, **kwargs: Any) -> tuple[int, int]:
        ch = self.channel()
        method = ch.queue_declare(name, **kwargs).method
        ch.close()
        return method.message_count, method.consumer_count

    def rs(self, queue: str) -> str:
        return f"queue '{queue}' in vhost '{self.vhost}'"

    def type_is(self, queue: str, wanted: str, arguments: dict[str, Any] | None = None,
                **flags: bool) -> bool:
        """Whether `queue` (declared with `flags` and `arguments`) is of type `wanted`, from a
        redeclaration that names classic: a quorum queue refuses it, a classic one takes it.
        (Naming quorum to a classic queue would do too, but 3.10.8 and 4.3 word that refusal
        differently: `received the value 'quorum' of type 'longstr' but current is none`,
        as 3.10.8 keeps no x-queue-type in such a queue's arguments.)"""
        redeclared = {**(arguments or {}), "x-queue-type": "classic"}
        if wanted == "classic":
            return self.declared(queue, arguments=redeclared, **flags) == (0, 0)
        return self.refused(queue, arguments=redeclared, **flags) == (
            406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for {self.rs(queue)}: "
            f"received 'classic' but current is '{wanted}'")


def add_leveret_vhost(server: InProcessBroker, vhost: str, queue_type: str | None) -> None:
    server.call(lambda: admin.add_vhost(server.broker, vhost, acting_user="guest",
                                        default_queue_type=queue_type))


@pytest.fixture(params=["leveret", "rabbitmq"])
def dq(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VhostAmqp]:
    """A vhost whose default queue type is quorum, on Leveret and on the reference RabbitMQ."""
    vhost = f"dq-{uuid.uuid4().hex[:12]}"
    if request.param == "rabbitmq":
        reference = request.getfixturevalue("reference")
        reference.ctl("add_vhost", vhost, "--default-queue-type", "quorum")
        try:
            reference.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
            client = VhostAmqp("rabbitmq", reference.port, vhost)
            yield client
            client.close()
        finally:
            reference.ctl("delete_vhost", vhost)
        return
    server = InProcessBroker(tmp_path / "data").start()
    try:
        add_leveret_vhost(server, vhost, "quorum")
        client = VhostAmqp("leveret", server.port, vhost)
        yield client
        client.close()
    finally:
        server.stop()


# -- declaring in a vhost whose default is quorum (both brokers) ------------------------------

def test_a_declaration_without_a_type_gets_the_vhosts(dq: VhostAmqp) -> None:
    queue = dq.uid("dq")
    assert dq.declared(queue, durable=True) == (0, 0)
    assert dq.type_is(queue, "quorum", durable=True)
    assert dq.declared(queue, durable=True) == (0, 0)  # compared with the completed arguments
    assert dq.declared(queue, durable=True, arguments=QUORUM) == (0, 0)
    assert dq.declared(queue, passive=True) == (0, 0)
    assert dq.channel().queue_delete(queue).method.message_count == 0


def test_its_arguments_are_checked_as_the_default_types(dq: VhostAmqp) -> None:
    queue = dq.uid("dq")
    assert dq.refused(queue, durable=True, arguments={"x-max-priority": 5}) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for {dq.rs(queue)} of queue "
        "type rabbit_quorum_queue")
    assert dq.refused(queue, durable=True, arguments={"x-max-length": -1}) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-max-length' for {dq.rs(queue)}: "
        "{value_negative,-1}")
    limit = {"x-delivery-limit": 3}
    assert dq.declared(queue, durable=True, arguments=limit) == (0, 0)
    assert dq.type_is(queue, "quorum", limit, durable=True)


@pytest.mark.parametrize("flags", [
    {"durable": True, "exclusive": True},
    {"durable": True, "auto_delete": True},
    {"durable": False},
])  # fmt: skip
def test_exclusive_auto_delete_and_transient_declarations_stay_classic(
        dq: VhostAmqp, flags: dict[str, bool]) -> None:
    """They could not be quorum queues: the default does not apply (a priority, a classic
    argument, is taken)."""
    queue = dq.uid("dq")
    priority = {"x-max-priority": 5}
    assert dq.declared(queue, arguments=priority, **flags) == (0, 0)
    assert dq.type_is(queue, "classic", priority, **flags)


def test_server_named_queues(dq: VhostAmqp) -> None:
    """A durable declaration of "" gets the default type, which cannot have one."""
    assert dq.refused("", durable=True) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
        "rabbit_quorum_queue")
    ch = dq.channel()
    assert ch.queue_declare("").method.queue.startswith("amq.gen-")  # not durable: classic
    assert ch.queue_declare("", durable=True, exclusive=True).method.queue.startswith("amq.gen-")


@pytest.mark.parametrize("queue_type", ["classic", "stream"])
def test_a_type_named_wins_and_a_redeclaration_without_it_is_refused(
        dq: VhostAmqp, queue_type: str) -> None:
    """The redeclaration gets the default type too, then is compared with the queue."""
    queue = dq.uid("dq")
    assert dq.declared(queue, durable=True, arguments={"x-queue-type": queue_type}) == (0, 0)
    assert dq.refused(queue, durable=True) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for {dq.rs(queue)}: "
        f"received 'quorum' but current is '{queue_type}'")
    assert dq.declared(queue, passive=True) == (0, 0)
    assert dq.declared(queue, durable=True, arguments={"x-queue-type": queue_type}) == (0, 0)


def test_kombu_and_aio_pika_declarations_get_it(dq: VhostAmqp) -> None:
    """kombu's queues are durable: quorum; aio-pika's are not durable unless asked."""
    by_kombu, durable, transient = dq.uid("dq"), dq.uid("dq"), dq.uid("dq")
    with kombu.Connection(dq.url) as connection:
        kombu.Queue(by_kombu).bind(connection.channel()).declare()

    async def run() -> None:
        connection = await aio_pika.connect(dq.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(durable, durable=True)
            await channel.declare_queue(transient)

    asyncio.run(run())
    assert dq.type_is(by_kombu, "quorum", durable=True)
    assert dq.type_is(durable, "quorum", durable=True)
    assert dq.type_is(transient, "classic")


# -- setting it: RabbitMQ 4.3's API, on Leveret ------------------------------------------------

@pytest.fixture
def http(managed_broker: InProcessBroker) -> Http:
    return Http.of(managed_broker)


def client(broker: InProcessBroker, vhost: str) -> VhostAmqp:
    return VhostAmqp("leveret", broker.port, vhost)


def test_the_http_api_sets_and_shows_it(managed_broker: InProcessBroker, http: Http) -> None:
    """RabbitMQ 4.3's PUT /api/vhosts takes default_queue_type (3.11's `defaultqueuetype`
    too) and GET shows it at the top level and in `metadata`; 3.10.8 reads only
    `defaultqueuetype`, when the vhost is created, and shows "undefined" when none was
    given."""
    assert http.put("/api/vhosts/orders", {"default_queue_type": "quorum"}).status == 201
    shown = http.get("/api/vhosts/orders").body
    assert (shown["default_queue_type"], shown["metadata"]["default_queue_type"]) == (
        "quorum", "quorum")
    assert http.get("/api/vhosts/%2F").body["default_queue_type"] == "classic"
    assert {v["name"]: v["default_queue_type"] for v in http.get("/api/vhosts").body} == {
        "/": "classic", "orders": "quorum"}
    amqp = client(managed_broker, "orders")
    try:
        assert amqp.declared("jobs", durable=True) == (0, 0)
        assert amqp.type_is("jobs", "quorum", durable=True)
    finally:
        amqp.close()
    assert http.put("/api/vhosts/orders", {"defaultqueuetype": "stream"}).status == 204
    assert http.get("/api/vhosts/orders").body["default_queue_type"] == "stream"
    assert http.put("/api/vhosts/orders", {"default_queue_type": "rabbit_quorum_queue"}).status \
        == 204
    assert http.get("/api/vhosts/orders").body["default_queue_type"] == "quorum"
    # as RabbitMQ 4.3: an update that names none gives the vhost the server's again
    assert http.put("/api/vhosts/orders", {"description": "Orders"}).status == 204
    assert http.get("/api/vhosts/orders").body["default_queue_type"] == "classic"


@pytest.mark.parametrize(("value", "reason"), [
    ("", "default_queue_type must not be an empty string"),
    ("bogus", "bogus is not a valid queue type"),
    ("rabbit_bogus_queue", "rabbit_bogus_queue is not a valid queue type"),
    (5, "5 is not a valid default_queue_type value"),
    (True, "true is not a valid queue type"),
])  # fmt: skip
def test_a_bad_value_is_a_400_with_rabbitmqs_text(http: Http, value: object,
                                                   reason: str) -> None:
    assert http.put("/api/vhosts/orders", {"default_queue_type": "quorum"}).status == 201
    reply = http.put("/api/vhosts/orders", {"default_queue_type": value})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": reason})
    assert http.get("/api/vhosts/orders").body["default_queue_type"] == "quorum"
    reply = http.put("/api/vhosts/new", {"default_queue_type": value})
    assert reply.status == 400 and http.get("/api/vhosts/new").status == 404


def test_changing_it_leaves_existing_queues_as_they_are(managed_broker: InProcessBroker,
                                                        http: Http) -> None:
    """RabbitMQ 4.3: a redeclaration without x-queue-type of a classic queue made before the
    default became quorum gets quorum, and is refused (3.10.8 cannot change a vhost's
    default). A passive declaration, or one that names classic, still succeeds."""
    assert http.put("/api/vhosts/shop", {}).status == 201
    amqp = client(managed_broker, "shop")
    try:
        assert amqp.declared("old", durable=True) == (0, 0)
        assert http.put("/api/vhosts/shop", {"default_queue_type": "quorum"}).status == 204
        assert amqp.refused("old", durable=True) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'old' in "
            "vhost 'shop': received 'quorum' but current is 'classic'")
        assert amqp.declared("old", passive=True) == (0, 0)
        assert amqp.declared("old", durable=True, arguments=CLASSIC) == (0, 0)
        assert amqp.declared("new", durable=True) == (0, 0)
        assert amqp.type_is("new", "quorum", durable=True)
    finally:
        amqp.close()


def test_definitions_carry_it_in_the_vhosts_metadata(managed_broker: InProcessBroker,
                                                     http: Http) -> None:
    """RabbitMQ 4.3 exports a vhost's default_queue_type in its `metadata` and imports it
    from there (3.10.8 exports it only when the vhost was given one)."""
    assert http.put("/api/vhosts/orders", {"default_queue_type": "quorum"}).status == 201
    exported = {v["name"]: v["metadata"] for v in http.get("/api/definitions").body["vhosts"]}
    assert exported["orders"]["default_queue_type"] == "quorum"
    assert exported["/"]["default_queue_type"] == "classic"
    document = {"vhosts": [
        {"name": "imported", "metadata": {"description": "", "tags": [],
                                          "default_queue_type": "stream"}},
        {"name": "plain", "metadata": {"default_queue_type": None}},
        {"name": "top-level", "default_queue_type": "quorum"},  # read from metadata only
    ]}  # fmt: skip
    assert http.post("/api/definitions", document).status == 204
    shown = {v["name"]: v["default_queue_type"] for v in http.get("/api/vhosts").body}
    assert (shown["imported"], shown["plain"], shown["top-level"]) == (
        "stream", "classic", "classic")
    bad = {"vhosts": [{"name": "bad", "metadata": {"default_queue_type": "bogus"}}]}
    reply = http.post("/api/definitions", bad)
    assert (reply.status, reply.body["reason"]) == (400, "bogus is not a valid queue type")
    assert http.get("/api/vhosts/bad").status == 404


def test_the_server_wide_setting(tmp_path: Path) -> None:
    """RabbitMQ 4.3's default_queue_type (rabbitmq.conf; 3.10.8 has none): a vhost made
    without its own default gets the server's, and keeps it when the setting changes."""
    data = tmp_path / "data"
    port = free_port()
    server = InProcessBroker(data, management_port=port, default_queue_type="quorum").start()
    try:
        http = Http(port)
        assert http.get("/api/vhosts/%2F").body["default_queue_type"] == "quorum"
        assert http.put("/api/vhosts/made", {}).status == 201
        assert http.put("/api/vhosts/own", {"default_queue_type": "classic"}).status == 201
        amqp = client(server, "/")
        try:
            assert amqp.declared("jobs", durable=True) == (0, 0)
            assert amqp.type_is("jobs", "quorum", durable=True)
        finally:
            amqp.close()
    finally:
        server.stop()
    server = InProcessBroker(data, management_port=port, default_queue_type="stream").start()
    try:
        shown = {v["name"]: v["default_queue_type"] for v in Http(port).get("/api/vhosts").body}
        assert shown == {"/": "quorum", "made": "quorum", "own": "classic"}
        assert Http(port).put("/api/vhosts/later", {}).status == 201
        assert Http(port).get(f"/api/vhosts/{q('later')}").body["default_queue_type"] == "stream"
    finally:
        server.stop()


def test_the_setting_is_checked(tmp_path: Path) -> None:
    assert load(env={"LEVERET_DEFAULT_QUEUE_TYPE": "quorum"}).default_queue_type == "quorum"
    assert load(env={}, overrides={"default_queue_type": "rabbit_stream_queue"}) \
        .default_queue_type == "stream"
    with pytest.raises(ConfigError) as raised:
        load(env={}, overrides={"default_queue_type": "lazy"})
    assert str(raised.value) == ("invalid value 'lazy' for setting 'default_queue_type': "
                                 "classic, quorum or stream")
    # on free ports, should the flag be ignored and the broker start
    result = subprocess.run(
        [sys.executable, "-m", "leveret.cli", "serve", "--data-dir", str(tmp_path / "data"),
         "--port", str(free_port()), "--management-port", "0", "--stream-port", "0",
         "--default-queue-type", "lazy"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: invalid value 'lazy' for setting 'default_queue_type': classic, quorum or stream"]
