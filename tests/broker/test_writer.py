"""The writer over a real log and a fake event loop: a turn's batch, its chunk, its confirms."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.broker.model.message import Confirm
from leveret.broker.model.writer import Writer
from leveret.storage import FakeClock, Log, LogConfig, OffsetSpec, StorageError
from leveret.storage.config import FsyncPolicy


@dataclass
class Replicated:
    """The log's replication as a test sets it: local or not, in contact with a quorum."""

    local: bool = True
    contact: bool = True
    appends: int = 0

    def may_append(self) -> bool:
        return self.contact

    def appended(self) -> None:
        self.appends += 1


class LaterSyncer:
    """The syncer's thread, as a test runs it: the fsyncs asked for wait for `run`."""

    def __init__(self) -> None:
        self.asked: list[tuple[Log, Callable[[bool], None]]] = []

    def sync(self, log: Log, done: Callable[[bool], None]) -> None:
        self.asked.append((log, done))

    def run(self) -> None:
        asked, self.asked = self.asked, []
        for log, done in asked:
            ticket = log.sync_ticket()
            if ticket is not None:
                ticket.run()
                log.synced(ticket)
            done(True)


class Setup:
    def __init__(self, directory: Path, policy: FsyncPolicy, local: bool,
                 on_write: bool = True) -> None:
        self.log = Log.open(directory, LogConfig(fsync=policy, clock=FakeClock(1_000),
                                                 fsync_on_write=on_write))
        self.loop = ManualScheduler()
        self.settled: list[tuple[int, bool]] = []
        self.commits = 0
        self.broken = False
        self.failed: list[list[bytes]] = []
        self.replication = Replicated(local=local)
        self.syncer = LaterSyncer()
        self.writer: Writer[list[bytes]] = Writer(
            self.loop, policy, lambda: self.log, batch=list, append=self.append,
            failed=self.on_failure, on_commit=self.on_commit, replication=self.replication,
            syncer=self.syncer)

    def append(self, batch: list[bytes]) -> None:
        if self.broken:
            raise StorageError("disk full")
        if batch:
            self.log.append(batch)

    def on_failure(self, batch: list[bytes], error: StorageError) -> bool:
        self.failed.append(batch)
        return False

    def on_commit(self) -> None:
        self.commits += 1

    def publish(self, *seqs: int) -> None:
        """Publishes within the current turn: each joins the batch, with its confirm."""
        for seq in seqs:
            self.writer.batch.append(b"m%d" % seq)
            confirm = Confirm(seq, lambda c: self.settled.append((c.seq, not c.rejected)))
            self.writer.confirm_later(confirm)
            confirm.seal()
            self.writer.schedule()

    def chunks(self) -> list[list[bytes]]:
        reader = self.log.reader(OffsetSpec.first())
        try:
            return [[bytes(r) for r in chunk.records] for chunk in reader]
        finally:
            reader.close()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []

    def build(policy: FsyncPolicy = "never", local: bool = True, on_write: bool = True) -> Setup:
        made.append(Setup(tmp_path / str(len(made)), policy, local, on_write))
        return made[-1]

    yield build
    for setup in made:
        setup.log.close()


def test_a_turn_is_one_chunk_and_one_round_of_confirms(make: Callable[..., Setup]) -> None:
    s = make()
    s.publish(1, 2, 3)
    assert len(s.loop.soon) == 1  # scheduled once for the turn
    assert s.settled == [] and s.chunks() == []
    s.loop.turn()
    assert s.chunks() == [[b"m1", b"m2", b"m3"]]
    assert s.settled == [(1, True), (2, True), (3, True)]
    assert s.commits == 1
    s.publish(4, 5)
    s.loop.turn()
    assert s.chunks() == [[b"m1", b"m2", b"m3"], [b"m4", b"m5"]]
    assert s.settled[3:] == [(4, True), (5, True)]
    assert s.commits == 2


def test_a_queue_logs_batch_of_several_chunks_costs_one_fsync_under_always(
        make: Callable[..., Setup], monkeypatch: pytest.MonkeyPatch) -> None:
    s = make("always", on_write=False)  # a queue's log: its syncer fsyncs (here inline)
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])

    def as_three_chunks(batch: list[bytes]) -> None:  # as a durable queue writes a turn
        for record in batch:
            s.log.append([record])

    s.writer._append = as_three_chunks
    s.publish(1, 2, 3)
    s.loop.turn()
    assert s.settled == [] and synced == []  # the syncer's fsync has not run yet
    s.syncer.run()
    assert s.chunks() == [[b"m1"], [b"m2"], [b"m3"]]
    assert len(synced) == 1
    assert s.settled == [(1, True), (2, True), (3, True)] and s.commits == 1


def test_a_replicated_leaders_queue_log_counts_its_own_copy_once_fsynced(
        make: Callable[..., Setup]) -> None:
    """The replication hears of the append at once (it ships), and again once the syncer's
    fsync ended: from then on the leader's kept offset counts towards the majority."""
    s = make("always", local=False, on_write=False)
    kept_when_told: list[int] = []
    s.replication.appended = lambda: kept_when_told.append(s.log.kept_next)  # type: ignore[method-assign]
    s.publish(1, 2)
    s.loop.turn()
    assert kept_when_told == [0]  # shipped, not fsynced yet
    s.syncer.run()
    assert kept_when_told == [0, 2]  # told again: kept
    assert s.settled == []  # the majority decides, through committed_up_to
    s.writer.committed_up_to(1)
    assert s.settled == [(1, True), (2, True)]


def test_a_failed_append_nacks_exactly_that_batch_in_order(make: Callable[..., Setup]) -> None:
    s = make()
    s.publish(1)
    s.loop.turn()
    s.broken = True
    s.publish(2, 3)
    s.loop.turn()
    assert s.failed == [[b"m2", b"m3"]]
    assert s.settled == [(1, True), (2, False), (3, False)]
    s.broken = False
    s.publish(4)
    s.loop.turn()
    assert s.settled[3:] == [(4, True)]
    assert s.chunks() == [[b"m1"], [b"m4"]]


def test_confirms_wait_for_the_commit_point(make: Callable[..., Setup]) -> None:
    """The seam replication plugs into: written (even fsynced) is not committed until
    committed_up_to covers it; then the confirms go, in order, and consumers are woken."""
    s = make("always", local=False)
    s.publish(1, 2)
    s.loop.turn()
    s.publish(3)
    s.loop.turn()
    assert s.log.committed_offset == 2  # on this node's disk
    assert s.settled == [] and s.commits == 0
    s.writer.committed_up_to(0)
    assert s.settled == []  # the first chunk ends at offset 1
    s.writer.committed_up_to(1)
    assert s.settled == [(1, True), (2, True)]
    assert s.commits == 2
    s.writer.committed_up_to(2)
    assert s.settled == [(1, True), (2, True), (3, True)]
    s.writer.committed_up_to(2)
    assert s.commits == 3  # woken only when the commit point moves


def test_a_nack_waits_behind_uncommitted_acks(make: Callable[..., Setup]) -> None:
    s = make("never", local=False)
    s.publish(1)
    s.loop.turn()
    s.broken = True
    s.publish(2)
    s.loop.turn()
    assert s.settled == []
    s.writer.committed_up_to(0)
    assert s.settled == [(1, True), (2, False)]


def test_every_n_ms_confirms_at_the_timers_fsync(make: Callable[..., Setup]) -> None:
    s = make(200)
    s.publish(1)
    s.loop.turn()
    assert s.settled == [] and s.writer.timer_armed
    s.loop.fire()
    assert s.settled == [(1, True)] and not s.writer.timer_armed
    assert s.commits == 1


def test_commit_pending_writes_the_turn_and_fsyncs(make: Callable[..., Setup]) -> None:
    s = make(60_000)
    s.publish(1, 2)
    s.writer.commit_pending()  # shutdown, before the turn ends
    assert s.settled == [(1, True), (2, True)]
    assert s.log.committed_offset == 1
    s.loop.turn()  # the scheduled flush finds nothing
    assert s.chunks() == [[b"m1", b"m2"]]


def test_delete_settles_what_was_written_and_nacks_what_comes_after(
    make: Callable[..., Setup],
) -> None:
    s = make(60_000)
    s.publish(1)
    s.loop.turn()
    s.publish(2)  # gathered, not yet written, when the queue is deleted
    timer = s.loop.timers[0]
    s.writer.delete()
    assert timer.cancelled and not s.writer.timer_armed
    assert s.settled == [(1, True)]
    s.loop.turn()
    assert s.settled == [(1, True), (2, False)]
    assert s.chunks() == [[b"m1"]]


def test_a_held_writer_appends_nothing_until_released_then_writes_what_waited(
        make: Callable[..., Setup]) -> None:
    """A replicated stream's new leader holds its writer until it knows its epoch: what is
    published meanwhile waits, unwritten and unconfirmed, and goes out in one chunk at release."""
    s = make()
    s.writer.hold()
    s.publish(1, 2)
    s.loop.turn()
    s.publish(3)
    s.loop.turn()
    assert s.chunks() == [] and s.settled == []
    s.writer.release()
    assert s.chunks() == [[b"m1", b"m2", b"m3"]]
    assert s.settled == [(1, True), (2, True), (3, True)]
    s.publish(4)
    s.loop.turn()
    assert s.chunks()[-1] == [b"m4"]


def test_a_held_writer_discarded_or_closed_nacks_what_waited_and_writes_nothing(
        make: Callable[..., Setup]) -> None:
    """A leader deposed before it knew its epoch, or closed: nothing that waited is written,
    and each of its publishes is nacked, in order."""
    s = make()
    s.writer.hold()
    s.publish(1, 2)
    s.loop.turn()
    s.writer.discard()
    assert s.chunks() == [] and s.settled == [(1, False), (2, False)]
    s.writer.hold()
    s.publish(3)
    s.writer.close()
    assert s.chunks() == [] and s.settled[-1] == (3, False)


def test_a_writer_whose_leader_lost_its_quorum_waits_then_writes_or_nacks(
        make: Callable[..., Setup]) -> None:
    """A replicated stream's leader out of contact with a quorum (`may_append` says no) writes
    nothing: what is published waits, unconfirmed, and goes out in one chunk when contact is
    back (resume), or is nacked unwritten if this node stops leading (discard) or closes."""
    s = make()
    s.replication.contact = False
    s.publish(1, 2)
    s.loop.turn()
    s.publish(3)
    s.loop.turn()
    assert s.chunks() == [] and s.settled == [] and s.writer.waiting
    s.writer.resume()  # still no contact: it waits on
    s.loop.turn()
    assert s.chunks() == [] and s.writer.waiting
    s.replication.contact = True
    s.writer.resume()
    s.loop.turn()
    assert s.chunks() == [[b"m1", b"m2", b"m3"]] and s.settled == [(1, True), (2, True),
                                                                     (3, True)]
    s.replication.contact = False
    s.publish(4)
    s.loop.turn()
    s.writer.discard()
    assert s.chunks() == [[b"m1", b"m2", b"m3"]] and s.settled[-1] == (4, False)
    s.publish(5)
    s.loop.turn()
    s.writer.close()
    assert s.chunks() == [[b"m1", b"m2", b"m3"]] and s.settled[-1] == (5, False)
