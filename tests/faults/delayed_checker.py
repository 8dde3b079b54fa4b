"""The delayed-message checker: what a delayed exchange's publishers were told against what the
target queue's consumers got, and when.

Role: a pure function over a `DelayedHistory` (every publish with its outcome and due time;
every delivery with its `redelivered` flag and time, during the round and in the final drain),
the count of each id's records in the target queue's log once its members agree, and the
fault's times. A round's violations:

- lost: a confirmed id no consumer was ever given, not even in the final drain (a confirm of a
  delayed publish is a promise that a majority of the log's members hold it);
- unexpected: a delivery of an id nobody sent, or of a body not the workload's;
- routed-twice: an id given a second time without the `redelivered` flag (a quorum queue's
  `redelivered` false means never delivered before: docs/QUORUM-QUEUES.md, so a fresh second
  delivery is a second copy), or an id the target queue's log holds more than once (the
  copy's `x-leveret-delayed-id` did not stop it). A repeat with the flag (a consumer's channel
  died with it unacked) is counted (`redelivered`), never a failure;
- early: an id first given before its due time (less `TOLERANCE_S`: the due time is taken on
  the clients' clock when the publish is sent, before the broker sees it);
- late: a confirmed id first given more than `late_s` after its due time or, for one due
  before the cluster recovered, after it recovered (the stated bound after a heal).

Nacked or unconfirmed ids may arrive or not (counted). The figures: the worst lateness of a
first delivery (ms), the worst after recovery, and how many confirmed ids fell due while the
fault was in force.

Must not know: brokers, networks, pika. Threading: none; pure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from faults.checker import CONFIRMED, NACKED, UNCONFIRMED, Verdict, Violation
from faults.delayed_workload import LATE_S, DelayedHistory
from faults.queue_checker import DRAIN, Dequeue

TOLERANCE_S = 0.25


@dataclass(frozen=True)
class Times:
    """When the fault was applied and healed, and when the cluster was whole again (clients'
    clock); None where there was no fault."""

    applied_at: float | None = None
    healed_at: float | None = None
    recovered_at: float | None = None


def check_delayed(history: DelayedHistory, stored: Counter[str] | None = None,
                  times: Times = Times(), late_s: float = LATE_S) -> Verdict:
    """Every violation of the delayed workload's invariants, and the round's counts."""
    sent = {p.id: p for p in history.publishes}
    confirmed = [p for p in history.publishes if p.outcome == CONFIRMED]
    first: dict[str, Dequeue] = {}
    violations: list[Violation] = []
    routed_twice: set[str] = set()
    redelivered = 0
    for d in sorted(history.dequeues, key=lambda d: d.at):
        if d.id is None or d.id not in sent:
            violations.append(Violation("unexpected", f"{d.consumer} via {d.node} ({d.phase}) "
                                                      f"was given {d.id!r}, which nobody sent"))
            continue
        if d.id not in first:
            first[d.id] = d
        elif d.redelivered:
            redelivered += 1
        elif d.id not in routed_twice:
            routed_twice.add(d.id)
            f = first[d.id]
            violations.append(Violation("routed-twice", (
                f"{d.id} given fresh (not redelivered) to {d.consumer} via {d.node} ({d.phase}) "
                f"at +{d.at - f.at:.2f} s after its first delivery to {f.consumer} via "
                f"{f.node} ({f.phase})")))
    stored_twice = sorted(i for i, n in (stored or Counter()).items() if n > 1)
    violations += [Violation("routed-twice", f"{i} is stored {stored[i]} times in the target "
                                             "queue's log") for i in stored_twice if stored]
    violations += [Violation("lost", f"{p.id} (sent via {p.node}, confirmed, due "
                                     f"{history.due.get(p.id, 0.0) - p.sent_at:.1f} s after "
                                     "sending) was never delivered, not even in the final drain")
                   for p in confirmed if p.id not in first]
    late, after_recovery = 0.0, 0.0
    for id_, d in first.items():
        due = history.due.get(id_)
        if due is None:
            continue
        if d.at < due - TOLERANCE_S:
            violations.append(Violation("early", f"{id_} given to {d.consumer} via {d.node} "
                                                 f"{due - d.at:.2f} s before its due time"))
        if sent[id_].outcome != CONFIRMED:
            continue
        late = max(late, d.at - due)
        since = max(due, times.recovered_at or due)
        after_recovery = max(after_recovery, d.at - since)
        if d.at - since > late_s:
            violations.append(Violation("late", (
                f"{id_} first given {d.at - due:.1f} s after its due time"
                + (f", {d.at - since:.1f} s after the cluster recovered" if since != due else "")
                + f": more than the bound, {late_s:.0f} s")))
    in_fault = 0
    if times.applied_at is not None and times.healed_at is not None:
        in_fault = sum(times.applied_at <= history.due.get(p.id, -1.0) <= times.healed_at
                       for p in confirmed)
    stats = {
        "sent": len(history.publishes),
        "confirmed": len(confirmed),
        "nacked": sum(p.outcome == NACKED for p in history.publishes),
        "unconfirmed": sum(p.outcome == UNCONFIRMED for p in history.publishes),
        "due_in_fault": in_fault,
        "delivered": len(history.dequeues),
        "drained": sum(d.phase == DRAIN for d in history.dequeues),
        "lost": sum(v.kind == "lost" for v in violations),
        "routed_twice": len(routed_twice | set(stored_twice)),
        "stored_twice": len(stored_twice),
        "redelivered": redelivered,
        "early": sum(v.kind == "early" for v in violations),
        "late": sum(v.kind == "late" for v in violations),
        "worst_late_ms": round(late * 1000),
        "worst_late_after_recovery_ms": round(after_recovery * 1000),
        "unconfirmed_but_delivered": sum(p.outcome != CONFIRMED and p.id in first
                                         for p in history.publishes),
    }
    return Verdict(violations, stats)
