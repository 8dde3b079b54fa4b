"""Capacity scenarios: (f) many slow connections, (g) a filtered stream consumer, and (m) a
long stream read by ten consumers at different positions (memory).

Role: as in throughput.py (fresh queue, correctness checks, broker CPU), plus the broker's
RSS before and after (f) or sampled throughout (m), and the filtered / unfiltered speed ratio (g).

It must not know any broker. Threading contract: main thread; (m) forks workers and samples
RSS from one helper thread of the parent.
"""

from __future__ import annotations

import selectors
import threading
import time

from loadgen import wire, workers
from loadgen.client import Connection
from loadgen.common import (
    DEFAULT_MESSAGES,
    Options,
    cleanup,
    con_dict,
    consume_from,
    errors_of,
    mb,
    prefill,
    result,
    span,
    template_for,
)
from loadgen.measure import BrokerProbe, SelfCpu, weighted_percentiles
from loadgen.publish import ConfirmTracker, PublishStats, publish_confirmed

G_BURST = 1000  # scenario (g) publishes homogeneous bursts of this many messages
G_EVERY = 100  # one burst in G_EVERY is "wanted" (1%)

# ---- (f) many connections, each publishing slowly


def scenario_f(opts: Options, probe: BrokerProbe) -> list[dict]:
    queue = opts.queue_name("f")
    n = opts.connections
    admin = opts.connect()
    admin.declare_queue(queue, arguments=opts.stream)
    time.sleep(1.0)
    rss0 = probe.rss_kb()
    errors: list[str] = []
    conns: list[Connection] = []
    t_open = time.monotonic()
    try:
        for _ in range(n):
            conn = opts.connect()
            conn.confirm_select()
            conns.append(conn)
    except OSError as exc:
        errors.append(f"opened {len(conns)} of {n} connections: {type(exc).__name__}: {exc}")
    open_s = time.monotonic() - t_open
    time.sleep(2.0)
    rss1 = probe.rss_kb()
    stats = [PublishStats() for _ in conns]
    trackers = [ConfirmTracker(c, s) for c, s in zip(conns, stats, strict=True)]
    templates = [template_for(opts, c, queue, pid=i) for i, c in enumerate(conns)]
    sel = selectors.DefaultSelector()
    for i, c in enumerate(conns):
        c.sock.setblocking(False)
        sel.register(c.sock, selectors.EVENT_READ, i)
    cpu = SelfCpu()
    cpu.start()
    probe.start()
    start = time.monotonic()
    end = start + opts.duration
    # connection i publishes at start + (i / n + k) * interval, k = 0, 1, 2, ...
    k = 0
    order = list(range(len(conns)))
    try:
        while time.monotonic() < end:
            for i in order:
                due = start + (i / max(len(conns), 1) + k) * opts.interval
                while True:
                    now = time.monotonic()
                    if now >= due or now >= end:
                        break
                    _read_confirms(sel, conns, trackers, min(due, end) - now)
                if now >= end:
                    break
                ts = time.monotonic_ns()
                conns[i].send(templates[i].burst(stats[i].published, 1, ts))
                trackers[i].sent(1, ts)
            k += 1
        deadline = time.monotonic() + 30
        while any(t.outstanding for t in trackers) and time.monotonic() < deadline:
            _read_confirms(sel, conns, trackers, 0.5)
    except OSError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    seconds = time.monotonic() - start
    cpu_pct = probe.cpu_pct()
    machine = probe.machine_pct()
    rss2 = probe.rss_kb()
    published = sum(s.published for s in stats)
    confirmed = sum(t.upto + len(t.singles) for t in trackers)
    if confirmed != published:
        errors.append(f"{confirmed} confirms for {published} publishes")
    errors.extend(e for s in stats for e in s.errors[:1])
    sel.close()
    for c in conns:
        c.sock.setblocking(True)
        c.close(timeout=2)
    admin.close()
    cleanup(opts, queue)

    def per_conn(before: int | None, after: int | None) -> float | None:
        return round((after - before) / max(len(conns), 1), 1) if before and after else None

    lat = [v for s in stats for v in s.latency_ns]
    w = [v for s in stats for v in s.latency_weight]
    p50, p99 = weighted_percentiles(lat, w, (50, 99))
    return [
        result(
            opts,
            "f",
            messages=confirmed,
            seconds=seconds,
            errors=errors,
            cpu=cpu_pct,
            machine=machine,
            loadgen_cpu=cpu.pct(),
            p50=p50,
            p99=p99,
            latency="publish-to-confirm",
            connections=len(conns),
            open_s=round(open_s, 2),
            kb_per_connection=per_conn(rss0, rss2),
            kb_per_connection_idle=per_conn(rss0, rss1),
            broker_rss_mb_before=round(rss0 / 1024, 1) if rss0 else None,
            broker_rss_mb=round(rss2 / 1024, 1) if rss2 else None,
        )
    ]


def _read_confirms(
    sel: selectors.BaseSelector,
    conns: list[Connection],
    trackers: list[ConfirmTracker],
    timeout: float,
) -> None:
    for key, _ in sel.select(max(timeout, 0)):
        i = key.data
        try:
            data = conns[i].sock.recv(65536)
        except BlockingIOError:
            continue
        if not data:
            raise ConnectionResetError(f"connection {i} closed by the broker")
        trackers[i].feed(data)


# ---- (g) a filtered consumer that wants 1% of a stream


def scenario_g(opts: Options, probe: BrokerProbe) -> list[dict]:
    count = opts.messages or DEFAULT_MESSAGES["g"]
    group = G_BURST * G_EVERY
    count = max(group, count // group * group)
    queue = opts.queue_name("g")
    admin = opts.connect()
    admin.declare_queue(queue, arguments=opts.stream)
    conn = opts.connect()
    conn.confirm_select()
    other = template_for(opts, conn, queue, filter_value="other")
    wanted_t = template_for(opts, conn, queue, kind=wire.KIND_WANTED, filter_value="wanted")
    fill = PublishStats()
    wanted: list[int] = []
    for burst in range(count // G_BURST):
        first = burst * G_BURST
        is_wanted = burst % G_EVERY == G_EVERY - 1
        if is_wanted:
            wanted.extend(range(first, first + G_BURST))
        # each burst is confirmed before the next: no chunk mixes wanted and other messages
        publish_confirmed(
            conn,
            wanted_t if is_wanted else other,
            first_seq=first,
            count=G_BURST,
            window=G_BURST,
            stats=fill,
        )
        if fill.errors:
            break
    conn.close()
    errors = list(fill.errors) + ([] if fill.ok else ["fill: missing confirms"])
    runs: dict[str, dict] = {}
    if not errors:
        for name, args, expect, want in (
            ("filtered", {"x-stream-filter": "wanted"}, len(wanted), wanted),
            ("unfiltered", {}, count, None),
        ):
            stats, cpu = consume_from(opts, queue, expect, {"x-stream-offset": "first", **args},
                                      start=probe.start, wanted=want)
            runs[name] = {
                **con_dict(stats, cpu),
                "broker_cpu": probe.cpu_pct(),
                "machine": probe.machine_pct(),
                "seconds": stats.seconds,
            }
            errors.extend(f"{name}: {e}" for e in stats.errors)
    admin.close()
    cleanup(opts, queue)
    f, u = runs.get("filtered", {}), runs.get("unfiltered", {})
    tf, tu = f.get("seconds"), u.get("seconds")
    return [
        result(
            opts,
            "g",
            messages=count if tf else 0,
            seconds=tf or 1e-9,
            errors=errors,
            cpu=f.get("broker_cpu"),
            loadgen_cpu=f.get("cpu"),
            machine=f.get("machine"),
            wanted=len(wanted),
            filtered_delivered=f.get("delivered"),
            unfiltered_msgs_per_s=round(count / tu, 1) if tu else None,
            unfiltered_broker_cpu_pct=u.get("broker_cpu"),
            speedup=round(tu / tf, 2) if tu and tf else None,
            fill_msgs_per_s=round(fill.published / fill.seconds),
        )
    ]


# ---- (m) memory: a long stream read by ten consumers at different positions


def scenario_m(opts: Options, probe: BrokerProbe) -> list[dict]:
    """Fill a stream (default 10 million messages), then ten consumers attach at offsets
    0, N/10, 2N/10, ... and each reads N/10 messages, all at once, while the broker's RSS is
    sampled every 0.2 s. Reports the peak RSS (the issue's target: < 150 MB)."""
    count = opts.messages or DEFAULT_MESSAGES["m"]
    n = max(opts.consumers, 1)
    share = count // n
    queue = opts.queue_name("m")
    admin = opts.connect()
    admin.declare_queue(queue, arguments=opts.stream)
    rss_before = probe.rss_kb()
    fill = prefill(opts, queue, count)
    time.sleep(1.0)
    rss_filled = probe.rss_kb()
    peak = [rss_filled or 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], probe.rss_kb() or 0)

    sampler = threading.Thread(target=sample, daemon=True)

    def start() -> None:
        probe.start()
        sampler.start()

    def worker(i: int, ready: workers.Ready) -> dict:
        stats, cpu = consume_from(opts, queue, share, {"x-stream-offset": i * share},
                                  start=ready, first_seq=None)
        return {
            **con_dict(stats, cpu),
            "skew": None if stats.first_seq is None else i * share - stats.first_seq,
        }

    if fill.ok:
        res, _ = workers.run(worker, list(range(n)), start)
    else:
        start()
        res = [{"errors": ["prefill failed: " + "; ".join(fill.errors or ["missing confirms"])]}]
    done.set()
    cpu = probe.cpu_pct()
    machine = probe.machine_pct()
    peak[0] = max(peak[0], probe.rss_kb() or 0)
    admin.close()
    cleanup(opts, queue)
    return [
        result(
            opts,
            "m",
            messages=sum(r.get("received", 0) for r in res),
            seconds=span(res),
            errors=errors_of(res),
            cpu=cpu,
            machine=machine,
            loadgen_cpu=sum(r.get("cpu", 0) for r in res),
            consumers=n,
            stream_messages=count,
            prefill_msgs_per_s=round(fill.published / fill.seconds),
            broker_rss_mb_before=mb(rss_before),
            broker_rss_mb_filled=mb(rss_filled),
            broker_rss_mb_peak=mb(peak[0]),
            # how far offset N was from message N where a consumer attached (RabbitMQ's
            # offsets skip one number per segment; each consumer still reads in order)
            offset_skew_max=max((r.get("skew") or 0 for r in res), default=None),
        )
    ]
