"""One fault round, start to verdict, and the figures it yields; the rounds of a test.

A round, all of it decided by its seed (`random.Random(seed)`), the same for every kind of
queue (a `RoundKind`: the stream's here, the quorum queue's in queue_rounds.py, the delayed
exchange's in delayed_rounds.py):

1. restore the cluster (heal, resume, restart; every node live in etcd and linked);
2. declare a fresh queue of the kind, through a node chosen by the seed (its leader: placement
   is client-local) and check it got every node as a member;
3. start the kind's workload (publishers and consumers on every node), let it run a moment,
   inflict the nemesis on the leader of that moment of the kind's `subject` (the queue itself,
   or a delayed exchange's hidden log: delayed_rounds.py), heal, restore, let the clients see
   the healed cluster a moment, and stop them (a cluster that did not recover fails the round
   as `unrecovered`, with nothing settled or compared);
4. the kind's verdict. A stream (`verify_stream`): wait (polling) until the leader's
   stream_status shows every member at its offset and commit point, and every member's files
   as long as the leader's; then read every member's log from disk and run the checker;
5. a passed round deletes its queue; a failed one leaves it for a look (`_keep`).

While the nemesis runs, a monitor thread polls the queue's leadership key in etcd, so the round
can say when a new leader was elected, and when a publish sent after the fault through another
node was first confirmed: the failover time (`Failover`). `run_rounds` runs a test's plan of
(nemesis, seed) rounds, prints each and fails the test with the failed rounds' replay commands.

Must not know: how the network is cut (the nemesis does it). Threading: the test's thread, plus
the monitor thread it starts and joins.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faults.checker import CONFIRMED, History, Verdict, Violation, check
from faults.cluster import AMQP_PORT, FaultCluster, wait_for
from faults.nemesis import NEMESES, Fault, Nemesis
from faults.storedlog import StoredLog, read_log
from faults.workload import StreamWorkload, Workload

SETTLE_S = 30.0  # a member not caught up this long after healing is stuck


def seeds(count: int) -> list[int]:
    """`count` fresh seeds, or the one LEVERET_FAULT_SEED replays."""
    replay = os.environ.get("LEVERET_FAULT_SEED")
    if replay:
        return [int(replay)]
    fresh = random.SystemRandom()
    return [fresh.randrange(2**32) for _ in range(count)]


def nemesis_of(seed: int) -> Nemesis:
    """The slow variant's nemesis for a seed (the round's own rng starts afresh from it)."""
    names = sorted(NEMESES)
    return NEMESES[names[random.Random(seed ^ 0x5EED).randrange(len(names))]]


class LeaderMonitor(threading.Thread):
    """Polls the queue's leadership key in etcd; `changes` lists (time, leader, epoch)."""

    def __init__(self, cluster: FaultCluster, stream: str) -> None:
        super().__init__(name="faults-leader-monitor", daemon=True)
        self.cluster, self.stream = cluster, stream
        self.changes: list[tuple[float, str, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                found = self.cluster.leadership(self.stream)
            except (OSError, ValueError):
                found = None
            if found is not None:
                state = (str(found["leader"]), int(found["epoch"]))
                if not self.changes or self.changes[-1][1:] != state:
                    self.changes.append((time.monotonic(), *state))
            self.done.wait(0.1)

    def stop(self) -> None:
        self.done.set()
        self.join(5)


@dataclass
class Failover:
    """From the fault to a new leader in etcd, and to the first confirm (of a publish sent after
    the fault, through a node other than the old leader); None where it did not happen while
    the fault lasted."""

    elected_s: float | None
    confirmed_s: float | None
    new_leader: str | None


@dataclass
class RoundResult:
    nemesis: str
    seed: int
    description: str = ""
    verdict: Verdict | None = None
    violations: list[Violation] = field(default_factory=list)
    failover: Failover | None = None
    leaders: list[tuple[float, str, int]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kept: str = ""  # where a failed round's queue was left (the nodes' data dirs)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        head = f"[{self.nemesis} seed={self.seed}] {self.description}"
        lines = [head, "  " + ("OK" if self.ok else "FAILED")
                 + " " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())]
        if self.failover is not None:
            f = self.failover
            lines.append(f"  failover: new leader {f.new_leader} elected after "
                         f"{_s(f.elected_s)}, first confirm through another node after "
                         f"{_s(f.confirmed_s)}")
        start = self.leaders[0][0] if self.leaders else 0.0
        lines.append("  leadership: " + ", ".join(f"{leader}/epoch {epoch} at +{t - start:.1f}s"
                                                  for t, leader, epoch in self.leaders))
        if self.verdict is not None:
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in self.verdict.stats.items()))
        if self.violations:
            counts = sorted(Counter(v.kind for v in self.violations).items())
            lines.append("  VIOLATIONS " + ", ".join(f"{k}: {n}" for k, n in counts))
            lines += [f"    {v}" for v in _sample(self.violations)]
        if self.kept:
            lines.append(f"  kept for inspection: {self.kept}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"nemesis": self.nemesis, "seed": self.seed, "description": self.description,
                "ok": self.ok, "violations": [str(v) for v in self.violations],
                "stats": self.verdict.stats if self.verdict else {},
                "failover": asdict(self.failover) if self.failover else None,
                "seconds": self.seconds}


def _sample(violations: list[Violation], per_kind: int = 4) -> list[Violation]:
    """The first few violations of each kind."""
    shown: Counter[str] = Counter()
    out = []
    for v in violations:
        shown[v.kind] += 1
        if shown[v.kind] <= per_kind:
            out.append(v)
    return out


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


WorkloadFactory = Callable[[dict[str, tuple[str, int]], str], Workload]
# after the workload stopped, in a recovered cluster: settle, check, and add the verdict, its
# violations and the seconds spent to the result; the node to delete the queue through
Verify = Callable[[FaultCluster, Any, History, Fault | None, RoundResult], str]


@dataclass(frozen=True)
class RoundKind:
    """What a round of one kind of queue does its own way."""

    prefix: str  # the round's queue is <prefix>-<nemesis>-<seed>
    make_workload: WorkloadFactory
    verify: Verify
    keep_prefix: str = ""  # a failed round is kept as <keep_prefix><nemesis>-<seed>
    # the replicated queue whose leader the nemesis strikes and the monitor watches, named
    # from the round's queue: the queue itself, or (a delayed exchange's round) the hidden
    # log that holds the exchange's messages
    subject: Callable[[str], str] = lambda queue: queue


def verify_stream(cluster: FaultCluster, workload: Workload, history: History,
                  _fault: Fault | None, result: RoundResult) -> str:
    """Settle the stream, read every member's log and run the checker; its leader."""
    stream = workload.queue
    settle_started = time.monotonic()
    leader, committed, unsettled = settle(cluster, stream)
    result.seconds["settle"] = time.monotonic() - settle_started
    result.violations += unsettled
    members = {name: read_log(cluster.stream_dir(name, stream)) for name in cluster.names}
    result.verdict = check(history, members, leader, committed, workload.decode)
    result.violations += result.verdict.violations
    return leader


STREAM = RoundKind("faults", StreamWorkload, verify_stream)


def run_round(cluster: FaultCluster, nemesis: Nemesis, seed: int,
              kind: RoundKind = STREAM) -> RoundResult:
    rng = random.Random(seed)
    result = RoundResult(nemesis.name, seed)
    clock = time.monotonic
    started = clock()
    result.seconds["restore"] = cluster.restore()
    queue = f"{kind.prefix}-{nemesis.name}-{seed}"
    endpoints = {name: (node.ns.ip, AMQP_PORT) for name, node in cluster.nodes.items()}
    workload = kind.make_workload(endpoints, queue)
    declared_on = rng.choice(cluster.names)
    workload.declare(declared_on)
    subject = kind.subject(queue)
    result.violations += _placement(cluster, queue)
    if subject != queue:
        result.violations += _placement(cluster, subject)
    monitor = LeaderMonitor(cluster, subject)
    monitor.start()
    workload.start()
    fault: Fault | None = None
    try:
        time.sleep(rng.uniform(1.0, 2.0))
        leader = cluster.leader_of(subject) or declared_on
        fault = nemesis.inflict(cluster, leader, rng)
        result.description = f"{fault.description}; clients {workload.paths()}"
        result.seconds["fault"] = fault.healed_at - fault.applied_at
        result.seconds["recover"] = cluster.restore()
        time.sleep(rng.uniform(1.0, 2.0))  # the clients see the healed cluster
    except (AssertionError, RuntimeError) as exc:  # a node did not come back, or not linked
        result.violations.append(Violation("unrecovered", f"after healing: {exc}"))
    finally:
        history = workload.stop()
        monitor.stop()
    result.leaders = monitor.changes
    result.notes = history.notes
    if fault is not None and fault.majority_cut:
        result.failover = failover(fault, monitor.changes, history)
    if any(v.kind == "unrecovered" for v in result.violations):  # the next round restores
        result.seconds["round"] = clock() - started
        _record(result)
        return result
    via = kind.verify(cluster, workload, history, fault, result)
    if result.ok:
        _cleanup(workload, cluster, via)
    else:  # left as it is, for a look at the members' files and the nodes' logs
        result.kept = _keep(cluster, queue, f"{kind.keep_prefix}{nemesis.name}-{seed}")
    result.seconds["round"] = clock() - started
    _record(result)
    return result


def plan(count: int, nemesis: str | None = None) -> list[tuple[Nemesis, int]]:
    """`count` rounds (their seeds from `seeds`) of the named nemesis, or, with None, each of
    a nemesis drawn from its seed (the slow variants')."""
    return [(NEMESES[nemesis] if nemesis else nemesis_of(seed), seed) for seed in seeds(count)]


def run_rounds(cluster: FaultCluster, rounds: list[tuple[Nemesis, int]], replay: str,
               everything: list[RoundResult], kind: RoundKind = STREAM) -> None:
    """Every round of the plan, each printed as it ends; the test fails with every failed
    round's report and the command that replays it."""
    results: list[RoundResult] = []
    for n, (nemesis, seed) in enumerate(rounds, start=1):
        print(f"\nround {n}/{len(rounds)}: {nemesis.name}, seed {seed}", flush=True)
        result = run_round(cluster, nemesis, seed, kind)
        print(result.report(), flush=True)
        for note in result.notes:
            if note.startswith(("duplicate ", "dirty read ")):
                print(f"  {note}")
        results.append(result)
        everything.append(result)
    failed = [r for r in results if not r.ok]
    times = [r.failover.confirmed_s for r in results
             if r.failover is not None and r.failover.confirmed_s is not None]
    print(f"\n{len(results) - len(failed)} of {len(results)} rounds passed; failover to a "
          f"confirm: {', '.join(f'{t:.2f}s' for t in times) or 'none seen'}", flush=True)
    assert not failed, "\n\n".join(
        r.report() + f"\n  replay: LEVERET_FAULT_SEED={r.seed} {replay}" for r in failed)


def _placement(cluster: FaultCluster, queue: str) -> list[Violation]:
    """The queue got every node as a member (its initial size is the node count)."""
    record = cluster.queue_record(queue)
    members = list(record.get("members", [])) if record else []
    if sorted(members) != cluster.names:
        return [Violation("placement", f"{queue} declared with {len(cluster.names)} members "
                                       f"has {members}")]
    return []


def failover(fault: Fault, leaders: list[tuple[float, str, int]], history: History) -> Failover:
    elected = next(((t, leader) for t, leader, _epoch in leaders
                    if fault.applied_at <= t <= fault.healed_at and leader != fault.old_leader),
                   None)
    if elected is None:
        return Failover(None, None, None)
    confirms = [p.settled_at for p in history.publishes
                if p.outcome == CONFIRMED and p.node != fault.old_leader and p.settled_at
                and p.sent_at >= fault.applied_at and elected[0] <= p.settled_at]
    return Failover(elected[0] - fault.applied_at,
                    min(confirms) - fault.applied_at if confirms else None, elected[1])


def settle(cluster: FaultCluster, stream: str) -> tuple[str, int, list[Violation]]:
    """Wait until every member holds the leader's log and its commit point; (leader, commit
    point, [a violation if it never did])."""
    state: dict[str, Any] = {}

    def settled() -> bool:
        leader = cluster.leader_of(stream)
        if leader is None:
            return False
        status = cluster.stream_status(stream, leader)
        rows = {row["node"]: row for row in status["members"]}
        state.update(leader=leader, rows=rows)
        writer = rows.get(leader)
        if writer is None or sorted(rows) != cluster.names:
            return False
        if writer["committed_offset"] != writer["offset"]:
            return False
        if any(row["offset"] != writer["offset"] or row["committed_offset"] != writer["offset"]
               for row in rows.values()):
            return False
        lengths = {read_log(cluster.stream_dir(n, stream)).next_offset for n in cluster.names}
        return lengths == {writer["offset"] + 1}

    try:
        wait_for(settled, SETTLE_S, "unsettled", interval=0.2)
    except AssertionError:
        rows = json.dumps(state.get("rows"), sort_keys=True)
        leader = state.get("leader") or cluster.leader_of(stream) or cluster.names[0]
        logs: dict[str, StoredLog] = {n: read_log(cluster.stream_dir(n, stream))
                                      for n in cluster.names}
        ends = {n: log.next_offset for n, log in logs.items()}
        committed = _committed(state, leader)
        return leader, committed, [Violation("unsettled", (
            f"not settled {SETTLE_S:.0f} s after healing: leader {leader}, members' ends on "
            f"disk {ends}, stream_status rows {rows}"))]
    return state["leader"], _committed(state, state["leader"]), []


def _committed(state: dict[str, Any], leader: str) -> int:
    row = (state.get("rows") or {}).get(leader)
    return int(row["committed_offset"]) if row else -1


def _keep(cluster: FaultCluster, stream: str, label: str) -> str:
    """Where a failed round's members and the nodes' logs are: copied under
    $LEVERET_FAULT_KEEP/<nemesis>-<seed>/ when that is set (pytest's own temporary folders are
    pruned by later runs), else left in the nodes' data dirs."""
    keep = os.environ.get("LEVERET_FAULT_KEEP")
    if not keep:
        return ", ".join(f"{n}: {cluster.stream_dir(n, stream)} (log {cluster.nodes[n].log_path})"
                         for n in cluster.names)
    target = Path(keep) / label
    for name in cluster.names:
        shutil.copytree(cluster.stream_dir(name, stream), target / name / "stream",
                        dirs_exist_ok=True)
        shutil.copy2(cluster.nodes[name].log_path, target / name / "leveret.log")
    return str(target)


def _cleanup(workload: Workload, cluster: FaultCluster, leader: str) -> None:
    """Delete the round's queue, so later rounds' nemeses move only their own."""
    try:
        workload.delete(leader if cluster.nodes[leader].alive else cluster.names[0])
    except Exception as exc:  # noqa: BLE001 - a leftover stream only costs a little
        print(f"  (could not delete the round's stream: {exc!r})")


def _record(result: RoundResult) -> None:
    """Append the round to $LEVERET_FAULT_REPORT (JSON lines), when set."""
    path = os.environ.get("LEVERET_FAULT_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(result.as_json()) + "\n")


def failover_table(results: list[RoundResult]) -> str:
    """Per nemesis: rounds, failed rounds (with seeds), and the failover times seen."""
    lines = ["nemesis              rounds failed  elected (s)            first confirm (s)"]
    for name in sorted({r.nemesis for r in results}):
        mine = [r for r in results if r.nemesis == name]
        failed = [r.seed for r in mine if not r.ok]
        elected = [r.failover.elected_s for r in mine if r.failover and r.failover.elected_s]
        confirmed = [r.failover.confirmed_s for r in mine
                     if r.failover and r.failover.confirmed_s]
        lines.append(f"{name:<20} {len(mine):>6} {len(failed):>6}  {_spread(elected):<22} "
                     f"{_spread(confirmed)}" + (f"  failed seeds {failed}" if failed else ""))
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.2f} (max {ordered[-1]:.2f}, n={len(values)})"
