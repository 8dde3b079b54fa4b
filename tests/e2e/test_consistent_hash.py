"""The x-consistent-hash exchange against Leveret and RabbitMQ 3.10 with its
rabbitmq_consistent_hash_exchange plugin: every declare and bind error with its text, and
the distribution itself (each message in the same-named queue on both brokers)."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from support.brokers import InProcessBroker
from support.reference import Reference, running, start_consistent_hash_reference

from .conftest import Amqp

CHX = "x-consistent-hash"
WEIGHTS = {"q1": "1", "q2": "3", "q3": "7", "q4": "20"}


@pytest.fixture(scope="module")
def chx_reference() -> Iterator[Reference]:
    yield from running(start_consistent_hash_reference)


@pytest.fixture(params=["leveret", "rabbitmq"])
def chx(request: pytest.FixtureRequest, tmp_path) -> Iterator[Amqp]:  # type: ignore[no-untyped-def]
    if request.param == "rabbitmq":
        client = Amqp("rabbitmq", request.getfixturevalue("chx_reference").port)
        yield client
        client.close()
        return
    server = InProcessBroker(tmp_path / "data").start()
    client = Amqp("leveret", server.port)
    yield client
    client.close()
    server.stop()


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"hash-header": "h", "hash-property": "message_id"},
         "hash-header and hash-property are mutually exclusive"),
        ({"hash-property": "app_id"}, "Unsupported property: app_id"),
        ({"hash-property": "headers"}, "Unsupported property: headers"),
    ],
)
def test_declare_errors(chx: Amqp, arguments: dict[str, str], text: str) -> None:
    ch = chx.channel()
    name = chx.uid("chx")
    code, reply = chx.soft_error(lambda: ch.exchange_declare(name, CHX, arguments=arguments))
    assert (code, reply) == (406, f"PRECONDITION_FAILED - {text}")
    assert not chx.exists("exchange", name)


@pytest.mark.parametrize("prop", ["correlation_id", "message_id", "timestamp"])
def test_supported_properties_declare(chx: Amqp, prop: str) -> None:
    ch = chx.channel()
    ch.exchange_declare(chx.uid("chx"), CHX, arguments={"hash-property": prop})


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("abc", 'The binding key must be an integer: <<"abc">>'),
        ("", 'The binding key must be an integer: <<>>'),
        ("1.5", 'The binding key must be an integer: <<"1.5">>'),
        (" 3", 'The binding key must be an integer: <<" 3">>'),
        ("0", "The binding key must be greater than 0"),
        ("-4", "The binding key must be greater than 0"),
    ],
)
def test_bind_errors(chx: Amqp, key: str, text: str) -> None:
    ch = chx.channel()
    x, q = chx.uid("chx"), chx.uid("q")
    ch.exchange_declare(x, CHX)
    ch.queue_declare(q)
    code, reply = chx.soft_error(lambda: ch.queue_bind(q, x, key))
    assert (code, reply) == (406, f"PRECONDITION_FAILED - {text}")


def _distribution(chx: Amqp, arguments: dict[str, str], props: list[pika.BasicProperties],
                  keys: list[str], unbind: str | None = None) -> dict[str, list[bytes]]:
    ch = chx.channel(confirm=True)
    x = chx.uid("chx")
    ch.exchange_declare(x, CHX, arguments=arguments)
    queues = {}
    for label, weight in WEIGHTS.items():
        queues[label] = chx.uid(label)
        ch.queue_declare(queues[label])
        ch.queue_bind(queues[label], x, weight)
    ch.queue_bind(queues["q2"], x, "50")  # a second binding to q2 adds no buckets
    if unbind is not None:
        ch.queue_unbind(queues[unbind], x, WEIGHTS[unbind])
    for i, (key, prop) in enumerate(zip(keys, props, strict=True)):
        ch.basic_publish(x, key, str(i).encode(), prop)
    return {label: chx.drain(ch, q) for label, q in queues.items()}


_COUNT = 2000
_SEEN: dict[str, dict[str, dict[str, list[bytes]]]] = {}
CASES = {
    "routing-key": ({}, [pika.BasicProperties()] * _COUNT,
                    [f"key-{i}-{'x' * (i % 17)}" for i in range(_COUNT)], None),
    "removed": ({}, [pika.BasicProperties()] * _COUNT,
                [f"k{i}" for i in range(_COUNT)], "q2"),
    "hash-header": ({"hash-header": "shard"},
                    [pika.BasicProperties(headers={"shard": v}) for v in
                     [f"user-{i}" if i % 3 else i * 7919 - 5000 if i % 2 else None
                      for i in range(_COUNT)]],
                    ["same"] * _COUNT, None),
    "hash-property": ({"hash-property": "message_id"},
                      [pika.BasicProperties(message_id=f"m{i}" if i % 10 else None)
                       for i in range(_COUNT)], ["same"] * _COUNT, None),
    "timestamp": ({"hash-property": "timestamp"},
                  [pika.BasicProperties(timestamp=1_700_000_000 + i * 37)
                   for i in range(_COUNT)], ["same"] * _COUNT, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_distribution_matches_rabbitmq(chx: Amqp, case: str) -> None:
    """Each message lands in the same-named queue on both brokers (the second run compares
    with the first)."""
    arguments, props, keys, unbind = CASES[case]
    got = _distribution(chx, arguments, props, keys, unbind)
    assert sum(len(v) for v in got.values()) == _COUNT
    if unbind is None:
        assert len([q for q, bodies in got.items() if bodies]) >= 3
    seen = _SEEN.setdefault(case, {})
    seen[chx.name] = got
    if len(seen) == 2:
        assert seen["leveret"] == seen["rabbitmq"]
