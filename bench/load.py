"""The AMQP 0-9-1 load generator: one scenario per run, any broker, one JSON line per result.

    python bench/load.py --scenario a --body 100 --host 127.0.0.1 --port 5672 \\
        [--processes N] [--duration S] [--messages N] [--broker-pid PID[,PID]]
    python bench/load.py --scenario b --body 1024 --against-discard

Scenarios (issue 8): a stream publish with confirms (window 1,000); b one stream consumer from
`first` (prefetch 2,000, ack every 500); c ten such consumers at once; d publish-to-deliver
latency at a fixed 10,000 msgs/s; e persistent publish with confirms into a durable classic
queue, then consume it; f 1,000 connections publishing slowly; g a filtered stream consumer
that wants 1% of the stream, against an unfiltered one. And m (memory, not in the issue's list
but in its targets): ten consumers at different positions of a 10-million-message stream,
reporting the broker's peak RSS. Issue 17 (both cores) adds: h four publishers with confirms
into one stream; i four publishers with confirms, each into a stream of its own; j 1,000
connections, each publishing with confirms (window 10) into its own classic queue and
consuming from it, multiplexed over four load processes (publish-to-deliver latency, broker
CPU and RSS). Issue 28 adds q: one publisher with confirms and one consumer with acks through
one quorum queue at once (--messages, default 200,000; --stream-arg adds declare arguments,
e.g. x-quorum-initial-group-size=3).

Every line carries msgs_per_s, mb_per_s (bodies, 10^6 bytes), p50_ms/p99_ms where the scenario
measures latency, broker_cpu_pct (percent of one core, summed over --broker-pid and its
descendants), loadgen_cpu_pct (the generator's own processes), and ok: every publish confirmed,
every message received exactly once and in order. It speaks raw AMQP over sockets with
pre-encoded frames and imports nothing from Leveret, so it measures RabbitMQ the same way.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

from loadgen.measure import listening_pids
from loadgen.scenarios import SCENARIOS, Options, run

HERE = Path(__file__).resolve().parent
DISCARD_SCENARIOS = {"a", "b", "c", "e", "f", "h", "i"}


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--body", type=int, default=100, help="body size in bytes (>= 21)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--processes", type=int, default=1, help="publisher processes for (a)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds, for a, d, f, h, i, j")
    p.add_argument(
        "--messages", type=int, help="messages for b, c, e, g, m, q (d: overrides rate x duration)"
    )
    p.add_argument("--window", type=int, default=1000, help="publisher confirm window")
    p.add_argument("--prefetch", type=int, default=2000)
    p.add_argument("--ack-every", type=int, default=500)
    p.add_argument("--consumers", type=int, default=10, help="consumers for (c) and (m)")
    p.add_argument("--rate", type=float, default=10_000, help="msgs/s for (d)")
    p.add_argument("--connections", type=int, default=1000, help="connections for (f) and (j)")
    p.add_argument("--publishers", type=int, default=4, help="publisher processes for (h) and (i)")
    p.add_argument(
        "--conn-window",
        type=int,
        default=10,
        help="messages in flight per connection in (j) (unconfirmed or not yet delivered)",
    )
    p.add_argument(
        "--mux-processes",
        type=int,
        default=4,
        help="load processes that share (j)'s connections, each with one selector loop",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between publishes of one connection in (f)",
    )
    p.add_argument(
        "--broker-pid",
        default="",
        help="pid(s) of the broker, comma-separated, for "
        "CPU%% and RSS (descendants included); 'auto': whoever listens on --port",
    )
    p.add_argument("--label", help="a name for the broker, copied into each JSON line")
    p.add_argument("--queue", help="queue/stream name (default: a fresh bench.* name)")
    p.add_argument("--keep", action="store_true", help="do not delete the queue afterwards")
    p.add_argument(
        "--stream-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra argument for each stream's declare, and for scenario q's quorum "
        "queue's (integers as numbers), repeatable",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="a consumer that receives nothing this long fails the run",
    )
    p.add_argument(
        "--against-discard",
        action="store_true",
        help="start bench/discard.py and measure the generator's own ceiling",
    )
    return p.parse_args(argv)


def options(args: argparse.Namespace) -> Options:
    if args.broker_pid == "auto":
        pids = listening_pids(args.port)
    else:
        pids = [int(p) for p in args.broker_pid.split(",") if p.strip()]
    return Options(
        host=args.host,
        port=args.port,
        body=args.body,
        duration=args.duration,
        messages=args.messages,
        processes=args.processes,
        window=args.window,
        prefetch=args.prefetch,
        ack_every=args.ack_every,
        consumers=args.consumers,
        rate=args.rate,
        connections=args.connections,
        publishers=args.publishers,
        conn_window=args.conn_window,
        mux_processes=args.mux_processes,
        interval=args.interval,
        broker_pids=pids,
        queue=args.queue,
        keep=args.keep,
        label=args.label,
        idle_timeout=args.idle_timeout,
        user=args.user,
        password=args.password,
        vhost=args.vhost,
        stream_args=dict(_stream_arg(item) for item in args.stream_arg),
    )


def _stream_arg(item: str) -> tuple[str, object]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise SystemExit(f"--stream-arg wants KEY=VALUE, not {item!r}")
    return key, int(value) if value.lstrip("-").isdigit() else value


def start_discard() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "discard.py"), "--port", "0", "--print-port"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"discard server did not start: {line!r}")
    return proc, int(line)


def main(argv: list[str] | None = None) -> int:
    raise_nofile()
    args = parse_args(argv)
    opts = options(args)
    discard = None
    if args.against_discard and args.scenario not in DISCARD_SCENARIOS:
        print(
            f"the discard server stores and routes nothing: it serves scenarios "
            f"{', '.join(sorted(DISCARD_SCENARIOS))} only",
            file=sys.stderr,
        )
        return 2
    if args.against_discard:
        discard, opts.port = start_discard()
        opts.host = "127.0.0.1"
        opts.broker_pids = [discard.pid]
        opts.label = opts.label or "discard"
    try:
        results = run(args.scenario, opts)
    finally:
        if discard is not None:
            discard.terminate()
            discard.wait(10)
    for result in results:
        print(json.dumps(result), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
