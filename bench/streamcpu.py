"""The stream protocol's broker CPU per message: steadier than msgs/s on a shared machine.

    python bench/streamcpu.py --messages 2000000 --passes 5

It starts `leveret serve` from this checkout (a temporary data directory, free ports), fills
one stream with --messages 100-byte messages through bench/streamclient.py's publisher (one
publisher with confirms, batches of 100: the publish figure), then has one subscriber (or
--subscribers at once) read the stream from `first` to the end --passes times, one pass
after another. For the fill and for each pass it reads the broker process's CPU time before
and after (/proc/PID/task/*/schedstat, to the nanosecond; utime and stime from /proc/PID/stat
for the split) and prints the broker's CPU microseconds per message, and their median, as
JSON. Every chunk's CRC is checked and every message must arrive once and in order, as in
bench/streamproto.py.

Linux only (/proc). It must not know how the broker delivers; it only starts and measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from startup import free_port
from streamclient import StreamConnection, consume, publish

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """utime and stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads, in seconds, to the nanosecond (/proc/PID/task/*/
    schedstat; utime + stime only count 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _connect(port: int) -> StreamConnection:
    deadline = time.monotonic() + 60
    while True:
        try:
            return StreamConnection("127.0.0.1", port, timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _read(conn: StreamConnection, i: int, results: list, args: argparse.Namespace) -> None:
    """One subscriber's pass: from `first` to the end."""
    conn.subscribe(1, "cpu", args.credit)
    results[i] = consume(conn, 1, args.messages, initial_credit=args.credit)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--credit", type=int, default=10)
    p.add_argument("--subscribers", type=int, default=1,
                   help="subscribers reading at once in each pass (threads)")
    p.add_argument("--attach", metavar="CMD",
                   help="a command run during the passes (stopped with SIGINT), {pid} the "
                        "broker's: e.g. 'py-spy record --pid {pid} --format raw -o out.txt'")
    p.add_argument("--leveret-args", default="", help="extra `leveret serve` flags")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="leveret-streamcpu-"))
    port = free_port()
    log = open(base / "leveret.log", "wb")  # noqa: SIM115 - kept open for the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "leveret.cli", "serve", "--host", "127.0.0.1", "--port",
         str(free_port()), "--data-dir", str(base / "data"), "--management-port", "0",
         "--stream-port", str(port), *args.leveret_args.split()],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "LEVERET_LOG_FORMAT": "json"})
    log.close()
    out: dict = {"messages": args.messages, "body": args.body}
    try:
        conn = _connect(port)
        conn.create("cpu")
        conn.declare_publisher(1, "cpu")
        before = cpu_seconds(proc.pid)
        stats = publish(conn, 1, body_size=args.body, batch=100, window=10_000,
                        count=args.messages)
        used = cpu_seconds(proc.pid) - before
        conn.close()
        if not stats.ok:
            raise SystemExit("publish failed: " + "; ".join(stats.errors))
        out["publish_us_per_msg"] = round(used * 1e6 / args.messages, 4)
        passes = []
        spy = None
        if args.attach:
            spy = subprocess.Popen(args.attach.format(pid=proc.pid).split())
            time.sleep(1)
        for _ in range(args.passes):
            conns = [_connect(port) for _ in range(args.subscribers)]
            results: list = [None] * len(conns)

            threads = [threading.Thread(target=_read, args=(conn, i, results, args))
                       for i, conn in enumerate(conns)]
            before_u, before_s = cpu_times(proc.pid)
            before = cpu_seconds(proc.pid)
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            after_u, after_s = cpu_times(proc.pid)
            used = cpu_seconds(proc.pid) - before
            seconds = time.monotonic() - started
            for conn in conns:
                conn.close()
            errors = [e for got in results for e in (got.errors if got else ["no result"])]
            if errors:
                raise SystemExit("consume failed: " + "; ".join(errors))
            delivered = args.messages * len(conns)
            got = results[0]
            passes.append({"us_per_msg": round(used * 1e6 / delivered, 4),
                           "user_us_per_msg": round((after_u - before_u) * 1e6 / delivered, 4),
                           "sys_us_per_msg": round((after_s - before_s) * 1e6 / delivered, 4),
                           "msgs_per_s": round(delivered / seconds),
                           "msgs_per_chunk": round(got.received / got.chunks, 1)})
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        out["consume"] = passes
        out["consume_median_us_per_msg"] = statistics.median(r["us_per_msg"] for r in passes)
        print(json.dumps(out))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
