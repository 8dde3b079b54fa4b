"""A fault round's verdict for a quorum queue (`QUORUM`, the `RoundKind` that rounds.py's
`run_round` runs for a quorum queue), and the total-queue counts per nemesis.

The round is rounds.py's (restore, declare with every node a member, run the workload of
queue_workload.py, inflict the nemesis on the queue's leader, heal, stop the clients: their
unacked deliveries go back to the queue). Then `verify_queue`:

1. drain: empty the queue through every node, recording what comes out;
2. settle: wait (polling) until every member's log on disk is the same, chunk for chunk (the
   drain's settlements included), and run the total-queue checker (queue_checker.py).

A round fails on a confirmed id never delivered (lost), a delivery of an id nobody sent
(unexpected), a queue that cannot be drained (undrained), members whose logs are not the same
30 s after the drain (unsettled), a corrupt chunk, a queue placed on fewer members than
declared, a cluster that does not recover after healing (unrecovered), and, for a workload with
one consumer, a publisher's order broken in the first deliveries. Duplicates are counted.

Must not know: how the network is cut (the nemesis does it). Threading: the test's thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from faults.checker import Violation, _divergence
from faults.cluster import FaultCluster, wait_for
from faults.nemesis import Fault
from faults.queue_checker import QueueHistory, check_total_queue, duplicates
from faults.queue_workload import QuorumWorkload
from faults.rounds import SETTLE_S, RoundKind, RoundResult
from faults.storedlog import StoredLog, read_log

from leveret.storage.chunk import ChunkType

# A delivery of a message that was never committed (the leader gave it to a consumer, then lost
# it with its uncommitted tail) is counted as `delivered_never_stored`, and fails the round: a
# quorum queue delivers only what a majority holds
# (test_a_quorum_queue_delivers_only_what_a_majority_holds).
DIRTY_READS_FAIL = True


def verify_queue(cluster: FaultCluster, workload: QuorumWorkload, history: QueueHistory,
                 fault: Fault | None, result: RoundResult) -> str:
    """Drain the queue, settle its members, run the total-queue checker and look for dirty
    reads; the node to delete the queue through."""
    queue = workload.queue
    fallback = workload.declared_on or cluster.names[0]
    drain_started = time.monotonic()
    leader = cluster.leader_of(queue) or fallback
    result.violations += [Violation("undrained", p) for p in workload.drain(leader)]
    result.seconds["drain"] = time.monotonic() - drain_started
    settle_started = time.monotonic()
    logs, unsettled = settle_members(cluster, queue)
    result.violations += unsettled
    result.seconds["settle"] = time.monotonic() - settle_started
    result.verdict = check_total_queue(history, ordered=workload.ordered)
    result.violations += result.verdict.violations
    reads = dirty_reads(history, logs, workload.decode)
    result.verdict.stats["delivered_never_stored"] = len(reads)
    if DIRTY_READS_FAIL:
        result.violations += reads
    result.notes += [f"dirty read {v.detail}" for v in reads[:5]]
    result.notes += [f"duplicate {d}" for d in duplicates(history)]
    _dump(history, fault, result)
    return cluster.leader_of(queue) or fallback


QUORUM = RoundKind("qfaults", QuorumWorkload, verify_queue, keep_prefix="quorum-")


def _dump(history: QueueHistory, fault: Fault | None, result: RoundResult) -> None:
    """Write the round's whole history (every publish and delivery, the clients' notes, the
    fault's times and the leaders seen) to $LEVERET_FAULT_HISTORY/<nemesis>-<seed>.json, when
    that is set: what a report of a lost message or of odd duplicates needs."""
    folder = os.environ.get("LEVERET_FAULT_HISTORY")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    data = {"nemesis": result.nemesis, "seed": result.seed, "description": result.description,
            "fault": asdict(fault) if fault is not None else None, "leaders": result.leaders,
            "publishes": [asdict(p) for p in history.publishes],
            "dequeues": [asdict(d) for d in history.dequeues], "notes": history.notes}
    path = Path(folder) / f"{result.nemesis}-{result.seed}.json"
    path.write_text(json.dumps(data))


def _digest(log: StoredLog) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for chunk in log.chunks:
        digest.update(chunk.raw)
    return digest.hexdigest()


def settle_members(cluster: FaultCluster,
                   queue: str) -> tuple[dict[str, StoredLog], list[Violation]]:
    """Wait until every member's log on disk is the same, chunk for chunk; (the members' logs,
    the violations: a corrupt chunk, or members still apart after SETTLE_S)."""
    logs: dict[str, StoredLog] = {}

    def same() -> bool:
        logs.clear()
        logs.update({n: read_log(cluster.stream_dir(n, queue)) for n in cluster.names})
        return len({_digest(log) for log in logs.values()}) == 1

    try:
        wait_for(same, SETTLE_S, "unsettled", interval=0.3)
    except AssertionError:
        leader = cluster.leader_of(queue) or cluster.names[0]
        ends = {n: (len(log.chunks), log.next_offset) for n, log in sorted(logs.items())}
        apart = [str(v) for v in _divergence(logs, leader, logs[leader].chunks)] if logs else []
        return logs, [Violation("unsettled", (
            f"members' logs not the same {SETTLE_S:.0f} s after the drain: leader {leader}, "
            f"(chunks, next offset) {ends}; " + "; ".join(apart)))]
    return logs, [Violation("corrupt", f"{name}: {p}")
                  for name, log in sorted(logs.items()) for p in log.problems]


def dirty_reads(history: QueueHistory, logs: dict[str, StoredLog],
                decode: Callable[[bytes], str | None]) -> list[Violation]:
    """Deliveries of ids that no member's log holds once the members agree: given to a
    consumer before they were committed, then cut from the log (a quorum queue must deliver
    only what a majority holds). Nothing when a member's log lost its head to the deletion of
    settled segments (a record there would be missing for that reason)."""
    if not logs or any(log.chunks and log.chunks[0].first_offset for log in logs.values()):
        return []
    stored = {decode(record) for log in logs.values() for chunk in log.chunks
              if chunk.chunk_type == ChunkType.USER for record in chunk.records}
    reported: set[str] = set()
    out = []
    for d in history.dequeues:
        if d.id is not None and d.id not in stored and d.id not in reported:
            reported.add(d.id)
            out.append(Violation("dirty-read", (
                f"{d.id} was given to {d.consumer} via {d.node} ({d.phase}) and is in no "
                "member's log")))
    return out


def totals_table(results: list[RoundResult]) -> str:
    """Per nemesis: rounds, failed, and the summed counts of the total-queue checker."""
    keys = ["confirmed", "lost", "duplicated_ids", "duplicate_deliveries",
            "unflagged_redeliveries", "nacked_but_delivered", "unconfirmed_but_delivered",
            "delivered_never_stored"]
    lines = ["nemesis              rounds failed " + " ".join(f"{k:>12.12}" for k in keys)]
    for name in sorted({r.nemesis for r in results}):
        mine = [r for r in results if r.nemesis == name]
        sums: Counter[str] = Counter()
        for r in mine:
            if r.verdict is not None:
                sums.update(r.verdict.stats)
        failed = sum(not r.ok for r in mine)
        lines.append(f"{name:<20} {len(mine):>6} {failed:>6} "
                     + " ".join(f"{sums[k]:>12}" for k in keys))
    return "\n".join(lines)
