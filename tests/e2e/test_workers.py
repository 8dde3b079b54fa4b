"""`leveret serve --workers N`: what a client and an operator see with wire workers.

The rest of the suite runs once more with LEVERET_WORKERS=2 (.ci/run); these tests are about
the workers themselves, so each starts its broker with `--workers 2` whatever the environment:
a worker killed with -9 under load (its clients' connections close, a new worker takes the next
ones, nothing confirmed is lost, its exclusive queues go and its unacked deliveries are
requeued), a main process killed with -9 (its worker does not outlive it), and the one view of
the management API.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from support.brokers import BrokerProcess
from support.ports import free_port


def worker_pids(main_pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(main_pid), "-f", "leveret.broker.workers.worker"],
                           capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def wait_for(predicate: object, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for us
        return stat.read().split()[2] != "Z"


@pytest.fixture
def workers_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    management = free_port()
    broker = BrokerProcess(tmp_path / "data", args=["--workers", "2"],
                           env={"LEVERET_MANAGEMENT_PORT": str(management)})
    broker.command = lambda: [  # type: ignore[method-assign]
        *BrokerProcess.command(broker)[:-4], "--management-port", str(management),
        "--stream-port", "0", *broker.args]
    broker.management_port = management  # type: ignore[attr-defined]
    broker.start()
    wait_for(lambda: len(worker_pids(broker.pid)) == 1, what="the worker")
    yield broker
    broker.kill()


def connect(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def api(broker: BrokerProcess, path: str) -> object:
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.management_port}/api/{path}",  # type: ignore[attr-defined]
        headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def server_side_owners(port: int) -> list[str]:
    """The `users:(...)` of every established connection on the broker's side of `port`."""
    lines = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return [line[line.index("users:"):] for line in lines if "users:" in line]


def test_a_worker_holds_the_clients_and_the_main_process_shows_them(
        workers_broker: BrokerProcess) -> None:
    first, second = (pika.BlockingConnection(pika.URLParameters(
        workers_broker.url + f"?client_properties={{'connection_name':'{name}'}}"))
        for name in ("first", "second"))
    channel = first.channel()
    channel.confirm_delivery()
    channel.queue_declare("held")
    channel.basic_publish("", "held", b"through a worker")
    _method, _props, body = second.channel().basic_get("held", auto_ack=True)
    assert body == b"through a worker"
    worker, = worker_pids(workers_broker.pid)
    owners = server_side_owners(workers_broker.port)
    assert len(owners) == 2
    # Each socket is open in both: the worker reads it, the main process writes to it.
    assert all(f"pid={worker}," in owner for owner in owners)
    assert all(f"pid={workers_broker.pid}," in owner for owner in owners)
    connections = api(workers_broker, "connections")
    assert isinstance(connections, list)
    assert sorted(c["client_properties"]["connection_name"] for c in connections) == [
        "first", "second"]
    assert all(c["peer_host"] == "127.0.0.1" and c["peer_port"] > 0 for c in connections)
    first.close()
    second.close()


def test_kill_9_of_a_worker_under_load(workers_broker: BrokerProcess) -> None:
    setup = connect(workers_broker)
    setup.channel().queue_declare("durable-q", durable=True)
    setup.close()
    confirmed: list[int] = []
    stop = threading.Event()
    closed: list[BaseException] = []

    def publish() -> None:
        connection = connect(workers_broker)
        channel = connection.channel()
        channel.confirm_delivery()
        number = 0
        try:
            while not stop.is_set():
                channel.basic_publish("", "durable-q", str(number).encode(),
                                      pika.BasicProperties(delivery_mode=2))
                confirmed.append(number)  # basic_publish returned: the broker confirmed it
                number += 1
        except (pika.exceptions.AMQPError, OSError) as exc:
            closed.append(exc)

    # what the dying worker's clients hold: an exclusive queue, and two unacked deliveries
    holder = connect(workers_broker)
    held = holder.channel()
    exclusive = held.queue_declare("", exclusive=True).method.queue
    held.queue_declare("work")
    for body in (b"a", b"b"):
        held.basic_publish("", "work", body)
    held.basic_qos(prefetch_count=2)
    got: list[bytes] = []
    held.basic_consume("work", lambda _c, _m, _p, body: got.append(body))
    while len(got) < 2:
        holder.process_data_events(time_limit=0.1)

    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_for(lambda: len(confirmed) > 500, what="confirmed publishes")
    old, = worker_pids(workers_broker.pid)
    os.kill(old, signal.SIGKILL)
    publisher.join(timeout=15)
    stop.set()
    assert closed, "the publisher's connection did not close with its worker"
    with pytest.raises((pika.exceptions.AMQPError, OSError)):
        for _ in range(50):
            holder.process_data_events(time_limit=0.1)

    # a new worker serves the next clients; the main process never stopped
    wait_for(lambda: worker_pids(workers_broker.pid) not in ([], [old]), what="a new worker")
    assert workers_broker.proc is not None and workers_broker.proc.poll() is None
    after = connect(workers_broker)
    channel = after.channel()
    bodies = set()
    while True:
        method, _props, body = channel.basic_get("durable-q", auto_ack=True)
        if method is None:
            break
        bodies.add(int(body))
    assert set(confirmed) <= bodies  # every confirmed message is there
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare(exclusive, passive=True)
    assert gone.value.reply_code == 404
    channel = after.channel()
    redelivered = []
    for _ in range(2):
        method, _props, body = channel.basic_get("work", auto_ack=True)
        assert method is not None
        redelivered.append((body, method.redelivered))
    assert sorted(redelivered) == [(b"a", True), (b"b", True)]
    connections = api(workers_broker, "connections")
    assert isinstance(connections, list) and len(connections) == 1  # none of the dead ones
    after.close()


def test_a_client_that_no_worker_can_take_is_served_by_the_main_process(
        workers_broker: BrokerProcess) -> None:
    """A worker that keeps dying within 10 s of its start is restarted after 0, 0.5, then 1 s;
    a client that comes while there is none is served by the main process itself."""
    for _ in range(2):
        dying, = worker_pids(workers_broker.pid)
        os.kill(dying, signal.SIGKILL)
        wait_for(lambda: worker_pids(workers_broker.pid) not in ([], [dying]),  # noqa: B023
                 what="a new worker")
    last, = worker_pids(workers_broker.pid)
    os.kill(last, signal.SIGKILL)
    wait_for(lambda: not alive(last), what="the third worker to die")
    client = connect(workers_broker)  # no worker now: the restart waits 1 s
    owners = server_side_owners(workers_broker.port)
    assert len(owners) == 1 and f"pid={workers_broker.pid}," in owners[0]
    channel = client.channel()
    channel.confirm_delivery()
    channel.queue_declare("served-by-main")
    channel.basic_publish("", "served-by-main", b"still served")
    assert channel.basic_get("served-by-main", auto_ack=True)[2] == b"still served"
    wait_for(lambda: len(worker_pids(workers_broker.pid)) == 1, what="the fourth worker")
    assert "worker exited; starting a new one" in workers_broker.log()
    metrics = urllib.request.urlopen(  # the main process counts its workers
        f"http://127.0.0.1:{workers_broker.management_port}/metrics",  # type: ignore[attr-defined]
        timeout=10).read().decode()
    assert "leveret_worker_processes 1.0" in metrics
    client.close()


def publish_burst_with_a_bad_third(port: int) -> tuple[object, ...]:
    """Five publishes to one queue in one write (a worker makes them one run), the third with
    an expiration that is no integer: what closes the channel, and how many the queue took."""
    from pamqp import commands
    from support.fuzzwire import frame, method_frame
    from support.rawamqp import RawClient

    def header(expiration: bytes) -> bytes:
        if not expiration:
            return struct.pack(">HHQH", 60, 0, 1, 0)
        return struct.pack(">HHQH", 60, 0, 1, 0x0100) + bytes([len(expiration)]) + expiration

    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    setup.channel().queue_declare("run-q", auto_delete=False)
    setup.close()
    burst = b"".join(
        method_frame(1, commands.Basic.Publish(exchange="", routing_key="run-q"))
        + frame(2, 1, header(b"abc" if n == 2 else b"")) + frame(3, 1, b"x") for n in range(5))
    with RawClient(port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.sock.sendall(burst)
        close = raw.expect(commands.Channel.Close, 1)
    check = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = check.channel()
    taken = channel.queue_declare("run-q", passive=True).method.message_count
    channel.queue_delete("run-q")
    check.close()
    return close.reply_code, close.reply_text, close.class_id, close.method_id, taken


def test_a_run_refused_in_its_middle_closes_the_channel_as_rabbitmq_does(
        workers_broker: BrokerProcess, reference: object) -> None:
    leveret = publish_burst_with_a_bad_third(workers_broker.port)
    assert leveret == publish_burst_with_a_bad_third(reference.port)  # type: ignore[attr-defined]
    assert leveret == (406, "PRECONDITION_FAILED - invalid expiration 'abc': no_integer",
                       60, 40, 2)


def test_kill_9_of_the_main_process_ends_its_worker(workers_broker: BrokerProcess) -> None:
    client = connect(workers_broker)
    worker, = worker_pids(workers_broker.pid)
    workers_broker.kill()
    wait_for(lambda: not alive(worker), what="the worker to exit")
    with pytest.raises((pika.exceptions.AMQPError, OSError)):
        for _ in range(50):
            client.process_data_events(time_limit=0.1)


def test_sigterm_ends_the_workers_after_closing_their_clients(
        workers_broker: BrokerProcess) -> None:
    client = connect(workers_broker)
    worker, = worker_pids(workers_broker.pid)
    assert workers_broker.proc is not None
    workers_broker.proc.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(100):
            client.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320
    assert workers_broker.proc.wait(15) == 0
    wait_for(lambda: not alive(worker), what="the worker to exit")


@pytest.mark.parametrize("value", ["-1", "two"])
def test_a_bad_workers_value_is_one_line_and_exit_1(tmp_path: Path, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "leveret.cli", "serve", "--workers", value, "--port", "0",
         "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=30,
        check=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "workers" in result.stderr + result.stdout


def test_a_worker_that_cannot_be_started_is_one_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """fork refused (EAGAIN, as under a process limit): `leveret serve` says so in one line
    (ServerError, which the CLI prints and exits 1 with) and leaves nothing running."""
    import errno

    from support.brokers import InProcessBroker

    from leveret.broker.server import ServerError
    from leveret.broker.workers import pool

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(pool.subprocess, "Popen", refuse)
    broker = InProcessBroker(tmp_path / "data", workers=2)
    with pytest.raises(ServerError, match=r"^cannot start the wire workers: .*Resource tempor"):
        broker.start()


def test_by_default_one_process_per_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No --workers and no LEVERET_WORKERS: a worker for each usable core but the main
    process's; pinned to one core (a cpuset, taskset), one process alone."""
    monkeypatch.delenv("LEVERET_WORKERS", raising=False)
    cores = sorted(os.sched_getaffinity(0))
    machines = [(BrokerProcess(tmp_path / "all" / "data"), len(cores) - 1),
                (BrokerProcess(tmp_path / "one" / "data",
                               preexec=lambda: os.sched_setaffinity(0, cores[:1])), 0)]
    for broker, workers in machines:
        broker.data_dir.parent.mkdir(parents=True)
        broker.start()
        try:
            assert len(worker_pids(broker.pid)) == workers  # started before the port opened
            connection = connect(broker)
            channel = connection.channel()
            channel.queue_declare("default")
            channel.basic_publish("", "default", b"served")
            _method, _props, body = channel.basic_get("default", auto_ack=True)
            assert body == b"served"
            connection.close()
        finally:
            broker.kill()


def stream_burst(port: int) -> tuple[list[int], dict[str, list[tuple[bytes, object]]]]:
    """Seventeen confirmed publishes in one write, as a worker gathers them into runs: six plain
    ones to a stream (one run, taken by the stream in one call), three to it with headers on
    the middle one, four through a fanout to two streams, four through a direct exchange to one
    stream. The acks, and what each stream holds, in order."""
    from pamqp import commands
    from pamqp.commands import Basic
    from support.rawamqp import RawClient

    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = setup.channel()
    for stream in ("burst-s1", "burst-s2"):
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.exchange_declare("burst-fan", "fanout")
    channel.exchange_declare("burst-direct", "direct")
    for stream in ("burst-s1", "burst-s2"):
        channel.queue_bind(stream, "burst-fan")
    channel.queue_bind("burst-s2", "burst-direct", "to-s2")
    plain = commands.Basic.Properties(content_type="text/plain")
    with_headers = commands.Basic.Properties(headers={"k": "v"})
    sends = ([("", "burst-s1", b"a%d" % n, plain) for n in range(6)]
             + [("", "burst-s1", b"b%d" % n, with_headers if n == 1 else plain) for n in range(3)]
             + [("burst-fan", "", b"c%d" % n, plain) for n in range(4)]
             + [("burst-direct", "to-s2", b"d%d" % n, plain) for n in range(4)])
    with RawClient(port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_method(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk, 1)
        raw.send(b"".join(b"".join(RawClient.publish_frames(1, body, exchange, key, props))
                          for exchange, key, body, props in sends))
        confirmed: set[int] = set()
        while len(confirmed) < len(sends):  # acks may come in any grouping and order
            ack = raw.expect(Basic.Ack, 1)
            confirmed.update(range(1, ack.delivery_tag + 1) if ack.multiple
                             else [ack.delivery_tag])
        acked = sorted(confirmed)
    held: dict[str, list[tuple[bytes, object]]] = {}
    channel.basic_qos(prefetch_count=100)
    for stream in ("burst-s1", "burst-s2"):
        got: list[tuple[bytes, object]] = []
        for _method, props, body in channel.consume(stream, arguments={
                "x-stream-offset": "first"}, inactivity_timeout=2):
            if body is None:
                break
            headers = {k: v for k, v in (props.headers or {}).items() if k != "x-stream-offset"}
            got.append((body, headers))
        channel.cancel()
        held[stream] = got
        channel.queue_delete(stream)
    channel.exchange_delete("burst-fan")
    channel.exchange_delete("burst-direct")
    setup.close()
    return acked, held


def test_runs_into_streams_hold_what_rabbitmq_holds(workers_broker: BrokerProcess,
                                                     reference: object) -> None:
    acked, held = stream_burst(workers_broker.port)
    assert acked == list(range(1, 18))
    assert [body for body, _h in held["burst-s1"]] == [
        b"a0", b"a1", b"a2", b"a3", b"a4", b"a5", b"b0", b"b1", b"b2", b"c0", b"c1", b"c2", b"c3"]
    assert [body for body, _h in held["burst-s2"]] == [
        b"c0", b"c1", b"c2", b"c3", b"d0", b"d1", b"d2", b"d3"]
    assert held["burst-s1"][7][1] == {"k": "v"}
    assert (acked, held) == stream_burst(reference.port)  # type: ignore[attr-defined]


def hashed_burst(port: int, exchange: str, kind: str, one_by_one: bool) -> list[int]:
    """Thirty confirmed publishes alike but for their message_id through a consistent-hash
    exchange that hashes it, to three queues of one kind: in one write (a worker makes them
    one run), or one at a time. What each queue holds."""
    from pamqp import commands
    from support.rawamqp import RawClient

    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = setup.channel()
    channel.exchange_declare(exchange, "x-consistent-hash",
                             arguments={"hash-property": "message_id"})
    queues = [f"{exchange}-{n}" for n in range(3)]
    for queue in queues:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        channel.queue_bind(queue, exchange, "1")
    ids = [f"id-{n}" for n in range(30)]
    if one_by_one:
        channel.confirm_delivery()
        for n, message_id in enumerate(ids):
            channel.basic_publish(exchange, "same", b"m%d" % n,
                                  pika.BasicProperties(message_id=message_id))
    else:
        with RawClient(port) as raw:
            raw.handshake()
            raw.open_channel(1)
            raw.send_method(1, commands.Confirm.Select())
            raw.expect(commands.Confirm.SelectOk, 1)
            raw.send(b"".join(b"".join(RawClient.publish_frames(
                1, b"m%d" % n, exchange, "same", commands.Basic.Properties(message_id=message_id)))
                for n, message_id in enumerate(ids)))
            confirmed: set[int] = set()
            while len(confirmed) < len(ids):
                ack = raw.expect(commands.Basic.Ack, 1)
                confirmed.update(range(1, ack.delivery_tag + 1) if ack.multiple
                                 else [ack.delivery_tag])
    held = [channel.queue_declare(queue, passive=True).method.message_count for queue in queues]
    setup.close()
    return held


@pytest.mark.parametrize("kind", ["stream", "quorum", "classic"])
def test_a_run_through_an_exchange_that_hashes_a_property_routes_each_message(
        workers_broker: BrokerProcess, kind: str) -> None:
    """Messages alike in exchange, routing key and headers may still route apart: a run of
    them lands as the same messages published one by one (not all where the first went)."""
    one_by_one = hashed_burst(workers_broker.port, "hashed-1", kind, one_by_one=True)
    assert sum(one_by_one) == 30 and len([n for n in one_by_one if n]) >= 2
    assert hashed_burst(workers_broker.port, "hashed-2", kind, one_by_one=False) == one_by_one


def quorum_burst(port: int) -> tuple[list[int], list[bytes], list[tuple[Any, ...]],
                                     list[tuple[Any, ...]], int, list[bytes]]:
    """Confirmed publishes in one write, as a worker gathers them into runs, taken by quorum
    queues in one call (`QuorumQueue.publish_many`): nine plain ones to a queue (three of them
    through amq.direct by two other routing keys, three others with priority 9); five to a
    queue with a message TTL of 300 ms that dead-letters. The acks; the bodies of the first
    queue in the order a consumer gets them; (delivery tag, redelivered, body, exchange,
    routing key) of that consumer's deliveries, unacked, and of a second consumer's after the
    first channel closed (deliveries of one write go out as one run: `Channel.send_many`); how
    many the TTL queue holds after 1.5 s; the bodies dead-lettered, in order."""
    from pamqp import commands
    from pamqp.commands import Basic
    from support.rawamqp import RawClient

    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = setup.channel()
    channel.queue_declare("burst-qq", durable=True, arguments={"x-queue-type": "quorum"})
    routes = {b"a1": ("amq.direct", "alt"), b"a2": ("amq.direct", "alt2"),
              b"a3": ("amq.direct", "alt")}  # the others: ("", "burst-qq")
    for key in ("alt", "alt2"):
        channel.queue_bind("burst-qq", "amq.direct", key)
    channel.queue_declare("burst-dead", durable=True)
    channel.queue_declare("burst-ttl", durable=True, arguments={
        "x-queue-type": "quorum", "x-message-ttl": 300, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "burst-dead"})
    plain = commands.Basic.Properties(content_type="text/plain", delivery_mode=2)
    urgent = commands.Basic.Properties(content_type="text/plain", delivery_mode=2, priority=9)
    bodies = [b"a0", b"a1", b"p0", b"a2", b"p1", b"a3", b"a4", b"p2", b"a5"]
    sends = ([(*routes.get(body, ("", "burst-qq")), body,
               urgent if body.startswith(b"p") else plain) for body in bodies]
             + [("", "burst-ttl", b"t%d" % n, plain) for n in range(5)])
    with RawClient(port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_method(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk, 1)
        raw.send(b"".join(b"".join(RawClient.publish_frames(1, body, exchange, key, props))
                          for exchange, key, body, props in sends))
        confirmed: set[int] = set()
        while len(confirmed) < len(sends):  # acks may come in any grouping and order
            ack = raw.expect(Basic.Ack, 1)
            confirmed.update(range(1, ack.delivery_tag + 1) if ack.multiple
                             else [ack.delivery_tag])
    deliveries: list[list[tuple[int, bool, bytes, str, str]]] = []
    for _ in range(2):
        consumer = setup.channel()
        consumer.basic_qos(prefetch_count=100)
        got: list[tuple[int, bool, bytes, str, str]] = []
        for method, _props, body in consumer.consume("burst-qq", inactivity_timeout=1):
            if method is None:
                break
            got.append((method.delivery_tag, method.redelivered, body, method.exchange,
                        method.routing_key))
        deliveries.append(got)
        consumer.close()  # unacked: back, redelivered, to the next consumer
    time.sleep(1.5)
    left = channel.queue_declare("burst-ttl", passive=True).method.message_count
    dead: list[bytes] = []
    while True:
        _method, _props, body = channel.basic_get("burst-dead", auto_ack=True)
        if body is None:
            break
        dead.append(body)
    for queue in ("burst-qq", "burst-ttl", "burst-dead"):
        channel.queue_delete(queue)
    setup.close()
    order = [delivery[2] for delivery in deliveries[0]]
    return sorted(confirmed), order, deliveries[0], deliveries[1], left, dead


def test_runs_into_quorum_queues_keep_priorities_ttl_and_delivery_tags(
        workers_broker: BrokerProcess) -> None:
    acked, order, first, second, left, dead = quorum_burst(workers_broker.port)
    assert acked == list(range(1, 15))
    assert order == [b"p0", b"p1", b"p2", b"a0", b"a1", b"a2", b"a3", b"a4", b"a5"]
    def names(body: bytes) -> tuple[str, str]:
        return {b"a1": ("amq.direct", "alt"), b"a2": ("amq.direct", "alt2"),
                b"a3": ("amq.direct", "alt")}.get(body, ("", "burst-qq"))

    assert first == [(tag, False, body, *names(body)) for tag, body in enumerate(order, 1)]
    # returned, they come back in the order they were published (as RabbitMQ's returns)
    assert second == [(tag, True, body, *names(body)) for tag, body in enumerate(
        [b"a0", b"a1", b"p0", b"a2", b"p1", b"a3", b"a4", b"p2", b"a5"], 1)]
    assert left == 0
    assert dead == [b"t0", b"t1", b"t2", b"t3", b"t4"]
