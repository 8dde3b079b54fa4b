"""What every scenario shares: the options, the result line, setup and teardown helpers.

Role: hold the run's Options (broker address, sizes, rates), turn measurements into the flat
result dict that load.py prints as one JSON line, fill a stream with numbered messages, and
delete a scenario's queue afterwards.

It must not know any broker: only AMQP 0-9-1 as RabbitMQ speaks it. Threading contract: none
(plain functions; each process builds its own connections).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadgen import wire
from loadgen.client import Connection, connect
from loadgen.consume import ConsumeStats, consume
from loadgen.measure import SelfCpu, percentiles
from loadgen.publish import PublishStats, publish_confirmed

STREAM = {"x-queue-type": "stream"}
QUORUM = {"x-queue-type": "quorum"}


@dataclass
class Options:
    host: str = "127.0.0.1"
    port: int = 5672
    body: int = 100
    duration: float = 10.0
    messages: int | None = None
    processes: int = 1
    window: int = 1000
    prefetch: int = 2000
    ack_every: int = 500
    consumers: int = 10
    rate: float = 10_000.0
    connections: int = 1000
    publishers: int = 4  # (h) and (i)
    conn_window: int = 10  # (j): messages in flight per connection
    mux_processes: int = 4  # (j): load processes that share the connections
    interval: float = 5.0
    broker_pids: list[int] = field(default_factory=list)
    queue: str | None = None
    keep: bool = False
    label: str | None = None
    idle_timeout: float = 30.0
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    # added to each stream's declare, and to scenario q's quorum queue's
    stream_args: dict[str, Any] = field(default_factory=dict)

    @property
    def stream(self) -> dict[str, Any]:
        """The arguments every stream of a run is declared with."""
        return {**STREAM, **self.stream_args}

    @property
    def quorum(self) -> dict[str, Any]:
        """The arguments a quorum queue of a run (scenario q) is declared with."""
        return {**QUORUM, **self.stream_args}

    def connect(self) -> Connection:
        return connect(
            self.host,
            self.port,
            user=self.user,
            password=self.password,
            vhost=self.vhost,
            timeout=max(self.idle_timeout, 30.0),
        )

    def queue_name(self, scenario: str) -> str:
        return self.queue or f"bench.{scenario}.{self.body}.{secrets.token_hex(4)}"


DEFAULT_MESSAGES = {"b": 500_000, "c": 200_000, "e": 100_000, "g": 1_000_000, "m": 10_000_000,
                    "q": 200_000}


def result(
    opts: Options,
    scenario: str,
    *,
    messages: int,
    seconds: float,
    errors: list[str],
    cpu: float | None,
    loadgen_cpu: float | None,
    p50: float | None = None,
    p99: float | None = None,
    machine: float | None = None,
    **extra: Any,
) -> dict:
    seconds = max(seconds, 1e-9)
    out = {
        "scenario": scenario,
        "broker": opts.label,
        "body": opts.body,
        "msgs_per_s": round(messages / seconds, 1),
        "mb_per_s": round(messages * opts.body / seconds / 1e6, 2),
        "p50_ms": p50,
        "p99_ms": p99,
        "broker_cpu_pct": cpu,
        "loadgen_cpu_pct": None if loadgen_cpu is None else round(loadgen_cpu, 1),
        "machine_cpu_pct": machine,
        "messages": messages,
        "seconds": round(seconds, 3),
        "ok": not errors,
    }
    out.update(extra)
    if errors:
        out["errors"] = errors[:10]
    return out


def mb(kb: int | None) -> float | None:
    return round(kb / 1024, 1) if kb else None


def span(results: list[dict]) -> float:
    starts = [r["started_ns"] for r in results if r.get("started_ns")]
    ends = [r["finished_ns"] for r in results if r.get("finished_ns")]
    if not starts or not ends:
        return 1e-9
    return (max(ends) - min(starts)) / 1e9


def errors_of(results: list[dict]) -> list[str]:
    return [e for r in results for e in r.get("errors", [])]


def cleanup(opts: Options, name: str) -> None:
    if opts.keep:
        return
    try:
        conn = opts.connect()
        conn.delete_queue(name)
        conn.close()
    except Exception:  # noqa: BLE001 - best effort: a broken broker is reported elsewhere
        pass


def template_for(opts: Options, conn: Connection, queue: str, pid: int = 0, **kw: Any) -> Any:
    return wire.publish_template(
        conn.channel, queue, opts.body, publisher_id=pid, frame_max=conn.frame_max, **kw
    )


def pub_dict(stats: PublishStats, cpu: SelfCpu) -> dict:
    return {
        "published": stats.published,
        "confirmed": stats.confirmed,
        "nacked": stats.nacked,
        "started_ns": stats.started_ns,
        "finished_ns": stats.finished_ns,
        "errors": stats.errors
        + (
            []
            if stats.ok or stats.errors
            else [
                f"{stats.confirmed} confirms ({stats.nacked} nacks) for {stats.published} publishes"
            ]
        ),
        "lat": stats.latency_ns,
        "lat_w": stats.latency_weight,
        "cpu": cpu.pct(),
    }


def con_dict(stats: ConsumeStats, cpu: SelfCpu, latency: bool = False) -> dict:
    out = {
        "received": stats.received,
        "delivered": stats.delivered,
        "started_ns": stats.started_ns,
        "finished_ns": stats.finished_ns,
        "errors": stats.errors,
        "cpu": cpu.pct(),
    }
    if latency:
        p50, p99, p999 = percentiles(stats.latency_ns, (50, 99, 99.9))
        out.update(
            p50=p50,
            p99=p99,
            p999=p999,
            max=round(max(stats.latency_ns) / 1e6, 3) if stats.latency_ns else None,
        )
    return out


def consume_from(
    opts: Options,
    queue: str,
    count: int,
    arguments: dict | None = None,
    *,
    start: Callable[[], object] = lambda: None,
    **options: Any,
) -> tuple[ConsumeStats, SelfCpu]:
    """One consumer on a connection of its own takes `count` messages of `queue` (prefetch,
    acks and body checks as `opts` say; `options` go to consume()). `start` runs once the
    connection is ready, just before the clocks start."""
    conn = opts.connect()
    conn.qos(opts.prefetch)
    start()
    cpu = SelfCpu()
    cpu.start()
    stats = ConsumeStats(started_ns=time.monotonic_ns())
    conn.consume(queue, arguments)
    consume(conn, count, ack_every=opts.ack_every, body_size=opts.body,
            idle_timeout=opts.idle_timeout, stats=stats, **options)
    conn.close()
    return stats, cpu


def prefill(opts: Options, queue: str, count: int, make: Callable | None = None) -> PublishStats:
    """Publish `count` messages (publisher 0, seq 0..count-1) with confirms, window-limited."""
    conn = opts.connect()
    conn.confirm_select()
    template = make(conn) if make else template_for(opts, conn, queue)
    stats = publish_confirmed(conn, template, count=count, window=opts.window)
    conn.close()
    return stats
