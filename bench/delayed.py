"""Delayed exchanges (issue 30) on one node: publish rate with confirms, memory while holding
many messages, and the routing rate when a million fall due at once.

    python bench/delayed.py                          # 200k per rate, 1M held, 1M due at once
    python bench/delayed.py --held 10000000          # 10M held (about ten minutes)
    python bench/delayed.py --rate-count 50000 --held 200000 --due 200000   # a quick look

One `leveret serve` (this checkout, --workers 0 unless --workers says otherwise) in a fresh
data dir, LEVERET_QUEUE_FSYNC as --fsync (default: the broker's). Body --body-size bytes,
persistent, one raw-socket publisher (bench/loadgen) with a --window confirm window.

1. direct: --rate-count messages through a direct exchange into a durable queue (the
   baseline: a persistent message written to a log once, as a held message is);
2. delayed: --rate-count messages with x-delay one day into a delayed exchange (direct type);
3. held: more of those until --held are held; RSS (VmRSS of the broker's process tree) at
   0, 1M (or --held if less) and --held, and the exchange's messages_delayed from the API;
   then a restart after kill -9 (the index is rebuilt from the log) and after SIGTERM (the
   bucket files are trusted), each timed until AMQP answers and the count is back;
4. due: --due messages published into a second delayed exchange so that all fall due at one
   instant T (x-delay = T - now, per burst of 1,000), bound to a durable queue; measured from
   T until the queue holds them all: the routing rate, and RSS at its peak.

RabbitMQ 3.10.8's Debian package has no delayed-message plugin, so there is no comparison
with RabbitMQ here. Prints a Markdown table; writes bench/results/delayed-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

from loadgen import wire  # noqa: E402
from loadgen.client import Connection, connect  # noqa: E402
from loadgen.publish import publish_confirmed  # noqa: E402
from pamqp import commands  # noqa: E402
from support.brokers import BrokerProcess  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.procstat import peak_rss_mb, rss_mb  # noqa: E402

DAY_MS = 86_400_000


def template(exchange: str, key: str, body_size: int, delay: int | None) -> wire.PublishTemplate:
    """One persistent message's frames, with an x-delay header when `delay` is given."""
    body = wire.BODY.pack(0, 0, 0, wire.KIND_OTHER) + b"x" * (body_size - wire.BODY_PREFIX)
    props = commands.Basic.Properties(
        delivery_mode=2, headers={"x-delay": delay} if delay is not None else None)
    head = wire.publish_method(1, exchange, key) + wire.content_header(1, body_size, props)
    return wire.PublishTemplate(head + wire.frame(wire.FRAME_BODY, 1, body), len(head) + 11,
                                body_size)


def publish(conn: Connection, tpl: wire.PublishTemplate, count: int, window: int) -> float:
    """Publish `count` with confirms; messages per second."""
    stats = publish_confirmed(conn, tpl, count=count, window=window, confirm_timeout=300)
    if not stats.ok:
        raise RuntimeError(f"publish failed: {stats.errors} nacked={stats.nacked}")
    return count / stats.seconds


def declare(conn: Connection, method: Any, reply: str) -> None:
    conn.rpc(method, reply)


def queue_count(conn: Connection, name: str) -> int:
    ok = conn.rpc(commands.Queue.Declare(queue=name, durable=True, passive=True),
                  "Queue.DeclareOk")
    return int(ok.message_count)


def api(port: int, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def held(mport: int, exchange: str) -> int:
    return int(api(mport, f"/api/exchanges/%2F/{exchange}")["messages_delayed"])


def wait_api(mport: int, exchange: str, timeout: float = 600) -> float:
    started = time.monotonic()
    while True:
        try:
            held(mport, exchange)
            return time.monotonic() - started
        except OSError:
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.1)


class PeakRss:
    """Samples the broker's RSS every 50 ms in a thread; `peak` in MiB."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except OSError:
                pass
            time.sleep(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-count", type=int, default=200_000)
    parser.add_argument("--held", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=1_000_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000)
    parser.add_argument("--fsync", default=None)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="leveret-delayed-bench-"))
    mport = free_port()
    env = {"LEVERET_QUEUE_FSYNC": args.fsync} if args.fsync else {}
    broker = BrokerProcess(tmp / "data", env=env,
                           args=["--management-port", str(mport),
                                 "--workers", str(args.workers)]).start()
    figures: dict[str, Any] = {"body_size": args.body_size, "window": args.window,
                               "fsync": args.fsync or "default", "workers": args.workers}
    try:
        conn = connect("127.0.0.1", broker.port)
        conn.confirm_select()
        declare(conn, commands.Exchange.Declare(exchange="direct-x", exchange_type="direct",
                                                durable=True), "Exchange.DeclareOk")
        conn.declare_queue("direct-q")
        declare(conn, commands.Queue.Bind(queue="direct-q", exchange="direct-x",
                                          routing_key="k"), "Queue.BindOk")
        for name in ("held-x", "due-x"):
            declare(conn, commands.Exchange.Declare(
                exchange=name, exchange_type="x-delayed-message", durable=True,
                arguments={"x-delayed-type": "direct"}), "Exchange.DeclareOk")
        conn.declare_queue("due-q")
        declare(conn, commands.Queue.Bind(queue="due-q", exchange="due-x", routing_key="k"),
                "Queue.BindOk")
        figures["rss_mb_start"] = round(rss_mb(broker.pid), 1)

        # 1 and 2: publish rates
        figures["direct_publish_per_s"] = round(publish(
            conn, template("direct-x", "k", args.body_size, None), args.rate_count,
            args.window))
        declare(conn, commands.Queue.Purge(queue="direct-q"), "Queue.PurgeOk")
        figures["delayed_publish_per_s"] = round(publish(
            conn, template("held-x", "k", args.body_size, DAY_MS), args.rate_count,
            args.window))
        print(f"publish: direct {figures['direct_publish_per_s']}/s, "
              f"delayed {figures['delayed_publish_per_s']}/s", flush=True)

        # 3: held messages and memory
        done = args.rate_count
        steps = sorted({min(1_000_000, args.held), args.held})
        tpl = template("held-x", "k", args.body_size, DAY_MS)
        started = time.monotonic()
        for step in steps:
            if step > done:
                publish(conn, tpl, step - done, args.window)
                done = step
            time.sleep(1)
            figures[f"rss_mb_held_{step}"] = round(rss_mb(broker.pid), 1)
            figures[f"api_held_{step}"] = held(mport, "held-x")
            print(f"held {step}: RSS {figures[f'rss_mb_held_{step}']} MiB, "
                  f"API says {figures[f'api_held_{step}']}", flush=True)
        figures["held_publish_per_s"] = round((done - args.rate_count)
                                              / (time.monotonic() - started))
        conn.close()
        for how in ("kill", "term"):
            if how == "kill":
                broker.kill()
            else:
                broker.stop(timeout=600)
            begun = time.monotonic()
            broker.start(timeout=600)
            wait_api(mport, "held-x")
            figures[f"restart_s_after_{how}"] = round(time.monotonic() - begun, 2)
            figures[f"held_after_{how}"] = held(mport, "held-x")
            figures[f"rss_mb_after_{how}"] = round(rss_mb(broker.pid), 1)
            print(f"restart after {how}: {figures[f'restart_s_after_{how}']} s, "
                  f"held {figures[f'held_after_{how}']}, "
                  f"RSS {figures[f'rss_mb_after_{how}']} MiB", flush=True)

        # 4: a million due at once
        conn = connect("127.0.0.1", broker.port)
        conn.confirm_select()
        lead_ms = 10_000 + args.due // 10  # publishing must end before T (10k/s at least)
        due_at = int(time.time() * 1000) + lead_ms
        sent = 0
        while sent < args.due:
            n = min(1000, args.due - sent)
            delay = due_at - int(time.time() * 1000)
            if delay <= 0:
                raise RuntimeError("publishing did not end before the due time: raise lead")
            publish(conn, template("due-x", "k", args.body_size, delay), n, args.window)
            sent += n
        print(f"due: {sent} published, {(due_at - time.time() * 1000) / 1000:.1f}s before T",
              flush=True)
        sampler = PeakRss(broker.pid)
        time.sleep(max(0.0, due_at / 1000 - time.time()))
        t0 = time.monotonic()
        probe = connect("127.0.0.1", broker.port)
        while (count := queue_count(probe, "due-q")) < args.due:
            if time.monotonic() - t0 > 1200:
                raise RuntimeError(f"only {count} routed after 20 min")
            time.sleep(0.05)
        took = time.monotonic() - t0
        figures["due_count"] = args.due
        figures["due_routed_s"] = round(took, 2)
        figures["due_routing_per_s"] = round(args.due / took)
        figures["rss_mb_peak_while_routing"] = round(sampler.stop(), 1)
        figures["rss_mb_peak_whole_run"] = round(peak_rss_mb(broker.pid), 1)
        print(f"due: {args.due} routed in {took:.2f}s = {figures['due_routing_per_s']}/s, "
              f"peak RSS {figures['rss_mb_peak_while_routing']} MiB", flush=True)
        probe.close()
        conn.close()
    finally:
        broker.kill()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    save_figures("delayed", figures)


def save_figures(name: str, figures: dict[str, Any]) -> None:
    """bench/results/<name>-<timestamp>.json, and the figures as a table."""
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(figures, indent=2))
    print("\n| figure | value |\n|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {value} |")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
