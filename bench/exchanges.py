"""Exchange routing rates (issue 30): direct, x-consistent-hash, x-modulus-hash and topic, each
routing into N queues, Leveret against RabbitMQ 3.10.8, interleaved A B A B.

    python bench/exchanges.py                           # 200,000 messages, 3 rounds
    python bench/exchanges.py --messages 5000 --rounds 1 --only leveret

Per exchange kind and round, on each broker in turn: a fresh exchange and N non-durable classic
queues bound to it; one publisher (bench/loadgen's raw client) sends --messages transient
messages with confirms (window --window), cycling over pre-encoded frames for K routing keys
(a burst is a slice of them, so the generator does no per-message work); then each queue's
message count is read with a passive declare, and the exchange and queues are deleted. It
speaks AMQP only and must not know either broker's internals.

    direct            queue j bound with "jjjj.000000"; the publisher cycles over those N keys
    x-consistent-hash queue j bound with weight "1"; keys "jjjj.iiiiii" for i < K, j = i % N
    x-modulus-hash    queue j bound with "1" (one key for all: 3.10's sharding plugin and 4.3
                      then order the slots alike); the same K keys
    topic             queue j bound with "jjjj.*"; the same K keys

Every routing key has the same length, so every kind sends the same bytes per message. A run
is ok when every publish is confirmed, none nacked, and the queues hold exactly what was
published: direct and topic queue j exactly its share, the hash kinds every queue some.

Figures per run: msgs/s (first publish to last confirm), broker CPU (percent of one core, its
process tree from /proc) and broker CPU-microseconds per message. The Markdown table has the
medians of the ok runs, each kind's rate against direct's on the same broker, Leveret /
RabbitMQ, and whether every ok run of the kind, on both brokers, split the messages over the
queues the same way (it should: the hash kinds route a key to the same queue on both).
Leveret runs as bench/compare.py runs it (`leveret serve` from a copy of this checkout's
sources); RabbitMQ is the tests' reference node with its
rabbitmq_consistent_hash_exchange and rabbitmq_sharding plugins
(tests/support/reference.py: start_consistent_hash_reference). JSON goes to
bench/results/exchanges-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare import (
    DEFAULT_LEVERET_ENV,
    Target,
    background_cpu,
    snapshot_leveret,
    start_leveret,
    start_rabbitmq,
)
from loadgen import wire
from loadgen.client import BrokerError, connect
from loadgen.measure import BrokerProbe
from loadgen.publish import publish_confirmed
from loadgen.report import machine, median
from pamqp import commands
from startup import stop_on_sigterm

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MAX_BURST = 1000


@dataclass(frozen=True)
class Kind:
    name: str
    type: str
    all_keys: bool  # publish over K keys (else over the N bound keys)
    exact: bool  # each queue gets exactly its share (else: some)

    def binding(self, j: int) -> str:
        if self.type == "direct":
            return f"{j:04d}.000000"
        if self.type == "topic":
            return f"{j:04d}.*"
        return "1"

    def keys(self, queues: int, count: int) -> list[str]:
        if not self.all_keys:
            return [self.binding(j) for j in range(queues)]
        return [f"{i % queues:04d}.{i:06d}" for i in range(count)]


KINDS = {
    "direct": Kind("direct", "direct", False, True),
    "consistent-hash": Kind("consistent-hash", "x-consistent-hash", True, False),
    "modulus-hash": Kind("modulus-hash", "x-modulus-hash", True, False),
    "topic": Kind("topic", "topic", True, True),
}


class KeyCycle:
    """publish_confirmed's template: message n carries keys[n % len(keys)]. Every message has
    the same size, so a burst is one slice of the ring repeated enough to hold any burst."""

    def __init__(self, keys: list[str], body: int, exchange: str) -> None:
        frames = [wire.publish_template(1, k, body, exchange=exchange).data for k in keys]
        self.size = len(frames[0])
        if any(len(f) != self.size for f in frames):
            raise ValueError("routing keys of different lengths")
        self.count = len(keys)
        ring = b"".join(frames)
        self.data = memoryview(ring * -(-(self.count - 1 + MAX_BURST) // self.count))

    def burst(self, first_seq: int, count: int, ts_ns: int) -> memoryview:
        start = first_seq % self.count * self.size
        return self.data[start : start + count * self.size]


def expected(kind: Kind, queues: int, keys: int, messages: int) -> list[int] | None:
    """Each queue's exact count for the kinds that route by key to one queue, else None."""
    if not kind.exact:
        return None
    cycle = queues if not kind.all_keys else keys
    counts = [0] * queues
    full, rest = divmod(messages, cycle)
    for i in range(cycle):
        counts[i % queues] += full + (1 if i < rest else 0)
    return counts


def check(kind: Kind, counts: list[int], published: int, want: list[int] | None) -> list[str]:
    """What is wrong with the queues' counts after `published` confirmed messages."""
    errors = []
    if sum(counts) != published:
        errors.append(f"the queues hold {sum(counts)} messages, {published} were published")
    if want is not None and counts != want:
        errors.append(f"counts {counts}, expected {want}")
    if want is None and 0 in counts:
        errors.append(f"queues {[j for j, c in enumerate(counts) if c == 0]} got nothing")
    return errors


def run_kind(
    port: int, pids: list[int], kind: Kind, args: argparse.Namespace, label: str = "bench"
) -> dict[str, Any]:
    """One run of one kind on one broker: declare, publish, count, delete."""
    result: dict[str, Any] = {"kind": kind.name, "type": kind.type, "ok": False, "errors": []}
    exchange = f"xbench.{label}.{kind.name}"
    queues = [f"xbench.{label}.{kind.name}.{j:04d}" for j in range(args.queues)]
    conn = connect("127.0.0.1", port, timeout=60)
    try:
        conn.rpc(commands.Exchange.Declare(exchange=exchange, exchange_type=kind.type),
                 "Exchange.DeclareOk")
        for j, queue in enumerate(queues):
            conn.declare_queue(queue, durable=False)
            conn.rpc(commands.Queue.Bind(queue=queue, exchange=exchange,
                                         routing_key=kind.binding(j)), "Queue.BindOk")
        cycle = KeyCycle(kind.keys(args.queues, args.keys), args.body, exchange)
        conn.confirm_select()
        probe = BrokerProbe(pids)
        probe.start()
        t0 = time.monotonic()
        stats = publish_confirmed(conn, cycle, count=args.messages, window=args.window,
                                  max_burst=MAX_BURST)
        cpu = probe.cpu_pct()
        sent = max(stats.published, 1)  # none when the first send failed (an error, below)
        cpu_s = None if cpu is None else cpu / 100 * (time.monotonic() - t0)
        counts = [conn.rpc(commands.Queue.Declare(queue=q, passive=True),
                           "Queue.DeclareOk").message_count for q in queues]
        result.update(
            messages=stats.published, confirmed=stats.confirmed, nacked=stats.nacked,
            msgs_per_s=round(stats.published / stats.seconds),
            broker_cpu_pct=cpu,
            cpu_us_per_msg=None if cpu_s is None else round(cpu_s * 1e6 / sent, 2),
            machine_cpu_pct=probe.machine_pct(), keys=cycle.count, counts=counts,
        )
        result["errors"] = stats.errors + check(
            kind, counts, stats.confirmed, expected(kind, args.queues, args.keys, args.messages))
        result["ok"] = stats.ok and not result["errors"]
        for queue in queues:
            conn.delete_queue(queue)
        conn.rpc(commands.Exchange.Delete(exchange=exchange), "Exchange.DeleteOk")
    except (OSError, BrokerError) as exc:
        result["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return result


def report(results: list[dict[str, Any]], kinds: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Medians of the ok runs per kind and broker, as a Markdown table and as rows."""
    rows = []
    for name in kinds:
        row: dict[str, Any] = {"kind": name}
        for broker in ("leveret", "rabbitmq"):
            runs = [r for r in results if r["kind"] == name and r["broker"] == broker]
            oks = [r for r in runs if r["ok"]]
            row[broker] = {key: median([r.get(key) for r in oks])
                           for key in ("msgs_per_s", "broker_cpu_pct", "cpu_us_per_msg")}
            row[broker]["ok"] = f"{len(oks)}/{len(runs)}"
        splits = {tuple(r["counts"]) for r in results if r["kind"] == name and r["ok"]}
        row["one_split"] = len(splits) == 1  # every ok run, both brokers: the same counts
        rows.append(row)
    direct = {b: rows[kinds.index("direct")][b]["msgs_per_s"] if "direct" in kinds else None
              for b in ("leveret", "rabbitmq")}
    lines = [
        "| exchange | Leveret msgs/s | vs direct | RabbitMQ msgs/s | vs direct | "
        "Leveret / RabbitMQ | broker CPU %, L / R | CPU us/msg, L / R | ok, L / R | one split |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lv, rb = row["leveret"], row["rabbitmq"]
        row["ratio"] = _ratio(lv["msgs_per_s"], rb["msgs_per_s"])
        lines.append(
            f"| {row['kind']} | {_num(lv['msgs_per_s'])} | "
            f"{_x(_ratio(lv['msgs_per_s'], direct['leveret']))} | {_num(rb['msgs_per_s'])} | "
            f"{_x(_ratio(rb['msgs_per_s'], direct['rabbitmq']))} | {_x(row['ratio'])} | "
            f"{_num(lv['broker_cpu_pct'])} / {_num(rb['broker_cpu_pct'])} | "
            f"{_num(lv['cpu_us_per_msg'], 2)} / {_num(rb['cpu_us_per_msg'], 2)} | "
            f"{lv['ok']} / {rb['ok']} | {'yes' if row['one_split'] else 'no'} |"
        )
    return "\n".join(lines), rows


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated of {','.join(KINDS)}")
    p.add_argument("--messages", type=int, default=200_000, help="per run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queues", type=int, default=10, help="N, at most 9,999")
    p.add_argument("--keys", type=int, default=1000, help="K routing keys, at most 1,000,000")
    p.add_argument("--body", type=int, default=100, help="bytes per message")
    p.add_argument("--window", type=int, default=1000, help="unconfirmed messages at most")
    p.add_argument("--only", choices=["leveret", "rabbitmq"], help="run against one broker")
    p.add_argument("--leveret-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `leveret serve`, repeatable")
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/exchanges-*)")
    args = p.parse_args(argv)
    unknown = [k for k in args.kinds.split(",") if k not in KINDS]
    if unknown:
        p.error(f"unknown kind {','.join(unknown)}: choose from {','.join(KINDS)}")
    if not (1 <= args.queues <= 9999 and 1 <= args.keys <= 1_000_000 and args.messages >= 1):
        p.error("--queues must be 1-9,999, --keys 1-1,000,000 and --messages at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)  # main's finally stops both brokers
    kinds = args.kinds.split(",")
    names = [args.only] if args.only else ["leveret", "rabbitmq"]
    workdir = Path(tempfile.mkdtemp(prefix="leveret-bench-src-"))
    info: dict[str, Any] = {"machine": machine(HERE.parent), "argv": sys.argv[1:] if argv is None
                            else argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "leveret_source": snapshot_leveret(workdir),
                            "leveret_serve_args": args.leveret_arg}
    starters = {
        "leveret": lambda: start_leveret(args.leveret_arg, workdir, DEFAULT_LEVERET_ENV),
        "rabbitmq": lambda: start_rabbitmq("start_consistent_hash_reference"),
    }
    targets: dict[str, Target] = {}
    results: list[dict[str, Any]] = []
    try:
        for name in names:
            targets[name] = starters[name]()
            info[f"{name}_version"] = targets[name].version
            print(f"# {name}: {targets[name].version} on port {targets[name].port}",
                  file=sys.stderr, flush=True)
        for kind in kinds:
            for rnd in range(1, args.rounds + 1):
                for name in names:
                    background = background_cpu(targets, 0.0, 30.0)
                    r = run_kind(targets[name].port, targets[name].pids, KINDS[kind], args,
                                 f"r{rnd}")
                    r.update(broker=name, round=rnd, background_cpu_pct_before=background)
                    results.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "counts"}), flush=True)
    finally:
        for target in targets.values():
            target.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text, rows = report(results, kinds)
    m = info["machine"]
    header = (f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, Python {m['python']}; "
              f"{info.get('leveret_version', '')} vs {info.get('rabbitmq_version', '')}; "
              f"{args.messages:,} messages of {args.body} B per run, {args.queues} queues, "
              f"{args.keys:,} keys, window {args.window}; medians of {args.rounds} rounds")
    print(f"\n{header}\n\n{text}")
    path = args.out or RESULTS / f"exchanges-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.write_text(json.dumps({**info, "header": header, "table": rows, "markdown": text,
                                "results": results}, indent=1))
    print(f"\n(results in {path})", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
