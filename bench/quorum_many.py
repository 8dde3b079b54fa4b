"""Many quorum queues (issue 28): what 1,000 quorum queues with a consumer each cost every node
of a three-node cluster, Leveret against RabbitMQ 3.10.8, idle and under light publishing.

    python bench/quorum_many.py                      # 1,000 queues, 2 rounds, L R L R
    python bench/quorum_many.py --queues 200 --rounds 1 --only leveret

Each round starts a fresh three-node cluster of each broker in turn (Leveret: etcd and nodes
a, b, c as bench/replicated.py starts them, from a copy of this checkout's sources; RabbitMQ:
tests/support/reference_cluster.py), so the two never share the machine. Then:

1. baseline: per node, with nothing declared;
2. --queues quorum queues (x-quorum-initial-group-size 3), queue i declared through node i % 3
   (its leader: client-local on both brokers), then one consumer per queue on its leader's node
   (prefetch 10, each delivery acked), --channels channels per connection, one consumer each;
3. idle: after --settle seconds, a --window-second window;
4. light: one publisher connection per node with confirms publishes one message per second to
   each queue it leads (--rate per queue, spread evenly over the second); after --settle
   seconds, the same window while publishing goes on.

Per node and phase: RSS (VmRSS summed over the node's process tree: Leveret's main process and
its workers, RabbitMQ's beam.smp and its helpers), open file descriptors (/proc/PID/fd, same
tree), CPU (percent of one core), and fsync + fdatasync + syncfs calls per second, counted by
`perf stat` on the syscall tracepoints (syscalls:sys_enter_fsync, _fdatasync, _syncfs) of every
process of the tree over the whole window (--counter strace: `strace -c -f -e
trace=fsync,fdatasync,syncfs` instead, which stops the node at every syscall and slows it down); the
count is of calls, not their cost.
Also each node's `Max open files` limit (/proc/PID/limits) and its peak fd use against it.
Leveret's nodes get LEVERET_QUEUE_FSYNC=always unless --leveret-env says otherwise (as
bench/compare.py and bench/replicated.py do: RabbitMQ's quorum queues fsync their write-ahead
log before confirming).

It prints a Markdown table (medians over rounds, min-max) and writes every measurement to
bench/results/quorum-many-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))  # appended: tests/ must not shadow anything

from loadgen import wire  # noqa: E402
from loadgen.client import BrokerError, Connection, connect, decode_method  # noqa: E402
from loadgen.measure import (  # noqa: E402
    cpu_ticks,
    percentiles,
    process_tree,
    rss_kb,
    weighted_percentiles,
)
from loadgen.publish import ConfirmTracker, PublishStats  # noqa: E402
from loadgen.report import median  # noqa: E402
from pamqp import commands  # noqa: E402
from replicated import QUORUM, LeveretCluster  # noqa: E402
from startup import FSYNC_ALWAYS, start_run, wait  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2, help="rounds, each broker once per round")
    p.add_argument("--only", choices=["leveret", "rabbitmq"], help="one broker")
    p.add_argument("--rate", type=float, default=1.0, help="messages per second per queue")
    p.add_argument("--body", type=int, default=100)
    p.add_argument("--channels", type=int, default=250, help="consumer channels per connection")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before each window")
    p.add_argument("--window", type=float, default=20.0, help="seconds of each window")
    p.add_argument("--drain", type=float, default=120.0,
                   help="seconds to wait after publishing for the last confirms and deliveries")
    p.add_argument("--counter", choices=["perf", "strace"], default="perf",
                   help="what counts fsync and fdatasync calls: perf stat on the syscall "
                        "tracepoints (default), or strace -c -f (slows the node down)")
    p.add_argument("--leveret-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for every Leveret node "
                        "(default LEVERET_QUEUE_FSYNC=always)")
    p.add_argument("--keep-logs", metavar="DIR",
                   help="copy each Leveret node's log there (node-ROUND-NAME.log) at its stop")
    p.add_argument("--lease-ttl", type=int, help="LEVERET_CLUSTER_LEASE_TTL_S (default Leveret's)")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run the installed Leveret instead of a copy of this checkout's sources")
    return p.parse_args(argv)


# -- what a node spends ------------------------------------------------------------------------


def fd_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return total


def nofile_limit(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


class NodeProbe:
    """One node's process tree, sampled over a window."""

    def __init__(self, name: str, pid: int) -> None:
        self.name, self.pid = name, pid

    def tree(self) -> list[int]:
        return process_tree([self.pid])

    def snapshot(self) -> dict[str, Any]:
        pids = self.tree()
        return {"rss_mb": round(sum(rss_kb(p) for p in pids) / 1024, 1),
                "fds": fd_count(pids), "processes": len(pids),
                "nofile_limit": nofile_limit(self.main_pid(pids))}

    def main_pid(self, pids: list[int]) -> int:
        """The process that holds the sockets and files: beam.smp for RabbitMQ."""
        for pid in pids:
            try:
                if b"beam.smp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                pass
        return self.pid

    def ticks(self) -> int:
        return sum(cpu_ticks(p) for p in self.tree())


def measure(probes: list[NodeProbe], seconds: float, counter: str,
            pump: Any) -> dict[str, dict[str, Any]]:
    """Every node over `seconds` (the clients pumped meanwhile): CPU, peak fds, RSS at the
    end, and its fsync + fdatasync calls, counted for the whole window by `counter` (perf:
    the syscall tracepoints, cheap; strace: ptrace, which stops the node at every syscall)."""
    start = time.monotonic()
    ticks0 = {p.name: p.ticks() for p in probes}
    peak_fds = {p.name: 0 for p in probes}
    counters = {p.name: _start_counter(counter, p.tree()) for p in probes}
    while time.monotonic() - start < seconds:
        pump(0.2)
        for p in probes:
            peak_fds[p.name] = max(peak_fds[p.name], fd_count(p.tree()))
    elapsed = time.monotonic() - start
    rows = {}
    for p in probes:
        row = p.snapshot()
        row["cpu_pct"] = round((p.ticks() - ticks0[p.name]) / CLK_TCK / elapsed * 100, 1)
        row["peak_fds"] = peak_fds[p.name]
        row.update(_stop_counter(counter, *counters[p.name]))
        rows[p.name] = row
    return rows


def _start_counter(counter: str, pids: list[int]) -> tuple[subprocess.Popen[bytes], Path, float]:
    out = Path(tempfile.mkstemp(prefix="qmany-count-")[1])
    if counter == "perf":
        cmd = ["perf", "stat", "-x", ",", "-o", str(out), "-e",
               "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync,syscalls:sys_enter_syncfs",
               "-p", ",".join(map(str, pids))]
    else:
        cmd = ["strace", "-c", "-f", "-e", "trace=fsync,fdatasync,syncfs", "-o", str(out)]
        for pid in pids:
            cmd += ["-p", str(pid)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out, time.monotonic()


def _stop_counter(counter: str, proc: subprocess.Popen[bytes], out: Path,
                  t0: float) -> dict[str, Any]:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    seconds = time.monotonic() - t0
    calls: dict[str, int] = {}
    for line in out.read_text(errors="replace").splitlines():
        if counter == "perf":  # value,unit,event,...
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith("syscalls:sys_enter_"):
                name = fields[2].removeprefix("syscalls:sys_enter_")
                calls[name] = int(fields[0]) if fields[0].isdigit() else 0
        else:  # % time, seconds, usecs/call, calls, [errors], syscall
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync", "syncfs") and len(parts) >= 5:
                calls[parts[-1]] = int(parts[3])
    out.unlink(missing_ok=True)
    if not calls:
        return {"fsyncs_per_s": None, "fsync_counter": f"{counter} counted nothing"}
    return {"fsync_calls": calls, "fsync_counter": counter, "counted_s": round(seconds, 1),
            "fsyncs_per_s": round(sum(calls.values()) / seconds, 1)}


# -- the clients -------------------------------------------------------------------------------


class Clients:
    """Consumers (many channels per connection, one consumer each) and one publisher with
    confirms per node, all in one selector loop of this process."""

    def __init__(self, body: int) -> None:
        self.body = body
        self.sel = selectors.DefaultSelector()
        self.conns: list[Connection] = []
        self.publishers: dict[str, Connection] = {}
        self.trackers: dict[int, ConfirmTracker] = {}  # by id() of a publisher connection
        self.templates: dict[str, list[wire.PublishTemplate]] = {}
        self.channel_tag: dict[tuple[int, int], int] = {}
        self.received = self.published = 0
        self.latency: list[int] = []
        self.errors: list[str] = []
        self.seq = 0
        self.schedule: list[tuple[str, wire.PublishTemplate]] = []
        self.interval = 1.0
        self.started = 0.0
        self.sent_count = 0

    def consume(self, port: int, queues: list[str], channels: int) -> None:
        for start in range(0, len(queues), channels):
            conn = connect("127.0.0.1", port, timeout=120)
            for k, queue in enumerate(queues[start:start + channels], 1):
                if k > 1:
                    conn.rpc(commands.Channel.Open(), "Channel.OpenOk", channel=k)
                conn.rpc(commands.Basic.Qos(prefetch_count=10), "Basic.QosOk", channel=k)
                conn.rpc(commands.Basic.Consume(queue=queue), "Basic.ConsumeOk", channel=k)
            self._register(conn)

    def publisher(self, node: str, port: int, queues: list[str]) -> None:
        conn = connect("127.0.0.1", port, timeout=120)
        conn.confirm_select()
        self.publishers[node] = conn
        self.trackers[id(conn)] = ConfirmTracker(conn, PublishStats())
        self.templates[node] = [wire.publish_template(conn.channel, q, self.body,
                                                      persistent=True,
                                                      frame_max=conn.frame_max)
                                for q in queues]
        self._register(conn)

    def _register(self, conn: Connection) -> None:
        conn.sock.setblocking(False)
        self.conns.append(conn)
        self.sel.register(conn.sock, selectors.EVENT_READ, conn)

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            conn: Connection = key.data
            try:
                data = conn.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError as exc:
                self._error(f"{type(exc).__name__}: {exc}")
                self.sel.unregister(conn.sock)
                continue
            if not data:
                self._error("a broker closed a connection")
                self.sel.unregister(conn.sock)
                continue
            self._feed(conn, data)

    def _feed(self, conn: Connection, data: bytes) -> None:
        buf = conn.buf + data if conn.buf else data
        pos, n = 0, len(buf)
        acks = bytearray()
        now = time.monotonic_ns()
        while n - pos >= 8:
            ftype, channel, size = wire.FRAME_HEAD.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == wire.FRAME_METHOD:
                index = wire.U32.unpack_from(buf, pos + 7)[0]
                if index == wire.BASIC_DELIVER:
                    self.channel_tag[(id(conn), channel)] = wire.deliver_tag(pos + 7, buf)
                elif index in (wire.BASIC_ACK, wire.BASIC_NACK):
                    self.trackers[id(conn)].confirm_frame(index, buf, pos)
                else:
                    method = decode_method(bytes(buf[pos + 7:end]))
                    self._error(f"{method.name} {getattr(method, 'reply_code', '')} "
                                f"{getattr(method, 'reply_text', '')}")
            elif ftype == wire.FRAME_BODY:
                _pid, _seq, ts, _kind = wire.BODY.unpack_from(buf, pos + 7)
                self.latency.append(now - ts)
                self.received += 1
                acks += wire.ack_frame(channel, self.channel_tag.get((id(conn), channel), 0),
                                       False)
            pos = end + 1
        conn.buf = buf[pos:]
        tracker = self.trackers.get(id(conn))
        if tracker is not None:
            tracker.account(now)  # confirm latency samples
        if acks:
            self._send(conn, bytes(acks))

    def _send(self, conn: Connection, data: bytes) -> None:
        try:
            conn.sock.setblocking(True)
            conn.sock.sendall(data)
        except OSError as exc:
            self._error(f"send: {type(exc).__name__}: {exc}")
        finally:
            conn.sock.setblocking(False)

    def _error(self, text: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(text)

    def start_publishing(self, rate: float) -> None:
        """From now on each queue gets `rate` messages per second, spread evenly over the
        queues (publish_for sends what is due)."""
        self.schedule = [(node, t) for node, ts in self.templates.items() for t in ts]
        self.interval = 1.0 / rate / max(len(self.schedule), 1)
        self.started = time.monotonic()
        self.sent_count = 0

    def publish_for(self, seconds: float) -> None:
        """Publish what is due for `seconds`, pumping meanwhile."""
        end = time.monotonic() + seconds
        templates = self.schedule
        while True:
            now = time.monotonic()
            if now >= end:
                break
            i = self.sent_count
            due = self.started + i * self.interval
            if now >= due:
                node, template = templates[i % len(templates)]
                conn = self.publishers[node]
                ts = time.monotonic_ns()
                self._send(conn, bytes(template.burst(self.seq, 1, ts)))
                self.trackers[id(conn)].sent(1, ts)
                self.seq += 1
                self.published += 1
                self.sent_count += 1
                continue
            self.pump(min(due - now, end - now, 0.05))

    @property
    def confirmed(self) -> int:
        return sum(t.upto + len(t.singles) for t in self.trackers.values())

    @property
    def nacked(self) -> int:
        return sum(t.stats.nacked for t in self.trackers.values())

    def confirm_latency(self) -> tuple[float | None, float | None]:
        """Confirm p50 and p99 (ms) over every publish of the run (one message per burst)."""
        lat = [v for t in self.trackers.values() for v in t.stats.latency_ns]
        weights = [w for t in self.trackers.values() for w in t.stats.latency_weight]
        p50, p99 = weighted_percentiles(lat, weights, (50, 99))
        return p50, p99

    def settled(self) -> bool:
        return (self.confirmed + self.nacked >= self.published
                and self.received >= self.published)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.sock.setblocking(True)
                conn.close(timeout=2)
            except (OSError, BrokerError):
                pass
        self.sel.close()


# -- the two brokers ---------------------------------------------------------------------------


def queue_names(n: int, label: str) -> list[str]:
    return [f"bench.many.{label}.{os.getpid()}.{i:05d}" for i in range(n)]


def declare_all(ports: list[int], queues: list[str]) -> float:
    """Queue i through node i % len(ports) (client-local: its leader); returns seconds."""
    start = time.monotonic()
    conns = [connect("127.0.0.1", port, timeout=120) for port in ports]
    for i, queue in enumerate(queues):
        conns[i % len(conns)].declare_queue(queue, durable=True, arguments=QUORUM)
    for conn in conns:
        conn.close()
    return time.monotonic() - start


RESYNC_LINES = ("process stalled", "loop stalled", "synced again")


class LeveretTarget:
    label = "leveret"

    def __init__(self, tmp: Path, snapshot: Path | None, args: argparse.Namespace,
                 env: dict[str, str]) -> None:
        self.cluster = LeveretCluster(tmp, snapshot, args.lease_ttl, env)
        self.keep_logs = Path(args.keep_logs) if args.keep_logs else None
        self.tmp = tmp
        self.names = ["a", "b", "c"]
        self.ports = [self.cluster.port(n) for n in self.names]
        self.pids = [self.cluster.nodes[n].pid for n in self.names]

    def placed(self, count: int) -> bool:
        """Every node holds the log folders of `count` queues."""
        return all(len(list((self.cluster.nodes[n].data_dir / "queues").iterdir())) >= count
                   for n in self.names)

    def log_lines(self) -> dict[str, dict[str, int]]:
        """Per node, how many times its log says a leader resynced its replicas (RESYNC_LINES):
        a loop that lagged past the stall threshold, or a replica that asked for it."""
        counts = {}
        for name in self.names:
            text = self.cluster.nodes[name].log_path.read_text(errors="replace")
            counts[name] = {key: text.count(key) for key in RESYNC_LINES}
        return counts


    def stop(self) -> None:
        self.cluster.stop()
        if self.keep_logs is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for name in self.names:
                shutil.copy(self.cluster.nodes[name].log_path,
                            self.keep_logs / f"node-{self.tmp.name}-{name}.log")


class RabbitTarget:
    label = "rabbitmq"

    def __init__(self) -> None:
        from support.reference_cluster import start_reference_cluster

        cluster = start_reference_cluster(3)
        if isinstance(cluster, str):
            raise RuntimeError(cluster)
        self.cluster = cluster
        self.names = [n.name.split("-")[0] for n in cluster.nodes]
        self.ports = cluster.ports
        self.pids = cluster.pids

    def placed(self, count: int) -> bool:
        out = self.cluster.ctl(self.cluster.nodes[0], "list_queues", "-q", "--no-table-headers",
                               "name", "online", timeout=300)
        full = sum(1 for line in out.splitlines() if line.partition("\t")[2].count("@") == 3)
        return full >= count


    def stop(self) -> None:
        self.cluster.stop()


def one_round(target: Any, args: argparse.Namespace, rnd: int) -> dict[str, Any]:
    label = target.label
    probes = [NodeProbe(n, pid) for n, pid in zip(target.names, target.pids, strict=True)]
    out: dict[str, Any] = {"broker": label, "round": rnd, "nodes": target.names,
                           "phases": {}, "ok": False}
    clients = Clients(args.body)
    try:
        time.sleep(args.settle)
        out["phases"]["baseline"] = measure(probes, min(args.window, 10.0), args.counter,
                                            time.sleep)
        queues = queue_names(args.queues, label)
        t0 = time.monotonic()
        out["declare_s"] = round(declare_all(target.ports, queues), 1)
        wait(lambda: target.placed(len(queues)), 900, "every queue's three members", 2.0)
        out["placed_s"] = round(time.monotonic() - t0, 1)
        by_node = {n: queues[i::len(target.ports)] for i, n in enumerate(target.names)}
        t0 = time.monotonic()
        for i, name in enumerate(target.names):
            clients.consume(target.ports[i], by_node[name], args.channels)
        out["consume_s"] = round(time.monotonic() - t0, 1)
        out["consumer_connections"] = len(clients.conns)
        clients.pump(args.settle)
        out["phases"]["idle"] = measure(probes, args.window, args.counter, clients.pump)
        for i, name in enumerate(target.names):
            clients.publisher(name, target.ports[i], by_node[name])
        clients.start_publishing(args.rate)
        clients.publish_for(args.settle)
        received0, published0 = clients.received, clients.published
        t0 = time.monotonic()
        last = {"t": t0, "published": published0, "received": received0}

        def publishing(seconds: float) -> None:
            clients.publish_for(seconds)
            last.update(t=time.monotonic(), published=clients.published,
                        received=clients.received)

        out["phases"]["light"] = measure(probes, args.window, args.counter, publishing)
        window = last["t"] - t0
        out["light_published_per_s"] = round((last["published"] - published0) / window, 1)
        out["light_delivered_per_s"] = round((last["received"] - received0) / window, 1)
        out["lag_at_window_end"] = {"unconfirmed": clients.published - clients.confirmed,
                                    "undelivered": clients.published - clients.received}
        t0 = time.monotonic()  # publishing stops: the last confirms and deliveries
        while not clients.settled() and time.monotonic() - t0 < args.drain:
            clients.pump(0.2)
        out["drain_s"] = round(time.monotonic() - t0, 1)
        if hasattr(target, "log_lines"):
            out["log_lines"] = target.log_lines()
        p50, p99 = percentiles(clients.latency, (50, 99))
        out["confirm_p50_ms"], out["confirm_p99_ms"] = clients.confirm_latency()
        out.update(published=clients.published, confirmed=clients.confirmed,
                   nacked=clients.nacked, received=clients.received,
                   deliver_p50_ms=p50, deliver_p99_ms=p99, errors=clients.errors)
        out["ok"] = (not clients.errors and clients.nacked == 0
                     and clients.confirmed == clients.published
                     and clients.received == clients.published)
        if not out["ok"] and not clients.errors:
            out["errors"] = [f"{clients.confirmed} confirms, {clients.received} deliveries for "
                             f"{clients.published} publishes"]
    except (RuntimeError, OSError, BrokerError) as exc:
        out["errors"] = [f"{type(exc).__name__}: {exc}"]
    finally:
        clients.close()
    return out


# -- the report --------------------------------------------------------------------------------


def _cell(values: list[float]) -> str:
    values = sorted(v for v in values if v is not None)
    if not values:
        return "-"
    med = median(values)
    text = f"{med:,.0f}" if med >= 100 else f"{med:,.1f}"
    if len(values) > 1:
        text += f" ({values[0]:,.0f}-{values[-1]:,.0f})" if med >= 100 else \
            f" ({values[0]:,.1f}-{values[-1]:,.1f})"
    return text


def report(rounds: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = ["| broker | phase | node | RSS MB | fds (peak) | fsyncs/s | CPU % | "
             "nofile limit |", "|---|---|---|---|---|---|---|---|"]
    for broker in ("leveret", "rabbitmq"):
        mine = [r for r in rounds if r["broker"] == broker and r.get("phases")]
        if not mine:
            continue
        for phase in ("baseline", "idle", "light"):
            for index in range(3):
                rows = [r["phases"][phase][r["nodes"][index]] for r in mine
                        if phase in r["phases"]]
                if not rows:
                    continue
                lines.append(
                    f"| {broker} | {phase} | {index + 1} | {_cell([x['rss_mb'] for x in rows])} | "
                    f"{_cell([x['fds'] for x in rows])} "
                    f"({max(x['peak_fds'] for x in rows)}) | "
                    f"{_cell([x.get('fsyncs_per_s') for x in rows])} | "
                    f"{_cell([x['cpu_pct'] for x in rows])} | "
                    f"{rows[0].get('nofile_limit')} |")
    lines.append("")
    lines.append("| broker | declare s | light: published/s | delivered/s | unconfirmed at the "
                 "window's end | confirm p50 / p99 ms | deliver p50 / p99 ms | drain s | ok |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rounds:
        lag = r.get("lag_at_window_end", {})
        lines.append(f"| {r['broker']} (round {r['round']}) | {r.get('declare_s')} | "
                     f"{r.get('light_published_per_s')} | {r.get('light_delivered_per_s')} | "
                     f"{lag.get('unconfirmed')} | "
                     f"{r.get('confirm_p50_ms')} / {r.get('confirm_p99_ms')} | "
                     f"{r.get('deliver_p50_ms')} / {r.get('deliver_p99_ms')} | "
                     f"{r.get('drain_s')} | {r['ok']} {r.get('errors') or ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which(args.counter) is None:
        print(f"{args.counter} is needed (apt-get install {args.counter})", file=sys.stderr)
        return 1
    run = start_run(args, argv, "leveret-quorum-many-", [FSYNC_ALWAYS])
    names = [args.only] if args.only else ["leveret", "rabbitmq"]
    rounds: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else list(reversed(names))
            for label in order:
                print(f"# round {rnd}: {label}", file=sys.stderr, flush=True)
                target: Any = None
                try:
                    if label == "leveret":
                        target = LeveretTarget(run.tmp / f"r{rnd}", run.snapshot, args, run.env)
                    else:
                        target = RabbitTarget()
                    result = one_round(target, args, rnd)
                except RuntimeError as exc:
                    result = {"broker": label, "round": rnd, "ok": False, "phases": {},
                              "errors": [str(exc)]}
                finally:
                    if target is not None:
                        target.stop()
                rounds.append(result)
                print(json.dumps(result), flush=True)
    finally:
        text = report(rounds, args)
        header = run.header(f"three nodes of each on this one machine, one broker at a time; "
                            f"{args.queues} quorum queues with a consumer each; light: "
                            f"{args.rate} msg/s per queue; medians of {args.rounds} rounds "
                            "(min-max)")
        print(f"\n{header}\n\n{text}\n")
        out = run.save("quorum-many", header=header, markdown=text, rounds=rounds)
        print(f"written to {out}")
        shutil.rmtree(run.tmp, ignore_errors=True)
    return 0 if rounds and all(r.get("ok") for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
