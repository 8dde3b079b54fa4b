"""Routing through the four exchange types, the default exchange, exchange-to-exchange
bindings and alternate exchanges: each scenario runs against Leveret and RabbitMQ alike
(`mq`), with the expected deliveries written out; a few run through aio-pika and kombu."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aio_pika
import kombu
import pika
import pytest

if TYPE_CHECKING:
    from e2e.conftest import Amqp  # the fixtures' helper (tests/e2e/conftest.py)
    from pika.adapters.blocking_connection import BlockingChannel

TOPIC_BINDINGS = [
    "", "#", "*", "a", "a.*", "a.#", "#.a", "*.*", "a..b", "a.*.b", "#.#", "a.#.b", "*.#",
    "..", ".", "a.", ".a", "#.*.#", "a.#.#.b",
]  # fmt: skip
TOPIC_KEYS = [
    "", "a", "a.b", "a..b", "a.x.b", "a.x.y.b", ".", "..", "a.", ".a", "b.a", "a.b.c", "x.a",
    "*", "#", "a.#",
]  # fmt: skip
ALL = TOPIC_KEYS
# What RabbitMQ 3.10 delivers for each binding key (observed, and the same in Leveret):
# `*` is exactly one word, `#` zero or more, and an empty word is a word.
TOPIC_EXPECTED = {
    "": [""],
    "#": ALL,
    "*": ["a", "*", "#"],
    "a": ["a"],
    "a.*": ["a.b", "a.", "a.#"],
    "a.#": ["a", "a.b", "a..b", "a.x.b", "a.x.y.b", "a.", "a.b.c", "a.#"],
    "#.a": ["a", ".a", "b.a", "x.a"],
    "*.*": ["a.b", ".", "a.", ".a", "b.a", "x.a", "a.#"],
    "a..b": ["a..b"],
    "a.*.b": ["a..b", "a.x.b"],
    "#.#": ALL,
    "a.#.b": ["a.b", "a..b", "a.x.b", "a.x.y.b"],
    "*.#": [k for k in ALL if k != ""],
    "..": [".."],
    ".": ["."],
    "a.": ["a."],
    ".a": [".a"],
    "#.*.#": [k for k in ALL if k != ""],
    "a.#.#.b": ["a.b", "a..b", "a.x.b", "a.x.y.b"],
}


def _bind_queues(
    ch: BlockingChannel, exchange: str, bindings: dict[str, dict[str, object]]
) -> dict[str, str]:
    queues = {}
    for label, arguments in bindings.items():
        queue = ch.queue_declare("", exclusive=True).method.queue
        key = str(arguments.pop("routing_key", ""))
        ch.queue_bind(queue, exchange, key, arguments=arguments or None)
        queues[label] = queue
    return queues


def test_topic_wildcards_and_empty_words(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    x = mq.uid("topic")
    ch.exchange_declare(x, "topic", auto_delete=True)
    queues = _bind_queues(ch, x, {k: {"routing_key": k} for k in TOPIC_BINDINGS})
    for key in TOPIC_KEYS:
        ch.basic_publish(x, key, key.encode())
    got = {k: [b.decode() for b in mq.drain(ch, q)] for k, q in queues.items()}
    assert got == TOPIC_EXPECTED


def test_direct_exact_key_and_several_bindings(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    key = mq.uid("key")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, "amq.direct", key + ".1")
    ch.queue_bind(q1, "amq.direct", key + ".2")
    ch.queue_bind(q2, "amq.direct", key + ".1")
    ch.queue_bind(q2, "amq.direct", key + ".1")  # the same binding twice is one binding
    for suffix in ("1", "2", "3", "1.x"):
        ch.basic_publish("amq.direct", f"{key}.{suffix}", suffix.encode())
    assert mq.drain(ch, q1) == [b"1", b"2"]
    assert mq.drain(ch, q2) == [b"1"]


def test_fanout_ignores_the_routing_key(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    x = mq.uid("fan")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x, "one")
    ch.queue_bind(q2, x, "two")
    ch.queue_bind(q2, x, "three")  # a second binding does not double the delivery
    ch.basic_publish(x, "anything", b"m")
    assert mq.drain(ch, q1) == [b"m"]
    assert mq.drain(ch, q2) == [b"m"]


HEADER_BINDINGS: dict[str, dict[str, object]] = {
    "all": {"x-match": "all", "a": 1, "b": "s"},
    "any": {"x-match": "any", "a": 1, "b": "s"},
    "default": {"a": 1, "b": "s"},
    "empty_all": {"x-match": "all"},
    "empty_any": {"x-match": "any"},
    "x_only_all": {"x-match": "all", "x-k": "v"},
    "x_only_any": {"x-match": "any", "x-k": "v"},
    "all_with_x": {"x-match": "all-with-x", "x-k": "v", "a": 1},
    "any_with_x": {"x-match": "any-with-x", "x-k": "v"},
    "void": {"x-match": "all", "p": None},
    "bool": {"x-match": "all", "t": True},
}
HEADER_MESSAGES: dict[str, dict[str, object] | None] = {
    "none": None,
    "a1": {"a": 1},
    "a1bs": {"a": 1, "b": "s"},
    "a2bs": {"a": 2, "b": "s"},
    "xk": {"x-k": "v"},
    "xka1": {"x-k": "v", "a": 1},
    "p": {"p": "anything"},
    "pnull": {"p": None},
    "t": {"t": True},
    "t1": {"t": 1},
    "along": {"a": 2**40},
    "astr": {"a": "1"},
    "bbytes": {"a": 1, "b": b"s"},  # pika sends bytes as a byte array: equal to longstr "s"
}
EVERY_MESSAGE = list(HEADER_MESSAGES)
HEADER_EXPECTED = {
    "all": ["a1bs", "bbytes"],
    "any": ["a1", "a1bs", "a2bs", "xka1", "bbytes"],
    "default": ["a1bs", "bbytes"],
    "empty_all": EVERY_MESSAGE,
    "empty_any": [],
    "x_only_all": EVERY_MESSAGE,  # x- keys are ignored by all/any: nothing left, all matches
    "x_only_any": [],
    "all_with_x": ["xka1"],
    "any_with_x": ["xk", "xka1"],
    "void": ["p", "pnull"],
    "bool": ["t"],
}


def test_headers_exchange_match_modes(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    x = mq.uid("hdr")
    ch.exchange_declare(x, "headers", auto_delete=True)
    queues = _bind_queues(ch, x, {k: dict(v) for k, v in HEADER_BINDINGS.items()})
    for label, headers in HEADER_MESSAGES.items():
        ch.basic_publish(x, "", label.encode(), pika.BasicProperties(headers=headers))
    got = {k: [b.decode() for b in mq.drain(ch, q)] for k, q in queues.items()}
    assert got == HEADER_EXPECTED


async def test_headers_values_of_int_and_float(mq: Amqp) -> None:
    """pika cannot send floats in tables, so this one goes through aio-pika.

    RabbitMQ 3.10 compares header values with Erlang's `==` (1 == 1.0); 4.x compares terms
    exactly (1 =/= 1.0, per the reference document), and Leveret targets 4.2 here.
    """
    connection = await aio_pika.connect(mq.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        x = await channel.declare_exchange(
            mq.uid("hdr"), aio_pika.ExchangeType.HEADERS, auto_delete=True
        )
        by_int = await channel.declare_queue("", exclusive=True)
        by_float = await channel.declare_queue("", exclusive=True)
        await by_int.bind(x, arguments={"f": 1})
        await by_float.bind(x, arguments={"f": 1.0})
        await x.publish(aio_pika.Message(b"int", headers={"f": 1}), "")
        await x.publish(aio_pika.Message(b"float", headers={"f": 1.0}), "")
        got = []
        for queue in (by_int, by_float):
            bodies = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                bodies.append(message.body)
            got.append(bodies)
    if mq.is_leveret:
        assert got == [[b"int"], [b"float"]]
    else:
        assert got == [[b"int", b"float"], [b"int", b"float"]]


@pytest.mark.parametrize(
    ("x_match", "text"),
    [
        (
            "foo",
            'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; expected all, any, '
            "all-with-x, or any-with-x",
        ),
        (1, "PRECONDITION_FAILED - Invalid x-match field type signedint (value 1); "
            "expected longstr"),
        (True, "PRECONDITION_FAILED - Invalid x-match field type bool (value true); "
               "expected longstr"),
    ],
)  # fmt: skip
def test_headers_binding_with_invalid_x_match(mq: Amqp, x_match: object, text: str) -> None:
    ch = mq.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    error = mq.soft_error(lambda: ch.queue_bind(queue, "amq.headers", "", {"x-match": x_match}))
    assert error == (406, text)


def test_predeclared_exchanges(mq: Amqp) -> None:
    ch = mq.channel()
    for name, kind in [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ]:
        ch.exchange_declare(name, passive=True)
        ch.exchange_declare(name, kind, durable=True)  # an equivalent redeclare is allowed
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, "amq.match", "", {"x-match": "any", "k": "v"})
    ch.confirm_delivery()
    ch.basic_publish("amq.match", "", b"m", pika.BasicProperties(headers={"k": "v"}))
    assert mq.drain(ch, queue) == [b"m"]
    ch.queue_unbind(queue, "amq.match", "", {"x-match": "any", "k": "v"})


def test_default_exchange_routes_by_queue_name(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    q1 = ch.queue_declare(mq.uid("q"), exclusive=True).method.queue
    q2 = ch.queue_declare(mq.uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q1, b"one")
    ch.basic_publish("", q1, b"cc", pika.BasicProperties(headers={"CC": [q2]}))
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", mq.uid("absent"), b"lost", mandatory=True)
    assert mq.drain(ch, q1) == [b"one", b"cc"]
    assert mq.drain(ch, q2) == [b"cc"]


def test_cc_and_bcc_headers_add_routing_keys(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    x = mq.uid("direct")
    ch.exchange_declare(x, "direct", auto_delete=True)
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(4)]
    for i, queue in enumerate(queues):
        ch.queue_bind(queue, x, f"k{i}")
    ch.queue_bind(queues[0], x, "k1")  # reached twice (key and CC): delivered once
    props = pika.BasicProperties(headers={"CC": ["k1"], "BCC": ["k2"]})
    ch.basic_publish(x, "k0", b"m", props)
    seen = []
    for queue in queues:
        method, props, _body = ch.basic_get(queue, auto_ack=True)
        seen.append(None if method is None else (method.routing_key, props.headers))
        if method is not None:
            assert ch.basic_get(queue, auto_ack=True)[0] is None
    # BCC is removed from the delivered message; CC stays; the routing key is the original.
    assert seen == [("k0", {"CC": ["k1"]}), ("k0", {"CC": ["k1"]}), ("k0", {"CC": ["k1"]}), None]


def test_exchange_to_exchange_bindings(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    source, dest_fanout, dest_direct = mq.uid("src"), mq.uid("dfan"), mq.uid("ddir")
    ch.exchange_declare(source, "topic", auto_delete=True)
    ch.exchange_declare(dest_fanout, "fanout", auto_delete=True)
    ch.exchange_declare(dest_direct, "direct", auto_delete=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.exchange_bind(dest_fanout, source, "a.*")
    ch.exchange_bind(dest_direct, source, "#")
    ch.queue_bind(q1, dest_fanout)
    ch.queue_bind(q2, dest_direct, "a.b")
    ch.queue_bind(q1, source, "a.b")  # q1 reachable twice: still one copy
    ch.exchange_bind(source, dest_fanout, "")  # a cycle: cut, no loop
    for key in ("a.b", "a.c", "x"):
        ch.basic_publish(source, key, key.encode())
    assert mq.drain(ch, q1) == [b"a.b", b"a.c"]
    assert mq.drain(ch, q2) == [b"a.b"]
    ch.exchange_unbind(dest_fanout, source, "a.*")
    ch.exchange_unbind(dest_direct, source, "#")
    ch.basic_publish(source, "a.c", b"after")
    assert mq.drain(ch, q1) == []
    assert mq.drain(ch, q2) == []


def test_alternate_exchange_chain_and_cycle(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    main, ae, ae2 = mq.uid("main"), mq.uid("ae"), mq.uid("ae2")
    ch.exchange_declare(ae2, "fanout", auto_delete=True)
    ch.exchange_declare(ae, "direct", arguments={"alternate-exchange": ae2}, auto_delete=True)
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae}, auto_delete=True)
    q_main = ch.queue_declare("", exclusive=True).method.queue
    q_ae = ch.queue_declare("", exclusive=True).method.queue
    q_ae2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_main, main, "k")
    ch.queue_bind(q_ae, ae, "ka")
    ch.queue_bind(q_ae2, ae2)
    ch.basic_publish(main, "k", b"1", mandatory=True)
    ch.basic_publish(main, "ka", b"2", mandatory=True)
    ch.basic_publish(main, "zz", b"3", mandatory=True)
    assert (mq.drain(ch, q_main), mq.drain(ch, q_ae), mq.drain(ch, q_ae2)) == (
        [b"1"],
        [b"2"],
        [b"3"],
    )
    missing = mq.uid("x")
    ch.exchange_declare(missing, "direct", arguments={"alternate-exchange": mq.uid("none")})
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(missing, "k", b"4", mandatory=True)
    loop1, loop2 = mq.uid("loop"), mq.uid("loop")
    ch.exchange_declare(loop1, "direct", arguments={"alternate-exchange": loop2})
    ch.exchange_declare(loop2, "direct", arguments={"alternate-exchange": loop1})
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(loop1, "k", b"5", mandatory=True)


def test_alternate_exchange_not_used_when_an_exchange_binding_matches(mq: Amqp) -> None:
    ch = mq.channel(confirm=True)
    main, ae, dest = mq.uid("main"), mq.uid("ae"), mq.uid("dest")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(dest, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    q_ae = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_ae, ae)
    ch.exchange_bind(dest, main, "k")  # dest has no queues at all
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(main, "k", b"to-dest", mandatory=True)
    ch.basic_publish(main, "other", b"to-ae", mandatory=True)
    assert mq.drain(ch, q_ae) == [b"to-ae"]


async def test_aio_pika_topic_and_headers_routing(lev: Amqp) -> None:
    connection = await aio_pika.connect(lev.url)
    async with connection:
        channel = await connection.channel()
        topic = await channel.declare_exchange("logs", aio_pika.ExchangeType.TOPIC)
        headers = await channel.declare_exchange("hdrs", aio_pika.ExchangeType.HEADERS)
        errors = await channel.declare_queue("", exclusive=True)
        everything = await channel.declare_queue("", exclusive=True)
        matched = await channel.declare_queue("", exclusive=True)
        await errors.bind(topic, "*.*.error")
        await everything.bind(topic, "#")
        await matched.bind(headers, arguments={"x-match": "any", "kind": "a", "n": 2})
        for key in ("app.web.error", "app.db.info", "app.error", "error"):
            await topic.publish(aio_pika.Message(key.encode()), key)
        await headers.publish(aio_pika.Message(b"h1", headers={"n": 2}), "")
        await headers.publish(aio_pika.Message(b"h2", headers={"kind": "b"}), "")

        async def bodies(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
            out = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                out.append(message.body)
            return out

        assert await bodies(errors) == [b"app.web.error"]
        assert await bodies(everything) == [
            b"app.web.error",
            b"app.db.info",
            b"app.error",
            b"error",
        ]
        assert await bodies(matched) == [b"h1"]


def test_kombu_exchange_types(lev: Amqp) -> None:
    with kombu.Connection(lev.url) as conn:
        channel = conn.channel()
        direct = kombu.Exchange("k-direct", "direct", channel=channel)
        fanout = kombu.Exchange("k-fanout", "fanout", channel=channel)
        topic = kombu.Exchange("k-topic", "topic", channel=channel)
        queues = {
            "direct": kombu.Queue("k-q-direct", direct, "red", channel=channel, exclusive=True),
            "fanout": kombu.Queue("k-q-fanout", fanout, channel=channel, exclusive=True),
            "topic": kombu.Queue("k-q-topic", topic, "red.#", channel=channel, exclusive=True),
        }
        for queue in queues.values():
            queue.declare()
        producer = kombu.Producer(channel)
        producer.publish("d", exchange=direct, routing_key="red")
        producer.publish("d2", exchange=direct, routing_key="blue")
        producer.publish("f", exchange=fanout, routing_key="whatever")
        producer.publish("t", exchange=topic, routing_key="red.light.on")
        got = {}
        for name, queue in queues.items():
            got[name] = []
            while (message := queue.get(no_ack=True)) is not None:
                got[name].append(message.payload)
        assert got == {"direct": ["d"], "fanout": ["f"], "topic": ["t"]}
        channel.close()
