"""Snapshots (broker/model/snapshot.py): a queue recovered from its snapshot plus the log's tail
is the queue recovered from the whole log, over random sequences of publishes (with priorities,
transient ones for a classic queue), gets, acks, rejects, requeues, purges, snapshots and
restarts (`kill -9` between snapshots: the log as written, no snapshot at close), with pages,
segments and snapshot buckets made small so that paging, the deletion of the log's head and
the buckets it cuts are all reached. Stale and corrupt snapshots are read in full.

A model-level test: the queue over a real log in a temporary directory, a scheduler the test
drives (support.manual_scheduler)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.manual_scheduler import ManualScheduler

from leveret.amqp import properties as props
from leveret.amqp.content import Message
from leveret.amqp.stored import decode_record, encode_record
from leveret.broker.model import durable, snapshot
from leveret.broker.model.durable import DurableClassicQueue
from leveret.broker.model.message import QueuedMessage
from leveret.broker.model.quorum import QuorumQueue
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.vhost import VHost
from leveret.storage import DiskFullError

QUEUE = "q"
STORAGE = "kept"


@pytest.fixture(autouse=True)
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 4 messages, segments of 400 bytes (a few records), buckets of 8 offsets."""
    monkeypatch.setattr(durable, "PAGE_MESSAGES", 4)
    monkeypatch.setattr(durable, "SEGMENT_BYTES", 400)
    monkeypatch.setattr(snapshot, "BUCKET", 8)


def message(number: int, priority: int | None, persistent: bool = True) -> Message:
    properties = props.Properties(delivery_mode=2 if persistent else 1, priority=priority)
    return Message.build("", QUEUE, b"m%d-" % number + b"x" * (number % 7), properties)


class Harness:
    """One queue over a directory: the operations, restarts, and what a drain reads."""

    def __init__(self, root: Path, kind: type[DurableClassicQueue],
                 arguments: dict[str, Any] | None = None) -> None:
        self.root = root
        self.kind = kind
        self.arguments = arguments or {}
        self.vhost = VHost("/", ManualScheduler(inline_soon=True))
        self.queue = self.open(root)
        self.unacked: list[QueuedMessage] = []
        self.published = 0

    def open(self, root: Path) -> DurableClassicQueue:
        env = StorageEnv(root, encode_record, decode_record)
        return self.kind(self.vhost, QUEUE, env=env, storage_id=STORAGE, durable=True,
                         exclusive_owner=None, auto_delete=False,
                         arguments=dict(self.arguments))

    @property
    def directory(self) -> Path:
        return self.root / STORAGE

    def run(self, op: tuple[Any, ...]) -> None:
        queue, name = self.queue, op[0]
        if name == "publish":
            self.published += 1
            queue.publish(message(self.published, op[1], op[2]), None)
        elif name == "get":
            entry = queue.get(False)
            if entry is not None:
                self.unacked.append(entry)
        elif name in ("ack", "reject", "requeue", "return") and self.unacked:
            entry = self.unacked.pop(op[1] % len(self.unacked))
            if name == "ack":
                queue.ack(entry)
            elif name == "reject":
                queue.reject(entry)
            else:
                queue.requeue([entry], delivery_failed=name == "requeue")
        elif name == "purge":
            queue.purge()
        elif name == "snapshot":
            queue.writer.flush()
            queue.writer.commit()
            queue.write_snapshot()
        elif name == "kill":
            self.kill()
            self.queue = self.open(self.root)
        elif name == "stop":
            queue.close()
            self.unacked = []
            self.queue = self.open(self.root)

    def kill(self) -> None:
        """kill -9 once what was written is in the log: no snapshot at close; unacked
        deliveries are forgotten (they come back at the restart)."""
        self.queue.writer.flush()
        self.queue.writer.close()
        self.queue.log.close()
        self.unacked = []


def drain(queue: DurableClassicQueue) -> list[tuple[bytes, bool, dict[str, Any]]]:
    """What a consumer reads from the queue, in order, taking it."""
    out = []
    while (entry := queue.get(True)) is not None:
        out.append((entry.message.body, entry.redelivered, dict(entry.message.headers)))
    return out


def recovered(harness: Harness, source: Path, with_snapshot: bool, name: str
              ) -> tuple[int, list[tuple[bytes, bool, dict[str, Any]]], list[bytes]]:
    """The queue recovered from a copy of `source`, with its snapshot or without."""
    copy = harness.root.parent / name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy / STORAGE)
    if not with_snapshot:
        (copy / STORAGE / snapshot.NAME).unlink(missing_ok=True)
    queue = harness.open(copy)
    try:
        held = [e.message.body for e in getattr(queue, "dead_letters", {})]
        return queue.message_count, drain(queue), held
    finally:
        queue.writer.close()
        queue.log.close()


def operations(priorities: bool, transient: bool) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    priority = st.sampled_from([None, None, None, 1, 7]) if priorities else st.just(None)
    persistent = st.sampled_from([True, True, False]) if transient else st.just(True)
    index = st.integers(0, 50)
    op = st.one_of(
        st.tuples(st.just("publish"), priority, persistent),
        st.tuples(st.just("publish"), priority, persistent),
        st.tuples(st.just("get")),
        st.tuples(st.just("get")),
        st.tuples(st.sampled_from(["ack", "ack", "ack", "reject", "requeue", "return"]), index),
        st.tuples(st.sampled_from(["ack", "ack", "ack", "reject", "requeue", "return"]), index),
        st.tuples(st.sampled_from(["snapshot", "snapshot", "kill", "stop", "purge"])),
    )
    return st.lists(op, min_size=30, max_size=200)


def examples(count: int) -> Any:
    return settings(max_examples=count, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


QUORUM = given(ops=operations(priorities=True, transient=False))
CLASSIC = given(ops=operations(priorities=False, transient=True))


# at-least-once dead lettering to an exchange that does not exist: a rejected message is held
# (a DEAD_LETTERS record) for as long as the test runs
HOLDING = {"x-dead-letter-exchange": "nowhere", "x-dead-letter-strategy": "at-least-once",
           "x-overflow": "reject-publish"}


def check(tmp_path: Path, kind: type[DurableClassicQueue], ops: list[tuple[Any, ...]],
          arguments: dict[str, Any] | None = None) -> None:
    root = tmp_path / "run"
    shutil.rmtree(tmp_path, ignore_errors=True)
    tmp_path.mkdir()
    harness = Harness(root, kind, arguments)
    for op in ops:
        harness.run(op)
    harness.kill()  # the last snapshot (if any) and the tail after it
    with_snapshot = recovered(harness, harness.directory, True, "a")
    without = recovered(harness, harness.directory, False, "b")
    assert with_snapshot == without


@examples(60)
@QUORUM
def test_a_quorum_queue_holding_dead_letters_recovers_from_its_snapshot_as_from_its_log(
        tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    check(tmp_path, QuorumQueue, ops, HOLDING)


@examples(60)
@QUORUM
def test_a_quorum_queue_recovers_from_its_snapshot_as_from_its_whole_log(
        tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    check(tmp_path, QuorumQueue, ops)


@examples(60)
@CLASSIC
def test_a_durable_classic_queue_recovers_from_its_snapshot_as_from_its_whole_log(
        tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    check(tmp_path, DurableClassicQueue, ops)


@pytest.mark.slow
@examples(1000)
@QUORUM
def test_a_quorum_queue_recovers_from_its_snapshot_as_from_its_whole_log_slow(
        tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    check(tmp_path, QuorumQueue, ops, HOLDING)


@pytest.mark.slow
@examples(1000)
@CLASSIC
def test_a_durable_classic_queue_recovers_from_its_snapshot_as_from_its_whole_log_slow(
        tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    check(tmp_path, DurableClassicQueue, ops)


# -- the paths where a snapshot is not used ---------------------------------------------------

def filled(tmp_path: Path, kind: type[DurableClassicQueue] = QuorumQueue) -> Harness:
    """A queue with 40 messages, 10 of them acked, and a snapshot at the end of its log."""
    harness = Harness(tmp_path / "run", kind)
    for _ in range(40):
        harness.run(("publish", None, True))
    for _ in range(10):
        harness.run(("get",))
        harness.run(("ack", 0))
    harness.run(("snapshot",))
    return harness


def test_a_clean_close_writes_a_snapshot_that_the_restart_uses(tmp_path: Path) -> None:
    harness = filled(tmp_path)
    for _ in range(3):
        harness.run(("publish", None, True))
    harness.queue.close()
    data = (harness.directory / snapshot.NAME).read_bytes()
    ledger, _check = snapshot.decode(data)
    assert ledger.covers == harness.queue.log.next_offset
    assert ledger.count == 33
    queue = harness.open(harness.root)
    assert queue.ledger is not None and queue.ledger.changes == 0  # no record read again
    assert queue.message_count == 33
    queue.close()


def test_a_restart_after_a_kill_reads_the_tail_after_the_snapshot(tmp_path: Path) -> None:
    harness = filled(tmp_path)
    covers = harness.queue.ledger.covers if harness.queue.ledger else -1
    for _ in range(5):
        harness.run(("publish", None, True))
    harness.kill()
    queue = harness.open(harness.root)
    assert queue.ledger is not None
    assert queue.ledger.changes == 5  # the five records after the snapshot, no more
    assert covers > 0
    assert queue.message_count == 35
    queue.close()


def snapshot_not_used(harness: Harness) -> tuple[int, list[Any]]:
    queue = harness.open(harness.root)
    try:
        assert queue.ledger is not None
        return queue.ledger.changes, drain(queue)
    finally:
        queue.writer.close()
        queue.log.close()


def test_a_corrupt_snapshot_is_not_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    harness = filled(tmp_path)
    harness.kill()
    expected = recovered(harness, harness.directory, False, "b")
    path = harness.directory / snapshot.NAME
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    read, messages = snapshot_not_used(harness)
    assert read == 30  # every ready record was read
    assert (len(messages), messages, []) == expected
    assert "checksum mismatch" in caplog.text


def test_a_snapshot_beyond_the_logs_end_is_not_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As after the uncommitted tail of a replica or a deposed leader was cut back."""
    harness = filled(tmp_path)
    harness.kill()
    saved = (harness.directory / snapshot.NAME).read_bytes()
    expected = recovered(harness, harness.directory, False, "b")
    shutil.rmtree(harness.root)
    fresh = Harness(harness.root, QuorumQueue)  # the same queue's log, shorter
    for _ in range(20):
        fresh.run(("publish", None, True))
    fresh.kill()
    (fresh.directory / snapshot.NAME).write_bytes(saved)
    read, messages = snapshot_not_used(fresh)
    assert read == 20
    assert len(messages) == 20 and expected[0] == 30
    assert "beyond the log's end" in caplog.text


def test_a_snapshot_of_a_log_since_written_again_below_it_is_not_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A deposed leader's log cut back and written again by the next leader past the
    snapshot's offset: the chunk ending at S is not the one the snapshot saw."""
    harness = filled(tmp_path)
    harness.kill()
    saved = (harness.directory / snapshot.NAME).read_bytes()
    covers = snapshot.decode(saved)[0].covers
    shutil.rmtree(harness.root)
    fresh = Harness(harness.root, QuorumQueue)
    for _ in range(covers + 5):  # one record a chunk: a chunk ends at S too
        fresh.run(("publish", 3, True))
    fresh.kill()
    (fresh.directory / snapshot.NAME).write_bytes(saved)
    read, messages = snapshot_not_used(fresh)
    assert read == covers + 5 and len(messages) == covers + 5
    assert "written again below" in caplog.text


def test_a_snapshot_file_not_written_leaves_the_last_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    harness = filled(tmp_path)
    before = (harness.directory / snapshot.NAME).read_bytes()
    harness.run(("publish", None, True))
    (harness.directory / f"{snapshot.NAME}.new").mkdir()  # the temporary file cannot be made
    harness.run(("snapshot",))
    assert (harness.directory / snapshot.NAME).read_bytes() == before
    assert "queue snapshot not written" in caplog.text
    harness.kill()
    queue = harness.open(harness.root)
    assert queue.message_count == 31
    queue.close()


def test_after_a_failed_write_no_snapshot_is_written_until_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that fails (a full disk) may leave the counts ahead of the log: the queue
    writes no more snapshots; the last one stays valid, and the restart reads it."""
    harness = filled(tmp_path)
    before = (harness.directory / snapshot.NAME).read_bytes()
    log = harness.queue.log

    def full(*_args: object, **_kwargs: object) -> int:
        raise DiskFullError(log.directory, "no space left on device")

    monkeypatch.setattr(log, "append", full)
    harness.run(("publish", None, True))
    assert "durable queue write failed" in caplog.text
    monkeypatch.undo()
    harness.run(("publish", None, True))  # written now, the failed one kept in memory
    assert harness.queue.ledger is None
    assert harness.queue.write_snapshot() is False
    harness.queue.close()
    assert (harness.directory / snapshot.NAME).read_bytes() == before
    queue = harness.open(harness.root)
    assert queue.message_count == 31  # the snapshot's 30 and the one written after it
    assert queue.ledger is not None and queue.ledger.changes == 1
    queue.close()


def test_the_ledger_subtracts_a_range_through_whole_buckets() -> None:
    ledger = snapshot.Ledger()
    for offset in range(40):
        ledger.written(offset, snapshot.PAGED, 10, offset)
    ledger.settle(3, 30, (), None)
    assert sorted(ledger.buckets) == [0, 3, 4]  # buckets 1 and 2 (8-23) emptied whole
    assert list(ledger.dirty.ranges()) == [(3, 8), (24, 30)]


def test_minus() -> None:
    a, b = snapshot.IntervalSet(), snapshot.IntervalSet()
    for low, high in ((0, 10), (20, 30), (40, 41)):
        a.add_range(low, high)
    for low, high in ((2, 4), (8, 22), (25, 26), (40, 50)):
        b.add_range(low, high)
    assert list(snapshot.minus(a, b).ranges()) == [(0, 2), (4, 8), (22, 25), (26, 30)]



def test_the_ledger_takes_a_write_and_a_settled_range_as_it_takes_each_offset() -> None:
    """`written_many` counts as `written` of each record does; `settle` passes by the offsets
    already out, leveled or transient, takes out what the queue knows and leaves the rest
    dirty, as a look at each offset would."""
    kinds = [(snapshot.PAGED, 10), (snapshot.OTHER, 20), (snapshot.TRANSIENT, 30)] * 20
    one, many = snapshot.Ledger(), snapshot.Ledger()
    for offset, (kind, size) in enumerate(kinds, 5):
        one.written(offset, kind, size, offset)
    many.written_many(5, kinds, 64)
    assert (many.buckets, many.leveled._starts, many.transient._starts, many.seq,
            many.changes) == (one.buckets, one.leveled._starts, one.transient._starts, 64, 60)
    out = snapshot.IntervalSet()
    out.add_range(20, 26)
    known = {offset: (snapshot.PAGED, 10) for offset in range(30, 40)}
    for start, end in ((5, 9), (18, 23), (27, 38), (41, 50)):
        many.settle(start, end, (out,), known.get)
        settle_each(one, start, end, out, known)
    assert (many.buckets, list(many.dirty.ranges()), many.changes) == (
        one.buckets, list(one.dirty.ranges()), one.changes)
    assert many.dirty.range_count > 1 and many.buckets  # (something to compare)
    none = snapshot.Ledger()
    none.written_many(0, [(snapshot.PAGED, 1)] * 10, 9)
    none.settle(2, 8, (out,), None)  # nothing known: the rest dirty, range by range
    assert list(none.dirty.ranges()) == [(2, 8)]


def settle_each(ledger: snapshot.Ledger, start: int, end: int, out: snapshot.IntervalSet,
                known: dict[int, tuple[int, int]]) -> None:
    """Ledger.settle as it was, offset by offset: the reference."""
    ledger.changes += end - start
    index = start // snapshot.BUCKET
    while index * snapshot.BUCKET < end:
        low = max(start, index * snapshot.BUCKET)
        high = min(end, (index + 1) * snapshot.BUCKET)
        if high - low == snapshot.BUCKET:
            ledger.buckets.pop(index, None)
        elif index in ledger.buckets:
            for offset in range(low, high):
                if offset in out or offset in ledger.leveled or offset in ledger.transient:
                    continue
                what = known.get(offset)
                if what is None:
                    ledger.dirty.add(offset)
                else:
                    ledger.gone(offset, *what)
        index += 1
