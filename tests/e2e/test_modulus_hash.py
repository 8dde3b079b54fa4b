"""The x-modulus-hash exchange (RabbitMQ 4.3's core type) against Leveret and RabbitMQ 3.10,
where the same type comes with the rabbitmq_sharding plugin.

Both pick the destination `phash2([RoutingKey | CC ++ BCC]) rem N` among the N bindings; 4.3
sorts the destinations, 3.10 takes its route table's order (binding key, then destination).
With one binding key for all the bindings the two orders are the same, so those tests are
differential; the key-independence of 4.3 is checked against values computed with RabbitMQ's
algorithm in `erl` (OTP 25: `lists:sort` of the `#resource{}` records, `erlang:phash2/2`)."""

from __future__ import annotations

import pika
import pytest
from support.brokers import InProcessBroker

from .conftest import Amqp, HashBroker

MOD = "x-modulus-hash"
_SEEN: dict[str, dict[str, object]] = {}


def _compare(case: str, name: str, got: object) -> None:
    """Keep one broker's result; the second broker's must equal the first's."""
    seen = _SEEN.setdefault(case, {})
    seen[name] = got
    if len(seen) == 2:
        assert seen["leveret"] == seen["rabbitmq"]


def _topology(amqp: Amqp, durable: bool = False) -> tuple[str, dict[str, str]]:
    """An x-modulus-hash exchange with five queues made in no sorted order (q2 bound twice,
    with other arguments), and a fanout exchange in front of one more queue."""
    ch = amqp.channel()
    x, fan = amqp.uid("mod"), amqp.uid("fan")
    ch.exchange_declare(x, MOD, durable=durable)
    ch.exchange_declare(fan, "fanout", durable=durable)
    queues = {}
    for label in ("q4", "q1", "q5", "q2", "q3", "via-fan"):
        queues[label] = amqp.uid(label)
        ch.queue_declare(queues[label], durable=durable)
        if label != "via-fan":
            ch.queue_bind(queues[label], x, "shard")
    ch.queue_bind(queues["q2"], x, "shard", arguments={"second": 1})
    ch.queue_bind(queues["via-fan"], fan)
    ch.exchange_bind(fan, x, "shard")
    return x, queues


def _publish(amqp: Amqp, x: str, queues: dict[str, str], count: int) -> dict[str, list[bytes]]:
    ch = amqp.channel(confirm=True)
    for i in range(count):
        headers = None
        if i % 5 == 1:
            headers = {"CC": [f"cc{i}", "more"]}
        elif i % 5 == 2:
            headers = {"CC": [f"cc{i}"], "BCC": [f"bcc{i}"]}
        ch.basic_publish(x, f"key-{i}", str(i).encode(), pika.BasicProperties(headers=headers))
    return {label: amqp.drain(ch, q) for label, q in queues.items()}


def test_distribution_matches_rabbitmq(chx: Amqp) -> None:
    """Each message in the same-named queue on both brokers: routing keys, CC and BCC, a
    destination bound twice (two slots), an exchange among the destinations; then after an
    unbind."""
    x, queues = _topology(chx)
    got = _publish(chx, x, queues, 1500)
    assert sum(len(v) for v in got.values()) == 1500
    assert all(got.values())
    assert len(got["q2"]) > max(len(got["q1"]), len(got["q3"]))  # two bindings, two slots
    chx.channel().queue_unbind(queues["q3"], x, "shard")
    after = _publish(chx, x, queues, 500)
    assert after["q3"] == []
    _compare("distribution", chx.name, (got, after))


def test_binding_key_does_not_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """4.3 sorts the destinations: the binding keys and the order of binding do not change
    where a message goes. Expected: RabbitMQ 4.3's rule evaluated in erl over the sorted
    [x-z, q-a, q-a, q-b, q-c] for the routing keys "1".."30" (3.10 would order them by key)."""
    expected = ["q-b", "q-a", "x-z", "x-z", "q-c", "q-a", "x-z", "q-c", "q-b", "x-z",
                "x-z", "q-b", "x-z", "q-c", "x-z", "q-c", "x-z", "q-a", "q-a", "q-b",
                "q-a", "q-c", "x-z", "q-c", "q-a", "x-z", "x-z", "q-a", "q-c", "q-a"]
    server = InProcessBroker(tmp_path / "data").start()
    amqp = Amqp("leveret", server.port)
    try:
        ch = amqp.channel(confirm=True)
        ch.exchange_declare("m", MOD)
        ch.exchange_declare("x-z", "fanout")
        for name in ("q-b", "q-a", "q-c", "via-x-z"):
            ch.queue_declare(name)
        ch.queue_bind("via-x-z", "x-z")
        for destination, key in (("q-b", "z"), ("q-a", "y"), ("q-c", "x"), ("x-z", "w"),
                                 ("q-a", "v")):
            if destination == "x-z":
                ch.exchange_bind(destination, "m", key)
            else:
                ch.queue_bind(destination, "m", key)
        for i in range(1, 31):
            ch.basic_publish("m", str(i), str(i).encode())
        got = {name: amqp.drain(ch, "via-x-z" if name == "x-z" else name)
               for name in ("q-a", "q-b", "q-c", "x-z")}
        assert got == {name: [str(i).encode() for i, e in enumerate(expected, 1) if e == name]
                       for name in got}
    finally:
        amqp.close()
        server.stop()


def test_unroutable_and_alternate_exchange(chx: Amqp) -> None:
    """No binding: a mandatory message comes back (312 NO_ROUTE), an alternate exchange
    takes it."""
    ch = chx.channel(confirm=True)
    x, ae, q = chx.uid("mod"), chx.uid("ae"), chx.uid("q")
    ch.exchange_declare(x, MOD)
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        ch.basic_publish(x, "k", b"lost", mandatory=True)
    assert info.value.messages[0].method.reply_code == 312
    ch.exchange_declare(ae, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, ae)
    y = chx.uid("mod")
    ch.exchange_declare(y, MOD, arguments={"alternate-exchange": ae})
    ch.basic_publish(y, "k", b"to-ae", mandatory=True)
    assert chx.drain(ch, q) == [b"to-ae"]


def test_any_arguments_and_keys_equivalence(chx: Amqp) -> None:
    """No argument or binding key is checked; a redeclaration is equivalent unless its
    alternate exchange differs (the only argument RabbitMQ compares), with RabbitMQ's text."""
    ch = chx.channel()
    x, q = chx.uid("mod"), chx.uid("q")
    ch.exchange_declare(x, MOD, arguments={"hash-header": "h", "anything": 5})
    ch.queue_declare(q)
    for key in ("", "abc", "-1", "0"):
        ch.queue_bind(q, x, key)
    ch.exchange_declare(x, MOD, arguments={"hash-header": "other"})
    code, text = chx.soft_error(
        lambda: ch.exchange_declare(x, MOD, arguments={"alternate-exchange": "ae"}))
    assert code == 406
    _compare("equivalence", chx.name, text.replace(x, "X"))


def test_routing_stable_across_restart(hash_broker: HashBroker) -> None:
    """A durable exchange with durable queues: the same messages reach the same queues
    before and after a restart, on both brokers alike."""
    amqp = hash_broker.amqp
    x, queues = _topology(amqp, durable=True)
    before = _publish(amqp, x, queues, 500)
    after = _publish(hash_broker.restart(), x, queues, 500)
    assert after == before
    _compare("restart", hash_broker.name, before)
