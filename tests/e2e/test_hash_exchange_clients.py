"""The hash exchanges through aio-pika and kombu, against Leveret and RabbitMQ 3.10 with the
consistent-hash and sharding plugins: the declare and bind errors with their texts, and the
distribution of messages published by each library (whose own integer encodings, pamqp's
smallest type and py-amqp's `I`/`L`, pick the wire types a hash-header hashes). Each routing
case must put each message in the same-named queue on both brokers."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import kombu
import pytest

from .conftest import Amqp

CHX = "x-consistent-hash"
WEIGHTS = {"q1": "1", "q2": "3", "q3": "7", "q4": "20"}
DECLARE_ERRORS = [
    ({"hash-header": "h", "hash-property": "message_id"},
     "hash-header and hash-property are mutually exclusive"),
    ({"hash-property": "app_id"}, "Unsupported property: app_id"),
]
BIND_ERRORS = [("abc", 'The binding key must be an integer: <<"abc">>'),
               ("0", "The binding key must be greater than 0")]
_SEEN: dict[str, dict[str, Any]] = {}


def _compare(case: str, name: str, got: object) -> None:
    seen = _SEEN.setdefault(case, {})
    seen[name] = got
    if len(seen) == 2:
        assert seen["leveret"] == seen["rabbitmq"]


def _values(count: int) -> list[Any]:
    """Header values: integers of every size (byte, short, int, long on the wire for pamqp),
    negative ones, strings, floats and booleans."""
    out: list[Any] = []
    for i in range(count):
        out.append([i % 100, i * 300, i * 70_000, 2**40 + i, -i, f"user-{i}", i / 8,
                    bool(i % 2)][i % 8])
    return out


def _queues(amqp: Amqp, exchange: str, kind: str) -> dict[str, str]:
    """Four queues bound with the weights; to x-modulus-hash with one key, where 3.10 and 4.3
    order the bindings alike (see test_modulus_hash)."""
    ch = amqp.channel()
    queues = {}
    for label, weight in WEIGHTS.items():
        queues[label] = amqp.uid(label)
        ch.queue_declare(queues[label])
        ch.queue_bind(queues[label], exchange, weight if kind == CHX else "shard")
    return queues


def _drain(amqp: Amqp, queues: dict[str, str]) -> dict[str, list[bytes]]:
    ch = amqp.channel()
    return {label: amqp.drain(ch, q) for label, q in queues.items()}


# -- aio-pika ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "text"), DECLARE_ERRORS)
def test_aio_pika_declare_errors(chx: Amqp, arguments: dict[str, str], text: str) -> None:
    name = chx.uid("chx")

    async def run() -> str:
        async with await aio_pika.connect(chx.url) as connection:
            channel = await connection.channel()
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as info:
                await channel.declare_exchange(name, CHX, arguments=arguments)
            return str(info.value.args[0])

    assert asyncio.run(run()) == f"PRECONDITION_FAILED - {text}"
    assert not chx.exists("exchange", name)


@pytest.mark.parametrize(("key", "text"), BIND_ERRORS)
def test_aio_pika_bind_errors(chx: Amqp, key: str, text: str) -> None:
    x, q = chx.uid("chx"), chx.uid("q")

    async def run() -> str:
        async with await aio_pika.connect(chx.url) as connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(x, CHX)
            queue = await channel.declare_queue(q)
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as info:
                await queue.bind(exchange, key)
            return str(info.value.args[0])

    assert asyncio.run(run()) == f"PRECONDITION_FAILED - {text}"


@pytest.mark.parametrize("case", ["hash-header", "hash-property", "routing-key", "modulus"])
def test_aio_pika_distribution_matches_rabbitmq(chx: Amqp, case: str) -> None:
    x = chx.uid("x")
    kind, arguments = {"hash-header": (CHX, {"hash-header": "shard"}),
                       "hash-property": (CHX, {"hash-property": "correlation_id"}),
                       "routing-key": (CHX, {}),
                       "modulus": ("x-modulus-hash", {})}[case]
    chx.channel().exchange_declare(x, kind, arguments=arguments)
    queues = _queues(chx, x, kind)
    values = _values(800)

    async def run() -> None:
        async with await aio_pika.connect(chx.url) as connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(x)
            for i, value in enumerate(values):
                message = aio_pika.Message(str(i).encode(), headers={"shard": value},
                                           correlation_id=f"c{i}" if i % 9 else None)
                await exchange.publish(message, f"rk-{i}")

    asyncio.run(run())
    got = _drain(chx, queues)
    assert sum(len(v) for v in got.values()) == len(values)
    _compare(f"aio-pika-{case}", chx.name, got)


# -- kombu ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "text"), DECLARE_ERRORS)
def test_kombu_declare_errors(chx: Amqp, arguments: dict[str, str], text: str) -> None:
    name = chx.uid("chx")
    with kombu.Connection(chx.url) as connection:
        exchange = kombu.Exchange(name, CHX, durable=False, arguments=arguments)
        with pytest.raises(connection.channel_errors) as info:
            exchange(connection.channel()).declare()
    assert getattr(info.value, "code", None) == 406
    assert f"PRECONDITION_FAILED - {text}" in str(info.value)
    assert not chx.exists("exchange", name)


@pytest.mark.parametrize(("key", "text"), BIND_ERRORS)
def test_kombu_bind_errors(chx: Amqp, key: str, text: str) -> None:
    x, q = chx.uid("chx"), chx.uid("q")
    with kombu.Connection(chx.url) as connection:
        exchange = kombu.Exchange(x, CHX, durable=False)
        queue = kombu.Queue(q, exchange, routing_key=key, durable=False)
        with pytest.raises(connection.channel_errors) as info:
            queue(connection.channel()).declare()
    assert getattr(info.value, "code", None) == 406
    assert f"PRECONDITION_FAILED - {text}" in str(info.value)


@pytest.mark.parametrize("case", ["hash-header", "routing-key", "modulus"])
def test_kombu_distribution_matches_rabbitmq(chx: Amqp, case: str) -> None:
    x = chx.uid("x")
    kind, arguments = {"hash-header": (CHX, {"hash-header": "shard"}),
                       "routing-key": (CHX, {}),
                       "modulus": ("x-modulus-hash", {})}[case]
    chx.channel().exchange_declare(x, kind, arguments=arguments)
    queues = _queues(chx, x, kind)
    values = _values(800)
    with kombu.Connection(chx.url) as connection:
        exchange = kombu.Exchange(x, kind, durable=False, arguments=arguments)
        with connection.Producer(exchange=exchange) as producer:
            producer.channel.confirm_select()
            for i, value in enumerate(values):
                producer.publish(str(i), routing_key=f"rk-{i}", headers={"shard": value},
                                 serializer="raw", declare=[])
    got = _drain(chx, queues)
    assert sum(len(v) for v in got.values()) == len(values)
    _compare(f"kombu-{case}", chx.name, got)
