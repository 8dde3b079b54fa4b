"""Benchmark of stream replication's core (leveret.broker.cluster.replication), three processes.

    python bench/replication.py                  # 5 s, chunks of 1,000 records of 100 bytes
    python bench/replication.py --seconds 10 --records 100 --replicas 1

Two replica processes (nodes "r1", "r2") each open a log and answer the leader over a real
node-to-node link on loopback; this process (node "l") appends chunks to its log as fast as the
commit point lets it (at most --window records ahead of it), with a `Shipper` sending them to
the replicas, and measures:

- `committed_records_per_s`: records that a majority of the three logs hold, per second (the
  rate at which a replicated stream could confirm publishes, without AMQP around it);
- `commit_latency_ms` p50/p99: from a chunk's append to the commit point covering it;
- `replica_bytes_per_s`: chunk bytes each replica appended, per second.

It prints one JSON line. It never runs as part of the test suite. Logs go to a temporary
directory (fsync "never"; the figure is the protocol's, not the disk's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from leveret.broker.cluster.link import Handlers, Link, LinkConfig, LinkServer, connect
from leveret.broker.cluster.replication import Replicas, Shipper
from leveret.storage import Log, LogConfig

SECRET = b"bench-secret"
STREAM = "bench"


def _config(node: str) -> LinkConfig:
    return LinkConfig(cluster="bench", node=node, secret=SECRET)


async def _replica(node: str, directory: str, port_out: Any) -> None:
    handlers = Handlers()
    replicas = Replicas(handlers)
    log = Log.open(Path(directory), LogConfig())
    replicas.add(STREAM, log)
    server = LinkServer(_config(node), handlers, host="127.0.0.1", port=0)
    await server.start()
    port_out.send(server.port)
    await asyncio.Event().wait()


def _replica_process(node: str, directory: str, port_out: Any) -> None:
    asyncio.run(_replica(node, directory, port_out))


async def _lead(ports: dict[str, int], directory: str, args: argparse.Namespace) -> dict[str, Any]:
    handlers = Handlers()
    replicas = Replicas(handlers)
    links: dict[str, Link] = {}
    for node, port in ports.items():
        links[node] = await connect("127.0.0.1", port, _config("l"), handlers)
    log = Log.open(Path(directory), LogConfig())
    appended_at: dict[int, float] = {}  # last offset of a chunk -> when it was appended
    latencies: list[float] = []
    moved = asyncio.Event()

    def on_commit(offset: int) -> None:
        now = time.perf_counter()
        for last in [o for o in appended_at if o <= offset]:
            latencies.append((now - appended_at.pop(last)) * 1000)
        moved.set()

    shipper = Shipper(STREAM, log, 1, list(ports), links.get, on_commit)
    replicas.shippers[STREAM] = shipper
    shipper.start()
    records = [os.urandom(args.body) for _ in range(args.records)]
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        if log.next_offset - (shipper.committed + 1) >= args.window:
            moved.clear()
            await moved.wait()
            continue
        log.append(records)
        appended_at[log.next_offset - 1] = time.perf_counter()
        shipper.appended()
        await asyncio.sleep(0)
    end = log.next_offset - 1
    while shipper.committed < end:
        moved.clear()
        await moved.wait()
    elapsed = time.perf_counter() - started
    await shipper.close()
    for link in links.values():
        await link.close()
    chunk_bytes = sum(f.stat().st_size for f in Path(directory).glob("*.segment"))
    latencies.sort()
    return {
        "committed_records_per_s": round((shipper.committed + 1) / elapsed),
        "commit_latency_ms": {"p50": round(statistics.median(latencies), 2),
                              "p99": round(latencies[int(len(latencies) * 0.99)], 2)},
        "replica_bytes_per_s": round(chunk_bytes / elapsed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--records", type=int, default=1000, help="records per chunk")
    parser.add_argument("--body", type=int, default=100, help="bytes per record")
    parser.add_argument("--window", type=int, default=20_000,
                        help="records appended ahead of the commit point, at most")
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="leveret-replication-") as tmp:
        processes, ports = [], {}
        try:
            for i in range(1, args.replicas + 1):
                port_in, port_out = ctx.Pipe(duplex=False)
                node = f"r{i}"
                proc = ctx.Process(target=_replica_process, daemon=True,
                                   args=(node, os.path.join(tmp, node), port_out))
                proc.start()
                processes.append(proc)
                ports[node] = port_in.recv()
            figures = asyncio.run(_lead(ports, os.path.join(tmp, "l"), args))
        finally:
            for proc in processes:
                proc.terminate()
                proc.join()
    print(json.dumps({"bench": "replication", "seconds": args.seconds, "records": args.records,
                      "body": args.body, "members": args.replicas + 1,
                      "python": platform.python_version(), "cpus": os.cpu_count(), **figures}))


if __name__ == "__main__":
    main()
