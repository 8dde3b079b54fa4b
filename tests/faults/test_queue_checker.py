"""The total-queue checker on hand-made histories: a clean round passes and is counted; a
confirmed id never delivered is lost; a delivery nobody sent (or a foreign body) is unexpected;
duplicates, unflagged redeliveries and ids delivered although nacked or unconfirmed are counted,
never failed; with one consumer, a publisher's order broken in first deliveries is reported on
one channel and across a confirm. Needs no root and no broker."""

from __future__ import annotations

from faults.checker import CONFIRMED, NACKED, UNCONFIRMED, Publish
from faults.queue_checker import DRAIN, RUN, Dequeue, QueueHistory, check_total_queue, duplicates


def sent(publisher: str, ids: list[str], channel: int = 1, start: float = 0.0,
         outcome: str = CONFIRMED) -> list[Publish]:
    """Sent one a second from `start`, each settled half a second after it was sent."""
    return [Publish(id_, publisher, seq, channel, "n1", start + seq, outcome, start + seq + 0.5)
            for seq, id_ in enumerate(ids, start=1)]


def given(ids: list[str | None], start: float = 10.0, consumer: str = "c1",
          redelivered: bool = False, phase: str = RUN) -> list[Dequeue]:
    return [Dequeue(consumer, "n2", id_, redelivered, start + i / 10, phase)
            for i, id_ in enumerate(ids)]


def unknown() -> list[Publish]:
    """c1 nacked, c2 unconfirmed (its connection lost): their outcome unknown."""
    return sent("p3", ["c1"], outcome=NACKED) + sent("p3", ["c2"], outcome=UNCONFIRMED)


def clean() -> QueueHistory:
    history = QueueHistory(sent("p1", ["a1", "a2", "a3"]) + sent("p2", ["b1", "b2"]))
    history.dequeues = given(["a1", "b1", "a2"]) + given(["b2", "a3"], 20.0, "drain@n1",
                                                         phase=DRAIN)
    return history


def kinds(history: QueueHistory, ordered: bool = False) -> list[str]:
    return sorted({v.kind for v in check_total_queue(history, ordered).violations})


def test_a_clean_round_passes_and_is_counted() -> None:
    verdict = check_total_queue(clean(), ordered=True)
    assert verdict.ok, verdict.summary()
    stats = verdict.stats
    assert (stats["confirmed"], stats["delivered"], stats["drained"]) == (5, 5, 2)
    assert stats["lost"] == stats["duplicate_deliveries"] == 0


def test_a_confirmed_id_never_delivered_is_lost() -> None:
    history = clean()
    history.dequeues = [d for d in history.dequeues if d.id != "a2"]
    verdict = check_total_queue(history)
    assert kinds(history) == ["lost"]
    assert verdict.stats["lost"] == 1 and "a2" in str(verdict.violations[0])


def test_an_unconfirmed_or_nacked_id_never_delivered_is_not_lost() -> None:
    history = clean()
    history.publishes += unknown()
    assert check_total_queue(history).ok


def test_a_delivery_nobody_sent_is_unexpected() -> None:
    history = clean()
    history.dequeues += given(["zz"], 30.0)
    assert kinds(history) == ["unexpected"]
    history = clean()
    history.dequeues += given([None], 30.0)  # a body that is not the workload's
    assert kinds(history) == ["unexpected"]


def test_duplicates_are_counted_not_failed() -> None:
    history = clean()
    history.dequeues += given(["a1"], 11.0, "c2", redelivered=True)
    history.dequeues += given(["b1", "b1"], 12.0, "c2")  # again, twice, without the flag
    verdict = check_total_queue(history)
    assert verdict.ok, verdict.summary()
    assert verdict.stats["duplicated_ids"] == 2 and verdict.stats["duplicate_deliveries"] == 3
    assert verdict.stats["unflagged_redeliveries"] == 2
    assert duplicates(history)[0].startswith("a1: c1@n2/run, c2@n2/run/r")


def test_ids_whose_outcome_was_unknown_may_be_delivered() -> None:
    history = clean()
    history.publishes += unknown()
    history.dequeues += given(["c1", "c2"], 30.0)
    verdict = check_total_queue(history)
    assert verdict.ok, verdict.summary()
    assert verdict.stats["nacked_but_delivered"] == verdict.stats["unconfirmed_but_delivered"] == 1


def test_first_deliveries_out_of_a_channels_order() -> None:
    history = QueueHistory(sent("p1", ["a1", "a2", "a3"]))
    history.dequeues = given(["a1", "a3", "a2"])
    assert kinds(history) == []  # several consumers: the order is not checked
    assert kinds(history, ordered=True) == ["order"]
    history.dequeues = given(["a1", "a2", "a1", "a3"], redelivered=True)  # a redelivery: fine
    assert kinds(history, ordered=True) == []


def test_first_deliveries_out_of_order_across_a_confirm() -> None:
    # a2 goes on another channel, sent after a1 was confirmed: it must come after a1
    history = QueueHistory(sent("p1", ["a1"]) + sent("p1", ["a2"], channel=2, start=1.0))
    history.publishes[1].seq = 2
    history.dequeues = given(["a2", "a1"])
    verdict = check_total_queue(history, ordered=True)
    assert [v.kind for v in verdict.violations] == ["order"]
    assert "was confirmed, but is delivered before it" in str(verdict.violations[0])
