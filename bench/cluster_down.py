"""How long a cluster takes to see a node as down after `kill -9`, with the default lease.

    python bench/cluster_down.py                 # 3 kills, the default 10 s lease
    python bench/cluster_down.py --kills 5 --lease-ttl 5

It starts a real etcd and three `leveret serve` nodes (a, b, c) as bench/cluster.py does, with
`--cluster-lease-ttl-s` left at its default unless given. Each round declares a durable queue
held by c, starts a pika consumer of it on b, kills c with SIGKILL, and times from the kill:

- `consumer_cancelled_s`: until the consumer on b gets basic.cancel (b's link to c breaks: the
  kernel closes a killed process's sockets at once);
- `record_gone_s`: until c's node record leaves etcd (its lease expires): from then on
  `leveret cluster-status` and `/api/nodes` on every node show c as down.

Then c is restarted for the next round. It prints the figures and their medians as one JSON
line. It never runs as part of the test suite.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import pika

HERE = Path(__file__).resolve().parent
if str(HERE.parent / "tests") not in sys.path:
    sys.path.append(str(HERE.parent / "tests"))  # appended: tests/ must not shadow anything

from support.cluster import make_node, wait_until  # noqa: E402
from support.etcd import EtcdServer  # noqa: E402


def record_present(etcd_url: str, cluster: str, node: str) -> bool:
    """Whether the node's leased record is in etcd (a range read on etcd's JSON gateway)."""
    key = base64.b64encode(f"/leveret/{cluster}/nodes/{node}".encode()).decode()
    request = Request(f"{etcd_url}/v3/kv/range", data=json.dumps({"key": key}).encode(),
                      method="POST")
    with urlopen(request, timeout=5) as response:
        return bool(json.loads(response.read()).get("kvs"))


def consume_on(port: int, queue: str, cancelled: threading.Event) -> pika.BlockingConnection:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.add_on_cancel_callback(lambda _frame: cancelled.set())
    ch.basic_consume(queue, lambda *args: None)
    return conn


def one_round(etcd: EtcdServer, cluster: str, nodes: dict[str, Any], r: int) -> dict[str, float]:
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    queue = f"down.{r}"
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", c.port)) as conn:
        conn.channel().queue_declare(queue, durable=True)
    wait_until(lambda: _visible(b.port, queue), timeout=20)
    cancelled = threading.Event()
    consumer = consume_on(b.port, queue, cancelled)
    killed = time.monotonic()
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    figures: dict[str, float] = {}
    while not cancelled.is_set() and time.monotonic() - killed < 60:
        consumer.process_data_events(time_limit=0.005)
    figures["consumer_cancelled_s"] = time.monotonic() - killed
    while record_present(etcd.url, cluster, "c") and time.monotonic() - killed < 60:
        time.sleep(0.05)
    figures["record_gone_s"] = time.monotonic() - killed
    consumer.close()
    c.restart()
    wait_until(lambda: record_present(etcd.url, cluster, "c"), timeout=30)
    del a
    return figures


def _visible(port: int, queue: str) -> bool:
    try:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
            conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.AMQPError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--lease-ttl", type=int, default=None,
                   help="seconds (default: Leveret's default, 10)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="leveret-cluster-down-"))
    etcd = EtcdServer(tmp / "etcd").start()
    cluster = "down"
    env = {"LEVERET_CLUSTER_LEASE_TTL_S": str(args.lease_ttl or 10)}
    nodes = {name: make_node(tmp, etcd.url, cluster, name, env=env) for name in "abc"}
    rounds = []
    try:
        for node in nodes.values():
            node.start()
        wait_until(lambda: "cluster link up" in nodes["c"].log(), timeout=30)
        for r in range(args.kills):
            rounds.append(one_round(etcd, cluster, nodes, r))
            print(f"kill {r}: {rounds[-1]}", flush=True)
    finally:
        for node in nodes.values():
            node.stop()
        etcd.stop()
    medians = {key: round(statistics.median(f[key] for f in rounds), 3) for key in rounds[0]}
    print(json.dumps({"bench": "cluster_down", "lease_ttl_s": args.lease_ttl or 10,
                      "kills": args.kills, "median": medians,
                      "rounds": [{k: round(v, 3) for k, v in f.items()} for f in rounds]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
