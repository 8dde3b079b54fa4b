"""Replicated streams (issue 15's figures): confirmed publishing on three nodes against a
three-node RabbitMQ, the failover time, and a returning replica's catch-up rate.

    python bench/replicated.py --quick           # a few minutes: 3 s runs, 64 MiB catch-up
    python bench/replicated.py                   # --runs 3, 10 s runs, 1 GiB catch-up
    python bench/replicated.py --parts failover --runs 5 --lease-ttl 3

It starts a real etcd (Debian's etcd-server, tests/support/etcd.py) and three `leveret serve`
nodes a, b, c (tests/support/cluster.py, from a copy of this checkout's sources taken at the
start, as bench/compare.py does; the lease is Leveret's default unless --lease-ttl), and for
part 1 a three-node RabbitMQ cluster (tests/support/reference_cluster.py: three Debian
`rabbitmq-server` nodes joined with `rabbitmqctl join_cluster`). Three parts (--parts):

- publish: scenario (a) of bench/load.py (one publisher, confirms, window --window, --body
  bytes, --duration seconds) into a fresh stream declared with x-initial-cluster-size 3 on the
  first node (its leader: client-local on both brokers), once both replicas are in sync;
  Leveret and RabbitMQ interleaved, --runs times each; msgs/s and confirm p50/p99, medians.
- failover: a publisher on b (not the leader) publishes one message at a time with confirms
  into a stream led by a, publishing again --retry-pause after a nack and after
  --confirm-timeout without an answer, as a client would; a is killed with SIGKILL; the figure
  is, on the client, from the kill to the first basic.ack of a message published after it.
  Also: when the new leader logged its election (its JSON log's timestamp), the nacks and
  timeouts the client saw. a is restarted between runs.
- catchup: a replica (c) is killed with SIGKILL, --catchup-bytes of bodies (--catchup-body
  bytes each) are published with confirms to a (committed by a and b), c is restarted, and the
  leader's stream_status (management API) is polled until c has acknowledged the leader's
  committed offset. Reported: the time from c's sync (its row on the leader shows synced again,
  or its log starts growing, whichever is seen first) and from its restart (which includes its
  boot and its wait for its old lease to expire), the bytes c's log grew by (the chunks shipped:
  the code exposes no counter of them) and MB/s.

With --queue-type quorum (issue 28) the same tool measures a quorum queue instead of a stream
(x-quorum-initial-group-size 3 on both brokers; parts publish and failover):

- publish: scenario (q) of bench/load.py (one publisher with confirms and one consumer with acks
  through the queue at once, --messages messages) for each of --bodies, connected to the
  leader's node on both brokers, Leveret and RabbitMQ interleaved; msgs/s and confirm p50/p99.
- failover: as above, plus a consumer with acks on c; the figures are, from the kill of the
  leader a, the first basic.ack of a message published through b after it, and the first
  delivery on c of a message published after it (and the first delivery of any message).

It prints a Markdown table and writes every run to bench/results/replicated-<timestamp>.json
(replicated-quorum-<timestamp>.json for quorum queues).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

from loadgen import wire  # noqa: E402
from loadgen.client import BrokerError, connect, decode_method  # noqa: E402
from loadgen.common import STREAM, Options, prefill  # noqa: E402
from loadgen.report import median  # noqa: E402
from startup import FSYNC_ALWAYS, start_run, wait  # noqa: E402

PARTS = ("publish", "failover", "catchup")
QUORUM_PARTS = ("publish", "failover")
MEMBERS = {"x-initial-cluster-size": 3}
QUORUM = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
LEASE_ENV = "LEVERET_CLUSTER_LEASE_TTL_S"
TUNING = ("After kill -9 every link to the dead leader breaks at once; once a quorum of the "
          "members has been without its link for LEVERET_STREAM_FAILOVER_AFTER_S "
          "(stream_failover_after_s, default 1 s) they elect a new leader in one etcd "
          "transaction, checked every 0.5 s (stream_failover.CHECK_S). Lower it to fail over "
          "sooner (a link that breaks and comes back within it elects nobody). A leader that is "
          "cut off from etcd rather than from its peers is replaced when its lease expires "
          "(LEVERET_CLUSTER_LEASE_TTL_S, default 10 s).")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="3 s publish runs, 64 MiB catch-up (default --runs still applies)")
    p.add_argument("--runs", type=int, default=3, help="runs of each part (medians)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ",".join(PARTS))
    p.add_argument("--duration", type=float, help="seconds per publish run (default 10; quick 3)")
    p.add_argument("--body", type=int, default=100, help="publish body bytes")
    p.add_argument("--bodies", help="comma-separated body sizes for the publish part "
                                    "(default: --body)")
    p.add_argument("--queue-type", choices=("stream", "quorum"), default="stream",
                   help="what is replicated: a stream (issue 15) or a quorum queue (issue 28)")
    p.add_argument("--messages", type=int, default=200_000,
                   help="quorum publish part: messages per run (bench/load.py scenario q)")
    p.add_argument("--window", type=int, default=1000, help="publisher confirm window")
    p.add_argument("--catchup-bytes", type=int,
                   help="bytes of bodies written while the replica is down "
                        "(default 1 GiB; quick 64 MiB)")
    p.add_argument("--catchup-body", type=int, default=1024, help="body bytes of that fill")
    p.add_argument("--confirm-timeout", type=float, default=1.0,
                   help="failover client: seconds without a confirm before publishing again")
    p.add_argument("--retry-pause", type=float, default=0.02,
                   help="failover client: seconds it waits after a nack before publishing again")
    p.add_argument("--failover-timeout", type=float, default=60.0,
                   help="seconds after the kill before a failover run without a confirm fails")
    p.add_argument("--lease-ttl", type=int,
                   help=f"{LEASE_ENV} for every Leveret node (default: Leveret's own, 10 s)")
    p.add_argument("--leveret-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for every Leveret node (quorum queues: "
                        "LEVERET_QUEUE_FSYNC=always unless given, as compare.py does: RabbitMQ's "
                        "quorum queues fsync their write-ahead log before confirming)")
    p.add_argument("--no-rabbitmq", action="store_true", help="publish part: Leveret alone")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run the installed Leveret instead of a copy of this checkout's sources")
    p.add_argument("--timeout", type=float, default=900, help="seconds per load.py run")
    args = p.parse_args(argv)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.catchup_bytes = args.catchup_bytes or ((64 if args.quick else 1024) << 20)
    args.bodies = [int(b) for b in (args.bodies or str(args.body)).split(",")]
    if args.queue_type == "quorum" and args.parts == ",".join(PARTS):
        args.parts = ",".join(QUORUM_PARTS)
    args.parts = [x for x in args.parts.split(",") if x]
    allowed = QUORUM_PARTS if args.queue_type == "quorum" else PARTS
    unknown = [x for x in args.parts if x not in allowed]
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(allowed)}")
    return args


# -- the Leveret cluster --------------------------------------------------------------------


class LeveretCluster:
    """etcd and nodes a, b, c (with management), from tests/support."""

    def __init__(self, tmp: Path, snapshot: Path | None, lease_ttl: int | None,
                 extra_env: dict[str, str] | None = None) -> None:
        from support.cluster import make_node
        from support.etcd import EtcdServer

        self.etcd = EtcdServer(tmp / "etcd").start()
        env = {"PYTHONPATH": os.pathsep.join([str(snapshot), os.environ.get("PYTHONPATH", "")])
               } if snapshot is not None else {}
        env.update(extra_env or {})
        cluster = f"benchrep{os.getpid()}"
        self.cluster = cluster
        self.nodes = {name: make_node(tmp, self.etcd.url, cluster, name, env=env,
                                      management=True) for name in "abc"}
        for node in self.nodes.values():
            if lease_ttl is None:
                node.env.pop(LEASE_ENV, None)  # the tests' 2 s: the bench wants the default
            else:
                node.env[LEASE_ENV] = str(lease_ttl)
        for node in self.nodes.values():
            node.start(timeout=60)
        self.wait_linked()

    @property
    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]

    def port(self, name: str) -> int:
        return int(self.nodes[name].port)

    def wait_linked(self, timeout: float = 120) -> None:
        from support.cluster import linked

        wait(lambda: all(linked(n, 2) for n in self.nodes.values()), timeout,
             "the three nodes to link", 0.3)

    def rows(self, name: str, stream: str) -> list[dict[str, Any]] | None:
        """stream_status's member rows on node `name` (management API), or None."""
        from support.cluster import api_get

        try:
            data = api_get(self.nodes[name], f"/api/leveret/streams/%2F/{quote(stream, '')}"
                                             "/status")
        except (OSError, ValueError):
            return None
        rows: list[dict[str, Any]] = data.get("members", [])
        return rows

    def in_sync(self, leader: str, stream: str) -> bool:
        rows = self.rows(leader, stream) or []
        return (len(rows) == 3 and any(r["role"] == "writer" and r["node"] == leader
                                       for r in rows)
                and all(r.get("synced", True) for r in rows))

    def declare(self, stream: str, on: str = "a") -> None:
        """A 3-member stream declared on `on` (its leader), once every replica is synced."""
        conn = connect("127.0.0.1", self.port(on))
        conn.declare_queue(stream, arguments={**STREAM, **MEMBERS})
        conn.close()
        wait(lambda: self.in_sync(on, stream), 60, f"{stream}'s replicas to sync")

    def declare_quorum(self, queue: str, on: str = "a") -> None:
        """A 3-member quorum queue declared on `on` (its leader: client-local), once etcd names
        the three members with `on` leading and each node holds the queue's log folder."""
        from support.cluster import in_etcd

        conn = connect("127.0.0.1", self.port(on))
        conn.declare_queue(queue, durable=True, arguments=QUORUM)
        conn.close()

        def placed() -> bool:
            record, leadership = in_etcd(self.etcd, self.cluster, queue)
            return (record is not None and leadership is not None
                    and leadership.leader == on and len(leadership.members) == 3
                    and all((n.data_dir / "queues" / str(record.storage_id)).is_dir()
                            for n in self.nodes.values()))

        wait(placed, 60, f"{queue}'s three members")

    def quorum_leader(self, queue: str) -> str | None:
        """The leader etcd names for a quorum queue (or a stream)."""
        from support.cluster import in_etcd

        try:
            _record, leadership = in_etcd(self.etcd, self.cluster, queue)
        except Exception:  # noqa: BLE001 - etcd busy: the caller asks again
            return None
        return None if leadership is None else leadership.leader

    def delete(self, stream: str, on: str = "a") -> None:
        try:
            conn = connect("127.0.0.1", self.port(on))
            conn.delete_queue(stream)
            conn.close()
        except (OSError, BrokerError) as exc:
            print(f"  (could not delete {stream}: {exc})", file=sys.stderr)

    def leader(self, stream: str, among: tuple[str, ...]) -> str | None:
        for name in among:
            rows = self.rows(name, stream) or []
            if any(r["role"] == "writer" and r["node"] == name for r in rows):
                return name
        return None

    def restart(self, name: str) -> None:
        self.nodes[name].start(timeout=120)
        self.wait_linked()

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                try:
                    node.stop(30)
                except subprocess.TimeoutExpired:
                    node.kill()
        self.etcd.stop()


# -- part 1: publish with confirms ------------------------------------------------------------


def load_a(port: int, queue: str, pids: list[int], label: str,
           args: argparse.Namespace) -> dict[str, Any]:
    """bench/load.py scenario (a) into `queue` (declared beforehand with 3 members)."""
    cmd = [sys.executable, str(HERE / "load.py"), "--scenario", "a", "--body", str(args.body),
           "--port", str(port), "--queue", queue, "--duration", str(args.duration),
           "--window", str(args.window), "--label", label,
           "--broker-pid", ",".join(map(str, pids)),
           "--stream-arg", f"x-initial-cluster-size={MEMBERS['x-initial-cluster-size']}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"broker": label, "ok": False, "errors": ["load.py did not finish (a hang?)"]}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"broker": label, "ok": False,
                "errors": [f"load.py exited {out.returncode}: {out.stderr[-800:]}"]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def load_q(port: int, queue: str, pids: list[int], label: str, body: int,
           args: argparse.Namespace) -> dict[str, Any]:
    """bench/load.py scenario (q) through `queue` (declared beforehand with 3 members)."""
    cmd = [sys.executable, str(HERE / "load.py"), "--scenario", "q", "--body", str(body),
           "--port", str(port), "--queue", queue, "--messages", str(args.messages),
           "--window", str(args.window), "--label", label,
           "--broker-pid", ",".join(map(str, pids)),
           "--stream-arg", f"x-quorum-initial-group-size={QUORUM['x-quorum-initial-group-size']}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"broker": label, "ok": False, "errors": ["load.py did not finish (a hang?)"]}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"broker": label, "ok": False,
                "errors": [f"load.py exited {out.returncode}: {out.stderr[-800:]}"]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def rabbit_declare(rabbit: Any, stream: str, arguments: dict[str, Any] | None = None) -> None:
    """A stream (or a quorum queue) with 3 members on rabbit1 (its leader), once all three
    are online."""
    first = rabbit.nodes[0]
    conn = connect("127.0.0.1", first.port)
    conn.declare_queue(stream, arguments=arguments or {**STREAM, **MEMBERS})
    conn.close()

    def online() -> bool:
        out = rabbit.ctl(first, "list_queues", "-q", "--no-table-headers", "name", "online")
        for line in out.splitlines():
            name, _, members = line.partition("\t")
            if name == stream:
                return members.count("@") == 3
        return False

    wait(online, 60, f"RabbitMQ's {stream} to have three members online", 0.5)


def publish_part(leveret: LeveretCluster, rabbit: Any, args: argparse.Namespace) -> list[dict]:
    if args.queue_type == "quorum":
        return quorum_publish_part(leveret, rabbit, args)
    runs = []
    for run in range(args.runs):
        targets = [("leveret", None)] + ([] if rabbit is None else [("rabbitmq", rabbit)])
        if run % 2:
            targets.reverse()  # A B B A ...: neither always goes first
        for label, ref in targets:
            stream = f"bench.rep.pub.{label}.{run}.{os.getpid()}"
            if ref is None:
                leveret.declare(stream)
                result = load_a(leveret.port("a"), stream, leveret.pids, label, args)
            else:
                rabbit_declare(ref, stream)
                result = load_a(ref.nodes[0].port, stream, ref.pids, label, args)
            result.update(part="publish", broker=label, run=run)
            runs.append(result)
            print(f"publish run {run} {label}: {result.get('msgs_per_s', 0):,.0f} msgs/s, "
                  f"p50 {result.get('p50_ms')} ms, p99 {result.get('p99_ms')} ms, "
                  f"ok={result.get('ok')} {result.get('errors', '')}", flush=True)
    return runs


def quorum_publish_part(leveret: LeveretCluster, rabbit: Any,
                        args: argparse.Namespace) -> list[dict]:
    """Scenario q through a fresh 3-member quorum queue led by the first node, per body size,
    Leveret and RabbitMQ interleaved (A B, then B A)."""
    runs = []
    for run in range(args.runs):
        for body in args.bodies:
            targets = [("leveret", None)] + ([] if rabbit is None else [("rabbitmq", rabbit)])
            if run % 2:
                targets.reverse()
            for label, ref in targets:
                queue = f"bench.rep.q.{label}.{body}.{run}.{os.getpid()}"
                background = round(os.getloadavg()[0], 2)
                if ref is None:
                    leveret.declare_quorum(queue)
                    result = load_q(leveret.port("a"), queue, leveret.pids, label, body, args)
                else:
                    rabbit_declare(ref, queue, QUORUM)
                    result = load_q(ref.nodes[0].port, queue, ref.pids, label, body, args)
                result.update(part="publish", broker=label, run=run, body=body,
                              loadavg_1m_before=background)
                runs.append(result)
                print(f"publish run {run} {label} {body} B: {result.get('msgs_per_s', 0):,.0f} "
                      f"msgs/s, confirm p50 {result.get('p50_ms')} ms, p99 "
                      f"{result.get('p99_ms')} ms, CPU {result.get('broker_cpu_pct')}%, "
                      f"ok={result.get('ok')} {result.get('errors', '')}", flush=True)
    return runs


# -- part 2: failover -------------------------------------------------------------------------


class OneAtATime:
    """A publisher with confirms that sends one message and waits for its confirm; on a nack,
    or --confirm-timeout without one, it publishes the next message (a late confirm of an
    earlier one still counts). Raw AMQP from bench/loadgen; runs in a thread."""

    def __init__(self, port: int, stream: str, body: int, timeout: float,
                 retry_pause: float = 0.02) -> None:
        self.port, self.stream, self.body, self.timeout = port, stream, body, timeout
        self.retry_pause = retry_pause
        self.killed_at: float | None = None  # set by the main thread just before the kill
        self.first_after: float | None = None  # first ack of a message sent after the kill
        self.acks = self.nacks = self.timeouts = self.reconnects = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._sent: dict[int, float] = {}  # unconfirmed tag -> send time

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._session()
            except (OSError, BrokerError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.reconnects += 1
                time.sleep(0.2)

    def _session(self) -> None:
        conn = connect("127.0.0.1", self.port, timeout=30)
        try:
            conn.confirm_select()
            template = wire.publish_template(conn.channel, self.stream, self.body,
                                             frame_max=conn.frame_max)
            self._sent.clear()
            tag = 0
            while not self.stop.is_set():
                tag += 1
                self._sent[tag] = time.monotonic()
                conn.send(template.burst(tag, 1, time.monotonic_ns()))
                if self._await(conn, tag) == "nack":
                    time.sleep(self.retry_pause)
        finally:
            conn.close(timeout=1)

    def _await(self, conn: Any, tag: int) -> str:
        """Wait for `tag`'s confirm: "ack", "nack" or "timeout"."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.timeouts += 1
                return "timeout"
            conn.sock.settimeout(left)
            try:
                ftype, _channel, payload = conn.read_frame()
            except TimeoutError:  # socket.timeout
                self.timeouts += 1
                return "timeout"
            if ftype != wire.FRAME_METHOD:
                continue
            index = struct.unpack_from(">I", payload)[0]
            if index in (wire.BASIC_ACK, wire.BASIC_NACK):
                confirmed, multiple = wire.parse_confirm(0, payload)
                ack = index == wire.BASIC_ACK
                if self._confirm(confirmed, multiple, ack, tag):
                    return "ack" if ack else "nack"
            else:
                method = decode_method(payload)
                if method.name in ("Connection.Close", "Channel.Close"):
                    raise BrokerError(f"{method.name} {method.reply_code} {method.reply_text}")

    def _confirm(self, confirmed: int, multiple: bool, ack: bool, waiting: int) -> bool:
        tags = [t for t in self._sent if t <= confirmed] if multiple else [confirmed]
        now = time.monotonic()
        for t in tags:
            sent = self._sent.pop(t, None)
            if sent is None:
                continue
            if not ack:
                self.nacks += 1
                continue
            self.acks += 1
            if (self.killed_at is not None and sent > self.killed_at
                    and self.first_after is None):
                self.first_after = now
        return waiting in tags


class Consumer:
    """A consumer with acks (prefetch 100, each delivery acked) in a thread: when it first
    received a delivery after `killed_at`, and the first one of a message published after it
    (the body's send time, bench/loadgen/wire.py). Reconnects and subscribes again if the
    broker cancels it or drops its connection (counted)."""

    def __init__(self, port: int, queue: str) -> None:
        self.port, self.queue = port, queue
        self.killed_at: float | None = None
        self.first_any: float | None = None  # first delivery of any message after the kill
        self.first_new: float | None = None  # first delivery of a message published after it
        self.received = self.redelivered = self.cancels = self.reconnects = 0
        self.errors: list[str] = []
        self.subscribed = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._session()
            except (OSError, BrokerError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.reconnects += 1
                time.sleep(0.2)

    def _session(self) -> None:
        conn = connect("127.0.0.1", self.port, timeout=30)
        try:
            conn.qos(100)
            conn.consume(self.queue)
            self.subscribed.set()
            tag = 0
            while not self.stop.is_set():
                conn.sock.settimeout(0.5)
                try:
                    ftype, _channel, payload = conn.read_frame()
                except TimeoutError:
                    continue
                if ftype == wire.FRAME_METHOD:
                    index = struct.unpack_from(">I", payload)[0]
                    if index == wire.BASIC_DELIVER:
                        tag = wire.deliver_tag(0, payload)
                        self.redelivered += payload[13 + payload[4]] & 1
                        continue
                    method = decode_method(payload)
                    if method.name == "Basic.Cancel":
                        self.cancels += 1
                        raise BrokerError("basic.cancel from the broker")
                    if method.name in ("Connection.Close", "Channel.Close"):
                        raise BrokerError(f"{method.name} {method.reply_code} "
                                          f"{method.reply_text}")
                elif ftype == wire.FRAME_BODY and len(payload) >= wire.BODY_PREFIX:
                    now = time.monotonic()
                    _pid, _seq, sent_ns, _kind = wire.BODY.unpack_from(payload, 0)
                    self.received += 1
                    killed = self.killed_at
                    if killed is not None and now > killed:
                        if self.first_any is None:
                            self.first_any = now
                        if self.first_new is None and sent_ns / 1e9 > killed:
                            self.first_new = now
                    conn.ack(tag, multiple=False)
        finally:
            conn.close(timeout=1)


def elected_at(node: Any, stream: str) -> float | None:
    """When `node` logged that it was elected the leader of `stream` (its JSON log's UTC
    timestamp, as time.time()), or None."""
    for line in node.log().splitlines():
        if "elected the leader of a replicated stream" not in line or stream not in line:
            continue
        try:
            record = json.loads(line)
            if record.get("stream") == stream:
                stamp = record["timestamp"].replace("Z", "+00:00")
                return datetime.fromisoformat(stamp).timestamp()
        except (ValueError, KeyError, AttributeError):
            continue
    return None


def failover_part(leveret: LeveretCluster, args: argparse.Namespace) -> list[dict]:
    if args.queue_type == "quorum":
        return quorum_failover_part(leveret, args)
    runs = []
    for run in range(args.runs):
        stream = f"bench.rep.fo.{run}.{os.getpid()}"
        result: dict[str, Any] = {"part": "failover", "run": run, "ok": False}
        pub: OneAtATime | None = None
        thread = None
        try:
            leveret.declare(stream, on="a")
            pub = OneAtATime(leveret.port("b"), stream, args.body, args.confirm_timeout,
                             args.retry_pause)
            thread = threading.Thread(target=pub.run, daemon=True)
            thread.start()
            wait(lambda p=pub: p.acks >= 50, 60, "50 confirms before the kill")
            acks_before = pub.acks
            killed_wall = time.time()
            pub.killed_at = killed = time.monotonic()
            leveret.nodes["a"].kill()  # SIGKILL
            deadline = killed + args.failover_timeout
            while pub.first_after is None and time.monotonic() < deadline:
                time.sleep(0.05)
            elected = None
            deadline = time.monotonic() + 5
            while elected is None and time.monotonic() < deadline:
                elected = next(((name, at) for name in "bc" if (at := elected_at(
                    leveret.nodes[name], stream)) is not None), None)
                time.sleep(0.1)
            result.update(
                failover_s=None if pub.first_after is None else round(pub.first_after - killed, 3),
                elected_s=None if elected is None else round(elected[1] - killed_wall, 3),
                new_leader=None if elected is None else elected[0], acks_before_kill=acks_before,
                nacks=pub.nacks, timeouts=pub.timeouts, reconnects=pub.reconnects,
                client_errors=pub.errors[:5], ok=pub.first_after is not None)
            if pub.first_after is None:
                result["errors"] = [f"no confirm {args.failover_timeout:.0f} s after the kill"]
        except RuntimeError as exc:
            result["errors"] = [str(exc)]
        finally:
            if pub is not None:
                pub.stop.set()
            if thread is not None:
                thread.join(args.confirm_timeout + 10)
        runs.append(result)
        print(f"failover run {run}: first confirm after the kill in {result.get('failover_s')} s "
              f"(new leader {result.get('new_leader')} elected at {result.get('elected_s')} s; "
              f"{result.get('nacks')} nacks, {result.get('timeouts')} timeouts) "
              f"ok={result['ok']} {result.get('errors', '')}", flush=True)
        a = leveret.nodes["a"]
        if a.proc is None or a.proc.poll() is not None:
            leveret.restart("a")
        leveret.delete(stream, on="b")
    return runs


def quorum_failover_part(leveret: LeveretCluster, args: argparse.Namespace) -> list[dict]:
    """kill -9 of a quorum queue's leader (a): the first confirm through b and the first
    delivery on c of what is published after the kill."""
    runs = []
    for run in range(args.runs):
        queue = f"bench.rep.qfo.{run}.{os.getpid()}"
        result: dict[str, Any] = {"part": "failover", "run": run, "ok": False}
        pub: OneAtATime | None = None
        sub: Consumer | None = None
        threads: list[threading.Thread] = []
        try:
            leveret.declare_quorum(queue, on="a")
            sub = Consumer(leveret.port("c"), queue)
            pub = OneAtATime(leveret.port("b"), queue, args.body, args.confirm_timeout,
                             args.retry_pause)
            threads = [threading.Thread(target=sub.run, daemon=True),
                       threading.Thread(target=pub.run, daemon=True)]
            threads[0].start()
            wait(sub.subscribed.is_set, 30, "the consumer on c")
            threads[1].start()
            wait(lambda p=pub, s=sub: p.acks >= 50 and s.received >= 50, 60,
                 "50 confirms and deliveries before the kill")
            acks_before, received_before = pub.acks, sub.received
            killed_wall = time.time()
            killed = time.monotonic()
            pub.killed_at = sub.killed_at = killed
            leveret.nodes["a"].kill()  # SIGKILL
            deadline = killed + args.failover_timeout
            while ((pub.first_after is None or sub.first_new is None)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            elected = None
            deadline = time.monotonic() + 5
            while elected is None and time.monotonic() < deadline:
                elected = next(((name, at) for name in "bc" if (at := elected_at(
                    leveret.nodes[name], queue)) is not None), None)
                time.sleep(0.1)

            def since(at: float | None, killed: float = killed) -> float | None:
                return None if at is None else round(at - killed, 3)

            ok = pub.first_after is not None and sub.first_new is not None
            result.update(
                failover_s=since(pub.first_after), delivery_s=since(sub.first_new),
                any_delivery_s=since(sub.first_any),
                elected_s=None if elected is None else round(elected[1] - killed_wall, 3),
                new_leader=(None if elected is None else elected[0])
                or leveret.quorum_leader(queue),
                acks_before_kill=acks_before, received_before_kill=received_before,
                nacks=pub.nacks, timeouts=pub.timeouts, reconnects=pub.reconnects,
                consumer_cancels=sub.cancels, consumer_reconnects=sub.reconnects,
                redelivered=sub.redelivered, client_errors=(pub.errors + sub.errors)[:5], ok=ok)
            if not ok:
                result["errors"] = [f"no confirm or no delivery {args.failover_timeout:.0f} s "
                                    "after the kill"]
        except RuntimeError as exc:
            result["errors"] = [str(exc)]
        finally:
            for client in (pub, sub):
                if client is not None:
                    client.stop.set()
            for thread in threads:
                thread.join(args.confirm_timeout + 10)
        runs.append(result)
        print(f"failover run {run}: first confirm through b after the kill in "
              f"{result.get('failover_s')} s, first delivery on c of a new message in "
              f"{result.get('delivery_s')} s (any: {result.get('any_delivery_s')} s; new leader "
              f"{result.get('new_leader')} elected at {result.get('elected_s')} s; "
              f"{result.get('nacks')} nacks, {result.get('timeouts')} timeouts, "
              f"{result.get('consumer_cancels')} cancels) ok={result['ok']} "
              f"{result.get('errors', '')}", flush=True)
        leveret.delete(queue, on="b")
        a = leveret.nodes["a"]
        if run + 1 < args.runs and (a.proc is None or a.proc.poll() is not None):
            try:
                leveret.restart("a")
            except RuntimeError as exc:  # e.g. its cluster port taken meanwhile: keep the runs
                result["errors"] = [*result.get("errors", []), f"restarting a: {exc}"]
                break
    return runs


# -- part 3: catch-up -------------------------------------------------------------------------


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:  # a file deleted meanwhile (retention, an index rewritten)
            pass
    return total


class Growth(threading.Thread):
    """When a folder first grows past `before` bytes (polled every 10 ms)."""

    def __init__(self, folder: Path, before: int) -> None:
        super().__init__(daemon=True)
        self.folder, self.before = folder, before
        self.first: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.first is None:
            if folder_bytes(self.folder) > self.before:
                self.first = time.monotonic()
            time.sleep(0.01)


def catchup_part(leveret: LeveretCluster, args: argparse.Namespace) -> list[dict]:
    runs = []
    c = leveret.nodes["c"]
    for run in range(args.runs):
        stream = f"bench.rep.cu.{run}.{os.getpid()}"
        result: dict[str, Any] = {"part": "catchup", "run": run, "ok": False,
                                  "catchup_bytes": args.catchup_bytes}
        try:
            leveret.declare(stream, on="a")
            c.kill()  # SIGKILL
            before = folder_bytes(c.data_dir / "queues")
            count = args.catchup_bytes // args.catchup_body
            opts = Options(port=leveret.port("a"), body=args.catchup_body, window=args.window,
                           queue=stream)
            stats = prefill(opts, stream, count)
            if not stats.ok:
                raise RuntimeError(f"the fill failed: {stats.errors[:3]} "
                                   f"({stats.confirmed}/{stats.published} confirmed)")
            rows = leveret.rows("a", stream) or []
            committed = next(r["committed_offset"] for r in rows if r["role"] == "writer")
            growth = Growth(c.data_dir / "queues", before)
            restarted = time.monotonic()
            growth.start()
            c.start(timeout=120)
            synced = None

            def caught_up(stream: str = stream, committed: int = committed) -> bool:
                nonlocal synced
                row = next((r for r in leveret.rows("a", stream) or [] if r["node"] == "c"),
                           None)
                if row is None or not row.get("synced"):
                    return False
                synced = synced or time.monotonic()
                return bool(row["offset"] >= committed)

            try:
                wait(caught_up, args.timeout, "c to catch up", 0.05)
            finally:
                growth.done.set()
            done = time.monotonic()
            assert synced is not None
            shipped = folder_bytes(c.data_dir / "queues") - before
            started = min(synced, growth.first or synced)  # the sync, or c's log growing
            from_sync = max(done - started, 1e-3)
            result.update(
                fill_msgs=count, fill_s=round(stats.seconds, 3),
                fill_msgs_per_s=round(count / stats.seconds, 1), committed_offset=committed,
                from_restart_s=round(done - restarted, 3), from_sync_s=round(from_sync, 3),
                replica_bytes_appended=shipped, mb_per_s=round(shipped / 1e6 / from_sync, 1),
                ok=True)
        except (RuntimeError, OSError, BrokerError, StopIteration) as exc:
            result["errors"] = [f"{type(exc).__name__}: {exc}"]
        runs.append(result)
        print(f"catch-up run {run}: {result.get('replica_bytes_appended', 0) / 1e6:,.1f} MB in "
              f"{result.get('from_sync_s')} s from the sync ({result.get('mb_per_s')} MB/s), "
              f"{result.get('from_restart_s')} s from the restart; ok={result['ok']} "
              f"{result.get('errors', '')}", flush=True)
        if c.proc is None or c.proc.poll() is not None:
            c.start(timeout=120)
        leveret.wait_linked()
        leveret.delete(stream)
    return runs


# -- the report -------------------------------------------------------------------------------


def _med(runs: list[dict], part: str, key: str, broker: str | None = None,
         only_ok: bool = True) -> float | None:
    return median([r.get(key) for r in runs if r.get("part") == part
                   and (r.get("ok") or not only_ok)
                   and (broker is None or r.get("broker") == broker)])


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _spread(runs: list[dict], part: str, key: str, broker: str | None = None,
            body: int | None = None) -> str:
    values = sorted(r[key] for r in runs if r.get("part") == part and r.get("ok")
                    and r.get(key) is not None and (broker is None or r.get("broker") == broker)
                    and (body is None or r.get("body") == body))
    return f"{values[0]:,.1f}-{values[-1]:,.1f}" if values else "-"


def quorum_report(runs: list[dict], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """Medians (min-max of the ok runs) for quorum queues."""
    figures: dict[str, Any] = {}
    lines = ["| figure | Leveret | RabbitMQ 3.10.8 | Leveret / RabbitMQ | target | ok runs |",
             "|---|---|---|---|---|---|"]
    n = args.runs
    if "publish" in args.parts:
        for body in args.bodies:
            pub = [r for r in runs if r.get("part") == "publish" and r.get("body") == body]
            for key, label, digits, target in (
                    ("msgs_per_s", f"quorum queue, 3 members, {body} B, publish with confirms + "
                                   "consume with acks: msgs/s", 0, ">= 2.0x"),
                    ("p50_ms", f"{body} B confirm latency p50 (ms)", 1, ""),
                    ("p99_ms", f"{body} B confirm latency p99 (ms)", 1, "<= 1.0x"),
                    ("broker_cpu_pct", f"{body} B broker CPU, 3 nodes (% of one core)", 0, "")):
                mine, ref = (_med(pub, "publish", key, b) for b in ("leveret", "rabbitmq"))
                ratio = mine / ref if mine and ref else None
                figures[f"{key}_{body}"] = {"leveret": mine, "rabbitmq": ref, "ratio": ratio}
                oks = [sum(1 for r in pub if r.get("broker") == b and r.get("ok"))
                       for b in ("leveret", "rabbitmq")]
                spreads = [_spread(pub, "publish", key, b) for b in ("leveret", "rabbitmq")]
                lines.append(f"| {label} | {_fmt(mine, digits)} ({spreads[0]}) | "
                             f"{_fmt(ref, digits)} ({spreads[1]}) | {_fmt(ratio, 2)} | {target} | "
                             f"{oks[0]}/{n}, {oks[1]}/{n} |")
    if "failover" in args.parts:
        ok = sum(1 for r in runs if r.get("part") == "failover" and r.get("ok"))
        lease = f"lease {args.lease_ttl} s" if args.lease_ttl else "default lease (10 s)"
        for key, label, target in (
                ("failover_s", f"kill -9 of the leader to the first confirm through b (s, "
                               f"{lease})", "< 5 s"),
                ("delivery_s", "kill -9 of the leader to the first delivery on c of a message "
                               "published after it (s)", "< 5 s"),
                ("elected_s", "kill -9 to the new leader's election (its log) (s)", "")):
            values = sorted(r[key] for r in runs if r.get("part") == "failover"
                            and r.get(key) is not None)
            med = median(values)
            figures[key] = {"median": med, "min": values[0] if values else None,
                            "max": values[-1] if values else None}
            spread = f" ({values[0]:.2f}-{values[-1]:.2f})" if values else ""
            lines.append(f"| {label} | {_fmt(med, 2)}{spread} | | | {target} | {ok}/{n} |")
    return "\n".join(lines), figures


def report(runs: list[dict], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if args.queue_type == "quorum":
        return quorum_report(runs, args)
    figures: dict[str, Any] = {}
    lines = ["| figure | Leveret | RabbitMQ 3.10.8 | Leveret / RabbitMQ | target | ok runs |",
             "|---|---|---|---|---|---|"]
    n = args.runs
    if "publish" in args.parts:
        for key, label, digits, _better, target in (
                ("msgs_per_s", f"publish with confirms, 3 members, {args.body} B: msgs/s", 0,
                 "higher", ">= 1.0x"),
                ("p50_ms", "confirm latency p50 (ms)", 1, "lower", ""),
                ("p99_ms", "confirm latency p99 (ms)", 1, "lower", "<= 1.0x")):
            mine, ref = (_med(runs, "publish", key, b) for b in ("leveret", "rabbitmq"))
            ratio = mine / ref if mine and ref else None
            figures[key] = {"leveret": mine, "rabbitmq": ref, "ratio": ratio}
            oks = [sum(1 for r in runs if r.get("part") == "publish" and r.get("broker") == b
                       and r.get("ok")) for b in ("leveret", "rabbitmq")]
            lines.append(f"| {label} | {_fmt(mine, digits)} | {_fmt(ref, digits)} | "
                         f"{_fmt(ratio, 2)} | {target} | {oks[0]}/{n}, {oks[1]}/{n} |")
    if "failover" in args.parts:
        fo = _med(runs, "failover", "failover_s")
        seen = _med(runs, "failover", "elected_s", only_ok=False)  # confirming or not
        ok = sum(1 for r in runs if r.get("part") == "failover" and r.get("ok"))
        figures["failover_s"] = fo
        figures["elected_s"] = seen
        lease = f"lease {args.lease_ttl} s" if args.lease_ttl else "default lease (10 s)"
        lines.append(f"| failover: kill -9 of the leader to the first confirm on another node "
                     f"(s, {lease}) | {_fmt(fo, 2)} | | | < 5 s | {ok}/{n} |")
        seen_n = sum(1 for r in runs if r.get("part") == "failover"
                     and r.get("elected_s") is not None)
        lines.append(f"| failover: kill -9 to the new leader's election (its log) (s) | "
                     f"{_fmt(seen, 2)} | | | | {seen_n}/{n} |")
    if "catchup" in args.parts:
        rate = _med(runs, "catchup", "mb_per_s")
        from_sync = _med(runs, "catchup", "from_sync_s")
        from_restart = _med(runs, "catchup", "from_restart_s")
        ok = sum(1 for r in runs if r.get("part") == "catchup" and r.get("ok"))
        figures.update(catchup_mb_per_s=rate, catchup_from_sync_s=from_sync,
                       catchup_from_restart_s=from_restart)
        size = f"{args.catchup_bytes / 2**20:,.0f} MiB"
        lines.append(f"| catch-up of a replica down while {size} were written: MB/s "
                     f"(from its sync) | {_fmt(rate, 1)} | | | | {ok}/{n} |")
        lines.append(f"| catch-up: seconds from its sync / from its restart | "
                     f"{_fmt(from_sync, 2)} / {_fmt(from_restart, 2)} | | | | {ok}/{n} |")
    return "\n".join(lines), figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = start_run(args, argv, "leveret-replicated-bench-",
                    [FSYNC_ALWAYS] if args.queue_type == "quorum" else [])
    tmp, info = run.tmp, run.info
    leveret: LeveretCluster | None = None
    rabbit: Any = None
    runs: list[dict] = []
    try:
        leveret = LeveretCluster(tmp, run.snapshot, args.lease_ttl, run.env)
        print(f"# leveret: nodes a, b, c on ports {[leveret.port(n) for n in 'abc']}",
              file=sys.stderr, flush=True)
        if "publish" in args.parts and not args.no_rabbitmq:
            from support.reference_cluster import start_reference_cluster

            rabbit = start_reference_cluster(3)
            if isinstance(rabbit, str):
                print(f"error: {rabbit}", file=sys.stderr)
                return 1
            print(f"# rabbitmq: {[n.name for n in rabbit.nodes]} on ports {rabbit.ports}",
                  file=sys.stderr, flush=True)
            runs += publish_part(leveret, rabbit, args)
            rabbit.stop()  # the other parts are Leveret's alone: free the machine
            rabbit = None
        elif "publish" in args.parts:
            runs += publish_part(leveret, None, args)
        if "catchup" in args.parts:
            runs += catchup_part(leveret, args)
        if "failover" in args.parts:
            runs += failover_part(leveret, args)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        info["error"] = str(exc)
    finally:
        if rabbit is not None:
            rabbit.stop()
        if leveret is not None:
            leveret.stop()
    text, figures = report(runs, args)
    header = run.header(f"three nodes of each on this one machine; medians of {args.runs} runs"
                        f"{' (min-max)' if args.queue_type == 'quorum' else ''}"
                        f"{' (--quick)' if args.quick else ''}")
    print(f"\n{header}\n\n{text}\n")
    if "failover" in args.parts and args.queue_type == "stream":
        print(TUNING)
    kind = "-quorum" if args.queue_type == "quorum" else ""
    out = run.save(f"replicated{kind}", "-quick" if args.quick else "", header=header,
                   markdown=text, figures=figures, tuning=TUNING, runs=runs)
    print(f"\nwritten to {out}")
    ok = bool(runs) and all(r.get("ok") for r in runs) and "error" not in info
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"the nodes' logs and data are kept in {tmp}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
