"""Clients that misbehave, against a real `leveret serve`: they vanish mid-frame, mid-publish
and mid-consume, stop reading their socket, or go silent past the heartbeat. Their resources
(sockets, channels, consumers) are released, what they had unacked comes back flagged
redelivered, nothing half-published is stored, the broker's memory stays bounded, and the other
clients carry on.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp import frame as pframe
from support.brokers import BrokerProcess
from support.faults import connect, drain_queue, read_stream
from support.procstat import open_fds, rss_mb
from support.rawamqp import RawClient

QUEUE = "clients-q"
STREAM = "clients-s"
CONTROL = "clients-control"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def vanish(client: RawClient, reset: bool) -> None:
    """Drop the TCP connection without an AMQP close: a FIN, or a RST (SO_LINGER 0)."""
    if reset:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


class Control:
    """An ordinary client that keeps working while others misbehave."""

    def __init__(self, port: int) -> None:
        self.conn = connect(port)
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        self.ch.queue_declare(CONTROL)
        self.sent = 0

    def round_trip(self) -> float:
        """Publish one message and get it back; returns the seconds it took."""
        started = time.monotonic()
        self.sent += 1
        body = f"control-{self.sent}".encode()
        self.ch.basic_publish("", CONTROL, body)
        method, _props, got = self.ch.basic_get(CONTROL, auto_ack=True)
        assert method is not None and got == body
        return time.monotonic() - started

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def broker(broker_process: BrokerProcess) -> BrokerProcess:
    conn = connect(broker_process.port)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    return broker_process


def skip_to(client: RawClient, cls: type) -> None:
    """Read frames (deliveries, content) until a method of class `cls` arrives."""
    while True:
        got = client.next_frame()
        if got.type == 1 and isinstance(got.method, cls):
            return


def settled_fds(broker: BrokerProcess, baseline: int) -> bool:
    return wait_until(lambda: open_fds(broker.pid) <= baseline)


def test_vanishing_mid_frame_releases_the_connection(broker: BrokerProcess) -> None:
    control = Control(broker.port)
    baseline = open_fds(broker.pid)
    frame = pframe.marshal(commands.Queue.Declare(queue="never-declared", durable=True), 1)
    for i in range(20):
        client = RawClient(broker.port).handshake()
        client.open_channel(1)
        client.send(frame[: 3 + i % (len(frame) - 4)])  # cut inside the frame
        vanish(client, reset=bool(i % 2))
    assert settled_fds(broker, baseline), "sockets of vanished clients are still open"
    assert control.round_trip() < 2
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        control.conn.channel().queue_declare("never-declared", passive=True)
    control.close()


def test_vanishing_mid_publish_stores_nothing_partial(broker: BrokerProcess) -> None:
    control = Control(broker.port)
    baseline = open_fds(broker.pid)
    body = b"b" * 300_000  # three body frames
    for queue in (QUEUE, STREAM):
        for cut in ("after-method", "after-header", "mid-body"):
            client = RawClient(broker.port).handshake()
            client.open_channel(1)
            client.send_method(1, commands.Confirm.Select())
            client.expect(commands.Confirm.SelectOk)
            method, header, *bodies = RawClient.publish_frames(
                1, body, routing_key=queue, properties=commands.Basic.Properties(delivery_mode=2))
            sent = {"after-method": method, "after-header": method + header,
                    "mid-body": method + header + b"".join(bodies)[:-1000]}[cut]
            client.send(sent)
            vanish(client, reset=cut == "mid-body")
    assert settled_fds(broker, baseline)
    conn = connect(broker.port)
    ch = conn.channel()
    assert ch.queue_declare(QUEUE, passive=True).method.message_count == 0
    assert ch.queue_declare(STREAM, passive=True).method.message_count == 0
    ch.confirm_delivery()
    ch.basic_publish("", STREAM, b"whole")
    conn.close()
    assert read_stream(broker.port, STREAM, limit=1)[0] == [(0, b"whole")]  # offset 0: no gap
    assert control.round_trip() < 2
    control.close()


def test_vanishing_mid_consume_requeues_with_the_redelivered_flag(broker: BrokerProcess) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", QUEUE, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", STREAM, f"s{i}".encode())
    conn.close()
    control = Control(broker.port)
    baseline = open_fds(broker.pid)

    # A consumer takes five, acks two, and vanishes.
    client = RawClient(broker.port).handshake()
    client.open_channel(1)
    client.send_method(1, commands.Basic.Qos(prefetch_count=5))
    client.expect(commands.Basic.QosOk)
    client.send_method(1, commands.Basic.Consume(queue=QUEUE, consumer_tag="vanishing"))
    client.expect(commands.Basic.ConsumeOk)
    tags = []
    while len(tags) < 5:
        got = client.next_frame()
        if got.type == 1:
            tags.append(got.method.delivery_tag)
    client.send_method(1, commands.Basic.Ack(delivery_tag=tags[1], multiple=True))
    # A tracked stream consumer takes ten, acks four, and vanishes too.
    client.send_method(2, commands.Channel.Open())
    skip_to(client, commands.Channel.OpenOk)
    client.send_method(2, commands.Basic.Qos(prefetch_count=10))
    skip_to(client, commands.Basic.QosOk)
    tracking = {"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True}
    client.send_method(2, commands.Basic.Consume(
        queue=STREAM, consumer_tag="tracked", arguments=tracking))
    stream_tags = []
    while len(stream_tags) < 10:
        got = client.next_frame()
        if got.type == 1 and got.channel == 2 and isinstance(got.method, commands.Basic.Deliver):
            stream_tags.append(got.method.delivery_tag)
    client.send_method(2, commands.Basic.Ack(delivery_tag=stream_tags[3], multiple=True))
    time.sleep(0.2)
    vanish(client, reset=True)
    assert settled_fds(broker, baseline)

    got = drain_queue(broker.port, QUEUE)
    assert len(got) == 18  # the two acked are gone
    redelivered = sorted(int(b[1:]) for b, flag in got if flag)
    # The two acks made room for two more: 2..6 were delivered and not acked. They are
    # back, and flagged; the rest were never delivered.
    assert redelivered == [2, 3, 4, 5, 6]
    assert sorted(int(b[1:]) for b, _f in got) == list(range(2, 20))
    conn = connect(broker.port)
    ch = conn.channel()
    method, props, _b = ch.basic_get(
        f"amq.leveret.consumer-offset?stream={STREAM}&consumer=tracked", auto_ack=True)
    assert method is not None and props.headers["x-stream-offset"] == 3  # what it acked
    conn.close()
    assert control.round_trip() < 2
    control.close()


@pytest.mark.parametrize("mode", ["no-ack", "unlimited-prefetch"])
def test_a_client_that_stops_reading_is_bounded_then_dropped(
    broker: BrokerProcess, mode: str
) -> None:
    """Regression: a consumer without a prefetch limit took the whole queue into the broker's
    output buffer in one turn (memory grew by the size of the queue), and once it missed its
    heartbeats, close() waited forever for that buffer to drain: the socket and its memory
    were never released."""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.queue_declare("backlog")
    body = b"x" * 100_000
    for _ in range(600):  # 60 MB waiting in memory
        ch.basic_publish("", "backlog", body)
    ch.queue_declare("backlog", passive=True)
    conn.close()
    control = Control(broker.port)
    time.sleep(0.5)
    baseline_fds, baseline_rss = open_fds(broker.pid), rss_mb(broker.pid)

    stuck = RawClient(broker.port)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.handshake(heartbeat=2)
    stuck.open_channel(1)
    stuck.send_method(1, commands.Basic.Consume(queue="backlog", no_ack=mode == "no-ack"))
    # From here it neither reads nor writes.
    time.sleep(1.0)
    grown = rss_mb(broker.pid) - baseline_rss
    latencies = [control.round_trip() for _ in range(20)]
    assert max(latencies) < 1.0, latencies  # the others are unaffected
    assert grown < 30, f"the broker grew by {grown:.0f} MiB for a client that reads nothing"
    # Two heartbeat intervals of silence: dropped, and its socket released at once.
    assert wait_until(lambda: open_fds(broker.pid) <= baseline_fds, timeout=10), (
        "the silent client's socket is still open")
    assert "missed heartbeats from client" in broker.log()
    assert control.round_trip() < 1.0
    if mode == "unlimited-prefetch":  # what it was given comes back
        conn = connect(broker.port)
        count = conn.channel().queue_declare("backlog", passive=True).method.message_count
        conn.close()
        assert count == 600
    stuck.close()
    control.close()


def test_a_client_silent_past_the_heartbeat_is_dropped(broker: BrokerProcess) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    for i in range(5):
        ch.basic_publish("", QUEUE, f"h{i}".encode())
    conn.close()
    control = Control(broker.port)
    baseline = open_fds(broker.pid)
    silent = RawClient(broker.port).handshake(heartbeat=1)
    silent.open_channel(1)
    silent.send_method(1, commands.Basic.Qos(prefetch_count=3))
    silent.expect(commands.Basic.QosOk)
    silent.send_method(1, commands.Basic.Consume(queue=QUEUE, consumer_tag="silent"))
    silent.expect(commands.Basic.ConsumeOk)
    started = time.monotonic()
    # Silent from now on: it sends nothing (the broker's heartbeats pile up unread).
    assert wait_until(lambda: open_fds(broker.pid) <= baseline, timeout=10)
    dropped_after = time.monotonic() - started
    assert 1.5 <= dropped_after < 5, dropped_after  # two intervals, as RabbitMQ
    got = drain_queue(broker.port, QUEUE)
    assert sorted(b for b, _f in got) == [f"h{i}".encode() for i in range(5)]
    assert sorted(b for b, flag in got if flag) == [b"h0", b"h1", b"h2"]
    assert control.round_trip() < 2
    silent.close()
    control.close()
