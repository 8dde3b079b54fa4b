"""Super streams over AMQP 0.9.1: topology, routing, and a consumer group across partitions."""

from __future__ import annotations

import collections

import pytest
from support.amqp import connect, consume
from support.brokers import InProcessBroker

from leveret.broker.model import superstream


def create(broker: InProcessBroker, name: str, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    vhost = broker.broker.vhosts["/"]
    return broker.call(lambda: superstream.add(vhost, name, **kwargs))


def test_add_creates_the_rabbitmq_topology(broker: InProcessBroker) -> None:
    names = create(broker, "invoices", partitions=3)
    assert names == ["invoices-0", "invoices-1", "invoices-2"]
    vhost = broker.broker.vhosts["/"]
    exchange = vhost.exchanges["invoices"]
    assert (exchange.type, exchange.durable, exchange.arguments) == (
        "direct", True, {"x-super-stream": True})
    assert [(k, q.name) for k, q in exchange.partition_keys()] == [
        ("0", "invoices-0"), ("1", "invoices-1"), ("2", "invoices-2")]
    assert all(vhost.queues[n].type == "stream" for n in names)
    assert create(broker, "regions", binding_keys=["amer", "emea", "apac"]) == [
        "regions-amer", "regions-emea", "regions-apac"]


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"partitions": 0}, "The partition number must be greater than 0"),
    ({"partitions": 1001}, "The partition number must not exceed 1000"),
])
def test_add_validation(broker: InProcessBroker, kwargs, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=text):
        create(broker, "bad", **kwargs)


def test_add_refuses_existing_names_and_rolls_back(broker: InProcessBroker) -> None:
    conn = connect(broker.port)
    conn.channel().queue_declare("taken-1", durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(Exception, match="there is already a queue named taken-1"):
        create(broker, "taken", partitions=3)
    vhost = broker.broker.vhosts["/"]
    assert "taken" not in vhost.exchanges and "taken-0" not in vhost.queues
    conn.close()


def test_routing_by_binding_key_and_by_hash(broker: InProcessBroker) -> None:
    create(broker, "invoices", partitions=3)
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    for key in ("0", "1", "2", "2"):
        ch.basic_publish("invoices", key, key.encode())
    counts = {n: ch.queue_declare(n, passive=True).method.message_count
              for n in ("invoices-0", "invoices-1", "invoices-2")}
    assert counts == {"invoices-0": 1, "invoices-1": 1, "invoices-2": 2}
    # A key that matches no binding is unroutable without hash routing...
    ch.basic_publish("invoices", "hello1", b"x")
    assert sum(ch.queue_declare(n, passive=True).method.message_count
               for n in ("invoices-0", "invoices-1", "invoices-2")) == 4
    conn.close()


def test_hash_routing_spreads_keys_as_the_clients_do(broker: InProcessBroker) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.exchange_declare("orders", "direct", durable=True, arguments={
        "x-super-stream": True, "x-super-stream-routing": "hash"})
    for i, suffix in enumerate(("01", "02", "03")):
        ch.queue_declare(f"orders-{suffix}", durable=True, arguments={"x-queue-type": "stream"})
        ch.queue_bind(f"orders-{suffix}", "orders", f"k{i}",
                      arguments={"x-stream-partition-order": i})
    ch.confirm_delivery()
    ch.basic_publish("orders", "hello4", b"to-03")
    ch.basic_publish("orders", "hello2", b"to-01")
    got = consume(conn.channel(), "orders-03", 1, arguments={"x-stream-offset": "first"})
    assert [b for _m, _p, b in got] == [b"to-03"]
    got = consume(conn.channel(), "orders-01", 1, arguments={"x-stream-offset": "first"})
    assert [b for _m, _p, b in got] == [b"to-01"]
    conn.close()


def test_consumer_group_spreads_and_rebalances_without_loss(broker: InProcessBroker) -> None:
    """The seed's example: invoices with 3 partitions, a group of 3 consumes everything
    exactly once, in order within each partition; a killed member's partition moves on."""
    names = create(broker, "invoices", partitions=3)
    conn = connect(broker.port)
    pub = conn.channel()
    pub.confirm_delivery()
    for i in range(15):  # some before the group forms: rebalancing hands them over once
        pub.basic_publish("invoices", str(i % 3), b"%d" % i)

    received: dict[str, list[tuple[str, int, bytes]]] = collections.defaultdict(list)
    members = {}
    for member in ("m1", "m2", "m3"):
        member_conn = connect(broker.port)
        for name in names:  # a consumer tag is unique per channel: one channel per partition
            ch = member_conn.channel()
            ch.basic_qos(prefetch_count=5)
            def on_message(c, m, p, b, member=member, name=name) -> None:  # type: ignore[no-untyped-def]
                received[member].append((name, p.headers["x-stream-offset"], b))
                c.basic_ack(m.delivery_tag)
            ch.basic_consume(name, on_message, consumer_tag="group", arguments={
                "x-single-active-consumer": True, "x-stream-offset": "first"})
        members[member] = member_conn

    def total() -> int:
        return sum(len(v) for v in received.values())

    def pump(until: int) -> None:
        for _ in range(100):
            for c in members.values():
                c.process_data_events(0.02)
            if total() >= until:
                break

    pump(15)
    for i in range(15, 30):
        pub.basic_publish("invoices", str(i % 3), b"%d" % i)
    pump(30)
    assert total() == 30
    by_partition = collections.defaultdict(list)
    for items in received.values():
        for name, offset, _body in items:
            by_partition[name].append(offset)
    # Every message exactly once, in order within each partition.
    assert dict(by_partition) == {n: list(range(10)) for n in names}
    # Once the group has formed, each partition has exactly one active member, all different.
    owners = {name: {m for m, items in received.items() for n, o, _b in items
                     if n == name and o >= 5} for name in names}
    assert all(len(o) == 1 for o in owners.values()), owners
    assert len(set().union(*owners.values())) == 3

    # Kill the member that owns partition 0: its partition moves to another member.
    owner0 = next(iter(owners["invoices-0"]))
    members.pop(owner0).close()
    for i in range(30, 36):
        pub.basic_publish("invoices", str(i % 3), b"%d" % i)
    pump(36)
    new_offsets = [(n, o) for m, items in received.items() if m != owner0
                   for n, o, _b in items if o >= 10]
    assert sorted(new_offsets) == sorted((n, o) for n in names for o in (10, 11))
    for c in members.values():
        c.close()
    conn.close()


def test_delete_removes_exchange_and_partitions(broker: InProcessBroker) -> None:
    create(broker, "gone", partitions=2)
    vhost = broker.broker.vhosts["/"]
    deleted = broker.call(lambda: superstream.delete(vhost, "gone"))
    assert deleted == ["gone-0", "gone-1"]
    assert "gone" not in vhost.exchanges and "gone-0" not in vhost.queues
