"""Leveret against a reference RabbitMQ: every scenario, interleaved A B A B, medians and ratios.

    python bench/compare.py                  # everything, three rounds (about an hour)
    python bench/compare.py --quick          # a few minutes: short runs, 100-byte bodies
    python bench/compare.py --scenarios a,b --bodies 100 --rounds 3

It starts `leveret serve` (as `python -m leveret.cli serve`, in a temporary directory, never
the repository root) and the reference RabbitMQ the tests use (tests/support/reference.py:
LEVERET_REFERENCE_URL, else Docker, else Debian's rabbitmq-server on free ports). For each
scenario and body size it runs bench/load.py against Leveret, then RabbitMQ, then Leveret
again, and so on for --rounds rounds, each run on a fresh queue or stream. Scenarios (f) and
(m) measure memory, so each of their runs gets freshly started brokers. Scenario (m), ten
consumers over a 10-million-message stream, takes long (filling the stream) and only runs
when asked for: `--scenarios m`. Scenarios (h), (i) and (j) are issue 17's (four publishers
into one stream, into four streams, and 1,000 connections each publishing into and consuming
from its own classic queue); `--leveret-arg=--workers --leveret-arg=2` passes arguments to
`leveret serve` one by one (recorded in the results file and the table's header).
Scenario (q), issue 28's, puts one quorum queue through a publisher with confirms and a
consumer with acks at once; it too runs only when asked for (`--scenarios q`). Durable and
quorum queues confirm after an fsync in Leveret here (LEVERET_QUEUE_FSYNC=always), as both
RabbitMQ's message store and its quorum queues' write-ahead log do.

Leveret runs from a copy of this checkout's sources taken at the start (`--no-snapshot` runs
the installed package instead), so edits made during a long run do not change what is measured.

It prints a Markdown table of medians with the ratio Leveret / RabbitMQ and the issue's target,
and writes every JSON result, the machine and the table to bench/results/<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from load import raise_nofile
from loadgen.client import connect
from loadgen.measure import BrokerProbe, listening_pids
from loadgen.report import machine, median, table
from startup import LeveretNode, snapshot_leveret, stop_on_sigterm, wait_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

FULL = {
    "a": ["--duration", "15"],
    "b": ["--messages", "1000000"],
    "c": ["--messages", "300000"],
    "d": ["--duration", "15"],
    "e": ["--messages", "200000"],
    "f": ["--duration", "20", "--interval", "5"],
    "g": ["--messages", "1000000"],
    "m": ["--messages", "10000000"],
    "h": ["--duration", "15"],
    "i": ["--duration", "15"],
    "j": ["--duration", "15"],
    "q": ["--messages", "300000"],
}
QUICK = {
    "a": ["--duration", "3"],
    "b": ["--messages", "200000"],
    "c": ["--messages", "50000"],
    "d": ["--duration", "3"],
    "e": ["--messages", "20000"],
    "f": ["--duration", "8", "--interval", "4"],
    "g": ["--messages", "200000"],
    "m": ["--messages", "1000000"],
    "h": ["--duration", "3"],
    "i": ["--duration", "3"],
    "j": ["--duration", "5"],
    "q": ["--messages", "50000"],
}
QUICK_SCENARIOS = "a,b,c,d,e,g,h,i"  # not j: opening 1,000 connections twice a round
FULL_SCENARIOS = "a,b,c,d,e,f,g,h,i,j"
# Like for like: RabbitMQ confirms a persistent message in a durable classic queue once its
# message store has fsynced it, so Leveret's durable classic queues fsync before confirming too
# (its default is "never"). Streams need nothing: a single RabbitMQ node does not fsync them
# before confirming either, and Leveret's stream_fsync default is "never".
DEFAULT_LEVERET_ENV = {"LEVERET_QUEUE_FSYNC": "always"}
ONE_BODY = {"f", "m"}  # idle connections; the memory target is stated for 100-byte bodies
FRESH = {"f", "m"}  # memory scenarios: every run gets freshly started brokers


@dataclass
class Target:
    name: str
    port: int = 0
    pids: list[int] = field(default_factory=list)
    version: str = ""
    stop_fn: Any = None

    def stop(self) -> None:
        if self.stop_fn is not None:
            self.stop_fn()
            self.stop_fn = None


def _version(port: int) -> str:
    try:
        conn = connect("127.0.0.1", port)
        props = conn.server_properties
        conn.close()
    except Exception as exc:  # noqa: BLE001 - only for the report
        return f"unknown ({exc})"
    product = props.get("product", b"")
    version = props.get("version", b"")
    return f"{_text(product)} {_text(version)}".strip()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def health_check(port: int) -> None:
    """A channel, a declare and a delete, or RuntimeError: a broker that accepts TCP but does
    not answer would otherwise fail every scenario slowly."""
    name = f"bench.health.{os.getpid()}"
    try:
        conn = connect("127.0.0.1", port, timeout=15)
        conn.declare_queue(name, durable=False)
        conn.delete_queue(name)
        conn.close()
    except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
        raise RuntimeError(f"broker on port {port} failed its health check: {exc!r}") from None


def start_leveret(
    extra_args: list[str], snapshot: Path | None, extra_env: dict[str, str]
) -> Target:
    base = Path(tempfile.mkdtemp(prefix="leveret-bench-"))
    node = LeveretNode(base, snapshot, extra_env, extra_args)
    node.spawn()

    def stop() -> None:
        node.stop(30)
        shutil.rmtree(base, ignore_errors=True)

    try:
        wait_port(node.port, 60)
        health_check(node.port)
    except (TimeoutError, RuntimeError) as exc:
        tail = node.log_tail()
        stop()
        raise RuntimeError(f"leveret serve is not usable: {exc}\n{tail}") from None
    return Target("leveret", node.port, [node.pid], _version(node.port), stop)


def start_rabbitmq() -> Target:
    if str(ROOT / "tests") not in sys.path:
        sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything
    from support.reference import start_reference

    ref = start_reference()
    if isinstance(ref, str):
        raise RuntimeError(ref)
    local = ref.host in ("127.0.0.1", "localhost")
    pids = listening_pids(ref.port) if local else []
    try:
        health_check(ref.port)
    except RuntimeError:
        if ref.stop is not None:
            ref.stop()
        raise
    return Target("rabbitmq", ref.port, pids, _version(ref.port), ref.stop)


def run_load(
    target: Target, scenario: str, body: int, extra: list[str], timeout: float
) -> list[dict]:
    cmd = [
        sys.executable,
        str(HERE / "load.py"),
        "--scenario",
        scenario,
        "--body",
        str(body),
        "--host",
        "127.0.0.1",
        "--port",
        str(target.port),
        "--label",
        target.name,
        "--broker-pid",
        ",".join(map(str, target.pids)),
        *extra,
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [
            {
                "scenario": scenario,
                "broker": target.name,
                "body": body,
                "ok": False,
                "errors": [f"load.py did not finish in {timeout:.0f}s (a hang?)"],
            }
        ]
    results = []
    for line in out.stdout.splitlines():
        try:
            results.append(json.loads(line))
        except ValueError:
            continue
    if not results:
        results.append(
            {
                "scenario": scenario,
                "broker": target.name,
                "body": body,
                "ok": False,
                "errors": [f"load.py exited {out.returncode}: {out.stderr[-800:]}"],
            }
        )
    return results


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a few minutes: short runs, 100 B, scenarios {QUICK_SCENARIOS}",
    )
    p.add_argument(
        "--scenarios",
        help=f"comma-separated, e.g. a,b (default: {FULL_SCENARIOS}; --quick: {QUICK_SCENARIOS}; "
        "m only on request)",
    )
    p.add_argument("--bodies", help="comma-separated body sizes (default 100,1024; --quick 100)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--leveret-args", default="", help="extra `leveret serve` flags, e.g. '--loop uvloop'"
    )
    p.add_argument(
        "--leveret-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for `leveret serve`, repeatable and passed as it is "
        "(e.g. --leveret-arg=--workers --leveret-arg=2); recorded in the results",
    )
    p.add_argument(
        "--leveret-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for `leveret serve`, e.g. LEVERET_QUEUE_FSYNC=never "
        f"(defaults: {' '.join(f'{k}={v}' for k, v in DEFAULT_LEVERET_ENV.items())})",
    )
    p.add_argument("--only", choices=["leveret", "rabbitmq"], help="run against one broker")
    p.add_argument("--timeout", type=float, default=900, help="seconds per load.py run")
    p.add_argument("--load-args", default="", help="extra bench/load.py flags for every run")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run, wait up to S seconds for the machine's other CPU use to drop "
        "under --quiet-below (it is always measured and recorded)",
    )
    p.add_argument("--quiet-below", type=float, default=30.0, help="percent of one core")
    p.add_argument(
        "--no-snapshot",
        action="store_true",
        help="run the installed Leveret as it is, instead of a copy of this checkout's "
        "sources taken at the start",
    )
    return p.parse_args()


def background_cpu(targets: dict[str, Target], wait_s: float, threshold: float) -> float:
    """Percent of one core the machine spends on anything but our idle brokers, over 1 s; with
    wait_s > 0, keep sampling until it is under the threshold or wait_s has passed."""
    probe = BrokerProbe([p for t in targets.values() for p in t.pids])
    deadline = time.monotonic() + wait_s
    while True:
        probe.start()
        time.sleep(1.0)
        busy = round(probe.machine_pct() - (probe.cpu_pct() or 0.0), 1)
        if busy < threshold or time.monotonic() >= deadline:
            return busy


def _restart(targets: dict[str, Target], name: str, starters: dict[str, Any]) -> str | None:
    targets[name].stop()
    try:
        targets[name] = starters[name]()
    except RuntimeError as exc:
        targets[name] = Target(name)
        return str(exc)
    return None


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    raise_nofile()  # inherited by both brokers: scenario (f) opens 1,000 connections
    scenarios = (args.scenarios or (QUICK_SCENARIOS if args.quick else FULL_SCENARIOS)).split(",")
    unknown = [s for s in scenarios if s not in FULL]
    if unknown:
        choices = ",".join(FULL)
        print(f"unknown scenario {','.join(unknown)}: choose from {choices}", file=sys.stderr)
        return 1
    bodies = [int(b) for b in (args.bodies or ("100" if args.quick else "100,1024")).split(",")]
    sizes = QUICK if args.quick else FULL
    names = [args.only] if args.only else ["leveret", "rabbitmq"]
    leveret_env = dict(DEFAULT_LEVERET_ENV)
    leveret_env.update(kv.split("=", 1) for kv in args.leveret_env)  # type: ignore[misc]
    serve_args = args.leveret_args.split() + args.leveret_arg
    workdir = Path(tempfile.mkdtemp(prefix="leveret-bench-src-"))
    snapshot = None if args.no_snapshot else workdir
    info: dict[str, Any] = {
        "machine": machine(ROOT),
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "leveret_source": snapshot_leveret(workdir) if snapshot else "work tree (--no-snapshot)",
        "leveret_env": leveret_env,
        "leveret_args": args.leveret_args,
        "leveret_arg": args.leveret_arg,
        "leveret_serve_args": serve_args,
    }
    starters = {
        "leveret": lambda: start_leveret(serve_args, snapshot, leveret_env),
        "rabbitmq": start_rabbitmq,
    }
    targets: dict[str, Target] = {}
    results: list[dict] = []
    try:
        for name in names:
            targets[name] = starters[name]()
            info[f"{name}_version"] = targets[name].version
            print(
                f"# {name}: {targets[name].version} on port {targets[name].port}, "
                f"pids {targets[name].pids}",
                file=sys.stderr,
                flush=True,
            )
        for scenario in scenarios:
            for body in bodies[:1] if scenario in ONE_BODY else bodies:
                for rnd in range(1, args.rounds + 1):
                    for name in names:
                        failed = None
                        if scenario in FRESH:
                            failed = _restart(targets, name, starters)
                        extra = sizes[scenario] + args.load_args.split()
                        background = background_cpu(targets, args.wait_quiet, args.quiet_below)
                        runs = (
                            [
                                {
                                    "scenario": scenario,
                                    "broker": name,
                                    "body": body,
                                    "ok": False,
                                    "errors": [f"restart failed: {failed}"],
                                }
                            ]
                            if failed
                            else run_load(targets[name], scenario, body, extra, args.timeout)
                        )
                        for r in runs:
                            r["round"] = rnd
                            r["background_cpu_pct_before"] = background
                            r["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                            results.append(r)
                            print(json.dumps(r), flush=True)
    finally:
        for target in targets.values():
            target.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text, rows = table(results, bodies)
    m = info["machine"]
    header = (
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}; {info.get('leveret_version', '')} vs "
        f"{info.get('rabbitmq_version', '')}; medians of {args.rounds} rounds"
        f"{' (--quick)' if args.quick else ''}"
    )
    if serve_args:
        header += f"; leveret serve {' '.join(serve_args)}"
    background = median([r.get("background_cpu_pct_before") for r in results])
    if background is not None:
        header += (
            f"; other processes used a median {background:.0f}% of one core "
            "(of 100% x cores) just before each run"
        )
    print(f"\n{header}\n\n{text}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}.json"
    info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    path.write_text(
        json.dumps(
            {**info, "header": header, "table": rows, "markdown": text, "results": results},
            indent=1,
        )
    )
    print(f"\n(results in {path})", file=sys.stderr)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
