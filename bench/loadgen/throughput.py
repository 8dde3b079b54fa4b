"""Throughput and latency scenarios: (a) stream publish, (h)/(i) four publishers into one
stream or four, (b)/(c) stream consumers from `first`, (d) publish-to-deliver latency at a
fixed rate, (e) a durable classic queue, (q) a quorum queue published into and consumed from
at once.

Role: declare a fresh queue or stream, set up connections, run the hot paths of publish.py and
consume.py (in several processes where the scenario says so), check correctness (every confirm
came, every message arrived exactly once and in order), measure broker CPU, delete the queue,
and describe the outcome as result dicts, one per JSON line.

It must not know any broker. Threading contract: main thread; it forks workers (workers.py).
"""

from __future__ import annotations

from loadgen import workers
from loadgen.common import (
    DEFAULT_MESSAGES,
    Options,
    cleanup,
    con_dict,
    consume_from,
    errors_of,
    prefill,
    pub_dict,
    result,
    span,
    template_for,
)
from loadgen.consume import consume
from loadgen.measure import BrokerProbe, SelfCpu, weighted_percentiles
from loadgen.publish import publish_confirmed, publish_paced

# ---- (a), (h), (i): publishers with confirms into one stream or one stream each


def scenario_a(opts: Options, probe: BrokerProbe) -> list[dict]:
    return [_publishers(opts, probe, "a", opts.processes, streams=1)]


def scenario_h(opts: Options, probe: BrokerProbe) -> list[dict]:
    """(h) `--publishers` (4) publisher processes with confirms into one stream."""
    return [_publishers(opts, probe, "h", opts.publishers, streams=1)]


def scenario_i(opts: Options, probe: BrokerProbe) -> list[dict]:
    """(i) `--publishers` (4) publisher processes with confirms, each into a stream of its own."""
    return [_publishers(opts, probe, "i", opts.publishers, streams=opts.publishers)]


def _publishers(
    opts: Options, probe: BrokerProbe, scenario: str, publishers: int, streams: int
) -> dict:
    """Publisher p publishes into stream p % streams, for opts.duration seconds."""
    if publishers < 1:
        raise ValueError(f"scenario {scenario} needs at least one publisher, not {publishers}")
    base = opts.queue_name(scenario)
    queues = [base] if streams == 1 else [f"{base}.{k}" for k in range(streams)]
    admin = opts.connect()
    for queue in queues:
        admin.declare_queue(queue, arguments=opts.stream)

    def worker(pid: int, ready: workers.Ready) -> dict:
        conn = opts.connect()
        conn.confirm_select()
        template = template_for(opts, conn, queues[pid % streams], pid)
        ready()
        cpu = SelfCpu()
        cpu.start()
        stats = publish_confirmed(conn, template, duration_s=opts.duration, window=opts.window)
        conn.close()
        return pub_dict(stats, cpu)

    res, _ = workers.run(worker, list(range(publishers)), probe.start)
    cpu = probe.cpu_pct()
    machine = probe.machine_pct()
    admin.close()
    for queue in queues:
        cleanup(opts, queue)
    lat = [v for r in res for v in r.get("lat", [])]
    w = [v for r in res for v in r.get("lat_w", [])]
    p50, p99 = weighted_percentiles(lat, w, (50, 99))
    return result(
        opts,
        scenario,
        messages=sum(r.get("confirmed", 0) for r in res),
        seconds=span(res),
        errors=errors_of(res),
        cpu=cpu,
        machine=machine,
        loadgen_cpu=sum(r.get("cpu", 0) for r in res),
        p50=p50,
        p99=p99,
        latency="publish-to-confirm",
        publishers=publishers,
        streams=streams,
        published=sum(r.get("published", 0) for r in res),
    )


# ---- (b) and (c): consumers of a stream from `first`


def _stream_consumers(opts: Options, probe: BrokerProbe, scenario: str, consumers: int) -> dict:
    count = opts.messages or DEFAULT_MESSAGES[scenario]
    queue = opts.queue_name(scenario)
    admin = opts.connect()
    admin.declare_queue(queue, arguments=opts.stream)
    fill = prefill(opts, queue, count)

    def worker(_: int, ready: workers.Ready) -> dict:
        stats, cpu = consume_from(opts, queue, count, {"x-stream-offset": "first"}, start=ready)
        return con_dict(stats, cpu)

    if fill.ok:
        res, _ = workers.run(worker, list(range(consumers)), probe.start)
    else:
        probe.start()
        res = [{"errors": ["prefill failed: " + "; ".join(fill.errors or ["missing confirms"])]}]
    cpu = probe.cpu_pct()
    machine = probe.machine_pct()
    rss = probe.rss_kb()
    admin.close()
    cleanup(opts, queue)
    return result(
        opts,
        scenario,
        messages=sum(r.get("received", 0) for r in res),
        seconds=span(res),
        errors=errors_of(res),
        cpu=cpu,
        machine=machine,
        loadgen_cpu=sum(r.get("cpu", 0) for r in res),
        consumers=consumers,
        stream_messages=count,
        prefill_msgs_per_s=round(fill.published / fill.seconds),
        broker_rss_mb=round(rss / 1024, 1) if rss else None,
    )


def scenario_b(opts: Options, probe: BrokerProbe) -> list[dict]:
    return [_stream_consumers(opts, probe, "b", 1)]


def scenario_c(opts: Options, probe: BrokerProbe) -> list[dict]:
    return [_stream_consumers(opts, probe, "c", opts.consumers)]


# ---- (d) publish-to-deliver latency at a fixed rate


def scenario_d(opts: Options, probe: BrokerProbe) -> list[dict]:
    queue = opts.queue_name("d")
    count = opts.messages or int(opts.rate * opts.duration)
    admin = opts.connect()
    admin.declare_queue(queue, arguments=opts.stream)
    pub = opts.connect()
    pub.confirm_select()
    template = template_for(opts, pub, queue)

    def consumer(_: int, ready: workers.Ready) -> dict:
        conn = opts.connect()
        conn.qos(opts.prefetch)
        conn.consume(queue, {"x-stream-offset": "first"})
        ready()
        cpu = SelfCpu()
        cpu.start()
        stats = consume(
            conn,
            count,
            ack_every=opts.ack_every,
            body_size=opts.body,
            latency=True,
            idle_timeout=opts.idle_timeout,
        )
        conn.close()
        return con_dict(stats, cpu, latency=True)

    def publisher() -> dict:
        cpu = SelfCpu()
        cpu.start()
        stats = publish_paced(pub, template, rate=opts.rate, count=count, window=opts.window)
        return pub_dict(stats, cpu)

    res, pres = workers.run(consumer, [0], probe.start, parent=publisher)
    cpu = probe.cpu_pct()
    machine = probe.machine_pct()
    pub.close()
    admin.close()
    cleanup(opts, queue)
    c = res[0]
    pres = pres or {"errors": ["publisher did not run"]}
    return [
        result(
            opts,
            "d",
            messages=c.get("received", 0),
            seconds=(pres.get("finished_ns", 0) - pres.get("started_ns", 0)) / 1e9,
            errors=errors_of([c, pres]),
            cpu=cpu,
            machine=machine,
            loadgen_cpu=c.get("cpu", 0) + pres.get("cpu", 0),
            p50=c.get("p50"),
            p99=c.get("p99"),
            p999_ms=c.get("p999"),
            max_ms=c.get("max"),
            latency="publish-to-deliver",
            rate=opts.rate,
        )
    ]


# ---- (e) persistent publish with confirms into a durable classic queue, then consume


def scenario_e(opts: Options, probe: BrokerProbe) -> list[dict]:
    count = opts.messages or DEFAULT_MESSAGES["e"]
    queue = opts.queue_name("e")
    admin = opts.connect()
    admin.declare_queue(queue, durable=True)
    conn = opts.connect()
    conn.confirm_select()
    template = template_for(opts, conn, queue, persistent=True)
    cpu = SelfCpu()
    probe.start()
    cpu.start()
    stats = publish_confirmed(conn, template, count=count, window=opts.window)
    pub = pub_dict(stats, cpu)
    conn.close()
    p50, p99 = weighted_percentiles(pub["lat"], pub["lat_w"], (50, 99))
    out = [
        result(
            opts,
            "e.publish",
            messages=stats.confirmed,
            seconds=stats.seconds,
            errors=pub["errors"],
            cpu=probe.cpu_pct(),
            loadgen_cpu=pub["cpu"],
            machine=probe.machine_pct(),
            p50=p50,
            p99=p99,
            latency="publish-to-confirm",
            persistent=True,
        )
    ]
    if stats.ok:
        cstats, ccpu = consume_from(opts, queue, count, start=probe.start)
        c = con_dict(cstats, ccpu)
        out.append(
            result(
                opts,
                "e.consume",
                messages=cstats.received,
                seconds=cstats.seconds,
                errors=c["errors"],
                cpu=probe.cpu_pct(),
                loadgen_cpu=c["cpu"],
                machine=probe.machine_pct(),
            )
        )
    admin.close()
    cleanup(opts, queue)
    return out


# ---- (q) a quorum queue: one publisher with confirms and one consumer with acks, at once


def scenario_q(opts: Options, probe: BrokerProbe) -> list[dict]:
    """(q) Issue 28's figure: a fresh quorum queue (`x-queue-type: quorum` plus --stream-arg,
    e.g. x-quorum-initial-group-size=3), one publisher with confirms (persistent messages,
    window --window) and one consumer with acks (prefetch --prefetch, a multiple ack every
    --ack-every) on connections of their own, started together. msgs_per_s is messages over
    the whole run (first publish to last delivery); p50/p99 are publish-to-confirm, the
    publish-to-deliver ones are deliver_p50_ms/deliver_p99_ms."""
    count = opts.messages or DEFAULT_MESSAGES["q"]
    queue = opts.queue_name("q")
    admin = opts.connect()
    admin.declare_queue(queue, durable=True, arguments=opts.quorum)
    pub = opts.connect()
    pub.confirm_select()
    template = template_for(opts, pub, queue, persistent=True)

    def consumer(_: int, ready: workers.Ready) -> dict:
        conn = opts.connect()
        conn.qos(opts.prefetch)
        conn.consume(queue)
        ready()
        cpu = SelfCpu()
        cpu.start()
        stats = consume(conn, count, ack_every=opts.ack_every, body_size=opts.body,
                        latency=True, idle_timeout=opts.idle_timeout)
        conn.close()
        return con_dict(stats, cpu, latency=True)

    def publisher() -> dict:
        cpu = SelfCpu()
        cpu.start()
        stats = publish_confirmed(pub, template, count=count, window=opts.window)
        return pub_dict(stats, cpu)

    res, pres = workers.run(consumer, [0], probe.start, parent=publisher)
    cpu = probe.cpu_pct()
    machine = probe.machine_pct()
    rss = probe.rss_kb()
    pub.close()
    admin.close()
    cleanup(opts, queue)
    c = res[0]
    pres = pres or {"errors": ["publisher did not run"]}
    p50, p99 = weighted_percentiles(pres.get("lat", []), pres.get("lat_w", []), (50, 99))
    pub_seconds = max(pres.get("finished_ns", 0) - pres.get("started_ns", 0), 1) / 1e9
    return [
        result(
            opts,
            "q",
            messages=c.get("received", 0),
            seconds=span([c, pres]),
            errors=errors_of([pres, c]),
            cpu=cpu,
            machine=machine,
            loadgen_cpu=c.get("cpu", 0) + pres.get("cpu", 0),
            p50=p50,
            p99=p99,
            latency="publish-to-confirm",
            publish_msgs_per_s=round(pres.get("confirmed", 0) / pub_seconds, 1),
            deliver_p50_ms=c.get("p50"),
            deliver_p99_ms=c.get("p99"),
            queue_arguments=opts.quorum,
            broker_rss_mb=round(rss / 1024, 1) if rss else None,
        )
    ]
