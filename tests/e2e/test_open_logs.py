"""The node's cap on open queue logs (`open_logs`, storage/openlogs.py), as an operator sees it.

A real `leveret serve` with a cap of 20 logs and 400 queues (200 durable classic, 200 quorum),
every write fsynced (`queue_fsync = always`, the syncer's rounds): publishes confirmed one by
one across all the queues, consumed and acked by a consumer on each queue, a restart, more
publishes: every message arrives, in order, once, and the process's open descriptors
(`/proc/PID/fd`, what `ulimit -n` bounds) stay under twice the cap plus a constant, where
without the cap they are two per queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from support.brokers import BrokerProcess
from support.procstat import open_fds

CAP = 20
QUEUES = 200  # of each type
# besides the logs' files: the listener sockets, the client's connection, the syncer's
# descriptor of the file system, the server's lock on the queues folder, the log file...
CONSTANT = 20


class Watch:
    """The broker's open descriptors, sampled as the test goes."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.pid = broker.pid
        self.peak = 0

    def sample(self) -> int:
        now = open_fds(self.pid)
        self.peak = max(self.peak, now)
        return now


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    started = BrokerProcess(tmp_path / "data", args=["--workers", "1"], env={
        "LEVERET_OPEN_LOGS": str(CAP), "LEVERET_QUEUE_FSYNC": "always"}).start()
    yield started
    started.kill()


def names() -> list[str]:
    return [f"classic-{i}" for i in range(QUEUES)] + [f"quorum-{i}" for i in range(QUEUES)]


def publish(broker: BrokerProcess, watch: Watch, rounds: range) -> None:
    """Persistent messages, each confirmed before the next, `rounds` of them per queue."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for round_ in rounds:
            for i, name in enumerate(names()):
                channel.basic_publish("", name, f"{name}:{round_}".encode(),
                                      pika.BasicProperties(delivery_mode=2), mandatory=True)
                if i % 25 == 0:
                    watch.sample()


def consume(broker: BrokerProcess, watch: Watch, each: int) -> dict[str, list[str]]:
    """A consumer on every queue, acking each message, until `each` came from every queue."""
    got: dict[str, list[str]] = {name: [] for name in names()}
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        for name in names():
            def on_message(ch: pika.adapters.blocking_connection.BlockingChannel,
                           method: pika.spec.Basic.Deliver, _props: object, body: bytes,
                           queue: str = name) -> None:
                got[queue].append(body.decode())
                ch.basic_ack(method.delivery_tag)
            channel.basic_consume(name, on_message)
        deadline = time.monotonic() + 120
        while sum(map(len, got.values())) < each * len(got) and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
            watch.sample()
        connection.process_data_events(time_limit=0.5)  # (anything more would be a duplicate)
        watch.sample()
    return got


def test_descriptors_stay_bounded_across_400_queue_logs(broker: BrokerProcess) -> None:
    empty = open_fds(broker.pid)
    watch = Watch(broker)
    bound = empty + 2 * CAP + CONSTANT
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        for i, name in enumerate(names()):
            arguments = {"x-queue-type": "quorum"} if name.startswith("quorum") else None
            channel.queue_declare(name, durable=True, arguments=arguments)
            if i % 25 == 0:
                watch.sample()
    publish(broker, watch, range(3))
    # consume everything published so far, in order, each once
    got = consume(broker, watch, 3)
    assert got == {name: [f"{name}:{r}" for r in range(3)] for name in names()}
    publish(broker, watch, range(3, 5))  # left in the queues over the restart
    assert watch.peak < bound, (watch.peak, bound)

    assert broker.stop() == 0
    broker.start()
    watch = Watch(broker)
    recovered = watch.sample()
    assert recovered < bound, (recovered, bound)
    publish(broker, watch, range(5, 6))
    got = consume(broker, watch, 3)
    assert got == {name: [f"{name}:{r}" for r in range(3, 6)] for name in names()}
    assert watch.peak < bound, (watch.peak, bound)


def test_a_negative_cap_is_refused_at_start(tmp_path: Path) -> None:
    refused = BrokerProcess(tmp_path / "data", env={"LEVERET_OPEN_LOGS": "-1"}).run_to_exit()
    assert refused.returncode == 1
    assert "invalid value -1 for setting 'open_logs'" in refused.stdout + refused.stderr


def test_streams_share_the_cap(tmp_path: Path) -> None:
    """Streams' logs are under the same cap: 30 streams on a cap of 4, each written in turns,
    a consumer reading every one from the first offset while the others write, then a
    restart: every message there, in order."""
    from support.amqp import consume

    broker = BrokerProcess(tmp_path / "data", args=["--workers", "1"], env={
        "LEVERET_OPEN_LOGS": "4", "LEVERET_STREAM_FSYNC": "always"}).start()
    try:
        streams = [f"s{i}" for i in range(30)]
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for name in streams:
                channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            for turn in range(3):
                for name in streams:
                    channel.basic_publish("", name, f"{name}:{turn}".encode())
            assert open_fds(broker.pid) < 11 + 2 * 4 + CONSTANT
            for name in streams:
                got = consume(connection.channel(), name, 3,
                              arguments={"x-stream-offset": "first"})
                assert [body.decode() for _m, _p, body in got] == [f"{name}:{t}" for t in range(3)]
        assert broker.stop() == 0
        broker.start()
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
            for name in streams:
                got = consume(connection.channel(), name, 3,
                              arguments={"x-stream-offset": "first"})
                assert [body.decode() for _m, _p, body in got] == [f"{name}:{t}" for t in range(3)]
    finally:
        broker.kill()
