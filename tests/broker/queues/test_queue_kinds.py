"""Queue kinds (broker/model/queue_kind.py, classic_kind.py, stream_kind.py), without sockets:
each type's declare-time checks with RabbitMQ's texts and order, its equivalence, the queue it
builds, and that a vhost reaches a new type only through its registration."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.amqp.stored import decode_record, encode_record
from leveret.broker.model.classic_kind import ClassicKind
from leveret.broker.model.durable import DurableClassicQueue
from leveret.broker.model.errors import PreconditionFailed
from leveret.broker.model.fields import FieldTable
from leveret.broker.model.queue import ClassicQueue, Queue, QueueOwner
from leveret.broker.model.queue_kind import DeclareRules, QueueKind, QueueKinds
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.stream_kind import StreamKind
from leveret.broker.model.vhost import VHost

RS = "queue 'q' in vhost '/'"


def refusal(check: object, *args: object, **kwargs: object) -> str:
    """The text of the PreconditionFailed that `check(*args, **kwargs)` raises."""
    assert callable(check)
    with pytest.raises(PreconditionFailed) as raised:
        check(*args, **kwargs)
    return raised.value.text


def validate(kind: DeclareRules, arguments: FieldTable, *, durable: bool = True,
             exclusive: bool = False, auto_delete: bool = False) -> None:
    kind.validate_arguments(RS, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                            arguments=arguments)


@pytest.fixture
def vhost() -> VHost:
    return VHost("/", ManualScheduler(inline_soon=True))


@pytest.fixture
def env(tmp_path: Path) -> StorageEnv:
    return StorageEnv(tmp_path, encode_record, decode_record)


def as_kind(kind: QueueKind) -> QueueKind:
    return kind  # mypy checks here that each kind implements the protocol


# -- classic ----------------------------------------------------------------------------------

def test_classic_validates_its_own_keys_with_rabbitmqs_texts() -> None:
    kind = as_kind(ClassicKind())
    assert isinstance(kind, ClassicKind)
    assert refusal(validate, kind, {"x-max-priority": 300}) == (
        f"invalid arg 'x-max-priority' for {RS}: {{max_value_exceeded,300}}")
    validate(kind, {"x-max-priority": 10, "x-message-ttl": 5}, durable=False, auto_delete=True)


def test_classic_refuses_a_stream_key_as_rabbit_classic_queue() -> None:
    assert refusal(validate, ClassicKind(), {"x-max-age": "1D"}) == (
        f"invalid arg 'x-max-age' for {RS} of queue type rabbit_classic_queue")


def test_classic_may_be_server_named() -> None:
    ClassicKind().check_server_named()


def test_classic_equivalence_compares_its_keys_and_ignores_others(vhost: VHost) -> None:
    existing = ClassicQueue(vhost, "q", arguments={"x-max-length": 1, "x-whatever": 1})
    kind = ClassicKind()
    kind.check_equivalence(existing, True, False, {"x-max-length": 1, "x-whatever": 2})
    assert refusal(kind.check_equivalence, existing, True, False, {"x-max-length": 2}) == (
        f"inequivalent arg 'x-max-length' for {RS}: received '2' but current is '1'")


def test_equivalence_compares_the_keys_the_kind_declares(vhost: VHost) -> None:
    existing = ClassicQueue(vhost, "q", arguments={"x-max-length": 1, "x-custom": 1})
    kind = DeclareRules("classic")
    kind.declare_keys = ("x-custom",)
    kind.check_equivalence(existing, True, False, {"x-max-length": 2, "x-custom": 1})
    assert refusal(kind.check_equivalence, existing, True, False, {"x-custom": 2}) == (
        f"inequivalent arg 'x-custom' for {RS}: received '2' but current is '1'")


def test_classic_without_storage_builds_a_queue_in_memory(vhost: VHost) -> None:
    queue = ClassicKind().create(vhost, "q", durable=True, exclusive_owner=None,
                                 auto_delete=False, arguments={}, storage_id=None)
    assert type(queue) is ClassicQueue
    assert queue.durable


def test_classic_with_storage_keeps_a_durable_queue_in_the_log(vhost: VHost,
                                                             env: StorageEnv) -> None:
    kind = ClassicKind(env)
    durable = kind.create(vhost, "d", durable=True, exclusive_owner=None, auto_delete=False,
                          arguments={}, storage_id="kept")
    transient = kind.create(vhost, "t", durable=False, exclusive_owner=None, auto_delete=False,
                            arguments={}, storage_id=None)
    try:
        assert isinstance(durable, DurableClassicQueue)
        assert durable.storage_id == "kept"
        assert type(transient) is ClassicQueue
    finally:
        durable.on_delete()


# -- stream -----------------------------------------------------------------------------------

def test_a_stream_cannot_be_server_named(env: StorageEnv) -> None:
    assert refusal(StreamKind(env).check_server_named) == (
        "Cannot declare a server-named queue for type rabbit_stream_queue")


@pytest.mark.parametrize(("flags", "text"), [
    ({"auto_delete": True, "exclusive": True, "durable": False}, "auto-delete"),
    ({"exclusive": True, "durable": False}, "exclusive-owner"),
    ({"durable": False}, "non-durable"),
])
def test_a_stream_refuses_its_flags_in_rabbitmqs_order(env: StorageEnv, flags: dict[str, bool],
                                                       text: str) -> None:
    assert refusal(validate, StreamKind(env), {}, **flags) == (
        f"invalid property '{text}' for {RS}")


def test_a_stream_checks_generic_arguments_before_its_flags(env: StorageEnv) -> None:
    assert refusal(validate, StreamKind(env), {"x-max-age": "soon"}, auto_delete=True) == (
        f"invalid arg 'x-max-age' for {RS}: invalid_max_age")


def test_a_stream_refuses_a_classic_key_and_its_own_limits(env: StorageEnv) -> None:
    kind = StreamKind(env)
    assert refusal(validate, kind, {"x-max-priority": 1}) == (
        f"invalid arg 'x-max-priority' for {RS} of queue type rabbit_stream_queue")
    assert refusal(validate, kind, {"x-stream-filter-size-bytes": 300}) == (
        "Invalid value for x-stream-filter-size-bytes")
    validate(kind, {"x-max-age": "1D", "x-stream-filter-size-bytes": 32})


def test_a_stream_is_built_with_the_replication_the_root_chose(vhost: VHost,
                                                                env: StorageEnv) -> None:
    made: list[Replication] = []

    def replication() -> Replication:
        made.append(ONE_NODE)
        return ONE_NODE

    stream = StreamKind(env, replication).create(
        vhost, "s", durable=True, exclusive_owner=None, auto_delete=False,
        arguments={"x-max-age": "1D"}, storage_id=None)
    try:
        assert isinstance(stream, StreamQueue)
        assert stream.replication is ONE_NODE and made == [ONE_NODE]
        assert stream.arguments == {"x-max-age": "1D"}
    finally:
        stream.on_delete()


# -- the registry -----------------------------------------------------------------------------

def test_the_registry_reads_x_queue_type_with_rabbitmqs_texts(env: StorageEnv) -> None:
    kinds = QueueKinds([ClassicKind(), StreamKind(env)])
    assert kinds.declared({}, RS).name == "classic"
    assert isinstance(kinds.declared({"x-queue-type": b"stream"}, RS), StreamKind)
    assert refusal(kinds.declared, {"x-queue-type": 1}, RS) == (
        f"invalid arg 'x-queue-type' for {RS}: {{unacceptable_type,signedint}}")
    assert refusal(kinds.declared, {"x-queue-type": "lazy"}, RS) == (
        f"invalid arg 'x-queue-type' for {RS}: \"unsupported queue type 'lazy'\"")


def test_a_type_rabbitmq_knows_but_not_registered_is_checked_then_refused() -> None:
    kinds = QueueKinds([ClassicKind()])
    rules = kinds.declared({"x-queue-type": "quorum"}, RS)
    assert type(rules) is DeclareRules and "quorum" not in kinds
    assert refusal(validate, rules, {"x-max-priority": 1}) == (
        f"invalid arg 'x-max-priority' for {RS} of queue type rabbit_quorum_queue")
    assert refusal(kinds.implemented, "quorum", RS) == (
        f"invalid arg 'x-queue-type' for {RS}: \"unsupported queue type 'quorum'\"")


class QuorumForTest(DeclareRules):
    """A new queue type, as the next one will be added: one class and one registration."""

    def __init__(self) -> None:
        super().__init__("quorum")

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        queue = ClassicQueue(owner, name, durable=durable, exclusive_owner=exclusive_owner,
                             auto_delete=auto_delete, arguments=arguments)
        queue.type = "quorum"
        return queue


def test_a_vhost_declares_a_newly_registered_type_through_its_kind() -> None:
    kinds = QueueKinds([ClassicKind()])
    vhost = VHost("/", ManualScheduler(inline_soon=True), queue_kinds=kinds)
    with pytest.raises(PreconditionFailed):
        vhost.declare_queue("q", owner=None, durable=True, arguments={"x-queue-type": "quorum"})
    kinds.register(as_kind(QuorumForTest()))
    queue = vhost.declare_queue("q", owner=None, durable=True,
                                arguments={"x-queue-type": "quorum", "x-delivery-limit": 3})
    assert queue.type == "quorum" and vhost.queues["q"] is queue
    assert refusal(vhost.declare_queue, "q", owner=None, durable=True,
                   arguments={"x-queue-type": "quorum", "x-delivery-limit": 4}) == (
        f"inequivalent arg 'x-delivery-limit' for {RS}: received '4' but current is '3'")


def test_a_vhost_on_its_own_holds_classic_queues_only(vhost: VHost) -> None:
    assert vhost.declare_queue("q", owner=None).type == "classic"
    assert refusal(vhost.declare_queue, "s", owner=None, durable=True,
                   arguments={"x-queue-type": "stream"}) == (
        "invalid arg 'x-queue-type' for queue 's' in vhost '/': "
        "\"unsupported queue type 'stream'\"")
