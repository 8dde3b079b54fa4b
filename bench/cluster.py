"""Forwarding between cluster nodes against going straight to the holding node (issue 14).

    python bench/cluster.py                      # 3 rounds, 100-byte bodies
    python bench/cluster.py --rounds 3 --duration 10 --messages 300000

It starts a real etcd (Debian's etcd-server, as the tests do) and two `leveret serve` nodes,
a and b, in a temporary directory, and measures with bench/load.py (the raw AMQP load
generator, which imports nothing from Leveret), each run on a fresh stream held by node a:

- publish: scenario (a), one publisher with confirms (window 1,000) for --duration seconds,
  straight into a (`local`) and through b (`forwarded`: confirmed once a has confirmed);
- consume: scenario (b), one consumer from `first` (prefetch 2,000, ack every 500) of
  --messages messages, on a (`local`) and on b (`forwarded`).

Every stream is declared on a first, with `x-initial-cluster-size` --members (default 1: the
stream has one member, on a, so everything b does with it is forwarded; 2 puts a replica on b,
whose consumers then read locally and whose publishes are confirmed at the quorum of both), and
b is waited for until it sees it. Local and forwarded
runs alternate, for --rounds rounds; it prints the medians in msgs/s and forwarded / local, the
issue's target being at least 0.70 for both, and writes the runs to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

from loadgen.client import BrokerError, connect  # noqa: E402
from loadgen.common import STREAM  # noqa: E402
from loadgen.report import machine, median  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per publish run")
    p.add_argument("--messages", type=int, default=300_000, help="messages per consume run")
    p.add_argument("--members", type=int, default=1,
                   help="x-initial-cluster-size of each stream (1: held by a alone)")
    return p.parse_args()


def visible(port: int, queue: str) -> bool:
    try:
        conn = connect("127.0.0.1", port)
    except (OSError, BrokerError):
        return False
    try:
        conn.rpc(_passive(queue), "Queue.DeclareOk")
        return True
    except BrokerError:
        return False
    finally:
        try:
            conn.close()
        except (OSError, BrokerError):
            pass


def _passive(queue: str) -> Any:
    from pamqp import commands

    return commands.Queue.Declare(queue=queue, passive=True)


def declare_on_a(a_port: int, b_port: int, queue: str, members: int) -> None:
    conn = connect("127.0.0.1", a_port)
    conn.declare_queue(queue, arguments={**STREAM, "x-initial-cluster-size": members})
    conn.close()
    deadline = time.monotonic() + 30
    while not visible(b_port, queue):
        if time.monotonic() > deadline:
            raise RuntimeError(f"node b never saw {queue}")
        time.sleep(0.1)


def load(port: int, scenario: str, queue: str, args: argparse.Namespace,
         pids: str) -> dict[str, Any]:
    extra = (["--duration", str(args.duration)] if scenario == "a"
             else ["--messages", str(args.messages)])
    cmd = [sys.executable, str(HERE / "load.py"), "--scenario", scenario, "--body",
           str(args.body), "--port", str(port), "--queue", queue, "--keep",
           "--broker-pid", pids, "--stream-arg", f"x-initial-cluster-size={args.members}",
           *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"load.py failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    args = parse_args()
    from support.cluster import make_node
    from support.etcd import EtcdServer

    tmp = Path(tempfile.mkdtemp(prefix="leveret-cluster-bench-"))
    names = {(kind, where, r): f"bench.{kind}.{where}.{r}.{os.getpid()}"
             for kind in ("pub", "con") for where in ("local", "fwd")
             for r in range(args.rounds)}
    etcd = EtcdServer(tmp / "etcd").start()
    cluster = f"bench{os.getpid()}"
    a = make_node(tmp, etcd.url, cluster, "a")
    b = make_node(tmp, etcd.url, cluster, "b")
    runs: list[dict[str, Any]] = []
    try:
        a.start()
        b.start()
        deadline = time.monotonic() + 30
        while "cluster link up" not in b.log():
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not link")
            time.sleep(0.2)
        pids = f"{a.pid},{b.pid}"
        for r in range(args.rounds):
            for kind, scenario in (("pub", "a"), ("con", "b")):
                for where, port in (("local", a.port), ("fwd", b.port)):
                    queue = names[(kind, where, r)]
                    declare_on_a(a.port, b.port, queue, args.members)
                    result = load(port, scenario, queue, args, pids)
                    result.update(kind=kind, where=where, round=r)
                    runs.append(result)
                    print(f"round {r} {kind} {where}: {result.get('msgs_per_s', 0):,.0f} "
                          f"msgs/s ok={result.get('ok')}", flush=True)
    finally:
        b.stop()
        a.stop()
        etcd.stop()
    rows = []
    figures: dict[str, Any] = {}
    for kind, title in (("pub", "publish with confirms into a stream on a"),
                        ("con", "consume a stream on a")):
        local = median([r["msgs_per_s"] for r in runs if r["kind"] == kind
                        and r["where"] == "local"]) or 0.0
        fwd = median([r["msgs_per_s"] for r in runs
                      if r["kind"] == kind and r["where"] == "fwd"]) or 0.0
        ratio = fwd / local if local else 0.0
        figures[kind] = {"local": local, "forwarded": fwd, "ratio": ratio}
        rows.append(f"| {title} | {local:,.0f} | {fwd:,.0f} | {ratio:.2f} | >= 0.70 |")
    print("\n| figure (msgs/s, medians of", args.rounds, f"runs, {args.body} B) | straight to a "
          "| through b | ratio | target |\n|---|---|---|---|---|")
    print("\n".join(rows))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(ROOT), "args": vars(args), "runs": runs,
                               "figures": figures}, indent=1))
    print(f"\nwritten to {out}")
    ok = bool(runs) and all(r.get("ok") for r in runs)
    if ok:  # the nodes' data is gigabytes: keep it only to look at a failure
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the nodes' logs and data are kept in {tmp}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
