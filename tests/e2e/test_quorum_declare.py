"""Declaring quorum queues (`x-queue-type: quorum`): RabbitMQ's refusals and their texts, the
arguments a quorum queue takes, and redeclarations, against Leveret and RabbitMQ 3.10.8 alike
(`mq`), with pika, aio-pika and kombu. Where RabbitMQ 4.3 answers otherwise than 3.10.8,
Leveret follows 4.3 and the test runs against Leveret only (`lev`), saying what 3.10.8 does;
docs/QUORUM-QUEUES.md lists those differences.

Only declare, redeclare, passive declare and delete are used: what a quorum queue does with
messages is tested elsewhere.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aio_pika
import kombu
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp

QUORUM = {"x-queue-type": "quorum"}


def refused(mq: Amqp, name: str, **kwargs: Any) -> tuple[int, str]:
    """The channel.close that a declaration of `name` gets (reply code, text)."""
    ch = mq.channel()
    return mq.soft_error(lambda: ch.queue_declare(name, **kwargs))


def declared(mq: Amqp, name: str, **kwargs: Any) -> tuple[int, int]:
    """(messages, consumers) of a declaration's declare-ok."""
    ch = mq.channel()
    method = ch.queue_declare(name, **kwargs).method
    ch.close()
    return method.message_count, method.consumer_count


def invalid_arg(key: str, queue: str, error: str) -> tuple[int, str]:
    return 406, (f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/': "
                 f"{error}")


def of_another_type(key: str, queue: str) -> tuple[int, str]:
    return 406, (f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/' of "
                 "queue type rabbit_quorum_queue")


# -- flags and names ----------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "property_"), [
    ({"durable": True, "exclusive": True, "auto_delete": True}, "auto-delete"),
    ({"durable": False, "auto_delete": True}, "auto-delete"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": False, "exclusive": True}, "exclusive-owner"),
    ({"durable": False}, "non-durable"),
])  # fmt: skip
def test_flags_a_quorum_queue_cannot_have(mq: Amqp, flags: dict[str, bool],
                                          property_: str) -> None:
    """Checked in RabbitMQ's order: auto-delete, then exclusive, then durable."""
    queue = mq.uid("qq")
    assert refused(mq, queue, arguments=QUORUM, **flags) == (
        406, f"PRECONDITION_FAILED - invalid property '{property_}' for queue '{queue}' in "
        "vhost '/'")
    assert not mq.exists("queue", queue)


@pytest.mark.parametrize("flags", [{"durable": True}, {"durable": False}, {"exclusive": True}])
def test_no_server_named_quorum_queue(mq: Amqp, flags: dict[str, bool]) -> None:
    """Refused before the flags are looked at."""
    assert refused(mq, "", arguments=QUORUM, **flags) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
        "rabbit_quorum_queue")


def test_arguments_are_checked_before_the_flags(mq: Amqp) -> None:
    queue = mq.uid("qq")
    assert refused(mq, queue, durable=False, auto_delete=True,
                   arguments={**QUORUM, "x-max-length": -5}) == invalid_arg(
        "x-max-length", queue, "{value_negative,-5}")
    assert refused(mq, queue, durable=False, arguments={**QUORUM, "x-max-priority": 5}) == (
        of_another_type("x-max-priority", queue))


# -- arguments ------------------------------------------------------------------------------------

OTHER_TYPES = [
    ("x-max-priority", 5), ("x-max-priority", -5), ("x-queue-mode", "lazy"),
    ("x-queue-version", 2), ("x-queue-master-locator", "min-masters"), ("x-max-age", "1D"),
    ("x-stream-max-segment-size-bytes", 5), ("x-initial-cluster-size", 1),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value"), OTHER_TYPES)
def test_arguments_of_other_queue_types(mq: Amqp, key: str, value: object) -> None:
    """Refused by key, whatever the value (x-max-priority -5 too)."""
    queue = mq.uid("qq")
    assert refused(mq, queue, durable=True, arguments={**QUORUM, key: value}) == (
        of_another_type(key, queue))


INVALID = [
    ("x-max-length", -5, "{value_negative,-5}"),
    ("x-max-length", "5", '"expected integer, got longstr"'),
    ("x-max-length-bytes", -1, "{value_negative,-1}"),
    ("x-expires", 0, "{value_zero,0}"),
    ("x-expires", -5, "{value_negative,-5}"),
    ("x-message-ttl", -1, "{value_negative,-1}"),
    ("x-message-ttl", 315360000001, "{value_too_large,315360000001}"),
    ("x-overflow", "bogus", "invalid_overflow"),
    ("x-overflow", 3, "{unacceptable_type,signedint}"),
    ("x-dead-letter-strategy", "bogus", "invalid_dlx_strategy"),
    ("x-dead-letter-strategy", 3, "{unacceptable_type,signedint}"),
    ("x-quorum-initial-group-size", 0, "{value_zero,0}"),
    ("x-quorum-initial-group-size", -1, "{value_negative,-1}"),
    ("x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ("x-single-active-consumer", "true", "{unacceptable_type,longstr}"),
    ("x-max-in-memory-length", -1, "{value_negative,-1}"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value", "error"), INVALID)
def test_invalid_argument_values(mq: Amqp, key: str, value: object, error: str) -> None:
    queue = mq.uid("qq")
    assert refused(mq, queue, durable=True, arguments={**QUORUM, key: value}) == (
        invalid_arg(key, queue, error))


def test_a_routing_key_without_a_dead_letter_exchange(mq: Amqp) -> None:
    queue = mq.uid("qq")
    arguments = {**QUORUM, "x-dead-letter-routing-key": "k"}
    assert refused(mq, queue, durable=True, arguments=arguments) == invalid_arg(
        "x-dead-letter-routing-key", queue, "routing_key_but_no_dlx_defined")


EVERY_ARGUMENT = {
    **QUORUM,
    "x-dead-letter-exchange": "dlx",
    "x-dead-letter-routing-key": "dead",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    "x-expires": 3_600_000,
    "x-max-length": 1000,
    "x-max-length-bytes": 1_000_000,
    "x-single-active-consumer": True,
    "x-quorum-initial-group-size": 3,
    "x-queue-leader-locator": "balanced",
    "x-delivery-limit": 5,
    "x-message-ttl": 60_000,
    "x-max-in-memory-length": 10,
    "x-max-in-memory-bytes": 1000,
}


def test_every_quorum_argument_is_accepted(mq: Amqp) -> None:
    """A new quorum queue answers 0 messages and 0 consumers; the same declaration again, and a
    passive one, find it; a delete removes it."""
    queue = mq.uid("qq")
    assert declared(mq, queue, durable=True, arguments=EVERY_ARGUMENT) == (0, 0)
    assert declared(mq, queue, durable=True, arguments=dict(EVERY_ARGUMENT)) == (0, 0)
    assert declared(mq, queue, passive=True) == (0, 0)
    ch = mq.channel()
    assert ch.queue_delete(queue).method.message_count == 0
    assert not mq.exists("queue", queue)


@pytest.mark.parametrize(("key", "value"), [
    ("x-overflow", "drop-head"),
    ("x-overflow", "reject-publish-dlx"),  # accepted, and read as drop-head (with a warning)
    ("x-dead-letter-strategy", "at-most-once"),
    # at-least-once with drop-head: accepted, the queue falls back to at-most-once
    ("x-dead-letter-strategy", "at-least-once"),
    ("x-queue-leader-locator", "client-local"),
    ("x-queue-leader-locator", "random"),  # deprecated: balanced
    ("x-queue-leader-locator", "least-leaders"),  # deprecated: balanced
    ("x-quorum-initial-group-size", 7),  # more than the running nodes: as many as there are
    ("x-max-length", 0),
    ("x-message-ttl", 0),
    ("x-single-active-consumer", False),
])  # fmt: skip
def test_accepted_values(mq: Amqp, key: str, value: object) -> None:
    assert declared(mq, mq.uid("qq"), durable=True, arguments={**QUORUM, key: value}) == (0, 0)


@pytest.mark.parametrize("limit", [-1, 0, 1, 20, "abc"])
def test_the_delivery_limit_is_not_checked_at_declaration(mq: Amqp, limit: object) -> None:
    """Neither RabbitMQ 3.10 nor 4.3 validates x-delivery-limit: a negative value disables the
    limit (4.x), a value that is no integer means the default (20, in 4.x)."""
    queue = mq.uid("qq")
    arguments = {**QUORUM, "x-delivery-limit": limit}
    assert declared(mq, queue, durable=True, arguments=arguments) == (0, 0)
    assert declared(mq, queue, durable=True, arguments=dict(arguments)) == (0, 0)


# -- redeclaring --------------------------------------------------------------------------------

def test_redeclarations_must_match(mq: Amqp) -> None:
    queue = mq.uid("qq")
    arguments = {**QUORUM, "x-delivery-limit": 3, "x-max-length": 10}
    assert declared(mq, queue, durable=True, arguments=arguments) == (0, 0)
    assert refused(mq, queue, durable=True, arguments={**arguments, "x-delivery-limit": 4}) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue '{queue}' in "
        "vhost '/': received '4' but current is '3'")
    assert refused(mq, queue, durable=True, arguments={**QUORUM, "x-max-length": 10}) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue '{queue}' in "
        "vhost '/': received none but current is the value '3' of type 'signedint'")
    assert refused(mq, queue, durable=True,
                   arguments={**arguments, "x-queue-type": "classic"}) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{queue}' in "
        "vhost '/': received 'classic' but current is 'quorum'")
    # the flags first, as for any queue; then exclusivity (405)
    assert refused(mq, queue, durable=False, arguments=arguments) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{queue}' in vhost "
        "'/': received 'false' but current is 'true'")
    assert refused(mq, queue, durable=True, auto_delete=True, arguments=arguments) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '{queue}' in "
        "vhost '/': received 'true' but current is 'false'")
    code, text = refused(mq, queue, durable=True, exclusive=True, arguments=arguments)
    assert (code, text.split(".")[0]) == (
        405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in "
        "vhost '/'")
    assert declared(mq, queue, passive=True) == (0, 0)  # a passive declare compares nothing
    assert declared(mq, queue, durable=True, arguments=arguments) == (0, 0)


def test_a_redeclaration_without_the_type(lev: Amqp) -> None:
    """RabbitMQ 4.3 completes a declaration without x-queue-type with the vhost's default type
    (classic here) before comparing; 3.10.8 compares the missing key itself: `received none
    but current is the value 'quorum' of type 'longstr'`."""
    queue = lev.uid("qq")
    assert declared(lev, queue, durable=True, arguments=QUORUM) == (0, 0)
    assert refused(lev, queue, durable=True) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{queue}' in "
        "vhost '/': received 'classic' but current is 'quorum'")


# -- where RabbitMQ 4.3 differs from 3.10.8 ---------------------------------------------------

def test_the_consumer_timeout_is_a_quorum_argument(lev: Amqp) -> None:
    """RabbitMQ 4.3 checks x-consumer-timeout (a non-negative integer) and compares it on a
    redeclaration; 3.10.8 knows no such queue argument and takes any value."""
    queue = lev.uid("qq")
    assert refused(lev, queue, durable=True,
                   arguments={**QUORUM, "x-consumer-timeout": -5}) == invalid_arg(
        "x-consumer-timeout", queue, "{value_negative,-5}")
    assert refused(lev, queue, durable=True,
                   arguments={**QUORUM, "x-consumer-timeout": "1s"}) == invalid_arg(
        "x-consumer-timeout", queue, '"expected integer, got longstr"')
    arguments = {**QUORUM, "x-consumer-timeout": 60_000}
    assert declared(lev, queue, durable=True, arguments=arguments) == (0, 0)
    assert refused(lev, queue, durable=True,
                   arguments={**QUORUM, "x-consumer-timeout": 1000}) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-consumer-timeout' for queue '{queue}' "
        "in vhost '/': received '1000' but current is '60000'")


@pytest.mark.parametrize(("key", "value"), [
    ("x-stream-filter-size-bytes", 32),  # a stream argument since 3.13: 3.10.8 ignores it
    # a RabbitMQ 4.3 quorum argument that Leveret does not implement: refused rather than
    # ignored (3.10.8 ignores it as an unknown key)
    ("x-consumer-disconnected-timeout", 1000),
])  # fmt: skip
def test_arguments_refused_as_another_types(lev: Amqp, key: str, value: object) -> None:
    queue = lev.uid("qq")
    assert refused(lev, queue, durable=True, arguments={**QUORUM, key: value}) == (
        of_another_type(key, queue))


def test_min_masters_is_a_deprecated_leader_locator(lev: Amqp) -> None:
    """RabbitMQ 4.3 takes `min-masters` (as `balanced`); 3.10.8 refuses it with
    invalid_queue_locator_arg."""
    arguments = {**QUORUM, "x-queue-leader-locator": "min-masters"}
    assert declared(lev, lev.uid("qq"), durable=True, arguments=arguments) == (0, 0)


# -- other clients ----------------------------------------------------------------------------

def test_aio_pika_declares_and_is_refused_alike(mq: Amqp) -> None:
    queue, transient = mq.uid("qq"), mq.uid("qq")

    async def run() -> tuple[int | None, str]:
        connection = await aio_pika.connect(mq.url)
        async with connection:
            channel = await connection.channel()
            declared_ = await channel.declare_queue(
                queue, durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
            count = declared_.declaration_result.message_count
            again = await channel.declare_queue(queue, passive=True)
            assert again.declaration_result.consumer_count == 0
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as info:
                await channel.declare_queue(transient, durable=False, arguments=QUORUM)
            return count, str(info.value)

    count, text = asyncio.run(run())
    assert count == 0
    assert f"invalid property 'non-durable' for queue '{transient}' in vhost '/'" in text


def test_kombu_declares_and_is_refused_alike(mq: Amqp) -> None:
    queue, auto = mq.uid("qq"), mq.uid("qq")
    with kombu.Connection(mq.url) as connection:
        channel = connection.channel()
        name, messages, consumers = kombu.Queue(
            queue, durable=True, queue_arguments={**QUORUM, "x-max-length": 10},
        ).bind(channel).queue_declare()
        assert (name, messages, consumers) == (queue, 0, 0)
        # kombu's auto_delete queue: a quorum queue cannot be one
        with pytest.raises(Exception) as info:  # py-amqp's class for a 406
            kombu.Queue(auto, durable=True, auto_delete=True,
                        queue_arguments=QUORUM).bind(connection.channel()).declare()
        assert getattr(info.value, "code", None) == 406
        assert f"invalid property 'auto-delete' for queue '{auto}' in vhost '/'" in str(
            info.value)
