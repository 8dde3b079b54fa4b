"""Benchmark of the Spark data source against a single-publisher confirm benchmark.

    python bench/spark_sink.py                 # starts its own `leveret serve`, ~4 minutes
    python bench/spark_sink.py --uri amqp://guest:guest@host:5672/   # an existing broker
    python bench/spark_sink.py --quick         # fewer rows, for a smoke run

Against one broker, in one run, it measures:

- `baseline_scenario_a_msgs_per_s`: bench/'s own single-publisher confirm benchmark,
  `bench/load.py --scenario a --body 100` (one publisher process, pre-encoded frames, the
  same confirm window as the sink), run as a subprocess against the same broker: the figure
  issue 7 measures the sink against;
- `baseline_dedup_msgs_per_s`: the same kind of raw publisher, sending the two
  deduplication headers the sink sends (x-stream-publisher-name, x-stream-publishing-id),
  so the broker does the same work as for the sink: what is left between it and the sink is
  the cost of Spark;
- `sink_rows_per_s`: the `leveret` sink, exactly once, 100-byte values, one Spark partition
  (one publisher), from Spark's rate-micro-batch source: rows over the summed
  triggerExecution time of the measured micro-batches (a warm-up query runs first, and the
  first batch of each query is left out);
- `sink_vs_scenario_a` (the issue's figure: at least 0.8) and `sink_vs_baseline_dedup`: the
  ratios. The baselines and the sink alternate for `--rounds` rounds (the figures are
  medians), since other load on the machine moves every figure. Micro-batches are
  `--rows-per-batch` rows (1,000,000; their fixed cost is measured on its own below);
- `source_rows_per_s`: the `leveret` source reading that stream back in micro-batches
  (trigger availableNow, noop sink);
- `sink_batch_fixed_ms` and `source_batch_fixed_ms`: the median triggerExecution of
  micro-batches of one row: what a micro-batch costs whatever its size.

It prints one JSON line. It never runs as part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands, frame

BODY = b"x" * 100


# -- the broker -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_broker(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "leveret.cli", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--data-dir", str(directory / "data"), "--management-port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "LEVERET_LOG_FORMAT": "json"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"amqp://guest:guest@127.0.0.1:{port}/"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("leveret serve did not start")


# -- the baseline: one publisher on a raw socket --------------------------------------------


class RawPublisher:
    """Just enough AMQP 0.9.1 to publish with confirms and the sink's deduplication headers:
    frames by hand, acks parsed by hand."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._method()  # start
        self._send(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                               response="\0guest\0guest"))
        tune = self._method()
        self._send(commands.Connection.TuneOk(channel_max=tune.channel_max,
                                              frame_max=tune.frame_max, heartbeat=0))
        self._send(commands.Connection.Open(virtual_host="/"))
        self._method()
        self._send(commands.Channel.Open(), 1)
        self._method()
        self._send(commands.Confirm.Select(), 1)
        self._method()
        self.acked = 0

    def _send(self, method: Any, channel: int = 0) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def _method(self) -> Any:
        while True:
            try:
                used, _ch, value = frame.unmarshal(self.buf)
            except Exception:  # noqa: BLE001 - an incomplete frame: read more
                self.buf += self.sock.recv(65536)
                continue
            self.buf = self.buf[used:]
            return value

    def read_acks(self) -> None:
        self.buf += self.sock.recv(1 << 16)
        while len(self.buf) >= 8:
            size = struct.unpack_from(">I", self.buf, 3)[0]
            if len(self.buf) < size + 8:
                break
            payload = self.buf[7 : 7 + size]
            self.buf = self.buf[size + 8 :]
            if payload[:4] == b"\x00\x3c\x00\x50":  # basic.ack
                self.acked = max(self.acked, struct.unpack_from(">Q", payload, 4)[0])
            elif payload[:4] == b"\x00\x3c\x00\x78":
                raise SystemExit("baseline: nacked")

    def run(self, stream: str, count: int, window: int, publisher: str) -> float:
        """Publish `count` messages carrying the sink's two deduplication headers."""
        rk = stream.encode()
        method = b"\x00\x3c\x00\x28\x00\x00\x00" + bytes([len(rk)]) + rk + b"\x00"
        method_frame = struct.pack(">BHI", 1, 1, len(method)) + method + b"\xce"
        body_frame = struct.pack(">BHI", 3, 1, len(BODY)) + BODY + b"\xce"
        raw = publisher.encode()
        name = (b"\x17x-stream-publisher-name" + b"S" + struct.pack(">I", len(raw)) + raw
                + b"\x16x-stream-publishing-id" + b"l")
        started = time.perf_counter()
        sent = 0
        while sent < count:
            parts = []
            for pid in range(sent + 1, min(count, sent + 500) + 1):
                table = name + struct.pack(">q", pid)
                props = b"\x20\x00" + struct.pack(">I", len(table)) + table
                parts += (method_frame,
                          struct.pack(">BHIHHQ", 2, 1, 12 + len(props), 60, 0, len(BODY)),
                          props, b"\xce", body_frame)
            self.sock.sendall(b"".join(parts))
            sent = min(count, sent + 500)
            while sent - self.acked > window:
                self.read_acks()
        while self.acked < count:
            self.read_acks()
        return count / (time.perf_counter() - started)


def scenario_a(uri: str, window: int, seconds: float) -> float:
    """bench/load.py's scenario a against this broker: msgs/s of one confirm publisher."""
    from leveret.spark.endpoint import Endpoint

    ep = Endpoint.parse(uri)
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("load.py")), "--scenario", "a",
         "--body", str(len(BODY)), "--host", ep.host, "--port", str(ep.port),
         "--window", str(window), "--duration", str(seconds)],
        capture_output=True, text=True, check=False)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines or not lines[-1].get("ok"):
        raise SystemExit(f"scenario a failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    return float(lines[-1]["msgs_per_s"])


def baseline(uri: str, stream: str, count: int, window: int, publisher: str) -> float:
    from leveret.spark.endpoint import Endpoint

    ep = Endpoint.parse(uri)
    pub = RawPublisher(ep.host, ep.port)
    try:
        return pub.run(stream, count, window, publisher)
    finally:
        pub.sock.close()


# -- Spark ----------------------------------------------------------------------------------


def measured(progress: list[dict[str, Any]], skip: int = 1) -> list[dict[str, Any]]:
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    return batches[skip:]


def run_sink(spark: Any, uri: str, stream: str, rows_per_batch: int, batches: int,
             checkpoint: Path, window: int) -> list[dict[str, Any]]:
    """`batches` + 1 micro-batches of `rows_per_batch` 100-byte rows into `stream`."""
    source = (spark.readStream.format("rate-micro-batch")
              .option("rowsPerBatch", rows_per_batch).option("numPartitions", 1).load())
    rows = source.selectExpr("lpad(cast(value as string), 100, 'x') as value")
    query = (rows.writeStream.format("leveret").option("uri", uri).option("stream", stream)
             .option("max_unconfirmed", window)
             .option("checkpointLocation", str(checkpoint)).start())
    while len(measured(query.recentProgress, 0)) < batches + 1:
        if query.exception() is not None:
            raise SystemExit(f"sink query failed: {query.exception()}")
        time.sleep(0.05)
    query.stop()
    return measured(query.recentProgress)[:batches]


def run_source(spark: Any, uri: str, stream: str, per_trigger: int,
               checkpoint: Path) -> list[dict[str, Any]]:
    query = (spark.readStream.format("leveret").option("uri", uri).option("stream", stream)
             .option("startingOffsets", "first").option("maxMessagesPerTrigger", per_trigger)
             .load().writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return measured(query.recentProgress, 0)


def rate(batches: list[dict[str, Any]]) -> float:
    rows = sum(p["numInputRows"] for p in batches)
    ms = sum(p["durationMs"]["triggerExecution"] for p in batches)
    return rows / (ms / 1000) if ms else 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uri", help="an existing broker (default: start leveret serve)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3,
                        help="baseline and sink alternate this many times; medians reported")
    parser.add_argument("--window", type=int, default=10_000,
                        help="unconfirmed publishes in flight, for the baseline and the sink "
                             "(its max_unconfirmed)")
    parser.add_argument("--rows-per-batch", type=int, default=1_000_000,
                        help="rows per measured micro-batch (the fixed cost of a micro-batch "
                             "is measured on its own)")
    args = parser.parse_args()
    rows_per_batch = 50_000 if args.quick else args.rows_per_batch
    batches = 2
    rounds = 1 if args.quick else args.rounds
    baseline_count = rows_per_batch * batches
    workdir = Path(tempfile.mkdtemp(prefix="leveret-spark-bench-"))
    broker = None
    uri = args.uri
    if uri is None:
        broker, uri = start_broker(workdir)
    try:
        from leveret.spark import local_session
        from leveret.spark.admin import declare_stream

        spark = local_session("leveret-bench", master="local[2]",
                              conf={"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        declare_stream(uri, "bench-warmup")  # the JVM compiles the hot paths: not measured
        run_sink(spark, uri, "bench-warmup", rows_per_batch, 1, workdir / "warmup", args.window)
        plain, dedup, sink_rates, sink_rows = [], [], [], 0
        for n in range(rounds):
            for name in ("dedup", "sink"):
                declare_stream(uri, f"bench-{name}-{n}")
            plain.append(scenario_a(uri, args.window, 3 if args.quick else 8))
            dedup.append(baseline(uri, f"bench-dedup-{n}", baseline_count, args.window,
                                  f"bench-publisher-{n}"))
            sink = run_sink(spark, uri, f"bench-sink-{n}", rows_per_batch, batches,
                            workdir / f"sink-{n}", args.window)
            sink_rates.append(rate(sink))
            sink_rows += sum(p["numInputRows"] for p in sink)
        source = run_source(spark, uri, "bench-sink-0", rows_per_batch, workdir / "source")
        declare_stream(uri, "bench-tiny")
        tiny_sink = run_sink(spark, uri, "bench-tiny", 1, 10, workdir / "tiny-sink",
                             args.window)
        tiny_source = run_source(spark, uri, "bench-tiny", 1, workdir / "tiny-source")
        spark.stop()
        sink_rate = statistics.median(sink_rates)
        plain_rate, dedup_rate = statistics.median(plain), statistics.median(dedup)
        result = {
            "bench": "spark_sink",
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "body_bytes": len(BODY),
            "window": args.window,
            "rounds": rounds,
            "rows_per_batch": rows_per_batch,
            "baseline_scenario_a_msgs_per_s": round(plain_rate),
            "baseline_dedup_msgs_per_s": round(dedup_rate),
            "sink_rows_per_s": round(sink_rate),
            "sink_vs_scenario_a": round(sink_rate / plain_rate, 3),
            "sink_vs_baseline_dedup": round(sink_rate / dedup_rate, 3),
            "sink_rows": sink_rows,
            "all_rounds": {"scenario_a": [round(r) for r in plain],
                           "dedup": [round(r) for r in dedup],
                           "sink": [round(r) for r in sink_rates]},
            "source_rows_per_s": round(rate(source)),
            "source_rows": sum(p["numInputRows"] for p in source),
            "sink_batch_fixed_ms": statistics.median(
                p["durationMs"]["triggerExecution"] for p in tiny_sink),
            "source_batch_fixed_ms": statistics.median(
                p["durationMs"]["triggerExecution"] for p in tiny_source[1:] or tiny_source),
        }
        print(json.dumps(result))
    finally:
        if broker is not None:
            broker.kill()
            broker.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
