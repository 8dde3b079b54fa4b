"""Forwarding between cluster nodes, with a real etcd, real `leveret serve` nodes and real
clients (pika, aio-pika, kombu): a client of node B uses queues held by node A as if they were
B's own (publishes with confirms, consumers within prefetch, acks, nacks, rejects, recover,
cancel, basic.get, purge, delete, stream offsets), each publisher's order holds, and when A is
killed B's clients get RabbitMQ's answers, then everything works again once A is back."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, NackError
from support.brokers import BrokerProcess
from support.cluster import ClusterNode, make_node, wait_until
from support.etcd import EtcdServer
from support.procstat import rss_mb

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(node: BrokerProcess) -> pika.BlockingConnection:
    params = pika.URLParameters(node.url)
    params.client_properties = {"capabilities": {"consumer_cancel_notify": True,
                                                 "publisher_confirms": True,
                                                 "basic.nack": True}}
    return pika.BlockingConnection(params)


def visible(node: BrokerProcess, queue: str) -> bool:
    """`queue` answers a passive declare on `node`."""
    conn = connect(node)
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()


def counts(node: BrokerProcess, queue: str) -> tuple[int, int]:
    """(messages, consumers) as a passive declare on `node` reports them."""
    conn = connect(node)
    try:
        ok = conn.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


def declare_on(node: BrokerProcess, queue: str, **kwargs: Any) -> None:
    conn = connect(node)
    conn.channel().queue_declare(queue, durable=True, **kwargs)
    conn.close()


@pytest.fixture
def ab(tmp_path: Path, etcd: EtcdServer, cluster: str,
       nodes: list[BrokerProcess]) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    a = make_node(tmp_path, etcd.url, cluster, "a", management=True)
    b = make_node(tmp_path, etcd.url, cluster, "b", management=True)
    nodes.extend((a.start(), b.start()))
    wait_until(lambda: "cluster link up" in a.log() and "cluster link up" in b.log())
    yield a, b


@pytest.fixture
def ab_patient(tmp_path: Path, etcd: EtcdServer, cluster: str,
               nodes: list[BrokerProcess]) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    """`ab` with a lease and a link timeout of 5 s: a test that stops a node for a second to
    watch backpressure must not, on a loaded machine, watch failure detection instead."""
    patient = {"LEVERET_CLUSTER_LEASE_TTL_S": "5", "LEVERET_CLUSTER_HEARTBEAT_TIMEOUT_S": "5"}
    a = make_node(tmp_path, etcd.url, cluster, "a", management=True, env=patient)
    b = make_node(tmp_path, etcd.url, cluster, "b", management=True, env=patient)
    nodes.extend((a.start(), b.start()))
    wait_until(lambda: "cluster link up" in a.log() and "cluster link up" in b.log())
    yield a, b


def on_a(ab: tuple[ClusterNode, ClusterNode], queue: str, **kwargs: Any) -> None:
    """Declare `queue` on A and wait until B sees it."""
    a, b = ab
    declare_on(a, queue, **kwargs)
    wait_until(lambda: visible(b, queue), timeout=10)


def drain(conn: pika.BlockingConnection, got: list[Any], want: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        conn.process_data_events(0.1)


def test_publish_with_confirms_on_b_to_a_queue_on_a_then_consume_on_a_and_on_b(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.pub")
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2, headers={"k": "v"}, message_id="id-1")
    ch.exchange_declare("x.pub", "direct")
    ch.queue_bind("q.pub", "x.pub", "rk")
    for i in range(100):
        ch.basic_publish("x.pub", "rk", f"m{i}".encode(), props, mandatory=True)
    assert counts(a, "q.pub") == (100, 0)
    assert counts(b, "q.pub") == (100, 0)

    conn_a = connect(a)
    method, header, body = conn_a.channel().basic_get("q.pub", auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("x.pub", "rk", b"m0")
    assert header.headers == {"k": "v"} and header.message_id == "id-1"
    assert header.delivery_mode == 2
    conn_a.close()

    got: list[bytes] = []
    ch.basic_consume("q.pub", lambda c, m, p, body: got.append(body), auto_ack=True)
    drain(conn, got, 99)
    assert got == [f"m{i}".encode() for i in range(1, 100)]
    conn.close()
    assert counts(a, "q.pub") == (0, 0)


def test_a_consumer_on_b_of_a_queue_on_a_within_prefetch_acks_nacks_rejects_recovers_cancels(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.cons")
    pub = connect(a)
    pub_ch = pub.channel()
    pub_ch.confirm_delivery()
    for i in range(20):
        pub_ch.basic_publish("", "q.cons", f"m{i}".encode(), PERSISTENT)
    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    got: list[tuple[int, bool, bytes]] = []
    tag = ch.basic_consume("q.cons", lambda c, m, p, body: got.append(
        (m.delivery_tag, m.redelivered, body)))
    drain(conn, got, 5)
    conn.process_data_events(0.5)
    assert [body for _t, _r, body in got] == [f"m{i}".encode() for i in range(5)]
    assert [t for t, _r, _b in got] == [1, 2, 3, 4, 5]  # B's own delivery tags
    assert counts(a, "q.cons") == (15, 1)

    ch.basic_ack(2, multiple=True)  # m0, m1
    drain(conn, got, 7)
    assert [body for _t, _r, body in got[5:]] == [b"m5", b"m6"]

    ch.basic_nack(3, requeue=True)  # m2 comes back, redelivered
    drain(conn, got, 8)
    assert got[7][1:] == (True, b"m2")

    ch.basic_reject(4, requeue=False)  # m3 is dropped
    drain(conn, got, 9)
    conn.process_data_events(0.3)
    assert len(got) == 9

    ch.basic_recover(requeue=True)  # every unacked one comes back, redelivered
    drain(conn, got, 14)
    assert all(redelivered for _t, redelivered, _b in got[9:14])

    ch.basic_cancel(tag)
    ch.basic_ack(0, multiple=True)
    conn.process_data_events(0.5)
    assert len(got) == 14
    wait_until(lambda: counts(a, "q.cons")[1] == 0, timeout=5)
    # m0, m1 acked, m3 rejected; what was delivered since is acked with multiple=True
    delivered = {body for _t, _r, body in got}
    messages, _ = counts(a, "q.cons")
    assert messages == 20 - len(delivered)
    conn.close()
    pub.close()


def test_basic_get_purge_and_delete_from_b_with_the_holders_counts(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.ops")
    pub = connect(a)
    pub_ch = pub.channel()
    pub_ch.confirm_delivery()  # each publish is in the queue before the next line
    for i in range(10):
        pub_ch.basic_publish("", "q.ops", f"m{i}".encode(), PERSISTENT)
    conn = connect(b)
    ch = conn.channel()
    method, _props, body = ch.basic_get("q.ops")
    assert (body, method.message_count, method.delivery_tag) == (b"m0", 9, 1)
    ch.basic_nack(1, requeue=True)
    method, _props, body = ch.basic_get("q.ops", auto_ack=True)
    assert (body, method.redelivered) == (b"m0", True)
    assert counts(b, "q.ops") == (9, 0)
    assert ch.queue_purge("q.ops").method.message_count == 9
    assert ch.basic_get("q.ops") == (None, None, None)
    ch.queue_delete("q.ops")
    conn.close()
    pub.close()
    assert not visible(a, "q.ops")
    wait_until(lambda: not visible(b, "q.ops"), timeout=5)


def test_delete_from_b_reports_the_holders_count(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.count")
    pub = connect(a)
    pub_ch = pub.channel()
    pub_ch.confirm_delivery()
    pub_ch.basic_publish("", "q.count", b"last", PERSISTENT)
    conn = connect(b)
    assert conn.channel().queue_delete("q.count").method.message_count == 1
    conn.close()
    pub.close()


def test_errors_of_the_holding_node_reach_the_client_on_b_with_their_code_and_text(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.excl")
    owner = connect(a)
    owner.channel().basic_consume("q.excl", lambda *args: None, exclusive=True)
    conn = connect(b)
    with pytest.raises(ChannelClosedByBroker) as refused:
        conn.channel().basic_consume("q.excl", lambda *args: None)
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == (
        "ACCESS_REFUSED - queue 'q.excl' in vhost '/' in exclusive use")
    on_a(ab, "q.del")
    ch = conn.channel()
    owner_ch = owner.channel()
    owner_ch.confirm_delivery()
    owner_ch.basic_publish("", "q.del", b"x")
    with pytest.raises(ChannelClosedByBroker) as not_empty:
        ch.queue_delete("q.del", if_empty=True)
    assert not_empty.value.reply_code == 406
    assert not_empty.value.reply_text == (
        "PRECONDITION_FAILED - queue 'q.del' in vhost '/' not empty")
    owner.close()
    conn.close()


def test_a_stream_on_a_read_from_b_from_an_offset(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "s.read", arguments={"x-queue-type": "stream", "x-initial-cluster-size": 1})
    pub = connect(a)
    ch_a = pub.channel()
    ch_a.confirm_delivery()
    for i in range(10):
        ch_a.basic_publish("", "s.read", f"m{i}".encode())
    pub.close()
    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    got: list[tuple[int, bytes]] = []

    def on_message(c: BlockingChannel, m: Any, p: Any, body: bytes) -> None:
        got.append((p.headers["x-stream-offset"], body))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume("s.read", on_message, arguments={"x-stream-offset": 6})
    drain(conn, got, 4)
    assert got == [(6, b"m6"), (7, b"m7"), (8, b"m8"), (9, b"m9")]
    with pytest.raises(ChannelClosedByBroker) as bad:
        conn.channel().basic_consume("s.read", lambda *args: None,
                                     arguments={"x-stream-offset": "bogus"})
    assert bad.value.reply_code == 406  # the holder's own answer, relayed
    conn.close()


def test_a_stream_on_a_read_from_b_beyond_a_small_prefetch_and_with_the_largest(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    """Most of 600 deliveries wait on B for a consumer with prefetch 7, which settles them one by
    one and in multiples, out of order too: each arrives once, in order, never more than 7 at a
    time; a consumer with prefetch 65535 (more than the read-ahead B asks of A can double) reads
    them all; a consumer cancelled while deliveries wait leaves none behind on A."""
    a, b = ab
    on_a(ab, "s.ahead", arguments={"x-queue-type": "stream", "x-initial-cluster-size": 1})
    pub = connect(a)
    ch_a = pub.channel()
    ch_a.confirm_delivery()
    for i in range(600):
        ch_a.basic_publish("", "s.ahead", f"m{i}".encode())
    pub.close()
    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=7)
    got: list[tuple[int, bytes]] = []
    held: list[int] = []
    most = 0

    def on_message(c: BlockingChannel, m: Any, p: Any, body: bytes) -> None:
        nonlocal most
        got.append((p.headers["x-stream-offset"], body))
        held.append(m.delivery_tag)
        most = max(most, len(held))
        if len(held) == 5:  # the 2nd alone, then the rest up to the 5th as one multiple
            c.basic_ack(held[1])
            c.basic_ack(held[4], multiple=True)
            held.clear()

    ch.basic_consume("s.ahead", on_message, arguments={"x-stream-offset": "first"})
    drain(conn, got, 600, timeout=60)
    assert got == [(i, f"m{i}".encode()) for i in range(600)]
    assert most <= 7
    conn.close()

    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=65535)
    bodies: list[bytes] = []
    ch.basic_consume("s.ahead", lambda c, m, p, body: bodies.append(body), auto_ack=False,
                     arguments={"x-stream-offset": "first"})
    drain(conn, bodies, 600, timeout=60)
    assert bodies == [f"m{i}".encode() for i in range(600)]

    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=2)
    first_two: list[bytes] = []
    tag = ch2.basic_consume("s.ahead", lambda c, m, p, body: first_two.append(body),
                            arguments={"x-stream-offset": "first"})
    drain(conn, first_two, 2)
    assert first_two == [b"m0", b"m1"]
    ch2.basic_cancel(tag)
    ch2.close()
    ch.close()
    wait_until(lambda: counts(a, "s.ahead")[1] == 0)
    conn.close()


def test_each_publishers_order_holds_through_b(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.order")
    publishers = [connect(b), connect(b), connect(a)]
    channels = [p.channel() for p in publishers]
    for ch in channels:
        ch.confirm_delivery()
    for i in range(300):
        for n, ch in enumerate(channels):
            ch.basic_publish("", "q.order", f"{n}:{i}".encode())
    conn = connect(a)
    got: list[bytes] = []
    conn.channel().basic_consume("q.order", lambda c, m, p, body: got.append(body),
                                 auto_ack=True)
    drain(conn, got, 900)
    for n in range(3):
        mine = [int(body.split(b":")[1]) for body in got if body.startswith(f"{n}:".encode())]
        assert mine == list(range(300))
    for p in (conn, *publishers):
        p.close()


def test_aio_pika_and_kombu_clients_on_b(ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.clients")

    async def aio() -> list[bytes]:
        connection = await aio_pika.connect(b.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            for i in range(5):
                await channel.default_exchange.publish(
                    aio_pika.Message(f"a{i}".encode()), routing_key="q.clients")
            queue = await channel.get_queue("q.clients")
            await channel.set_qos(prefetch_count=2)
            got: list[bytes] = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 5:
                        break
            return got

    assert asyncio.run(aio()) == [f"a{i}".encode() for i in range(5)]
    with kombu.Connection(b.url) as conn:
        simple = conn.SimpleQueue("q.clients", queue_opts={"durable": True})
        simple.put(b"k", serializer=None, content_type="application/octet-stream")
        message = simple.get(timeout=5)
        assert message.body == b"k"
        message.ack()
        simple.close()
    assert counts(a, "q.clients") == (0, 0)


def test_when_a_is_killed_b_answers_as_rabbitmq_and_all_comes_back_with_a(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.down")
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", "q.down", f"m{i}".encode(), PERSISTENT)
    consumer = connect(b)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=10)
    cancelled: list[Any] = []
    got: list[bytes] = []
    cch.add_on_cancel_callback(cancelled.append)
    cch.basic_consume("q.down", lambda c, m, p, body: got.append(body))
    drain(consumer, got, 10)

    a.kill()
    deadline = time.monotonic() + 15
    while not cancelled and time.monotonic() < deadline:
        consumer.process_data_events(0.2)
    assert cancelled, "the consumer on B was not cancelled"

    probe = connect(b)
    with pytest.raises(ChannelClosedByBroker) as down:
        probe.channel().queue_declare("q.down", passive=True)
    assert down.value.reply_code == 404
    assert down.value.reply_text == ("NOT_FOUND - home node 'a' of durable queue 'q.down' "
                                     "in vhost '/' is down or inaccessible")
    with pytest.raises(NackError):
        ch.basic_publish("", "q.down", b"lost", PERSISTENT)
    with pytest.raises(ChannelClosedByBroker) as consume_down:
        probe.channel().basic_consume("q.down", lambda *args: None)
    assert consume_down.value.reply_code == 404
    probe.close()

    a.start()
    wait_until(lambda: visible(b, "q.down"), timeout=30)
    assert counts(b, "q.down") == (50, 0)  # the confirmed ones, unacked ones requeued
    got.clear()
    ch2 = conn.channel()
    ch2.basic_consume("q.down", lambda c, m, p, body: got.append(body), auto_ack=True)
    drain(conn, got, 50)
    assert sorted(got, key=lambda body: int(body[1:])) == [f"m{i}".encode() for i in range(50)]
    conn.close()
    consumer.close()


def test_a_queue_deleted_on_a_cancels_its_consumers_on_b(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.gone")
    conn = connect(b)
    ch = conn.channel()
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume("q.gone", lambda *args: None)
    admin = connect(a)
    admin.channel().queue_delete("q.gone")
    admin.close()
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(0.2)
    assert cancelled, "the consumer on B was not cancelled"
    assert ch.is_open  # as on one node: the channel stays
    conn.close()


def test_with_a_down_get_purge_and_consume_on_b_get_the_node_down_answer(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.absent")
    a.kill()
    text = ("NOT_FOUND - home node 'a' of durable queue 'q.absent' in vhost '/' is down or "
            "inaccessible")
    conn = connect(b)
    for attempt in (lambda ch: ch.basic_get("q.absent"),
                    lambda ch: ch.queue_purge("q.absent"),
                    lambda ch: ch.basic_consume("q.absent", lambda *args: None)):
        deadline = time.monotonic() + 10
        while True:  # until B has seen the link go
            with pytest.raises(ChannelClosedByBroker) as down:
                attempt(conn.channel())
            if down.value.reply_text == text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (down.value.reply_code, down.value.reply_text) == (404, text)
    conn.close()


def test_a_graceful_stop_of_a_cancels_consumers_on_b_and_nacks_nothing_confirmed(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.stop")
    conn = connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", "q.stop", f"m{i}".encode(), PERSISTENT)
    consumer = connect(b)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=5)
    cancelled: list[Any] = []
    got: list[bytes] = []
    cch.add_on_cancel_callback(cancelled.append)
    cch.basic_consume("q.stop", lambda c, m, p, body: got.append(body))
    drain(consumer, got, 5)
    a.stop()
    deadline = time.monotonic() + 15
    while not cancelled and time.monotonic() < deadline:
        consumer.process_data_events(0.2)
    assert cancelled
    a.start()
    wait_until(lambda: visible(b, "q.stop"), timeout=30)
    assert counts(b, "q.stop") == (20, 0)
    conn.close()
    consumer.close()


def test_two_clients_of_b_consume_one_queue_on_a_each_message_once(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.two")
    first, second = connect(b), connect(b)  # both consume on their channel 1
    got: list[bytes] = []
    for conn in (first, second):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume("q.two", lambda c, m, p, body: (got.append(body),
                                                         c.basic_ack(m.delivery_tag)))
    pub = connect(a)
    pub_ch = pub.channel()
    pub_ch.confirm_delivery()
    sent = [f"m{i}".encode() * 50 for i in range(200)]
    for body in sent:
        pub_ch.basic_publish("", "q.two", body)
    deadline = time.monotonic() + 15
    while len(got) < 200 and time.monotonic() < deadline:
        first.process_data_events(0.05)
        second.process_data_events(0.05)
    assert sorted(got) == sorted(sent)
    for conn in (first, second, pub):
        conn.close()


def test_a_publish_routed_to_queues_on_both_nodes_reaches_both_once_confirmed(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.fan.a")
    declare_on(b, "q.fan.b")  # held by b
    conn = connect(b)
    ch = conn.channel()
    ch.exchange_declare("x.fan", "fanout")
    ch.queue_bind("q.fan.a", "x.fan")
    ch.queue_bind("q.fan.b", "x.fan")
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("x.fan", "", f"m{i}".encode(), PERSISTENT)
    assert counts(a, "q.fan.a") == (50, 0)
    assert counts(b, "q.fan.b") == (50, 0)
    conn.close()


def test_a_transaction_on_b_publishes_to_a_queue_on_a_at_commit_only(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = ab
    on_a(ab, "q.tx")
    conn = connect(b)
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", "q.tx", b"dropped")
    ch.tx_rollback()
    ch.basic_publish("", "q.tx", b"kept")
    ch.tx_commit()
    wait_until(lambda: counts(a, "q.tx") == (1, 0), timeout=5)
    _method, _props, body = connect(a).channel().basic_get("q.tx", auto_ack=True)
    assert body == b"kept"
    conn.close()


def test_publishers_on_b_wait_while_a_is_behind_and_b_holds_little(
        ab_patient: tuple[ClusterNode, ClusterNode]) -> None:
    """A stopped (SIGSTOP) while a client of B publishes 100 MB to a queue on A: B stops
    reading from its clients once the link holds 8 MB, instead of holding it all; once A
    runs again every message arrives. (A stops for well under its 5 s lease and link
    timeout.)"""
    ab = ab_patient
    a, b = ab
    on_a(ab, "q.slow")
    conn = connect(b)
    ch = conn.channel()
    body = b"x" * 100_000
    before = rss_mb(b.pid)
    os.kill(a.pid, signal.SIGSTOP)
    done = threading.Event()

    def publish() -> None:
        for _ in range(1000):
            ch.basic_publish("", "q.slow", body)
        done.set()

    publisher = threading.Thread(target=publish, daemon=True)
    try:
        publisher.start()
        time.sleep(1.0)
        assert not done.is_set(), "B took all 100 MB while A was stopped"
        assert rss_mb(b.pid) - before < 60
    finally:
        os.kill(a.pid, signal.SIGCONT)
    publisher.join(60)
    assert done.is_set()
    wait_until(lambda: counts(a, "q.slow")[0] == 1000, timeout=60)
    conn.close()


def test_acks_out_of_order_on_b_settle_each_delivery_once(
        ab: tuple[ClusterNode, ClusterNode]) -> None:
    """A consumer on b acks tag 2, then (in a later turn) tag 1, then 4 after a nack of 3:
    the holder is asked to settle only what it still holds, so the consumer is not cancelled
    and exactly the acked messages leave (celery acks out of order)."""
    a, b = ab
    on_a(ab, "q.order")
    publisher = connect(a)
    for i in range(5):
        publisher.channel().basic_publish("", "q.order", b"m%d" % i)
    publisher.close()
    conn = connect(b)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=4)
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    got: list[Any] = []
    ch.basic_consume("q.order", lambda c, m, p, body: got.append(m.delivery_tag))
    drain(conn, got, 4)
    for settle in (lambda: ch.basic_ack(2), lambda: ch.basic_ack(1),
                   lambda: ch.basic_nack(3, requeue=False), lambda: ch.basic_ack(4)):
        settle()
        conn.process_data_events(0.2)
    ch.basic_cancel(ch.consumer_tags[0])
    conn.process_data_events(0.3)
    assert not cancelled and ch.is_open
    conn.close()
    assert counts(a, "q.order") == (1, 0)
