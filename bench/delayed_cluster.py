"""Delayed exchanges on three nodes (issue 30): publish rate with confirms into the exchange's
replicated log, and the lateness of due messages when its leader is killed.

    python bench/delayed_cluster.py                      # 50k per rate, 3 failover rounds
    python bench/delayed_cluster.py --rate-count 20000 --due 5000 --held 100000 --rounds 2

A real etcd (Debian's etcd-server, as the tests) and three `leveret serve` nodes (this
checkout) in a temporary directory, LEVERET_QUEUE_FSYNC as --fsync (default `always`, as
quorum queues are measured). One raw-socket publisher (bench/loadgen), --body-size bytes,
persistent, --window confirms outstanding.

1. quorum: --rate-count messages through a direct exchange into a quorum queue (3 members)
   led by the node published to (the baseline: a message on a majority before its confirm);
2. delayed via leader: --rate-count messages with x-delay one day into a delayed exchange
   (direct type), published to the node that leads its log;
3. delayed via another node: the same, published to a node that does not lead it (forwarded);
4. failover, --rounds times, on a fresh delayed exchange each: --held messages held for a
   day (what the new leader's index rebuild reads), then --due messages due at T (one burst,
   x-delay = T - now), published through a node that does not lead the log; the leader is
   killed (-9) at once, T is 2 s later (during the election); measured: from T until the
   bound durable queue (on a surviving node) holds all --due messages, through a survivor.
   The killed node is restarted before the next round.
5. burst (--burst messages, 0 to skip): due at one instant T, routed by the log's leader to a
   durable queue on another node (each copy waits for that node's confirm before its ROUTED
   record is written); measured: from T until the queue holds them all. Then the leader is
   killed: what the new leader routes again (its `delayed_routed`, 5 s after its election;
   0 when every ROUTED record was committed).

Prints a Markdown table; writes bench/results/delayed-cluster-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

from delayed import DAY_MS, declare, publish, queue_count, save_figures, template  # noqa: E402
from loadgen.client import Connection, connect  # noqa: E402
from loadgen.report import median  # noqa: E402
from pamqp import commands  # noqa: E402


def log_leader(etcd: Any, cluster: str, exchange: str) -> str:
    """The node that leads the exchange's log, read from etcd."""
    from support.cluster import in_etcd

    from leveret.broker.model.delayed_log import log_name
    record, _ = in_etcd(etcd, cluster, log_name("/", exchange))
    assert record is not None
    return str(record.node)


def channel(port: int) -> Connection:
    conn = connect("127.0.0.1", port)
    conn.confirm_select()
    return conn


def delayed_exchange(conn: Connection, name: str) -> None:
    declare(conn, commands.Exchange.Declare(
        exchange=name, exchange_type="x-delayed-message", durable=True,
        arguments={"x-delayed-type": "direct"}), "Exchange.DeclareOk")


def rates(nodes: dict[str, Any], etcd: Any, cluster: str, args: argparse.Namespace,
          figures: dict[str, Any]) -> None:
    """Publish rates with confirms: a quorum queue, and the delayed exchange via its log's
    leader and via another node."""
    conn = channel(nodes["a"].port)
    declare(conn, commands.Exchange.Declare(exchange="qx", exchange_type="direct",
                                            durable=True), "Exchange.DeclareOk")
    declare(conn, commands.Queue.Declare(
        queue="qq", durable=True, arguments={"x-queue-type": "quorum",
                                             "x-queue-leader-locator": "client-local"}),
        "Queue.DeclareOk")
    declare(conn, commands.Queue.Bind(queue="qq", exchange="qx", routing_key="k"),
            "Queue.BindOk")
    figures["quorum_publish_per_s"] = round(publish(
        conn, template("qx", "k", args.body_size, None), args.rate_count, args.window))
    delayed_exchange(conn, "rate-x")
    conn.close()
    leader = log_leader(etcd, cluster, "rate-x")
    other = next(name for name in nodes if name != leader)
    for label, name in (("leader", leader), ("other_node", other)):
        conn = channel(nodes[name].port)
        figures[f"delayed_publish_per_s_via_{label}"] = round(publish(
            conn, template("rate-x", "k", args.body_size, DAY_MS), args.rate_count,
            args.window))
        conn.close()
    print(f"publish: quorum {figures['quorum_publish_per_s']}/s, delayed via leader "
          f"{figures['delayed_publish_per_s_via_leader']}/s, via another node "
          f"{figures['delayed_publish_per_s_via_other_node']}/s", flush=True)


def failover_round(nodes: dict[str, Any], etcd: Any, cluster: str,
                   args: argparse.Namespace, round_: int) -> tuple[str, float]:
    """Held and due messages, the log's leader killed 2 s before T: (the leader killed, the
    seconds from T until all due messages are in the target queue)."""
    exchange, queue = f"fail-x{round_}", f"fail-q{round_}"
    conn = channel(nodes["a"].port)
    delayed_exchange(conn, exchange)
    conn.close()
    leader = log_leader(etcd, cluster, exchange)
    survivors = [name for name in sorted(nodes) if name != leader]
    conn = channel(nodes[survivors[0]].port)
    conn.declare_queue(queue)
    declare(conn, commands.Queue.Bind(queue=queue, exchange=exchange,
                                      routing_key="k"), "Queue.BindOk")
    if args.held:
        publish(conn, template(exchange, "k", args.body_size, DAY_MS), args.held,
                args.window)
    due_at = int(time.time() * 1000) + 10_000 + args.due // 5
    publish(conn, template(exchange, "k", args.body_size,
                           due_at - int(time.time() * 1000)), args.due, args.window)
    conn.close()
    wait_s = due_at / 1000 - time.time() - 2.0
    if wait_s > 0:
        time.sleep(wait_s)
    nodes[leader].kill()  # T is 2 s away: it falls due during the election
    time.sleep(max(0.0, due_at / 1000 - time.time()))
    t0 = time.monotonic()
    probe = connect("127.0.0.1", nodes[survivors[0]].port)
    while (count := queue_count(probe, queue)) < args.due:
        if time.monotonic() - t0 > 300:
            raise RuntimeError(f"only {count} of {args.due} routed after 5 min")
        time.sleep(0.05)
    took = time.monotonic() - t0
    probe.close()
    print(f"round {round_}: leader {leader} killed 2 s before T; all {args.due} "
          f"routed {took:.2f} s after T ({args.held} held besides)", flush=True)
    return leader, took


def burst_round(nodes: dict[str, Any], etcd: Any, cluster: str,
                args: argparse.Namespace, figures: dict[str, Any]) -> str:
    """The --burst round (5. above); the node killed."""
    from support.cluster import api_get

    conn = channel(nodes["a"].port)
    delayed_exchange(conn, "burst-x")
    conn.close()
    leader = log_leader(etcd, cluster, "burst-x")
    target = next(name for name in sorted(nodes) if name != leader)
    conn = channel(nodes[target].port)
    conn.declare_queue("burst-q")
    declare(conn, commands.Queue.Bind(queue="burst-q", exchange="burst-x",
                                      routing_key="k"), "Queue.BindOk")
    due_at = int(time.time() * 1000) + 5_000 + args.burst // 5
    publish(conn, template("burst-x", "k", args.body_size, due_at - int(time.time() * 1000)),
            args.burst, args.window)
    conn.close()
    time.sleep(max(0.0, due_at / 1000 - time.time()))
    t0 = time.monotonic()
    probe = connect("127.0.0.1", nodes[target].port)
    while (count := queue_count(probe, "burst-q")) < args.burst:
        if time.monotonic() - t0 > 300:
            raise RuntimeError(f"only {count} of {args.burst} routed after 5 min")
        time.sleep(0.05)
    took = time.monotonic() - t0
    probe.close()
    figures["burst_routed_s_after_due"] = round(took, 2)
    figures["burst_routing_per_s"] = round(args.burst / took)
    time.sleep(1.0)
    nodes[leader].kill()
    deadline = time.monotonic() + 60
    while log_leader(etcd, cluster, "burst-x") == leader:
        if time.monotonic() > deadline:
            raise RuntimeError("no new leader")
        time.sleep(0.2)
    time.sleep(5.0)
    new_leader = nodes[log_leader(etcd, cluster, "burst-x")]
    figures["burst_rerouted_after_failover"] = api_get(
        new_leader, "/api/exchanges/%2F/burst-x")["delayed_routed"]
    print(f"burst: {args.burst} due at T, to a queue on another node than the leader, all "
          f"there {took:.2f} s after T; routed again after the leader's kill: "
          f"{figures['burst_rerouted_after_failover']}", flush=True)
    return leader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-count", type=int, default=50_000)
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=0)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000)
    parser.add_argument("--fsync", default="always")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    args = parser.parse_args()

    from support.cluster import linked, make_node
    from support.etcd import EtcdServer

    tmp = Path(tempfile.mkdtemp(prefix="leveret-delayed-cluster-bench-"))
    etcd = EtcdServer(tmp / "etcd").start()
    cluster = f"b{uuid.uuid4().hex[:8]}"
    env = {"LEVERET_QUEUE_FSYNC": args.fsync}
    nodes = {name: make_node(tmp, etcd.url, cluster, name, env=env, management=True)
             for name in "abc"}
    for node in nodes.values():
        node.env.pop("LEVERET_CLUSTER_LEASE_TTL_S", None)  # the tests' 2 s: the default here
    figures: dict[str, Any] = {"body_size": args.body_size, "window": args.window,
                               "fsync": args.fsync, "held": args.held, "due": args.due,
                               "burst": args.burst}

    def wait_linked() -> None:
        deadline = time.monotonic() + 120
        while not all(linked(n, 2) for n in nodes.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not link")
            time.sleep(0.2)

    try:
        for node in nodes.values():
            node.start(timeout=60)
        wait_linked()
        rates(nodes, etcd, cluster, args, figures)
        late: list[float] = []
        for round_ in range(args.rounds):
            leader, took = failover_round(nodes, etcd, cluster, args, round_)
            late.append(round(took, 2))
            nodes[leader].start(timeout=120)
            wait_linked()
        figures["failover_all_routed_s_after_due"] = late
        figures["failover_median_s"] = median(late) if late else None
        if args.burst:
            nodes[burst_round(nodes, etcd, cluster, args, figures)].start(timeout=120)
    finally:
        for node in nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                node.kill()
        etcd.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    save_figures("delayed-cluster", figures)


if __name__ == "__main__":
    main()
