"""The delayed-message checker on hand-made histories: a clean round passes with its lateness
and the ids due during the fault counted; a confirmed id never delivered is lost; a delivery
nobody sent is unexpected; a second fresh delivery, or an id stored twice in the target queue,
is routed twice, while a flagged redelivery is only counted; a delivery before the due time is
early; a first delivery later than the bound after the due time or the recovery is late; ids
nacked or unconfirmed may arrive or not. Needs no root and no broker."""

from __future__ import annotations

from collections import Counter

from faults.checker import CONFIRMED, NACKED, UNCONFIRMED, Publish
from faults.delayed_checker import Times, check_delayed
from faults.delayed_workload import DelayedHistory
from faults.queue_checker import DRAIN, RUN, Dequeue


def history(*ids: tuple[str, float, str]) -> DelayedHistory:
    """(id, delay, outcome): each sent at 0, settled at 0.1, due `delay` s later."""
    h = DelayedHistory([Publish(i, "p1", n, 1, "n1", 0.0, outcome, 0.1)
                        for n, (i, _delay, outcome) in enumerate(ids, start=1)])
    h.due = {i: delay for i, delay, _outcome in ids}
    return h


def given(h: DelayedHistory, id_: str | None, at: float, redelivered: bool = False,
          phase: str = RUN) -> None:
    h.dequeues.append(Dequeue("c1", "n2", id_, redelivered, at, phase))


def clean() -> DelayedHistory:
    h = history(("a", 1.0, CONFIRMED), ("b", 5.0, CONFIRMED), ("c", 9.0, CONFIRMED))
    given(h, "a", 1.2)
    given(h, "b", 7.5)  # due during the fault, given 2.5 s late, 0.5 s after recovery
    given(h, "c", 9.1, phase=DRAIN)
    return h


FAULT = Times(applied_at=2.0, healed_at=6.0, recovered_at=7.0)


def kinds(h: DelayedHistory, stored: Counter[str] | None = None,
          times: Times = FAULT, late_s: float = 30.0) -> list[str]:
    return sorted(v.kind for v in check_delayed(h, stored, times, late_s).violations)


def test_a_clean_round_passes_with_its_lateness_counted() -> None:
    verdict = check_delayed(clean(), Counter({"a": 1, "b": 1, "c": 1}), FAULT)
    assert verdict.violations == []
    stats = verdict.stats
    assert (stats["confirmed"], stats["delivered"], stats["drained"]) == (3, 3, 1)
    assert stats["due_in_fault"] == 1
    assert stats["worst_late_ms"] == 2500
    assert stats["worst_late_after_recovery_ms"] == 500
    assert (stats["lost"], stats["routed_twice"], stats["early"], stats["late"]) == (0, 0, 0, 0)


def test_a_confirmed_id_never_delivered_is_lost() -> None:
    h = clean()
    h.dequeues = [d for d in h.dequeues if d.id != "b"]
    assert kinds(h) == ["lost"]
    assert check_delayed(h, None, FAULT).stats["lost"] == 1


def test_a_delivery_nobody_sent_is_unexpected() -> None:
    h = clean()
    given(h, "zz", 3.0)
    given(h, None, 3.1)
    assert kinds(h) == ["unexpected", "unexpected"]


def test_a_second_fresh_delivery_is_routed_twice_a_flagged_one_is_counted() -> None:
    h = clean()
    given(h, "a", 4.0, redelivered=True)
    verdict = check_delayed(h, None, FAULT)
    assert verdict.violations == [] and verdict.stats["redelivered"] == 1
    given(h, "b", 8.0)
    given(h, "b", 8.5, phase=DRAIN)  # reported once per id
    assert kinds(h) == ["routed-twice"]
    assert check_delayed(h, None, FAULT).stats["routed_twice"] == 1


def test_an_id_stored_twice_in_the_target_queue_is_routed_twice() -> None:
    stored = Counter({"a": 1, "b": 2, "c": 1})
    assert kinds(clean(), stored) == ["routed-twice"]
    stats = check_delayed(clean(), stored, FAULT).stats
    assert (stats["routed_twice"], stats["stored_twice"]) == (1, 1)


def test_a_delivery_before_its_due_time_is_early_within_a_tolerance() -> None:
    h = clean()
    h.dequeues[0] = Dequeue("c1", "n2", "a", False, 0.8, RUN)  # 0.2 s early: the tolerance
    assert kinds(h) == []
    h.dequeues[0] = Dequeue("c1", "n2", "a", False, 0.5, RUN)
    assert kinds(h) == ["early"]


def test_a_first_delivery_past_the_bound_is_late() -> None:
    h = clean()
    assert kinds(h, late_s=2.0) == []  # b: 2.5 s late, but 0.5 s after the recovery
    assert kinds(h, times=Times(), late_s=2.0) == ["late"]  # no fault: from its due time
    h.dequeues[1] = Dequeue("c1", "n2", "b", False, 9.5, RUN)
    assert kinds(h, late_s=2.0) == ["late"]


def test_nacked_or_unconfirmed_ids_may_arrive_or_not() -> None:
    h = clean()
    h.publishes += history(("n", 2.0, NACKED), ("u", 3.0, UNCONFIRMED)).publishes
    h.due.update({"n": 2.0, "u": 3.0})
    given(h, "u", 50.0)  # never late: its outcome was unknown
    verdict = check_delayed(h, None, FAULT, late_s=2.0)
    assert verdict.violations == []
    assert (verdict.stats["unconfirmed_but_delivered"], verdict.stats["nacked"]) == (1, 1)
