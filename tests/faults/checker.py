"""The checker: what a round's clients saw against what every member of the stream holds.

Role: pure functions over data. The workload records a `History` (every publish with its
outcome, every delivery with its offset); the round reads every member's log from disk
(storedlog.py) and asks the leader for its commit point once the cluster has settled. `check`
then returns every `Violation` of the invariants docs/REPLICATION.md states:

- lost: a confirmed id absent from the final committed log (the leader's log up to its commit
  point);
- duplicate: an id stored twice in it;
- order: a publisher's messages out of order in it: two ids sent on one channel (AMQP orders a
  channel's publishes), or an id sent after an earlier one was confirmed, stored before it;
- diverged: a member whose log is not byte-identical to the leader's up to the commit point
  (chunk by chunk: epochs, offsets, records and CRCs), or that lacks part of it;
- dirty-read: a consumer delivered, at some offset, anything but what the final committed log
  holds there (an entry that was never committed, or was cut);
- gap: a consumer (reading from `first`, resuming after its last offset when it reconnects)
  that skipped offsets: committed entries it was never given. Offsets delivered again (a
  resumed reader starts at its chunk's start, as RabbitMQ's) are not gaps;
- phantom: an entry in the committed log that no publisher sent; corrupt: a chunk whose CRC
  fails, or a segment file that cannot be read.

Nacked or unconfirmed ids that are stored anyway are counted, not failed: a nack or a lost
connection leaves the outcome unknown to the client, as in RabbitMQ.

Must not know: brokers, networks, how records are encoded (`decode` is the workload's).
Threading: none; pure.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from faults.storedlog import StoredChunk, StoredLog

CONFIRMED, NACKED, UNCONFIRMED = "confirmed", "nacked", "unconfirmed"


@dataclass
class Publish:
    """One message sent once: its id, who sent it (in `seq` order), on which channel, when, and
    what came back (`outcome`, at `settled_at`)."""

    id: str
    publisher: str
    seq: int
    channel: int
    node: str
    sent_at: float
    outcome: str = UNCONFIRMED
    settled_at: float | None = None


@dataclass(frozen=True)
class Delivery:
    """A message a consumer was given: at which offset, through which node."""

    consumer: str
    node: str
    offset: int
    id: str | None  # None: the body was not one of the workload's
    at: float


@dataclass
class History:
    publishes: list[Publish] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # client errors, for the report


@dataclass(frozen=True)
class Violation:
    kind: str  # lost | duplicate | order | diverged | dirty-read | gap | phantom | corrupt
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Verdict:
    violations: list[Violation]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self, limit: int = 12) -> str:
        counts = Counter(v.kind for v in self.violations)
        lines = [", ".join(f"{k}={v}" for k, v in self.stats.items())]
        if counts:
            lines.append("VIOLATIONS " + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())))
            lines += [f"  {v}" for v in self.violations[:limit]]
            if len(self.violations) > limit:
                lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)


Decode = Callable[[bytes], "str | None"]


def compared_prefix(log: StoredLog, committed: int) -> list[StoredChunk]:
    """The chunks up to and including the last one whose records are all committed (with the
    tracking chunks between them): what every member must hold byte for byte."""
    chunks = log.committed_chunks(committed)
    while chunks and not chunks[-1].num_records:
        chunks.pop()  # a trailing tracking chunk may be written after the commit point
    return chunks


def check(history: History, members: dict[str, StoredLog], leader: str, committed: int,
          decode: Decode) -> Verdict:
    """Every violation of the invariants, given each member's log, the leader's name and its
    commit point after the cluster settled."""
    violations: list[Violation] = []
    for name, log in sorted(members.items()):
        violations += [Violation("corrupt", f"{name}: {p}") for p in log.problems]
    final = compared_prefix(members[leader], committed)
    violations += _divergence(members, leader, final)
    entries = [(chunk.first_offset + i, record) for chunk in final if chunk.records
               for i, record in enumerate(chunk.records)]
    log_ids = [(offset, decode(record)) for offset, record in entries]
    sent = {p.id: p for p in history.publishes}
    violations += _phantoms(log_ids, sent)
    position: dict[str, int] = {}
    for offset, id_ in log_ids:
        if id_ is not None:
            position.setdefault(id_, offset)
    violations += _lost(history.publishes, position)
    violations += _duplicates(log_ids)
    violations += _order(history.publishes, position)
    violations += _dirty_reads(history.deliveries, dict(log_ids))
    violations += _gaps(history.deliveries, first=log_ids[0][0] if log_ids else 0)
    stored = set(position)
    stats = {
        "sent": len(history.publishes),
        "confirmed": sum(p.outcome == CONFIRMED for p in history.publishes),
        "nacked": sum(p.outcome == NACKED for p in history.publishes),
        "unconfirmed": sum(p.outcome == UNCONFIRMED for p in history.publishes),
        "committed_entries": len(log_ids),
        "nacked_but_stored": sum(p.outcome == NACKED and p.id in stored
                                 for p in history.publishes),
        "unconfirmed_but_stored": sum(p.outcome == UNCONFIRMED and p.id in stored
                                      for p in history.publishes),
        "deliveries": len(history.deliveries),
    }
    return Verdict(violations, stats)


def _divergence(members: dict[str, StoredLog], leader: str,
                final: list[StoredChunk]) -> list[Violation]:
    out = []
    for name, log in sorted(members.items()):
        if name == leader:
            continue
        theirs = log.chunks[:len(final)]
        for i, (mine, other) in enumerate(zip(final, theirs, strict=False)):
            if mine.raw != other.raw:
                out.append(Violation("diverged", (
                    f"{name} differs from the leader {leader} at chunk {i}: leader has "
                    f"{_describe(mine)}, {name} has {_describe(other)}")))
                break
        else:
            if len(theirs) < len(final):
                missing = final[len(theirs)]
                out.append(Violation("diverged", (
                    f"{name} lacks committed chunks from chunk {len(theirs)} "
                    f"({_describe(missing)}); it ends at offset {log.next_offset}")))
    return out


def _describe(chunk: StoredChunk) -> str:
    return (f"type {chunk.chunk_type} epoch {chunk.epoch} offsets {chunk.first_offset}.."
            f"{chunk.next_offset - 1} ({len(chunk.raw)} bytes)")


def _phantoms(log_ids: list[tuple[int, str | None]], sent: dict[str, Publish]) -> list[Violation]:
    return [Violation("phantom", f"offset {offset} holds {id_!r}, which nobody sent")
            for offset, id_ in log_ids if id_ is None or id_ not in sent]


def _lost(publishes: Iterable[Publish], position: dict[str, int]) -> list[Violation]:
    return [Violation("lost", f"{p.id} (sent via {p.node}, confirmed) is not in the committed "
                              "log")
            for p in publishes if p.outcome == CONFIRMED and p.id not in position]


def _duplicates(log_ids: list[tuple[int, str | None]]) -> list[Violation]:
    offsets: dict[str, list[int]] = defaultdict(list)
    for offset, id_ in log_ids:
        if id_ is not None:
            offsets[id_].append(offset)
    return [Violation("duplicate", f"{id_} stored at offsets {where}")
            for id_, where in offsets.items() if len(where) > 1]


def _order(publishes: Iterable[Publish], position: dict[str, int],
           place: str = "offset", stored: str = "stored") -> list[Violation]:
    """Each publisher's ids placed in the order AMQP promises; `position` ranks them (a
    stream's offsets; a queue's order of first deliveries, queue_checker.py), `place` and
    `stored` name that rank in the report."""
    by_publisher: dict[str, list[Publish]] = defaultdict(list)
    for p in publishes:
        by_publisher[p.publisher].append(p)
    out: list[Violation] = []
    for sends in by_publisher.values():
        sends.sort(key=lambda p: p.seq)
        out += _channel_order(sends, position, place)
        out += _causal_order(sends, position, place, stored)
    return out


def _channel_order(sends: list[Publish], position: dict[str, int],
                   place: str = "offset") -> list[Violation]:
    """On one channel, ids are stored in the order they were sent."""
    out = []
    last: dict[int, Publish] = {}
    for p in sends:
        if p.id not in position:
            continue
        before = last.get(p.channel)
        if before is not None and position[before.id] > position[p.id]:
            out.append(Violation("order", (
                f"{before.id} ({place} {position[before.id]}) was sent before {p.id} ({place} "
                f"{position[p.id]}) on the same channel")))
        last[p.channel] = p
    return out


def _causal_order(sends: list[Publish], position: dict[str, int], place: str = "offset",
                  stored: str = "stored") -> list[Violation]:
    """An id sent after another was confirmed is stored after it, whatever the channels."""
    confirmed = sorted((p.settled_at, position[p.id], p.id) for p in sends
                       if p.outcome == CONFIRMED and p.id in position and p.settled_at is not None)
    times = [c[0] for c in confirmed]
    highest: list[tuple[int, str]] = []  # running max of (offset, id) over confirmed
    for _t, offset, id_ in confirmed:
        highest.append(max(highest[-1], (offset, id_)) if highest else (offset, id_))
    out = []
    for p in sends:
        if p.id not in position:
            continue
        n = bisect.bisect_left(times, p.sent_at)  # confirmed strictly before p was sent
        if n and highest[n - 1][0] > position[p.id]:
            offset, earlier = highest[n - 1]
            out.append(Violation("order", (
                f"{p.id} ({place} {position[p.id]}) was sent after {earlier} ({place} {offset}) "
                f"was confirmed, but is {stored} before it")))
    return out


def _dirty_reads(deliveries: Iterable[Delivery], final: dict[int, str | None]) -> list[Violation]:
    out = []
    for d in deliveries:
        if d.offset not in final:
            out.append(Violation("dirty-read", (
                f"{d.consumer} via {d.node} got {d.id} at offset {d.offset}, past the committed "
                "log")))
        elif final[d.offset] != d.id:
            out.append(Violation("dirty-read", (
                f"{d.consumer} via {d.node} got {d.id} at offset {d.offset}, where the committed "
                f"log holds {final[d.offset]}")))
    return out


def _gaps(deliveries: Iterable[Delivery], first: int) -> list[Violation]:
    """Each consumer, in the order it was given messages, saw every offset from `first` on."""
    expected: dict[str, int] = {}
    out = []
    for d in sorted(deliveries, key=lambda d: d.at):
        want = expected.get(d.consumer, first)
        if d.offset > want:
            out.append(Violation("gap", (
                f"{d.consumer} via {d.node} skipped offsets {want}..{d.offset - 1} (got "
                f"{d.offset} next)")))
        expected[d.consumer] = max(want, d.offset + 1)
    return out
