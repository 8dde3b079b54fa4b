"""The stream protocol: Leveret against RabbitMQ's stream plugin, raw frames, medians of N runs.

    python bench/streamproto.py --quick              # a few minutes, small counts, 1 run
    python bench/streamproto.py --runs 3             # the figures (about 10 minutes)
    python bench/streamproto.py --scenarios a,b --only leveret

It starts `leveret serve` (from a copy of this checkout's sources, in a temporary directory,
as bench/compare.py does, with `--stream-port` on a free port) and Debian's RabbitMQ 3.10.8
with `rabbitmq_stream` enabled on free ports (tests/support/reference.py's
start_stream_reference, as the stream differential tests use it). Scenarios (issue 16), each
run on a fresh stream created over the stream protocol, the brokers interleaved (Leveret,
RabbitMQ, Leveret, ...) for --runs runs:

  a  one publisher with confirms: Publish frames of 100 messages (no sub-entry batching),
     at most --window messages unconfirmed, 100-byte bodies, for --duration seconds:
     msgs/s and publish-to-confirm latency p50/p99;
  b  one subscriber from `first` of a stream filled with --messages messages: msgs/s;
  c  ten subscribers at once from `first` (ten processes): aggregate msgs/s;
  d  Leveret only: the same stream read by one stream-protocol subscriber and by one AMQP
     0.9.1 consumer (basic.consume with x-stream-offset first, prefetch 1,000, multiple acks
     every 250: bench/loadgen's consumer), in alternating order.

Subscribers start with --credit credits (10, as rstream and the Java client) and give one back
per chunk handled; every chunk's CRC is checked and every message must arrive once and in
order. The client is bench/streamclient.py (Leveret's own frame codec: it imports
leveret.broker.streamproto, unlike bench/load.py). It prints one JSON line per run, then a
Markdown table of medians with Leveret / RabbitMQ, and writes everything to
bench/results/streamproto-<timestamp>[-quick].json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare import _version, background_cpu, start_leveret
from load import raise_nofile
from loadgen import workers
from loadgen.common import Options, consume_from, result
from loadgen.measure import BrokerProbe, SelfCpu, listening_pids, weighted_percentiles
from loadgen.report import machine, median
from startup import snapshot_leveret, stop_on_sigterm
from streamclient import ConsumeStats, StreamConnection, consume, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

FULL = {"duration": 15.0, "b": 3_000_000, "c": 1_000_000, "d": 3_000_000}
QUICK = {"duration": 3.0, "b": 1_000_000, "c": 200_000, "d": 1_000_000}
BATCH = 100


@dataclass
class Target:
    name: str
    stream_port: int = 0
    amqp_port: int = 0
    pids: list[int] = field(default_factory=list)
    version: str = ""
    stop_fn: Callable[[], None] | None = None

    def stop(self) -> None:
        if self.stop_fn is not None:
            self.stop_fn()
            self.stop_fn = None


def _wait_stream(port: int, timeout: float) -> None:
    """Until a stream connection opens (a listening port is not enough for RabbitMQ)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            StreamConnection("127.0.0.1", port, timeout=10).close()
            return
        except Exception:  # not ready yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def start_leveret_target(snapshot: Path | None, extra: list[str]) -> Target:
    from support.ports import free_port

    port = free_port()
    lev = start_leveret(["--stream-port", str(port), *extra], snapshot, {})
    _wait_stream(port, 60)
    return Target("leveret", port, lev.port, lev.pids, lev.version, lev.stop)


def start_rabbitmq_target() -> Target:
    from support.reference import start_stream_reference

    ref = start_stream_reference()
    if isinstance(ref, str):
        raise RuntimeError(ref)
    try:
        _wait_stream(ref.stream_port, 90)
    except Exception:
        if ref.stop is not None:
            ref.stop()
        raise
    return Target("rabbitmq", ref.stream_port, ref.port, listening_pids(ref.port),
                  _version(ref.port), ref.stop)


# -- scenarios ----------------------------------------------------------------------------------


def _opts(target: Target, args: argparse.Namespace) -> Options:
    """bench/loadgen's Options, for its result line and its AMQP 0.9.1 consumer."""
    return Options(port=target.amqp_port, body=args.body, label=target.name,
                   prefetch=args.prefetch091, ack_every=args.ack_every091,
                   idle_timeout=args.idle_timeout)


def _connect(target: Target, args: argparse.Namespace) -> StreamConnection:
    return StreamConnection("127.0.0.1", target.stream_port, timeout=max(args.idle_timeout, 30))


def _fresh_stream(target: Target, args: argparse.Namespace, scenario: str) -> str:
    name = f"bench.sp.{scenario}.{secrets.token_hex(4)}"
    conn = _connect(target, args)
    conn.create(name)
    conn.close()
    return name


def _drop_stream(target: Target, args: argparse.Namespace, name: str) -> None:
    try:
        conn = _connect(target, args)
        conn.delete(name)
        conn.close()
    except Exception:  # noqa: BLE001 - best effort: a broken broker is reported elsewhere
        pass


def _publish(target: Target, args: argparse.Namespace, stream: str, *,
             count: int | None = None, duration: float | None = None) -> Any:
    conn = _connect(target, args)
    conn.declare_publisher(1, stream)
    stats = publish(conn, 1, body_size=args.body, batch=BATCH, window=args.window,
                    count=count, duration_s=duration, idle_timeout=args.idle_timeout)
    conn.close()
    return stats


def scenario_a(target: Target, args: argparse.Namespace, sizes: dict) -> list[dict]:
    stream = _fresh_stream(target, args, "a")
    probe = BrokerProbe(target.pids)
    cpu = SelfCpu()
    probe.start()
    cpu.start()
    stats = _publish(target, args, stream, duration=sizes["duration"])
    p50, p99 = weighted_percentiles(stats.latency_ns, stats.latency_weight, (50, 99))
    out = result(_opts(target, args), "a", messages=stats.confirmed, seconds=stats.seconds,
                 errors=stats.errors, cpu=probe.cpu_pct(), machine=probe.machine_pct(),
                 loadgen_cpu=cpu.pct(), p50=p50, p99=p99, latency="publish-to-confirm",
                 batch=BATCH, window=args.window, published=stats.published)
    _drop_stream(target, args, stream)
    return [out]


def _filled(target: Target, args: argparse.Namespace, scenario: str, count: int) -> str:
    stream = _fresh_stream(target, args, scenario)
    fill = _publish(target, args, stream, count=count)
    if not fill.ok:
        _drop_stream(target, args, stream)
        raise RuntimeError("filling the stream failed: " + "; ".join(fill.errors))
    return stream


def _subscriber(target: Target, args: argparse.Namespace, stream: str, count: int,
                ready: Callable[[], None]) -> dict:
    conn = _connect(target, args)
    ready()
    cpu = SelfCpu()
    cpu.start()
    stats = ConsumeStats(started_ns=time.monotonic_ns())
    conn.subscribe(1, stream, args.credit)
    consume(conn, 1, count, initial_credit=args.credit, check_crc=not args.no_crc,
            idle_timeout=args.idle_timeout, stats=stats)
    conn.close()
    return {"received": stats.received, "chunks": stats.chunks, "started_ns": stats.started_ns,
            "finished_ns": stats.finished_ns, "errors": stats.errors, "cpu": cpu.pct()}


def _subscribers(target: Target, args: argparse.Namespace, scenario: str, count: int,
                 consumers: int) -> dict:
    stream = _filled(target, args, scenario, count)
    probe = BrokerProbe(target.pids)
    res, _ = workers.run(lambda _i, ready: _subscriber(target, args, stream, count, ready),
                         list(range(consumers)), probe.start)
    cpu, mach = probe.cpu_pct(), probe.machine_pct()
    _drop_stream(target, args, stream)
    starts = [r["started_ns"] for r in res if r.get("started_ns")]
    ends = [r["finished_ns"] for r in res if r.get("finished_ns")]
    seconds = (max(ends) - min(starts)) / 1e9 if starts and ends else 1e-9
    chunks = sum(r.get("chunks", 0) for r in res)
    received = sum(r.get("received", 0) for r in res)
    return result(_opts(target, args), scenario, messages=received, seconds=seconds,
                  errors=[e for r in res for e in r.get("errors", [])], cpu=cpu, machine=mach,
                  loadgen_cpu=sum(r.get("cpu", 0) for r in res), consumers=consumers,
                  stream_messages=count, credit=args.credit,
                  msgs_per_chunk=round(received / chunks, 1) if chunks else None)


def scenario_b(target: Target, args: argparse.Namespace, sizes: dict) -> list[dict]:
    return [_subscribers(target, args, "b", sizes["b"], 1)]


def scenario_c(target: Target, args: argparse.Namespace, sizes: dict) -> list[dict]:
    return [_subscribers(target, args, "c", sizes["c"], args.consumers)]


def scenario_d(target: Target, args: argparse.Namespace, sizes: dict,
               run: int = 0) -> list[dict]:
    """One stream, read over the stream protocol and over AMQP 0.9.1 (Leveret only)."""
    count = sizes["d"]
    stream = _filled(target, args, "d", count)
    opts = _opts(target, args)
    out: dict[str, dict] = {}
    order = ("stream", "amqp091") if run % 2 == 0 else ("amqp091", "stream")
    for how in order:
        probe = BrokerProbe(target.pids)
        if how == "stream":
            r = _subscriber(target, args, stream, count, probe.start)
            seconds = (r["finished_ns"] - r["started_ns"]) / 1e9
            messages, errors, lcpu = r["received"], r["errors"], r["cpu"]
        else:
            stats, scpu = consume_from(opts, stream, count, {"x-stream-offset": "first"},
                                       start=probe.start)
            seconds, messages, errors, lcpu = (stats.seconds, stats.received, stats.errors,
                                               scpu.pct())
        out[how] = result(opts, f"d.{how}", messages=messages, seconds=seconds, errors=errors,
                          cpu=probe.cpu_pct(), machine=probe.machine_pct(), loadgen_cpu=lcpu,
                          stream_messages=count, order=list(order),
                          **({"credit": args.credit} if how == "stream" else
                             {"prefetch": args.prefetch091, "ack_every": args.ack_every091}))
    _drop_stream(target, args, stream)
    return [out["stream"], out["amqp091"]]


SCENARIOS: dict[str, Callable[..., list[dict]]] = {
    "a": scenario_a, "b": scenario_b, "c": scenario_c, "d": scenario_d,
}
LEVERET_ONLY = {"d"}


def run_one(name: str, target: Target, args: argparse.Namespace, sizes: dict,
            run: int) -> list[dict]:
    try:
        if name == "d":
            return scenario_d(target, args, sizes, run)
        return SCENARIOS[name](target, args, sizes)
    except Exception as exc:  # noqa: BLE001 - one failed run is one ok:false line
        return [{"scenario": name, "broker": target.name, "body": args.body, "ok": False,
                 "errors": [f"{type(exc).__name__}: {exc}"],
                 "traceback": traceback.format_exc().splitlines()[-6:]}]


def cpu_per_message(r: dict) -> float | None:
    """The broker's CPU time per message in microseconds: steadier than msgs/s when other
    processes share the cores."""
    cpu, seconds, messages = r.get("broker_cpu_pct"), r.get("seconds"), r.get("messages")
    if not cpu or not seconds or not messages:
        return None
    return round(cpu / 100 * seconds * 1e6 / messages, 3)


# -- report -------------------------------------------------------------------------------------

# (scenario, metric, label, target)
ROWS = [
    ("a", "msgs_per_s", "publish with confirms, batches of 100: msgs/s", ">= 1.0x"),
    ("a", "p50_ms", "publish-to-confirm p50 ms", ""),
    ("a", "p99_ms", "publish-to-confirm p99 ms", ""),
    ("a", "broker_cpu_us_per_msg", "publish: broker CPU us/msg", ""),
    ("b", "msgs_per_s", "one subscriber from first: msgs/s", ">= 1.0x"),
    ("b", "broker_cpu_us_per_msg", "one subscriber: broker CPU us/msg", ""),
    ("c", "msgs_per_s", "ten subscribers from first: aggregate msgs/s", ">= 1.0x"),
    ("c", "broker_cpu_us_per_msg", "ten subscribers: broker CPU us/msg", ""),
]


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _med(results: list[dict], scenario: str, broker: str, key: str) -> tuple[Any, str]:
    runs = [r for r in results if r.get("scenario") == scenario and r.get("broker") == broker]
    oks = sum(1 for r in runs if r.get("ok"))
    return median([r.get(key) for r in runs if r.get("ok")]), f"{oks}/{len(runs)}"


def table(results: list[dict]) -> tuple[str, list[dict]]:
    lines = ["| figure (100 B) | Leveret | RabbitMQ 3.10.8 | Leveret / RabbitMQ | target | ok |",
             "|---|---|---|---|---|---|"]
    rows = []
    for scenario, key, label, target in ROWS:
        lv, lok = _med(results, scenario, "leveret", key)
        rb, rok = _med(results, scenario, "rabbitmq", key)
        if lv is None and rb is None and lok == "0/0" and rok == "0/0":
            continue
        ratio = round(lv / rb, 2) if lv is not None and rb else None
        rows.append({"scenario": scenario, "metric": key, "leveret": lv, "rabbitmq": rb,
                     "ratio": ratio, "target": target, "ok": {"leveret": lok, "rabbitmq": rok}})
        lines.append(f"| {label} | {_fmt(lv)} | {_fmt(rb)} | "
                     f"{'' if ratio is None else f'{ratio:.2f}x'} | {target} | "
                     f"L {lok}, R {rok} |")
    st, sok = _med(results, "d.stream", "leveret", "msgs_per_s")
    am, aok = _med(results, "d.amqp091", "leveret", "msgs_per_s")
    if sok != "0/0" or aok != "0/0":
        ratio = round(st / am, 2) if st is not None and am else None
        rows.append({"scenario": "d", "metric": "msgs_per_s", "stream": st, "amqp091": am,
                     "ratio": ratio, "ok": {"stream": sok, "amqp091": aok}})
        lines += ["", "| Leveret, one stream read from first (100 B) | stream protocol | "
                  "AMQP 0.9.1 | stream / 0.9.1 | ok |", "|---|---|---|---|---|",
                  f"| one consumer: msgs/s | {_fmt(st)} | {_fmt(am)} | "
                  f"{'' if ratio is None else f'{ratio:.2f}x'} | S {sok}, A {aok} |"]
        sc, _ = _med(results, "d.stream", "leveret", "broker_cpu_us_per_msg")
        ac, _ = _med(results, "d.amqp091", "leveret", "broker_cpu_us_per_msg")
        lines.append(f"| broker CPU us/msg | {_fmt(sc)} | {_fmt(ac)} | | |")
    return "\n".join(lines), rows


# -- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts, 1 run unless --runs")
    p.add_argument("--runs", type=int, help="runs per scenario and broker (default 3; "
                   "--quick 1); the table shows medians")
    p.add_argument("--scenarios", default="a,b,c,d", help="comma-separated (default a,b,c,d)")
    p.add_argument("--only", choices=["leveret", "rabbitmq"], help="run against one broker")
    p.add_argument("--body", type=int, default=100, help="body bytes (>= 21)")
    p.add_argument("--duration", type=float, help="seconds of publishing in (a)")
    p.add_argument("--messages", type=int, help="messages in the stream for (b) and (d)")
    p.add_argument("--messages-c", type=int, help="messages in the stream for (c)")
    p.add_argument("--window", type=int, default=10_000,
                   help="unconfirmed messages at most (default 10,000, as stream-perf-test)")
    p.add_argument("--credit", type=int, default=10, help="a subscriber's initial credit")
    p.add_argument("--consumers", type=int, default=10, help="subscribers in (c)")
    p.add_argument("--prefetch091", type=int, default=1000, help="(d)'s AMQP 0.9.1 prefetch")
    p.add_argument("--ack-every091", type=int, default=250, help="(d)'s multiple-ack interval")
    p.add_argument("--no-crc", action="store_true", help="do not check chunk CRCs")
    p.add_argument("--idle-timeout", type=float, default=30.0)
    p.add_argument("--leveret-args", default="", help="extra `leveret serve` flags")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run the installed Leveret, not a copy of this checkout's sources")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="before each run, wait up to S seconds for the machine to be quiet")
    p.add_argument("--quiet-below", type=float, default=30.0, help="percent of one core")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    raise_nofile()
    runs = args.runs or (1 if args.quick else 3)
    sizes = dict(QUICK if args.quick else FULL)
    if args.duration:
        sizes["duration"] = args.duration
    if args.messages:
        sizes["b"] = sizes["d"] = args.messages
    if args.messages_c:
        sizes["c"] = args.messages_c
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)} (a, b, c, d)", file=sys.stderr)
        return 2
    names = [args.only] if args.only else ["leveret", "rabbitmq"]
    workdir = Path(tempfile.mkdtemp(prefix="leveret-bench-src-"))
    snapshot = None if args.no_snapshot else workdir
    info: dict[str, Any] = {
        "machine": machine(ROOT), "argv": sys.argv[1:], "runs": runs, "sizes": sizes,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "leveret_source": snapshot_leveret(workdir) if snapshot else "work tree (--no-snapshot)",
        "leveret_args": args.leveret_args, "window": args.window, "credit": args.credit,
        "batch": BATCH, "body": args.body,
    }
    starters = {"leveret": lambda: start_leveret_target(snapshot, args.leveret_args.split()),
                "rabbitmq": start_rabbitmq_target}
    targets: dict[str, Target] = {}
    results: list[dict] = []
    try:
        for name in names:
            try:
                targets[name] = starters[name]()
            except Exception as exc:  # noqa: BLE001 - any failure to start: one clear line
                hint = " (--only leveret runs without it)" if name == "rabbitmq" else ""
                print(f"cannot start {name}: {exc}{hint}", file=sys.stderr)
                return 1
            info[f"{name}_version"] = targets[name].version
            print(f"# {name}: {targets[name].version}, stream port {targets[name].stream_port}, "
                  f"pids {targets[name].pids}", file=sys.stderr, flush=True)
        for run in range(runs):
            for scenario in scenarios:
                for name in names:
                    if scenario in LEVERET_ONLY and name != "leveret":
                        continue
                    background = background_cpu(targets, args.wait_quiet, args.quiet_below)
                    for r in run_one(scenario, targets[name], args, sizes, run):
                        r["broker_cpu_us_per_msg"] = cpu_per_message(r)
                        r["run"] = run + 1
                        r["background_cpu_pct_before"] = background
                        r["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                        results.append(r)
                        print(json.dumps(r), flush=True)
    finally:
        for target in targets.values():
            target.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text, rows = table(results)
    m = info["machine"]
    header = (f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}; "
              f"{info.get('leveret_version', '')} vs {info.get('rabbitmq_version', '')}; "
              f"medians of {runs} run(s){' (--quick)' if args.quick else ''}; "
              f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"\n{header}\n\n{text}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (f"streamproto-{time.strftime('%Y%m%d-%H%M%S')}"
                      f"{'-quick' if args.quick else ''}.json")
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.write_text(json.dumps({**info, "header": header, "table": rows, "markdown": text,
                                "results": results}, indent=1))
    print(f"\n(results in {path})", file=sys.stderr)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
