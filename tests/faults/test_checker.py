"""The checker on hand-made histories and logs: a clean round passes, and each kind of damage
(a lost confirmed id, an id stored twice, a publisher's order broken on a channel or across a
confirm, members that differ or one that lacks committed chunks, a dirty read, a consumer that
skipped offsets, a record nobody sent, a chunk whose CRC fails) is reported as what it is.
Also the on-disk reader on a real log written by leveret.storage. Needs no root and no broker.
"""

from __future__ import annotations

from pathlib import Path

from faults.checker import CONFIRMED, NACKED, UNCONFIRMED, Delivery, History, Publish, check
from faults.storedlog import StoredChunk, StoredLog, read_log
from faults.workload import body_of, decode

from leveret.amqp.content import Message
from leveret.amqp.stored import encode_record
from leveret.storage.log import Log


def chunk(first: int, ids: list[str], epoch: int = 1) -> StoredChunk:
    records = tuple(i.encode() for i in ids)
    raw = f"{epoch}:{first}:".encode() + b",".join(records)
    return StoredChunk(0, epoch, first, len(records), raw, records)


def log(*chunks: StoredChunk) -> StoredLog:
    return StoredLog(list(chunks))


def plain(record: bytes) -> str | None:
    return record.decode()


def publishes(publisher: str, ids: list[str], channel: int = 1, start: float = 0.0,
              outcome: str = CONFIRMED) -> list[Publish]:
    """Sent one a second from `start`, each settled half a second after it was sent."""
    return [Publish(id_, publisher, seq, channel, "n1", start + seq, outcome, start + seq + 0.5)
            for seq, id_ in enumerate(ids, start=1)]


def clean() -> tuple[History, dict[str, StoredLog]]:
    history = History(publishes("p1", ["a1", "a2", "a3"]) + publishes("p2", ["b1", "b2"]))
    history.deliveries = [Delivery("c1", "n2", 0, "a1", 9.0), Delivery("c1", "n2", 1, "b1", 9.1)]
    same = [chunk(0, ["a1", "b1"]), chunk(2, ["a2", "b2", "a3"])]
    return history, {"n1": log(*same), "n2": log(*same), "n3": log(*same)}


def kinds(history: History, members: dict[str, StoredLog], committed: int = 4,
          leader: str = "n1") -> list[str]:
    return sorted({v.kind for v in check(history, members, leader, committed, plain).violations})


def test_a_clean_round_passes_and_is_counted() -> None:
    history, members = clean()
    verdict = check(history, members, "n1", 4, plain)
    assert verdict.ok, verdict.summary()
    assert verdict.stats["confirmed"] == 5 and verdict.stats["committed_entries"] == 5


def test_a_confirmed_id_missing_from_the_committed_log_is_lost() -> None:
    history, members = clean()
    history.publishes += publishes("p3", ["c1"])
    assert kinds(history, members) == ["lost"]
    # committed only up to offset 1: a2, b2 and a3 are beyond the commit point, so lost too
    verdict = check(*clean(), "n1", 1, plain)
    assert sorted(v.detail.split()[0] for v in verdict.violations) == ["a2", "a3", "b2"]


def test_nacked_and_unconfirmed_ids_may_be_missing_and_are_counted_when_stored() -> None:
    history, members = clean()
    history.publishes += publishes("p3", ["c1"], outcome=NACKED)
    history.publishes += publishes("p4", ["d1"], outcome=UNCONFIRMED)
    assert kinds(history, members) == []
    history.publishes[0].outcome = NACKED  # a1 is stored although nacked
    verdict = check(history, members, "n1", 4, plain)
    assert verdict.ok and verdict.stats["nacked_but_stored"] == 1


def test_an_id_stored_twice_is_a_duplicate() -> None:
    history, _ = clean()
    twice = [chunk(0, ["a1", "b1"]), chunk(2, ["a2", "b2", "a3"]), chunk(5, ["a3"])]
    members = {n: log(*twice) for n in ("n1", "n2", "n3")}
    assert kinds(history, members, committed=5) == ["duplicate"]


def test_ids_of_one_channel_stored_out_of_order_break_the_order() -> None:
    history, _ = clean()
    swapped = [chunk(0, ["a1", "b1"]), chunk(2, ["a3", "b2", "a2"])]
    members = {n: log(*swapped) for n in ("n1", "n2", "n3")}
    assert kinds(history, members) == ["order"]


def test_order_across_channels_holds_only_after_a_confirm() -> None:
    # x1 on channel 1 confirmed at 1.5; x2 sent on channel 2 at 2.0: x2 must come after x1
    sends = [Publish("x1", "p1", 1, 1, "n1", 1.0, CONFIRMED, 1.5),
             Publish("x2", "p1", 2, 2, "n1", 2.0, CONFIRMED, 2.5)]
    reversed_log = {n: log(chunk(0, ["x2", "x1"])) for n in ("n1", "n2", "n3")}
    assert kinds(History(sends), reversed_log, committed=1) == ["order"]
    # x1 still in flight (confirmed only at 3.0) when x2 was sent: either order is allowed
    sends[0].settled_at = 3.0
    assert kinds(History(sends), reversed_log, committed=1) == []


def test_members_that_differ_before_the_commit_point_have_diverged() -> None:
    history, members = clean()
    members["n3"] = log(chunk(0, ["a1", "b1"]), chunk(2, ["a2", "b2", "a3"], epoch=2))
    assert kinds(history, members) == ["diverged"]
    # the same difference after the commit point is no divergence
    first_two = History([p for p in history.publishes if p.id in ("a1", "b1")])
    assert kinds(first_two, members, committed=1) == []


def test_a_member_lacking_committed_chunks_has_diverged() -> None:
    history, members = clean()
    members["n2"] = log(chunk(0, ["a1", "b1"]))
    found = check(history, members, "n1", 4, plain).violations
    assert [v.kind for v in found] == ["diverged"] and "n2 lacks" in found[0].detail


def test_a_delivery_the_committed_log_does_not_hold_is_a_dirty_read() -> None:
    history, members = clean()
    history.publishes += publishes("p9", ["z1"], outcome=NACKED)
    history.deliveries.append(Delivery("c1", "n2", 2, "z1", 9.2))  # offset 2 holds a2
    assert kinds(history, members) == ["dirty-read"]
    history.deliveries[-1:] = [Delivery("c1", "n2", 2, "a2", 9.2),
                               Delivery("c1", "n2", 3, "b2", 9.3),
                               Delivery("c1", "n2", 4, "a3", 9.4),
                               Delivery("c1", "n2", 5, "z1", 9.5)]  # past the committed log
    assert kinds(history, members) == ["dirty-read"]


def test_a_consumer_that_skips_offsets_has_a_gap_but_one_given_offsets_again_has_not() -> None:
    history, members = clean()
    history.deliveries += [Delivery("c1", "n2", 1, "b1", 9.2),  # again, after a reconnect
                           Delivery("c1", "n2", 2, "a2", 9.3), Delivery("c1", "n2", 3, "b2", 9.4)]
    assert kinds(history, members) == []
    history.deliveries.append(Delivery("c3", "n3", 1, "b1", 9.5))  # c3 never got offset 0
    found = check(history, members, "n1", 4, plain).violations
    assert [v.kind for v in found] == ["gap"] and "skipped offsets 0..0" in found[0].detail


def test_a_record_nobody_sent_and_a_damaged_chunk_are_reported() -> None:
    history, members = clean()
    odd = [chunk(0, ["a1", "b1"]), chunk(2, ["a2", "b2", "a3"]), chunk(5, ["??"])]
    members = {n: log(*odd) for n in ("n1", "n2", "n3")}
    assert kinds(history, members, committed=5) == ["phantom"]
    members["n2"].problems.append("00000000000000000000.segment at 8: chunk CRC mismatch")
    assert kinds(history, members, committed=5) == ["corrupt", "phantom"]


def test_the_reader_gives_a_real_log_back_and_flags_a_flipped_byte(tmp_path: Path) -> None:
    """A log written by the storage engine: read_log gives each chunk's records and exact bytes,
    the workload's decode finds the ids, and a flipped byte makes a CRC problem."""
    folder = tmp_path / "stream"
    written = Log.open(folder)
    ids = [f"p-1-{i}" for i in range(1, 7)]
    for batch in (ids[:2], ids[2:]):
        written.append([encode_record(Message.build("", "s", body_of(i))) for i in batch])
    written.close()
    stored = read_log(folder)
    assert [decode(record) for _offset, record in stored.entries()] == ids
    assert [c.num_records for c in stored.chunks] == [2, 4] and not stored.problems
    segment = next(folder.glob("*.segment"))
    raw = bytearray(segment.read_bytes())
    raw[-3] ^= 0xFF
    segment.write_bytes(bytes(raw))
    damaged = read_log(folder)
    assert damaged.problems and not damaged.chunks[-1].crc_ok
