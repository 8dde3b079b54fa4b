"""Load against one `leveret serve`: many connections with churn, topology churn, and backlogs.

- Connections: N concurrent connections, each with a channel and a consumer, while publishers
  publish with confirms, and connections open and close at R a second (half of the closes
  clean, half dropped). Every confirmed message is consumed (at least once: a message unacked
  on a dropped connection comes back redelivered), no heartbeat is missed either way, the
  broker's memory stays bounded, and it returns near its baseline once the clients are gone.
- Topology: Q durable queues (some with arguments) and S streams declared, bound and partly
  deleted in a loop, with a restart (kill -9 or SIGTERM) after each round; afterwards the
  broker's queues, bindings and storage folders are exactly what was left.
- Backlog: M messages in one stream and K in a durable classic queue, consumed while publishing
  continues; the broker's memory stays bounded (a backlog is read from disk, not kept in
  memory).

Short sizes run in CI; the full sizes of the issue (5,000 connections, 200 a second for a
minute; 10,000 queues and 100 streams; 10 million and 1 million messages) are `slow`.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C
from support.brokers import BrokerProcess
from support.faults import queue_dir
from support.loadamqp import (
    Connection,
    Publisher,
    connect,
    heartbeats,
    open_channel,
)
from support.management import Http
from support.ports import free_port, wait_for_port
from support.procstat import open_fds, open_files_limit, raise_nofile, rss_mb

from leveret.amqp.codec import encode_ack

_ID = struct.Struct(">Q")


def body_of(number: int, size: int = 64) -> bytes:
    return _ID.pack(number) + b"x" * (size - 8)


# -- connections with churn ---------------------------------------------------------------------


class Storm:
    """Consumers on `queues` queues, churned; publishers; an account of every message."""

    def __init__(self, port: int, queues: int, heartbeat: int) -> None:
        self.port = port
        self.queue_names = [f"storm-{i}" for i in range(queues)]
        self.heartbeat = heartbeat
        self.consumers: list[Connection] = []
        self.received: Counter[int] = Counter()
        self.redelivered = 0
        self.opened = 0
        self.closed = 0
        self.silences: list[float] = []
        self.broker_closes: list[tuple[int, str]] = []
        self.serial = 0

    async def consumer(self) -> Connection:
        self.serial += 1
        serial = self.serial  # before any await: consumers are opened concurrently
        conn = await connect(self.port, self.heartbeat, name=f"c{serial}")
        await open_channel(conn)
        await conn.call(1, C.Basic.Qos(prefetch_count=20))

        def on_deliver(channel: int, tag: int, redelivered: bool, body: bytes) -> None:
            self.received[_ID.unpack_from(body)[0]] += 1
            self.redelivered += redelivered
            conn.write(encode_ack(channel, tag, False))

        conn.on_deliver = on_deliver
        queue = self.queue_names[serial % len(self.queue_names)]
        await conn.call(1, C.Basic.Consume(queue=queue, consumer_tag="c"))
        self.opened += 1
        return conn

    async def open(self, count: int, wave: int = 250) -> None:
        for start in range(0, count, wave):
            made = await asyncio.gather(*(self.consumer() for _ in range(min(wave,
                                                                            count - start))))
            self.consumers += made

    def retire(self, conn: Connection, clean: bool) -> None:
        self.silences.append(conn.max_silence)
        if conn.closed_by_broker is not None:
            self.broker_closes.append(conn.closed_by_broker)
        if clean:
            conn.close()
        else:
            conn.abort()
        self.closed += 1

    async def churn(self, per_second: int, seconds: float, rng: random.Random) -> None:
        tick = 0.1
        per_tick = max(1, round(per_second * tick))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            for _ in range(per_tick):
                victim = self.consumers.pop(rng.randrange(len(self.consumers)))
                self.retire(victim, clean=rng.random() < 0.5)
            self.consumers += await asyncio.gather(*(self.consumer() for _ in range(per_tick)))
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))


async def publish_steadily(publishers: list[Publisher], queues: list[str], rate: int,
                           stop: asyncio.Event, first: int = 0) -> int:
    """Publish `rate` messages a second, round robin, until `stop`; returns the count."""
    number = first
    tick = 0.05
    while not stop.is_set():
        started = time.monotonic()
        for _ in range(max(1, int(rate * tick))):
            publisher = publishers[number % len(publishers)]
            await publisher.publish(queues[number % len(queues)], body_of(number))
            number += 1
        await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))
    return number - first


def connection_storm(broker: BrokerProcess, connections: int, churn_per_s: int,
                     seconds: float, rate: int, queues: int, heartbeat: int,
                     rounds: int = 2) -> list[dict[str, Any]]:
    """`rounds` times: open the connections, churn them while publishing, close them all.
    The second round shows whether the memory the first one used is reused (no leak)."""
    async def one_round(round_number: int, baseline: float) -> dict[str, Any]:
        rng = random.Random(round_number)
        storm = Storm(broker.port, queues, heartbeat)
        setup = await connect(broker.port)
        await open_channel(setup)
        for name in storm.queue_names:
            await setup.call(1, C.Queue.Declare(queue=name))
        publishers = [await Publisher(await connect(broker.port, heartbeat)).start()
                      for _ in range(2)]
        stop_beats = asyncio.Event()
        beats = asyncio.create_task(heartbeats(
            lambda: [*storm.consumers, *(p.conn for p in publishers)], heartbeat, stop_beats))
        started = time.monotonic()
        await storm.open(connections)
        open_seconds = time.monotonic() - started
        with_connections = rss_mb(broker.pid)
        stop_publishing = asyncio.Event()
        publishing = asyncio.create_task(publish_steadily(
            publishers, storm.queue_names, rate, stop_publishing, first=round_number << 32))
        peak = with_connections
        churn = asyncio.create_task(storm.churn(churn_per_s, seconds, rng))
        while not churn.done():
            peak = max(peak, rss_mb(broker.pid))
            await asyncio.sleep(0.5)
        await churn
        stop_publishing.set()
        published = await publishing
        for publisher in publishers:
            await publisher.drain()
        acked = {_ID.unpack_from(b)[0] for p in publishers for b in p.acked}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not acked <= set(storm.received):
            await asyncio.sleep(0.1)
        missing = acked - set(storm.received)
        for conn in list(storm.consumers):
            storm.retire(conn, clean=True)
        storm.consumers.clear()
        for publisher in publishers:
            publisher.conn.close()
        stop_beats.set()
        await beats
        setup.close()
        await asyncio.sleep(3)
        return {
            "connections": connections, "churn_per_s": churn_per_s, "seconds": seconds,
            "opened": storm.opened, "closed": storm.closed, "open_all_s": round(open_seconds, 1),
            "published": published, "confirmed": len(acked), "missing": len(missing),
            "redelivered": storm.redelivered,
            "duplicates": sum(c - 1 for c in storm.received.values() if c > 1),
            "max_silence_s": round(max(storm.silences), 2),
            "broker_closes": storm.broker_closes[:5],
            "rss_baseline_mb": round(baseline, 1), "rss_with_connections_mb":
            round(with_connections, 1), "rss_peak_mb": round(peak, 1),
            "rss_after_mb": round(rss_mb(broker.pid), 1),
        }

    async def run() -> list[dict[str, Any]]:
        baseline = rss_mb(broker.pid)
        return [await one_round(number, baseline) for number in range(rounds)]

    return asyncio.run(run())


def check_storm(broker: BrokerProcess, rounds: list[dict[str, Any]], heartbeat: int) -> None:
    for figures in rounds:
        assert figures["missing"] == 0, figures
        assert figures["confirmed"] == figures["published"]
        assert figures["broker_closes"] == [], figures
        assert figures["max_silence_s"] < 2 * heartbeat, figures  # the broker's heartbeats came
    assert "missed heartbeats" not in broker.log()  # and ours reached it
    # Python keeps the memory it freed for reuse rather than give it back to the system, so
    # "back near the baseline" is measured as: a second round of the same load costs no more
    # memory than the first one left behind (it reuses it; nothing leaked).
    first, second = rounds[0], rounds[-1]
    assert second["rss_peak_mb"] <= first["rss_peak_mb"] * 1.1 + 10, rounds
    assert second["rss_after_mb"] <= first["rss_after_mb"] * 1.1 + 10, rounds


@pytest.fixture
def big_broker(tmp_path: Path) -> Any:
    raise_nofile(20_000)  # inherited by the broker process started below
    broker = BrokerProcess(tmp_path / "data").start()
    yield broker
    broker.kill()


def test_connections_with_churn(big_broker: BrokerProcess) -> None:
    heartbeat = 2
    figures = connection_storm(big_broker, connections=300, churn_per_s=40, seconds=4,
                               rate=400, queues=10, heartbeat=heartbeat)
    print("connection storm:", figures)
    check_storm(big_broker, figures, heartbeat)
    assert open_fds(big_broker.pid) < 50  # every socket released


@pytest.mark.slow
def test_five_thousand_connections_with_churn(big_broker: BrokerProcess) -> None:
    heartbeat = 10
    figures = connection_storm(big_broker, connections=5000, churn_per_s=200, seconds=60,
                               rate=1000, queues=50, heartbeat=heartbeat)
    print("connection storm:", figures)
    check_storm(big_broker, figures, heartbeat)
    assert open_fds(big_broker.pid) < 50


# -- topology churn --------------------------------------------------------------------------


async def _pipelined(conn: Connection, methods: list[Any], channel: int = 1) -> list[Any]:
    futures = [conn.call(channel, m) for m in methods]
    return await asyncio.gather(*futures)


def durable_budget(broker: BrokerProcess, streams: int) -> int:
    """How many durable classic queues the broker's open-files limit allows next to `streams`
    streams: each keeps 3 descriptors open (segment, index, folder lock); 1,000 are kept for
    connections and the rest."""
    return max(0, (open_files_limit(broker.pid) - 1000) // 3 - streams)


def topology_rounds(broker: BrokerProcess, queues: int, streams: int, rounds: int,
                    http: Http) -> dict[str, Any]:
    """Each round: delete what the last one left, declare `queues` queues (durable as far as
    the open-files limit allows, the rest transient, a third with arguments) and `streams`
    streams, bind them all, unbind some and delete half, pipelined; then kill -9 or stop the
    broker, restart it, and check that exactly the durable part of what is left is there."""
    rng = random.Random(11)
    durable = min(queues, durable_budget(broker, streams))
    left: list[str] = []
    restarts: list[float] = []
    for round_number in range(rounds):
        expected_queues: dict[str, dict[str, Any]] = {}
        expected_bindings: set[tuple[str, str]] = set()

        async def declare(round_number: int = round_number, gone: list[str] = left,
                          expected_queues: dict[str, Any] = expected_queues,
                          expected_bindings: set[tuple[str, str]] = expected_bindings) -> None:
            conn = await connect(broker.port)
            await open_channel(conn)
            await _pipelined(conn, [C.Queue.Delete(queue=n) for n in gone])
            await conn.call(1, C.Exchange.Declare(exchange="topo", exchange_type="topic",
                                                  durable=True))
            declares, binds, kept = [], [], {}
            for i in range(queues):
                name = f"topo-{round_number}-{i}"
                arguments = {"x-max-length": i} if i % 3 == 0 else {}
                declares.append(C.Queue.Declare(queue=name, durable=i < durable,
                                                arguments=arguments))
                binds.append(C.Queue.Bind(queue=name, exchange="topo", routing_key=f"k.{i}"))
                kept[name] = (arguments, f"k.{i}", i < durable)
            for i in range(streams):
                name = f"topo-{round_number}-stream-{i}"
                declares.append(C.Queue.Declare(queue=name, durable=True,
                                                arguments={"x-queue-type": "stream"}))
                binds.append(C.Queue.Bind(queue=name, exchange="topo", routing_key="s.#"))
                kept[name] = ({"x-queue-type": "stream"}, "s.#", True)
            await _pipelined(conn, declares)
            await _pipelined(conn, binds)
            names = sorted(kept)
            doomed = set(rng.sample(names, len(names) // 2))
            unbound = set(rng.sample(sorted(set(names) - doomed), len(names) // 8))
            await _pipelined(conn, [C.Queue.Unbind(queue=n, exchange="topo",
                                                   routing_key=kept[n][1]) for n in unbound])
            await _pipelined(conn, [C.Queue.Delete(queue=n) for n in doomed])
            for name in names:
                arguments, key, is_durable = kept[name]
                if name in doomed or not is_durable:
                    continue
                expected_queues[name] = arguments
                if name not in unbound:
                    expected_bindings.add((name, key))
            left[:] = [n for n in names if n not in doomed]
            conn.close()
            await asyncio.wait_for(conn.lost, 30)

        asyncio.run(declare())
        if round_number % 2:
            broker.kill()
        else:
            assert broker.stop(timeout=120) == 0
        started = time.monotonic()
        broker.start(timeout=120)
        restarts.append(round(time.monotonic() - started, 2))
        check_topology(broker, http, expected_queues, expected_bindings)
        left[:] = [n for n in left if n in expected_queues]  # transient ones are gone
    return {"queues_per_round": queues, "durable_per_round": durable,
            "streams_per_round": streams, "rounds": rounds, "restart_s": restarts}


def check_topology(broker: BrokerProcess, http: Http, queues: dict[str, dict[str, Any]],
                   bindings: set[tuple[str, str]]) -> None:
    wait_for_port(http.port)  # the management API starts just after the AMQP listener
    listed = {q["name"]: q for q in http.ok("/api/queues/%2F") if q["name"].startswith("topo-")}
    assert set(listed) == set(queues)
    for name, arguments in queues.items():
        assert listed[name]["durable"] is True
        assert listed[name]["arguments"] == arguments, name
    got = {(b["destination"], b["routing_key"]) for b in http.ok("/api/bindings/%2F")
           if b["source"] == "topo"}
    assert got == bindings
    # Every durable queue has its folder, and no folder is left of a deleted one.
    folders = {p.name for p in (broker.data_dir / "queues").iterdir()}
    assert folders == {queue_dir(broker.data_dir, name).name for name in queues}


@pytest.fixture
def managed_process(tmp_path: Path) -> Any:
    raise_nofile(20_000)
    port = free_port()
    broker = BrokerProcess(tmp_path / "data", args=["--management-port", str(port)]).start()
    yield broker, Http(port)
    broker.kill()


def test_topology_churn_survives_restarts(managed_process: tuple[BrokerProcess, Http]) -> None:
    broker, http = managed_process
    figures = topology_rounds(broker, queues=300, streams=6, rounds=2, http=http)
    print("topology churn:", figures)


@pytest.mark.slow
def test_ten_thousand_queues_and_a_hundred_streams(
    managed_process: tuple[BrokerProcess, Http],
) -> None:
    broker, http = managed_process
    figures = topology_rounds(broker, queues=10_000, streams=100, rounds=4, http=http)
    print("topology churn:", figures)


# -- backlogs -------------------------------------------------------------------------------------


async def _fill(port: int, queue: str, count: int, size: int, persistent: bool,
                first: int = 0) -> None:
    conn = await connect(port)
    publisher = await Publisher(conn, window=5000).start()
    for number in range(first, first + count):
        await publisher.publish(queue, body_of(number, size), persistent=persistent)
    await publisher.drain(timeout=600)
    assert not publisher.nacked
    conn.close()


def backlog(broker: BrokerProcess, stream_messages: int, queue_messages: int,
            size: int = 100) -> dict[str, Any]:
    """Fill a stream and a durable queue, then consume both from the start while publishing
    continues (10% more to each); every message arrives once, in order for the stream."""
    async def run() -> dict[str, Any]:
        setup = await connect(broker.port)
        await open_channel(setup)
        await setup.call(1, C.Queue.Declare(queue="backlog-stream", durable=True,
                                            arguments={"x-queue-type": "stream"}))
        await setup.call(1, C.Queue.Declare(queue="backlog-queue", durable=True))
        baseline = rss_mb(broker.pid)
        started = time.monotonic()
        await asyncio.gather(_fill(broker.port, "backlog-stream", stream_messages, size, False),
                             _fill(broker.port, "backlog-queue", queue_messages, size, True))
        filled_s = time.monotonic() - started
        after_fill = rss_mb(broker.pid)
        more_stream, more_queue = stream_messages // 10, queue_messages // 10
        stream_seen: list[int] = []
        queue_seen: Counter[int] = Counter()
        peak = after_fill

        async def consume(queue: str, arguments: dict[str, Any], seen: Any) -> Connection:
            conn = await connect(broker.port)
            await open_channel(conn)
            await conn.call(1, C.Basic.Qos(prefetch_count=2000))
            pending = [0]

            def on_deliver(channel: int, tag: int, _redelivered: bool, body: bytes) -> None:
                number = _ID.unpack_from(body)[0]
                if isinstance(seen, list):
                    seen.append(number)
                else:
                    seen[number] += 1
                pending[0] += 1
                if pending[0] >= 500:
                    conn.write(encode_ack(channel, tag, True))
                    pending[0] = 0

            conn.on_deliver = on_deliver
            await conn.call(1, C.Basic.Consume(queue=queue, consumer_tag="drain",
                                               arguments=arguments))
            return conn

        started = time.monotonic()
        consumers = [await consume("backlog-stream", {"x-stream-offset": "first"},
                                   stream_seen),
                     await consume("backlog-queue", {}, queue_seen)]
        publishing = asyncio.gather(
            _fill(broker.port, "backlog-stream", more_stream, size, False,
                  first=stream_messages),
            _fill(broker.port, "backlog-queue", more_queue, size, True, first=queue_messages))
        total_stream, total_queue = stream_messages + more_stream, queue_messages + more_queue
        deadline = time.monotonic() + max(120, (total_stream + total_queue) / 5000)
        while time.monotonic() < deadline and (len(stream_seen) < total_stream
                                               or len(queue_seen) < total_queue):
            peak = max(peak, rss_mb(broker.pid))
            await asyncio.sleep(0.5)
        await publishing
        consumed_s = time.monotonic() - started
        for conn in consumers:
            conn.close()
        setup.close()
        assert stream_seen == list(range(total_stream)), "the stream lost or reordered"
        assert set(queue_seen) == set(range(total_queue)), "the queue lost messages"
        assert max(queue_seen.values()) == 1
        return {"stream_messages": total_stream, "queue_messages": total_queue,
                "fill_s": round(filled_s, 1), "consume_s": round(consumed_s, 1),
                "rss_baseline_mb": round(baseline, 1), "rss_after_fill_mb": round(after_fill, 1),
                "rss_peak_mb": round(peak, 1)}

    return asyncio.run(run())


def test_a_backlog_is_consumed_while_publishing_continues(broker_process: BrokerProcess) -> None:
    figures = backlog(broker_process, stream_messages=100_000, queue_messages=20_000)
    print("backlog:", figures)
    assert figures["rss_peak_mb"] - figures["rss_baseline_mb"] < 150, figures


@pytest.mark.slow
def test_ten_million_in_a_stream_and_a_million_in_a_queue(broker_process: BrokerProcess) -> None:
    figures = backlog(broker_process, stream_messages=10_000_000, queue_messages=1_000_000)
    print("backlog:", figures)
    assert figures["rss_peak_mb"] - figures["rss_baseline_mb"] < 300, figures


def test_the_broker_raises_its_open_files_limit(tmp_path: Path) -> None:
    """Regression: every durable queue keeps three descriptors open, so under a common soft
    limit of 1,024 the broker refused durable queues after about 330 (541 "Too many open
    files"). `leveret serve` now raises its soft limit to the hard one, as RabbitMQ's
    packaging does."""
    import resource

    def low_soft_limit() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the hard limit ({hard}) leaves nothing to raise")
    broker = BrokerProcess(tmp_path / "data", preexec=low_soft_limit).start()
    try:
        assert open_files_limit(broker.pid) > 256
        async def declare() -> None:
            conn = await connect(broker.port)
            await open_channel(conn)
            await _pipelined(conn, [C.Queue.Declare(queue=f"fd-{i}", durable=True)
                                    for i in range(200)])
            conn.close()

        asyncio.run(declare())  # 600 descriptors for the queues alone
        assert "Too many open files" not in broker.log()
    finally:
        broker.kill()


def test_a_restart_rewrites_no_metadata(tmp_path: Path) -> None:
    """Regression: restoring the topology at start recorded every exchange, queue and binding
    again as it rebuilt them (a slow restart with many queues, and one that failed on a full
    disk). What is restored is already stored: the database sees no change at all."""
    import pika
    from support.brokers import InProcessBroker

    first = InProcessBroker(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(first.url))
        ch = conn.channel()
        ch.exchange_declare("restore-x", "topic", durable=True)
        for i in range(20):
            ch.queue_declare(f"restore-q{i}", durable=True,
                             arguments={"x-max-length": 10} if i % 2 else None)
            ch.queue_bind(f"restore-q{i}", "restore-x", f"key.{i}")
        ch.queue_declare("restore-s", durable=True, arguments={"x-queue-type": "stream"})
        conn.close()
    finally:
        first.stop()
    second = InProcessBroker(tmp_path / "data").start()
    try:
        vhost = second.call(lambda: second.broker.vhosts["/"])
        assert {f"restore-q{i}" for i in range(20)} | {"restore-s"} <= set(vhost.queues)
        assert len(vhost.exchanges["restore-x"].bindings) == 20
        assert second.call(lambda: second.broker.metastore.db.total_changes) == 0
    finally:
        second.stop()
