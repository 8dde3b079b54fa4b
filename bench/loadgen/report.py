"""The comparison's report: the machine it ran on, and the Markdown table of medians.

Role: describe the machine (CPU, cores, RAM, kernel, Python, commit) and turn every run's
result lines into one row per scenario, body size and metric: the median of the ok runs for
Leveret and for RabbitMQ, their ratio, the issue's target and how many runs were ok.

It must not know AMQP or start anything. Threading contract: none (pure functions).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path

# (result scenario, metric key, label, better, target ratio text). Issue 17: 2.0x RabbitMQ in
# every throughput scenario (issue 8's were 1.0x); the latency p99 no worse than RabbitMQ's.
METRICS = [
    ("a", "msgs_per_s", "msgs/s", "higher", ">= 2.0x"),
    ("a", "p99_ms", "confirm p99 ms", "lower", ""),
    ("b", "msgs_per_s", "msgs/s", "higher", ">= 2.0x"),
    ("c", "msgs_per_s", "msgs/s (10 consumers)", "higher", ">= 2.0x"),
    ("d", "p50_ms", "deliver p50 ms", "lower", ""),
    ("d", "p99_ms", "deliver p99 ms", "lower", "<= 1.0x"),
    ("e.publish", "msgs_per_s", "persistent publish msgs/s", "higher", ">= 2.0x"),
    ("e.consume", "msgs_per_s", "consume msgs/s", "higher", ">= 2.0x"),
    ("f", "kb_per_connection", "KB per connection", "lower", "Leveret < 50 KB"),
    ("f", "broker_cpu_pct", "broker CPU %", "lower", ""),
    ("g", "msgs_per_s", "filtered: stream msgs/s", "higher", ""),
    ("g", "unfiltered_msgs_per_s", "unfiltered msgs/s", "higher", ">= 2.0x"),
    ("g", "speedup", "filtered / unfiltered speed", "higher", "Leveret >= 5x"),
    ("m", "broker_rss_mb_peak", "peak broker RSS MB", "lower", "Leveret < 150 MB"),
    ("m", "msgs_per_s", "msgs/s (10 consumers)", "higher", ""),
    ("h", "msgs_per_s", "msgs/s (4 publishers, 1 stream)", "higher", ">= 2.0x"),
    ("h", "p99_ms", "confirm p99 ms", "lower", ""),
    ("h", "broker_cpu_pct", "broker CPU %", "lower", ""),
    ("i", "msgs_per_s", "msgs/s (4 publishers, 4 streams)", "higher", ">= 2.0x"),
    ("i", "p99_ms", "confirm p99 ms", "lower", ""),
    ("i", "broker_cpu_pct", "broker CPU %", "lower", ""),
    ("j", "msgs_per_s", "delivered msgs/s (1,000 connections)", "higher", ">= 2.0x"),
    ("j", "p50_ms", "deliver p50 ms", "lower", ""),
    ("j", "p99_ms", "deliver p99 ms", "lower", ""),
    ("j", "broker_cpu_pct", "broker CPU %", "lower", ""),
    ("j", "broker_rss_mb", "broker RSS MB", "lower", ""),
    # issue 28: a quorum queue, one publisher with confirms and one consumer with acks at once
    ("q", "msgs_per_s", "quorum queue, publish + consume msgs/s", "higher", ">= 2.0x"),
    ("q", "p50_ms", "confirm p50 ms", "lower", ""),
    ("q", "p99_ms", "confirm p99 ms", "lower", "<= 1.0x"),
    ("q", "broker_cpu_pct", "broker CPU %", "lower", ""),
]


def machine(root: Path) -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError):
        mem_kb = 0
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        rev = ""
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "leveret_commit": rev,
        "load_average_at_start": os.getloadavg(),
    }


def median(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, int | float)]
    return statistics.median(values) if values else None


def table(results: list[dict], bodies: list[int]) -> tuple[str, list[dict]]:
    rows = []
    lines = [
        "| scenario | body | metric | Leveret | RabbitMQ | Leveret / RabbitMQ | target | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario, key, label, _better, target in METRICS:
        for body in bodies:
            mine = [r for r in results if r.get("scenario") == scenario and r.get("body") == body]
            if not mine:
                continue
            per = {}
            oks = {}
            for broker in ("leveret", "rabbitmq"):
                runs = [r for r in mine if r.get("broker") == broker]
                per[broker] = median([r.get(key) for r in runs if r.get("ok")])
                oks[broker] = f"{sum(1 for r in runs if r.get('ok'))}/{len(runs)}"
            lv, rb = per["leveret"], per["rabbitmq"]
            ratio = round(lv / rb, 2) if lv is not None and rb else None
            rows.append(
                {
                    "scenario": scenario,
                    "body": body,
                    "metric": key,
                    "leveret": lv,
                    "rabbitmq": rb,
                    "ratio": ratio,
                    "target": target,
                    "ok": oks,
                }
            )
            lines.append(
                f"| {scenario} | {body} | {label} | {_fmt(lv)} | {_fmt(rb)} | "
                f"{'' if ratio is None else f'{ratio:.2f}x'} | {target} | "
                f"L {oks['leveret']}, R {oks['rabbitmq']} |"
            )
    return "\n".join(lines), rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
