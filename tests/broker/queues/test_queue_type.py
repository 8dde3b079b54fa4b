"""The queue-type interface (broker/model/queue_type.py), without sockets: how a classic queue,
a stream and a remote queue answer basic.consume and basic.get through a `QueueClient`, how
a remote queue hands a passive queue.declare, a queue.purge or a queue.delete to its holder
(and a queue of this node declines to), and that the channel and the session's queue methods
reach a queue only through the interface."""

from __future__ import annotations

import ast
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp.content import Message
from leveret.amqp.stored import decode_record, encode_record
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import NotFound, NotImplementedFeature, PreconditionFailed
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import ClassicQueue
from leveret.broker.model.queue_client import Closeable, QueueClient, QueueMethod
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.vhost import VHost
from leveret.broker.remote.remote_queue import RemoteQueue

ROOT = Path(__file__).resolve().parents[3]


class Client:
    """A QueueClient and ConsumerSink that writes down what it was told, in order."""

    def __init__(self) -> None:
        self.closed = False
        self.remote: Closeable | None = None
        self.said: list[tuple[Any, ...]] = []

    # QueueClient
    def consume_started(self, consumer: Consumer, nowait: bool) -> None:
        self.said.append(("consume-ok", consumer.tag, nowait))

    def get_ok(self, entry: QueuedMessage, queue: Any, no_ack: bool, remaining: int) -> None:
        self.said.append(("get-ok", entry.message.body, entry.redelivered, no_ack, remaining))

    def get_empty(self) -> None:
        self.said.append(("get-empty",))

    def wait_for(self, index: int, step: Coroutine[Any, Any, None]) -> None:
        step.close()
        self.said.append(("wait", index))

    # ConsumerSink
    def can_send(self, consumer: Consumer) -> bool:
        return True

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None:
        self.said.append(("deliver", consumer.tag, entry.message.body))

    def server_cancel(self, consumer: Consumer) -> None:
        self.said.append(("cancel", consumer.tag))

    def credit(self, consumer: Consumer) -> int:
        return 1 << 30

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        self.said.append(("records", consumer.tag, list(offsets)))


def as_client(client: Client) -> QueueClient:
    return client  # mypy checks here that Client is a QueueClient


def message(body: bytes) -> Message:
    return Message.build("", "q", body)


@pytest.fixture
def vhost() -> VHost:
    return VHost("/", ManualScheduler(inline_soon=True))


def test_a_classic_queue_answers_consume_ok_before_its_first_delivery(vhost: VHost) -> None:
    queue = ClassicQueue(vhost, "q")
    queue.publish(message(b"one"), None)
    client = Client()
    queue.consume(Consumer("ctag", queue, client), as_client(client), nowait=False)
    assert client.said == [("consume-ok", "ctag", False), ("deliver", "ctag", b"one")]
    assert queue.consumers and queue.had_consumers


def test_a_classic_queue_answers_get_with_what_remains_and_counts_it(vhost: VHost) -> None:
    queue = ClassicQueue(vhost, "q")
    for body in (b"a", b"b"):
        queue.publish(message(body), None)
    client = Client()
    queue.serve_get(client, no_ack=False)
    queue.serve_get(client, no_ack=True)
    queue.serve_get(client, no_ack=False)
    assert client.said == [("get-ok", b"a", False, False, 1), ("get-ok", b"b", False, True, 0),
                           ("get-empty",)]
    assert (queue.stats_get, queue.stats_get_no_ack, queue.stats_get_empty) == (1, 1, 1)
    assert queue.unacked == 1


def test_a_requeued_message_got_again_is_redelivered_and_counted(vhost: VHost) -> None:
    queue = ClassicQueue(vhost, "q")
    queue.publish(message(b"a"), None)
    taken = queue.get(no_ack=False)
    assert taken is not None
    queue.requeue([taken])
    client = Client()
    queue.serve_get(client, no_ack=False)
    assert client.said == [("get-ok", b"a", True, False, 0)]
    assert queue.stats_redeliver == 1


def test_a_stream_refuses_basic_get_with_rabbitmqs_text(vhost: VHost, tmp_path: Path) -> None:
    env = StorageEnv(tmp_path, encode_record, decode_record)
    stream = StreamQueue(vhost, "s", env=env)
    try:
        with pytest.raises(NotImplementedFeature) as raised:
            stream.serve_get(Client(), no_ack=False)
        assert raised.value.text == (
            "basic.get not supported by stream queues queue 's' in vhost '/'")
        assert stream.stats_get_empty == 0
    finally:
        stream.on_delete()


class Forwarder:
    """A Forwarding that keeps what a RemoteQueue hands it; its holder is reachable unless
    told otherwise."""

    def __init__(self, reachable: bool = True) -> None:
        self.handed: list[tuple[Any, ...]] = []
        self.holder_reachable = reachable

    def publish(self, queue: RemoteQueue, message: InboundMessage,
                confirm: Confirm | None) -> bool:
        self.handed.append(("publish", queue.name))
        return True

    def consume(self, queue: RemoteQueue, consumer: Consumer, client: QueueClient,
                nowait: bool) -> None:
        self.handed.append(("consume", queue.name, consumer.tag, client, nowait))

    def get(self, queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None:
        self.handed.append(("get", queue.name, client, no_ack))

    def forward(self, queue: RemoteQueue, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> None:
        self.handed.append(("forward", queue.name, client, method, answer))

    def reachable(self, queue: RemoteQueue) -> bool:
        return self.holder_reachable


def remote(vhost: VHost, forwarder: Forwarder | None, queue_type: str = "classic") -> RemoteQueue:
    return RemoteQueue(vhost, "q", queue_type=queue_type, node="b", durable=True,
                       auto_delete=False, arguments={}, exclusive_elsewhere=False,
                       forwarder=forwarder)


def test_a_remote_queue_hands_consume_and_get_to_its_forwarder(vhost: VHost) -> None:
    forwarder = Forwarder()
    queue = remote(vhost, forwarder)
    client = Client()
    queue.consume(Consumer("ctag", queue, client), client, nowait=True)
    queue.serve_get(client, no_ack=True)
    queue.publish(message(b"x"), None)
    assert forwarder.handed == [("consume", "q", "ctag", client, True),
                                ("get", "q", client, True), ("publish", "q")]
    assert client.said == []  # the forwarder answers, once the holder has
    assert queue.consumers == []  # added once the holder has taken it


def test_a_remote_queue_without_a_forwarder_is_on_a_node_that_is_down(vhost: VHost) -> None:
    queue = remote(vhost, None)
    client = Client()
    text = "home node 'b' of durable queue 'q' in vhost '/' is down or inaccessible"
    with pytest.raises(NotFound) as raised:
        queue.consume(Consumer("ctag", queue, client), client, nowait=False)
    assert raised.value.text == text
    with pytest.raises(NotFound) as raised:
        queue.serve_get(client, no_ack=False)
    assert raised.value.text == text
    confirm = Confirm(1, lambda _confirm: None)
    assert queue.publish(message(b"x"), confirm) is True
    assert confirm.rejected
    assert client.said == []


class Method:
    """A client's queue method, opaque to the queues (an AMQP frame in the session)."""


def no_answer(reply: QueueMethod) -> None:
    raise AssertionError(f"a queue of this node has no holder to answer: {reply!r}")


def test_a_queue_of_this_node_declines_to_forward_its_queue_methods(vhost: VHost) -> None:
    queue = ClassicQueue(vhost, "q")
    queue.publish(message(b"a"), None)
    client = Client()
    assert queue.forward(client, Method(), no_answer) is False
    assert queue.forward_delete(client, Method(), no_answer) is False
    assert client.said == []
    with pytest.raises(PreconditionFailed) as raised:  # its own conditions still hold
        queue.check_delete(if_unused=False, if_empty=True)
    assert raised.value.text == "queue 'q' in vhost '/' not empty"


def test_a_remote_queue_hands_its_queue_methods_to_its_forwarder(vhost: VHost) -> None:
    forwarder = Forwarder()
    queue = remote(vhost, forwarder)
    client, declare, delete = Client(), Method(), Method()
    answers: list[QueueMethod] = []
    assert queue.forward(client, declare, answers.append) is True
    assert queue.forward_delete(client, delete, answers.append) is True
    assert forwarder.handed == [("forward", "q", client, declare, answers.append),
                                ("forward", "q", client, delete, answers.append)]
    assert client.said == [] and answers == []  # the forwarder answers, once the holder has


def test_a_remote_queue_whose_holder_is_down_is_deleted_here_unless_if_empty(
        vhost: VHost) -> None:
    forwarder = Forwarder(reachable=False)
    queue = remote(vhost, forwarder)
    client = Client()
    assert queue.forward_delete(client, Method(), no_answer) is False
    assert forwarder.handed == []
    queue.check_delete(if_unused=True, if_empty=False)  # its consumers are not counted here
    with pytest.raises(PreconditionFailed) as raised:  # it may hold messages
        queue.check_delete(if_unused=False, if_empty=True)
    assert raised.value.text == "queue 'q' in vhost '/' not empty"


def test_a_remote_queue_without_a_forwarder_answers_node_down_or_is_deleted_here(
        vhost: VHost) -> None:
    queue = remote(vhost, None)
    client = Client()
    with pytest.raises(NotFound) as raised:
        queue.forward(client, Method(), no_answer)
    assert raised.value.text == (
        "home node 'b' of durable queue 'q' in vhost '/' is down or inaccessible")
    assert queue.forward_delete(client, Method(), no_answer) is False
    assert client.said == []


def test_a_remote_stream_gives_credit_back_rather_than_redelivering(vhost: VHost) -> None:
    assert remote(vhost, Forwarder(), "classic").redelivers is True
    assert remote(vhost, Forwarder(), "stream").redelivers is False


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any level (function bodies, TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_channel_reaches_queues_only_through_the_interface() -> None:
    path = ROOT / "broker" / "session" / "channel.py"
    modules = imported_modules(path)
    kinds = ("leveret.broker.remote", "leveret.broker.model.stream",
             "leveret.broker.model.durable", "leveret.broker.model.queue.")
    assert not [m for m in modules if m.startswith(kinds)]
    assert "leveret.broker.model.queue" not in modules
    names = {"RemoteQueue", "StreamQueue", "ClassicQueue", "DurableClassicQueue"}
    calls = [node for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"]
    assert not [ast.unparse(c) for c in calls if {n.id for n in ast.walk(c)
                                                  if isinstance(n, ast.Name)} & names]


def test_the_sessions_queue_methods_reach_queues_only_through_the_interface() -> None:
    path = ROOT / "broker" / "session" / "topology.py"
    assert not [m for m in imported_modules(path) if m.startswith("leveret.broker.remote")]
    names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
    assert not names & {"RemoteQueue", "StreamQueue", "ClassicQueue", "DurableClassicQueue"}


def test_the_model_does_not_import_the_remote_room() -> None:
    for path in (ROOT / "broker" / "model").glob("*.py"):
        assert not [m for m in imported_modules(path) if m.startswith("leveret.broker.remote")], \
            path.name


def test_every_queue_answers_what_the_management_rows_read(vhost: VHost) -> None:
    classic = ClassicQueue(vhost, "c", arguments={"x-single-active-consumer": True})
    classic.publish(message(b"abc"), None)
    classic.get(no_ack=False)
    classic.publish(message(b"de"), None)
    assert (classic.holder, classic.unacked, classic.message_bytes) == (None, 1, 2)
    assert classic.single_active
    held = remote(vhost, Forwarder())
    assert (held.holder, held.unacked, held.message_bytes, held.single_active) == (
        "b", 0, 0, False)


def test_a_queue_takes_its_consumers_itself_unless_its_type_keeps_them_elsewhere(
        vhost: VHost) -> None:
    queue = ClassicQueue(vhost, "q")
    assert queue.consumer_queue({"x-single-active-consumer": True}) is queue
    held = remote(vhost, Forwarder(), "stream")
    assert held.consumer_queue({}) is held


def test_each_type_checks_the_consume_arguments_it_knows_with_rabbitmqs_text(
        vhost: VHost) -> None:
    with pytest.raises(PreconditionFailed) as raised:
        ClassicQueue(vhost, "q").validate_consumer("t", False, 0, 0, {"x-stream-offset": 1})
    assert raised.value.text == ("invalid arg 'x-stream-offset' for queue 'q' in vhost '/' "
                                 "of queue type rabbit_classic_queue")
    with pytest.raises(PreconditionFailed) as raised:  # a remote queue checks as its type does
        remote(vhost, Forwarder(), "stream").validate_consumer("t", False, 0, 0,
                                                               {"x-priority": 1})
    assert raised.value.text == ("invalid arg 'x-priority' for queue 'q' in vhost '/' "
                                 "of queue type rabbit_stream_queue")
