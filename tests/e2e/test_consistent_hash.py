"""The x-consistent-hash exchange against Leveret and RabbitMQ 3.10 with its
rabbitmq_consistent_hash_exchange plugin: every declare and bind error with its text, and
the distribution itself (each message in the same-named queue on both brokers)."""

from __future__ import annotations

import struct
from typing import Any

import pika
import pytest
from pamqp import commands, frame
from support.brokers import InProcessBroker
from support.rawamqp import FRAME_BODY, FRAME_HEADER, RawClient, raw_frame

from .conftest import Amqp, HashBroker

CHX = "x-consistent-hash"
WEIGHTS = {"q1": "1", "q2": "3", "q3": "7", "q4": "20"}


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


def test_the_same_keys_follow_the_ring_as_it_changes(chx: Amqp) -> None:
    """The same 300 routing keys published three times: on a ring of two queues, after a
    third is bound, and after the first is unbound; each message lands where RabbitMQ puts it
    (Leveret remembers where a key went: a ring change must forget it)."""
    ch = chx.channel(confirm=True)
    x = chx.uid("chx")
    ch.exchange_declare(x, CHX)
    queues = [chx.uid(f"r{i}") for i in range(3)]
    for q in queues:
        ch.queue_declare(q)
    keys = [f"order-{i}" for i in range(300)]

    def publish(round_: str) -> None:
        for key in keys:
            ch.basic_publish(x, key, f"{round_}:{key}".encode())

    ch.queue_bind(queues[0], x, "10")
    ch.queue_bind(queues[1], x, "10")
    publish("two")
    ch.queue_bind(queues[2], x, "20")
    publish("three")
    ch.queue_unbind(queues[0], x, "10")
    publish("unbound")
    got = {f"r{i}": sorted(chx.drain(ch, q)) for i, q in enumerate(queues)}
    assert sum(len(v) for v in got.values()) == 900
    assert any(body.startswith(b"three:") for body in got["r2"])  # the third took some
    assert not any(body.startswith(b"unbound:") for body in got["r0"])
    seen = _SEEN.setdefault("ring-changes", {})
    seen[chx.name] = got
    if len(seen) == 2:
        assert seen["leveret"] == seen["rabbitmq"]


# -- hash-header: each wire type hashes as RabbitMQ's {Type, Value} ------------------------------


def _field(code: str, value: Any) -> bytes:
    """One encoded field value of wire type `code`."""
    fixed = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q",
             "L": ">q", "f": ">f", "d": ">d", "T": ">Q", "t": ">B", "D": ">BI"}
    if code in fixed:
        packed = struct.pack(fixed[code], *value) if code == "D" else \
            struct.pack(fixed[code], value)
        return code.encode() + packed
    if code == "V":
        return b"V"
    if code == "F":
        value = b"".join(_entry(k, v) for k, v in value)
    elif code == "A":
        value = b"".join(value)
    return code.encode() + struct.pack(">I", len(value)) + value


def _entry(key: str, field: bytes) -> bytes:
    return bytes([len(key)]) + key.encode() + field


def _typed_values() -> list[bytes]:
    """The shard header's values: every wire type, several values each."""
    values = []
    for i in range(12):
        n = i * 7 - 20
        values += [_field("b", n), _field("B", n + 20), _field("s", n * 300), _field("u", i * 5000),
                   _field("I", n), _field("i", 3_000_000_000 + i), _field("l", n),
                   _field("l", 2**40 + i), _field("L", n), _field("f", n / 4),
                   _field("d", n / 4), _field("d", float(n)), _field("D", (i % 3, i * 1234)),
                   _field("T", 1_700_000_000 + i), _field("t", i % 2), _field("x", b"v%d" % i),
                   _field("S", b"%d" % n), _field("S", b"v%d" % i),
                   _field("F", [("a", _field("I", n)), ("b", _field("S", b"x"))]),
                   _field("A", [_field("I", n), _field("S", b"v%d" % i)])]
    return [*values, _field("V", None), b""]  # b"": no shard header, only the other one


def _publish_typed(client: RawClient, exchange: str, tables: list[bytes]) -> None:
    """Publish one message per table content (the shard header after another header) on the
    raw client's channel 1, with confirms, and wait for the last ack."""
    client.send_method(1, commands.Confirm.Select())
    client.expect(commands.Confirm.SelectOk, 1)
    frames = []
    for i, shard in enumerate(tables):
        table = _entry("before", _field("S", b"x")) + (_entry("shard", shard) if shard else b"")
        body = str(i).encode()
        header = struct.pack(">HHQHI", 60, 0, len(body), 0x2000, len(table)) + table
        frames += [frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key="k"), 1),
                   raw_frame(FRAME_HEADER, 1, header), raw_frame(FRAME_BODY, 1, body)]
    client.send(b"".join(frames))
    while True:
        _channel, method = client.next_method(timeout=10)
        assert isinstance(method, commands.Basic.Ack), method
        if method.delivery_tag == len(tables):
            return


def test_header_wire_types_match_rabbitmq(chx: Amqp) -> None:
    """A header value hashes with its own wire type: a `long` 5, an `int` 5 and a `byte` 5
    reach the queues RabbitMQ picks for each (the second broker compares with the first)."""
    ch = chx.channel()
    x = chx.uid("chx")
    ch.exchange_declare(x, CHX, arguments={"hash-header": "shard"})
    queues = {}
    for label, weight in WEIGHTS.items():
        queues[label] = chx.uid(label)
        ch.queue_declare(queues[label])
        ch.queue_bind(queues[label], x, weight)
    tables = _typed_values()
    _publish_typed(chx.raw(), x, tables)
    got = {label: chx.drain(ch, q) for label, q in queues.items()}
    assert sum(len(v) for v in got.values()) == len(tables)
    seen = _SEEN.setdefault("wire-types", {})
    seen[chx.name] = got
    if len(seen) == 2:
        assert seen["leveret"] == seen["rabbitmq"]


# -- the ring after a restart ----------------------------------------------------------------------

# created in this order; RabbitMQ recovers them ordered by key (as bytes), then destination
RESTART_RING = [("qz", "7"), ("qa", "20"), ("qm", "3"), ("qb", "1"), ("qc", "100"), ("qy", "2"),
                ("qd", "15"), ("qe", "9")]


def test_ring_after_restart_matches_rabbitmq(hash_broker: HashBroker) -> None:
    """A durable exchange with durable queues, before and after a restart of the broker:
    RabbitMQ 3.10 rebuilds the ring from its bindings in their stored order, so messages move;
    Leveret moves them the same way (the second broker compares with the first)."""
    amqp = hash_broker.amqp
    ch = amqp.channel()
    x, fan = amqp.uid("chx"), amqp.uid("fan")
    ch.exchange_declare(x, CHX, durable=True)
    ch.exchange_declare(fan, "fanout", durable=True)
    queues = {label: amqp.uid(label) for label, _ in RESTART_RING}
    for label, weight in RESTART_RING:
        ch.queue_declare(queues[label], durable=True)
        ch.queue_bind(queues[label], x, weight)
    ch.queue_bind(queues["qz"], x, "10")  # no buckets now; "10" sorts before "7" after restart
    queues["via-fan"] = amqp.uid("via")
    ch.queue_declare(queues["via-fan"], durable=True)
    ch.queue_bind(queues["via-fan"], fan)
    ch.exchange_bind(fan, x, "3")  # an exchange sorts before a queue with the same key

    def distribution(amqp: Amqp) -> dict[str, list[bytes]]:
        ch = amqp.channel(confirm=True)
        for i in range(1000):
            ch.basic_publish(x, f"k{i}", str(i).encode())
        return {label: amqp.drain(ch, q) for label, q in queues.items()}

    before = distribution(amqp)
    after = distribution(hash_broker.restart())
    assert sum(len(v) for v in after.values()) == 1000
    seen = _SEEN.setdefault("restart", {})
    seen[hash_broker.name] = {"before": before, "after": after}
    if len(seen) == 2:
        assert seen["leveret"]["before"] == seen["rabbitmq"]["before"]
        assert seen["leveret"]["after"] == seen["rabbitmq"]["after"]


def test_hash_property_to_streams_routes_each_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Publishes pipelined with one routing key and no headers reach the broker as one run,
    which a single stream may take in one go; with `hash-property` each message still picks
    its own stream, as the same exchange with classic queues does."""
    server = InProcessBroker(tmp_path / "data").start()
    amqp = Amqp("leveret", server.port)
    try:
        ch = amqp.channel()
        counts = {}
        for kind in ("stream", "classic"):
            ch.exchange_declare(kind, CHX, arguments={"hash-property": "message_id"})
            for label, weight in WEIGHTS.items():
                ch.queue_declare(f"{kind}-{label}", durable=True,
                                 arguments={"x-queue-type": kind})
                ch.queue_bind(f"{kind}-{label}", kind, weight)
        publisher = amqp.channel()
        for kind in ("stream", "classic"):
            for i in range(2000):
                publisher.basic_publish(kind, "same", b"m",
                                        pika.BasicProperties(message_id=f"m{i}"))
        amqp.wait(lambda: sum(amqp.ready(f"classic-{label}") for label in WEIGHTS) == 2000)
        for kind in ("stream", "classic"):
            counts[kind] = amqp.wait(lambda kind=kind: (
                lambda c: c if sum(c.values()) == 2000 else None)(
                    {label: amqp.ready(f"{kind}-{label}") for label in WEIGHTS}))
        assert counts["stream"] == counts["classic"]
        assert len([n for n in counts["classic"].values() if n]) >= 3
    finally:
        amqp.close()
        server.stop()
