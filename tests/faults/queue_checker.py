"""The total-queue checker: what a queue's publishers were told against what its consumers got.

Role: pure functions over a `QueueHistory` (every publish with its outcome, as the stream
workload records it; every delivery a consumer was given, during the round and in the final
drain). It is Jepsen's `total-queue` check, on ids that are each sent once:

- lost: a confirmed id that no consumer was ever given, even after the final drain (a failure:
  a confirm is a promise that the message is on a majority of the members);
- unexpected: a delivery of an id nobody sent, or of a body that is not the workload's (a
  failure: the queue made a message up, or delivered another queue's);
- duplicates: an id given more than once (a consumer's connection lost with deliveries unacked,
  an ack lost in a failover, a new leader that had not yet committed the delivery or the
  settlement): counted and reported, never a failure, since a quorum queue delivers at least
  once. A repeat delivery without the `redelivered` flag is counted apart;
- recovered: a nacked or unconfirmed id that was delivered anyway (its outcome was unknown to
  the client): counted;
- order (only when asked, for a workload with one consumer at a time): per publisher, the
  first deliveries of its ids in the order AMQP promises them (on one channel, in the order
  sent; an id sent after another was confirmed, after it), as checker.py checks a stream's log.

Must not know: brokers, networks, pika. Threading: none; pure.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from faults.checker import CONFIRMED, NACKED, UNCONFIRMED, History, Verdict, Violation, _order

RUN, DRAIN = "run", "drain"


@dataclass(frozen=True)
class Dequeue:
    """A message a consumer was given (and acked after this was recorded)."""

    consumer: str
    node: str
    id: str | None  # None: the body was not one of the workload's
    redelivered: bool
    at: float
    phase: str = RUN  # RUN: while the nemesis ran; DRAIN: the final drain


@dataclass
class QueueHistory(History):
    dequeues: list[Dequeue] = field(default_factory=list)


def check_total_queue(history: QueueHistory, ordered: bool = False) -> Verdict:
    """Every violation of the total-queue invariants, and the round's counts."""
    sent = {p.id: p for p in history.publishes}
    given = Counter(d.id for d in history.dequeues)
    violations = [Violation("lost", f"{p.id} (sent via {p.node}, confirmed) was never delivered, "
                                    "not even in the final drain")
                  for p in history.publishes if p.outcome == CONFIRMED and p.id not in given]
    violations += [Violation("unexpected", f"{d.consumer} via {d.node} ({d.phase}) was given "
                                           f"{d.id!r}, which nobody sent")
                   for d in history.dequeues if d.id is None or d.id not in sent]
    if ordered:
        violations += _order(history.publishes, first_deliveries(history.dequeues),
                             place="first delivery", stored="delivered")
    seen: set[str | None] = set()
    unflagged = 0
    for d in sorted(history.dequeues, key=lambda d: d.at):
        if d.id in seen and not d.redelivered:
            unflagged += 1
        seen.add(d.id)
    stats = {
        "sent": len(history.publishes),
        "confirmed": sum(p.outcome == CONFIRMED for p in history.publishes),
        "nacked": sum(p.outcome == NACKED for p in history.publishes),
        "unconfirmed": sum(p.outcome == UNCONFIRMED for p in history.publishes),
        "delivered": len(history.dequeues),
        "drained": sum(d.phase == DRAIN for d in history.dequeues),
        "lost": sum(v.kind == "lost" for v in violations),
        "duplicated_ids": sum(1 for n in given.values() if n > 1),
        "duplicate_deliveries": sum(n - 1 for n in given.values() if n > 1),
        "unflagged_redeliveries": unflagged,
        "nacked_but_delivered": sum(p.outcome == NACKED and p.id in given
                                    for p in history.publishes),
        "unconfirmed_but_delivered": sum(p.outcome == UNCONFIRMED and p.id in given
                                         for p in history.publishes),
    }
    return Verdict(violations, stats)


def first_deliveries(dequeues: list[Dequeue]) -> dict[str, int]:
    """Each id's rank among first deliveries, in the order they were given (one consumer at a
    time: its order is the queue's)."""
    rank: dict[str, int] = {}
    for d in sorted(dequeues, key=lambda d: d.at):
        if d.id is not None and d.id not in rank:
            rank[d.id] = len(rank)
    return rank


def duplicates(history: QueueHistory, limit: int = 5) -> list[str]:
    """A few duplicated ids with where each was given, for a round's report."""
    given: dict[str, list[Dequeue]] = {}
    for d in history.dequeues:
        if d.id is not None:
            given.setdefault(d.id, []).append(d)
    out = []
    for id_, ds in given.items():
        if len(ds) > 1:
            where = ", ".join(f"{d.consumer}@{d.node}/{d.phase}{'/r' if d.redelivered else ''}"
                              for d in sorted(ds, key=lambda d: d.at))
            out.append(f"{id_}: {where}")
            if len(out) >= limit:
                break
    return out
