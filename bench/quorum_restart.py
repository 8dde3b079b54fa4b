"""Restart of a quorum queue with many ready messages (issue 28, "Compaction and restart"): how
long one node takes from `leveret serve` to the queue answering a basic.get, with the disk and
memory it spends before and after.

    python bench/quorum_restart.py --messages 1000000,3000000 --restarts 2
    python bench/quorum_restart.py --messages 10000000 --py-spy bench/results/restart-profile

For each --messages size: a fresh `leveret serve` (one node, no etcd; from a copy of this
checkout's sources, as bench/compare.py runs it) in a temp data directory, one quorum queue
filled with that many --body-byte persistent messages by one publisher with confirms (window
--window), nothing consumed. Then, measured: the node's RSS (VmRSS of its process tree: the main
process and its wire workers; the main one alone too) and the data directory's disk use
(`du`-style: allocated blocks) with the node up; the node is stopped (SIGTERM, its exit timed)
and started again --restarts times on the same directory. Each start is timed from the spawn of
`leveret serve` to: the AMQP port accepting, and a basic.get on the queue answering with a
message (then basic.nack with requeue, which RabbitMQ 4.3 and Leveret do not count as a failed
delivery); the get's message_count must be the size minus one. RSS right after the get and
--settle seconds later, and disk use after. The page cache is warm (the files were just written
or read): these are warm restarts, the common case of a restarted process on a running host.

--py-spy DIR records the main process of the last restart of each size with py-spy (raw
collapsed stacks, 250 samples/s) and prints the functions where recovery spends its time.
LEVERET_QUEUE_FSYNC=always unless --leveret-env says otherwise (as the other quorum figures).

It prints a Markdown table and writes every measurement to
bench/results/quorum-restart-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadgen.client import BrokerError, connect
from loadgen.common import QUORUM, Options, prefill
from loadgen.measure import process_tree, rss_kb
from loadgen.report import median
from pamqp import commands
from startup import FSYNC_ALWAYS, LeveretNode, start_run, wait_port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", default="1000000,3000000",
                   help="comma-separated queue sizes (ready messages)")
    p.add_argument("--restarts", type=int, default=2, help="restarts of each filled queue")
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--window", type=int, default=1000, help="the fill's confirm window")
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds after the get before RSS is read again")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a restart may take")
    p.add_argument("--leveret-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for `leveret serve` "
                        "(default LEVERET_QUEUE_FSYNC=always)")
    p.add_argument("--leveret-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `leveret serve`, repeatable")
    p.add_argument("--py-spy", metavar="DIR", help="profile each size's last restart into DIR")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run the installed Leveret instead of a copy of this checkout's sources")
    args = p.parse_args(argv)
    args.sizes = [int(n) for n in args.messages.split(",")]
    return args


# -- one node ----------------------------------------------------------------------------------


class Node(LeveretNode):
    """`leveret serve` on a data directory that outlives its restarts, and its memory."""

    def rss(self) -> dict[str, float]:
        pids = process_tree([self.pid])
        return {"rss_mb": round(sum(rss_kb(p) for p in pids) / 1024, 1),
                "main_rss_mb": round(rss_kb(self.pid) / 1024, 1)}


def disk(folder: Path) -> dict[str, float]:
    """Allocated bytes (as du counts them) and the apparent size, and the file count."""
    used = apparent = files = 0
    for path in folder.rglob("*"):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            files += 1
            used += st.st_blocks * 512
            apparent += st.st_size
    return {"disk_mb": round(used / 1e6, 1), "apparent_mb": round(apparent / 1e6, 1),
            "files": files}


def first_get(node: Node, queue: str, timeout: float) -> dict[str, Any]:
    """From the spawn: when the port accepts, and when a basic.get returns a message."""
    deadline = node.spawned + timeout
    port_s = None
    while time.monotonic() < deadline:
        if node.proc is not None and node.proc.poll() is not None:
            raise RuntimeError(f"leveret serve exited {node.proc.returncode}:\n"
                               f"{node.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", node.port), timeout=1):
                port_s = port_s or time.monotonic() - node.spawned
        except OSError:
            time.sleep(0.02)
            continue
        try:
            conn = connect("127.0.0.1", node.port, timeout=timeout)
            ok = conn.rpc(commands.Basic.Get(queue=queue), "Basic.GetOk", "Basic.GetEmpty")
            got = time.monotonic() - node.spawned
            count = getattr(ok, "message_count", None)
            if ok.name == "Basic.GetOk":
                conn.send_method(commands.Basic.Nack(delivery_tag=ok.delivery_tag,
                                                     requeue=True))
            conn.close()
            return {"port_s": round(port_s, 3), "get_s": round(got, 3),
                    "get_reply": ok.name, "message_count": count}
        except (OSError, BrokerError):
            time.sleep(0.05)
    raise RuntimeError(f"no answer to basic.get in {timeout:.0f} s:\n{node.log_tail()}")


def recovered_log(node: Node) -> dict[str, Any] | None:
    """The node's last "durable queue recovered" line (its messages count)."""
    found = None
    try:
        for line in (node.base / "leveret.log").read_text(errors="replace").splitlines():
            if "durable queue recovered" in line:
                try:
                    found = json.loads(line)
                except ValueError:
                    continue
    except OSError:
        return None
    return None if found is None else {"messages": found.get("messages")}


# -- py-spy ------------------------------------------------------------------------------------


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    if shutil.which("py-spy") is None:
        print("(py-spy not found: pip install py-spy)", file=sys.stderr)
        return None
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "250",
                             "--format", "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_py_spy(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _function(frame: str) -> str:
    """py-spy's "name (path/file.py:line)" as "name [folder/file.py]": lines merged."""
    name, sep, where = frame.strip().partition(" (")
    if not sep:
        return name
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} [{'/'.join(path.split('/')[-2:])}]"


def top_functions(raw: Path, count: int = 12) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: the functions with the most samples on the stack
    (inclusive) and at its top (self), as percent of all samples."""
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        samples = int(n)
        total += samples
        frames = [_function(f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        for frame in set(frames):
            inclusive[frame] += samples
        leaf[frames[-1]] += samples
    total = max(total, 1)
    return {"inclusive": [(f, round(100 * n / total, 1)) for f, n in inclusive.most_common(count)],
            "self": [(f, round(100 * n / total, 1)) for f, n in leaf.most_common(count)],
            "samples": [("all", float(total))]}


# -- the run -----------------------------------------------------------------------------------


def one_size(size: int, args: argparse.Namespace, snapshot: Path | None,
             env: dict[str, str], tmp: Path) -> dict[str, Any]:
    base = tmp / f"n{size}"
    base.mkdir()
    node = Node(base, snapshot, env, args.leveret_arg)
    queue = f"bench.restart.{size}"
    out: dict[str, Any] = {"messages": size, "body": args.body, "ok": False, "restarts": []}
    try:
        node.spawn()
        try:
            wait_port(node.port, 120)
        except TimeoutError:
            raise RuntimeError(f"leveret serve did not start:\n{node.log_tail()}") from None
        conn = connect("127.0.0.1", node.port, timeout=60)
        conn.declare_queue(queue, durable=True, arguments=QUORUM)
        conn.close()
        opts = Options(port=node.port, body=args.body, window=args.window, queue=queue)
        stats = prefill(opts, queue, size)
        if not stats.ok:
            raise RuntimeError(f"the fill failed: {stats.errors[:3]} "
                               f"({stats.confirmed}/{stats.published} confirmed)")
        out["fill_s"] = round(stats.seconds, 1)
        out["fill_msgs_per_s"] = round(size / stats.seconds)
        time.sleep(args.settle)
        out["before"] = {**node.rss(), **disk(node.data)}
        print(f"{size:,} messages: filled in {out['fill_s']} s ({out['fill_msgs_per_s']:,}/s); "
              f"up: {out['before']}", flush=True)
        for restart in range(args.restarts):
            row: dict[str, Any] = {"restart": restart}
            row["stop_s"] = round(node.stop(), 2)
            spy = None
            profile = None
            node.spawn()
            if args.py_spy and restart == args.restarts - 1:
                Path(args.py_spy).mkdir(parents=True, exist_ok=True)
                profile = Path(args.py_spy) / f"restart-{size}.txt"
                spy = start_py_spy(node.pid, profile)
            try:
                row.update(first_get(node, queue, args.timeout))
            finally:
                stop_py_spy(spy)
            row["after_get"] = node.rss()
            row["recovered"] = recovered_log(node)
            time.sleep(args.settle)
            row["after_settle"] = {**node.rss(), **disk(node.data)}
            row["ok"] = row.get("message_count") == size - 1
            if profile is not None and profile.exists():
                row["profile"] = str(profile)
                row["top"] = top_functions(profile)
            out["restarts"].append(row)
            print(f"  restart {restart}: port {row.get('port_s')} s, basic.get {row['get_s']} s "
                  f"(message_count {row.get('message_count')}), stop {row['stop_s']} s; "
                  f"after the get {row['after_get']}, {args.settle:.0f} s later "
                  f"{row['after_settle']}", flush=True)
            if row.get("top"):
                for kind in ("inclusive", "self"):
                    print(f"  py-spy {kind}: " + "; ".join(f"{f} {p}%" for f, p in
                                                          row["top"][kind][:10]), flush=True)
        out["ok"] = bool(out["restarts"]) and all(r["ok"] for r in out["restarts"])
    except (RuntimeError, OSError, BrokerError) as exc:
        out["errors"] = [f"{type(exc).__name__}: {exc}"]
        print(f"{size:,} messages: {out['errors']}", flush=True)
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    return out


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(sizes: list[dict[str, Any]]) -> str:
    lines = ["| ready messages | fill msgs/s | restart to basic.get, s (each restart) | "
             "port open, s | disk MB (up / after) | RSS MB up (main) | RSS MB after get / "
             "after settle (main) | ok |", "|---|---|---|---|---|---|---|---|"]
    for s in sizes:
        rs = s.get("restarts", [])
        gets = [r["get_s"] for r in rs if "get_s" in r]
        ports = [r["port_s"] for r in rs if r.get("port_s") is not None]
        before = s.get("before", {})
        after = rs[-1].get("after_settle", {}) if rs else {}
        after_get = rs[-1].get("after_get", {}) if rs else {}
        each = " / ".join(f"{g:.1f}" for g in gets)
        lines.append(
            f"| {s['messages']:,} | {s.get('fill_msgs_per_s', '-'):,} | "
            f"{_num(median(gets))} ({each}) | {_num(median(ports))} | "
            f"{before.get('disk_mb', '-')} / {after.get('disk_mb', '-')} | "
            f"{before.get('rss_mb', '-')} ({before.get('main_rss_mb', '-')}) | "
            f"{after_get.get('rss_mb', '-')} / {after.get('rss_mb', '-')} "
            f"({after.get('main_rss_mb', '-')}) | {s['ok']} {s.get('errors') or ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = start_run(args, argv, "leveret-quorum-restart-", [FSYNC_ALWAYS])
    sizes: list[dict[str, Any]] = []
    try:
        for size in args.sizes:
            sizes.append(one_size(size, args, run.snapshot, run.env, run.tmp))
    finally:
        text = report(sizes)
        header = run.header(f"one node, one quorum queue of {args.body}-byte messages, "
                            f"{args.restarts} warm restarts each; load average "
                            f"{os.getloadavg()[0]:.1f} at the end")
        print(f"\n{header}\n\n{text}\n")
        out = run.save("quorum-restart", header=header, markdown=text, sizes=sizes)
        print(f"written to {out}")
        shutil.rmtree(run.tmp, ignore_errors=True)
    return 0 if sizes and all(s["ok"] for s in sizes) else 1


if __name__ == "__main__":
    sys.exit(main())
