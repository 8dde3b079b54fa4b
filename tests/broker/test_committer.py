"""The committer over a real log and a fake scheduler: when confirms settle, and in what order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.manual_scheduler import ManualScheduler

from leveret.broker.model.committer import Committer
from leveret.broker.model.message import Confirm
from leveret.storage import FakeClock, Log, LogConfig
from leveret.storage.config import FsyncPolicy


class Setup:
    def __init__(self, directory: Path, policy: FsyncPolicy) -> None:
        self.clock = FakeClock(1_000)
        self.log = Log.open(directory, LogConfig(fsync=policy, clock=self.clock))
        self.scheduler = ManualScheduler(inline_soon=True)
        self.commits = 0
        self.settled: list[tuple[int, bool]] = []
        self.committer = Committer(self.scheduler, policy, lambda: self.log, self.on_commit)

    def on_commit(self) -> None:
        self.commits += 1

    def confirm(self, seq: int) -> Confirm:
        confirm = Confirm(seq, lambda c: self.settled.append((c.seq, not c.rejected)))
        confirm.defer()
        confirm.seal()
        return confirm

    def publish(self, *seqs: int) -> None:
        self.log.append([b"m%d" % seq for seq in seqs])
        self.committer.appended([self.confirm(seq) for seq in seqs])


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[FsyncPolicy], Setup]]:
    made: list[Setup] = []

    def build(policy: FsyncPolicy) -> Setup:
        made.append(Setup(tmp_path / str(len(made)), policy))
        return made[-1]

    yield build
    for setup in made:
        setup.log.close()


@pytest.mark.parametrize("policy", ["never", "always"])
def test_never_and_always_confirm_at_the_write_with_no_timer(
    make: Callable[[FsyncPolicy], Setup], policy: FsyncPolicy
) -> None:
    s = make(policy)
    s.publish(1, 2)
    assert s.settled == [(1, True), (2, True)]
    assert s.scheduler.timers == []


def test_every_n_ms_confirms_when_the_timer_fsyncs_in_order(
    make: Callable[[FsyncPolicy], Setup],
) -> None:
    s = make(200)
    s.publish(1)
    s.publish(2, 3)
    assert s.settled == []  # written, not fsynced
    assert [t.delay_ms for t in s.scheduler.timers] == [200]  # one timer for both appends
    assert s.log.committed_offset == -1
    s.scheduler.fire()
    assert s.settled == [(1, True), (2, True), (3, True)]
    assert s.log.committed_offset == 2
    assert s.commits == 1
    s.publish(4)
    assert [t.delay_ms for t in s.scheduler.timers] == [200]  # armed again by the next write


def test_an_append_after_the_interval_fsyncs_inline_and_leaves_no_timer(
    make: Callable[[FsyncPolicy], Setup],
) -> None:
    s = make(200)
    s.clock.advance(500)
    s.publish(1)
    assert s.settled == [(1, True)]
    assert s.scheduler.timers == []


def test_a_failed_fsync_nacks_the_waiting_confirms_in_order(
    make: Callable[[FsyncPolicy], Setup], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make(200)
    s.publish(1)
    s.publish(2)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    s.scheduler.fire()
    assert s.settled == [(1, False), (2, False)]
    assert s.commits == 0


def test_a_nack_waits_behind_earlier_confirms(make: Callable[[FsyncPolicy], Setup]) -> None:
    s = make(200)
    s.publish(1)
    s.committer.appended([s.confirm(2)], ok=False)  # a failed write after an unsynced one
    assert s.settled == []
    s.scheduler.fire()
    assert s.settled == [(1, True), (2, False)]


def test_close_cancels_the_timer_and_confirms_after_fsyncing(
    make: Callable[[FsyncPolicy], Setup],
) -> None:
    s = make(60_000)
    s.publish(1)
    timer = s.scheduler.timers[0]
    s.committer.close()
    assert timer.cancelled
    assert not s.committer.timer_armed
    assert s.settled == [(1, True)]
    assert s.log.committed_offset == 0
