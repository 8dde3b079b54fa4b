"""A fault round's verdict for a delayed exchange (`DELAYED`, the `RoundKind` that rounds.py's
`run_round` runs for delayed messages), and the delayed counts per nemesis.

The round is rounds.py's: restore, declare the workload of delayed_workload.py (a delayed
exchange, whose hidden log gets every node as a member, and its target quorum queue), start it,
inflict the nemesis on the leader of the exchange's log (`subject`: the node that holds and
routes the messages), heal, stop the clients (the consumers go on until what was sent fell
due). Then `verify_delayed`:

1. drain: empty the target queue through every node (queue_workload's final drain);
2. settle: wait until every member's log of the target queue is the same, chunk for chunk, and
   count each id's records there (a copy stored twice is a copy routed twice that the queue
   did not drop);
3. the delayed checker (delayed_checker.py), with the fault's times for the lateness bound.

Must not know: how the network is cut (the nemesis does it). Threading: the test's thread.
"""

from __future__ import annotations

import time
from collections import Counter

from faults.checker import Violation
from faults.cluster import FaultCluster
from faults.delayed_checker import Times, check_delayed
from faults.delayed_workload import DelayedHistory, DelayedWorkload, subject
from faults.nemesis import Fault
from faults.queue_checker import duplicates
from faults.queue_rounds import _dump, settle_members
from faults.queue_workload import decode
from faults.rounds import RoundKind, RoundResult
from faults.storedlog import StoredLog

from leveret.storage.chunk import ChunkType


def verify_delayed(cluster: FaultCluster, workload: DelayedWorkload, history: DelayedHistory,
                   fault: Fault | None, result: RoundResult) -> str:
    """Drain the target queue, settle its members, count its stored copies and run the delayed
    checker; the node to delete the queue and exchange through."""
    queue = workload.queue
    fallback = workload.target_on or cluster.names[0]
    drain_started = time.monotonic()
    result.violations += [Violation("undrained", p)
                          for p in workload.drain(cluster.leader_of(queue) or fallback)]
    result.seconds["drain"] = time.monotonic() - drain_started
    settle_started = time.monotonic()
    logs, unsettled = settle_members(cluster, queue)
    result.violations += unsettled
    result.seconds["settle"] = time.monotonic() - settle_started
    times = Times() if fault is None else Times(
        fault.applied_at, fault.healed_at, fault.healed_at + result.seconds.get("recover", 0.0))
    result.verdict = check_delayed(history, stored_copies(logs), times)
    result.violations += result.verdict.violations
    result.notes += [f"duplicate {d}" for d in duplicates(history)]
    _dump(history, fault, result)
    return cluster.leader_of(queue) or fallback


def stored_copies(logs: dict[str, StoredLog]) -> Counter[str]:
    """Each id's message records in one member's log of the target queue (the members agree
    once settled; a log whose head was deleted counts only what it still holds)."""
    log = next(iter(logs.values()), None)
    if log is None:
        return Counter()
    return Counter(i for chunk in log.chunks if chunk.chunk_type == ChunkType.USER
                   for i in map(decode, chunk.records) if i is not None)


DELAYED = RoundKind("dfaults", DelayedWorkload, verify_delayed, keep_prefix="delayed-",
                    subject=subject)


def delayed_table(results: list[RoundResult]) -> str:
    """Per nemesis: rounds, failed, the summed delayed counts and the worst lateness."""
    keys = ["confirmed", "due_in_fault", "lost", "routed_twice", "stored_twice", "redelivered",
            "early", "unconfirmed_but_delivered"]
    lines = ["nemesis              rounds failed " + " ".join(f"{k:>12.12}" for k in keys)
             + "  worst late (s)  after recovery (s)"]
    for name in sorted({r.nemesis for r in results}):
        mine = [r for r in results if r.nemesis == name]
        sums: Counter[str] = Counter()
        worst, after = 0, 0
        for r in mine:
            if r.verdict is not None:
                sums.update({k: r.verdict.stats.get(k, 0) for k in keys})
                worst = max(worst, r.verdict.stats.get("worst_late_ms", 0))
                after = max(after, r.verdict.stats.get("worst_late_after_recovery_ms", 0))
        failed = sum(not r.ok for r in mine)
        lines.append(f"{name:<20} {len(mine):>6} {failed:>6} "
                     + " ".join(f"{sums[k]:>12}" for k in keys)
                     + f"  {worst / 1000:>14.2f}  {after / 1000:>17.2f}")
    return "\n".join(lines)
