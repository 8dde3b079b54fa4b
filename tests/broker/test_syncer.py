"""The syncer over real logs and a real event loop: queue logs fsynced on threads, one round of
the node's group commit at a time, what was written meanwhile covered by the next, many logs'
rounds one syncfs after a first fdatasync of each, and a failed fsync or syncfs reported."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

import leveret.broker.model.syncer as syncer_module
from leveret.broker.model.syncer import InlineSyncer, ThreadSyncer
from leveret.storage import Log, LogConfig, LogIOError

QUEUE_LOG = LogConfig(fsync="always", fsync_on_write=False)


def test_fsyncs_run_off_the_loop_one_at_a_time_per_log(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log.open(tmp_path / "q", QUEUE_LOG)
    threads: list[str] = []
    release = threading.Event()
    real = os.fdatasync

    def slow(fd: int) -> None:  # the disk takes its time: writes go on meanwhile
        threads.append(threading.current_thread().name)
        release.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    syncer = ThreadSyncer()
    ended: list[tuple[int, bool, int]] = []

    async def scenario() -> None:
        for batch in range(3):
            log.append([b"m%d" % batch])
            syncer.sync(log, lambda ok, b=batch: ended.append((b, ok, log.committed_offset)))
            await asyncio.sleep(0.01)  # the loop runs while the first fsync is in flight
        assert ended == [] and log.committed_offset == -1 and len(threads) == 1
        release.set()
        for _ in range(500):
            if len(ended) == 3:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    syncer.close()
    # the first fsync covered batch 0; batches 1 and 2, written while it ran, share the next
    assert ended == [(0, True, 0), (1, True, 2), (2, True, 2)]
    assert len(threads) == 2 and all(name.startswith("fsync") for name in threads)
    assert threading.current_thread().name not in threads
    assert log.sync_ticket() is None and log.kept_next == 3
    log.close()


def test_a_round_of_one_log_wakes_one_thread(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual round of one queue's log: its fdatasync runs on the thread that runs the
    round, not handed to a second pool thread (a wake-up more per round); rounds of several
    logs still fdatasync the others at once on the pool's threads."""
    logs = [Log.open(tmp_path / f"q{i}", QUEUE_LOG) for i in range(3)]
    threads: list[str] = []
    real = os.fdatasync

    def watched(fd: int) -> None:
        threads.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", watched)
    syncer = ThreadSyncer()
    results: list[bool] = []

    async def scenario() -> None:
        for batch in range(5):
            logs[0].append([b"m%d" % batch])
            await _sync_and_wait(syncer, logs[0], results)
            results.clear()
        pool = syncer._pool  # one thread ran each round and its fdatasync (two, before)
        assert pool is not None and len(pool._threads) == 1
        assert len(threads) == 5 and len(set(threads)) == 1
        for log in logs:
            log.append([b"x"])
            syncer.sync(log, results.append)
        for _ in range(200):
            if len(results) == 3:
                return
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    syncer.close()
    assert results == [True, True, True] and len(threads) == 8
    assert all(name.startswith("fsync") for name in threads)
    for log in logs:
        assert log.sync_ticket() is None
        log.close()


def test_a_round_whose_loop_closed_is_not_answered_and_the_pool_serves_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round still in flight when its event loop closes (a broker stopping) is not answered
    (its loop refuses the call; the round's thread passes it by), and the pool's threads go on
    serving the rounds of a new loop."""
    log = Log.open(tmp_path / "q", QUEUE_LOG)
    syncer = ThreadSyncer()
    release = threading.Event()
    ended = threading.Event()
    real_sync = os.fdatasync

    def slow(fd: int) -> None:
        release.wait(5)
        real_sync(fd)
        ended.set()

    monkeypatch.setattr(os, "fdatasync", slow)
    log.append([b"b"])
    orphan: list[bool] = []

    async def leave_in_flight() -> None:
        syncer.sync(log, orphan.append)

    asyncio.run(leave_in_flight())  # its loop is closed before the round ends
    release.set()
    assert ended.wait(5)
    time.sleep(0.1)  # the thread's answer to the closed loop (refused, and passed by)
    assert orphan == []
    syncer._in_flight = 0  # (that loop's answer never came: a new loop starts afresh)
    log.append([b"c"])
    last: list[bool] = []
    asyncio.run(_sync_and_wait(syncer, log, last))
    syncer.close()
    assert last == [True] and log.committed_offset == 1
    log.close()


async def _sync_and_wait(syncer: InlineSyncer | ThreadSyncer, log: Log,
                         results: list[bool]) -> None:
    syncer.sync(log, results.append)
    for _ in range(200):
        if results:
            return
        await asyncio.sleep(0.01)


def test_a_failed_fsync_says_so_and_breaks_the_log(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    for syncer in (InlineSyncer(), ThreadSyncer()):
        log = Log.open(tmp_path / type(syncer).__name__, QUEUE_LOG)
        log.append([b"m"])
        monkeypatch.setattr(os, "fdatasync", failing)
        results: list[bool] = []

        asyncio.run(_sync_and_wait(syncer, log, results))
        monkeypatch.undo()
        assert results == [False] and log.committed_offset == -1
        with pytest.raises(LogIOError):
            log.append([b"after"])
        log.close()


def test_nothing_to_fsync_answers_at_once(tmp_path: Path) -> None:
    never = Log.open(tmp_path / "never", LogConfig(fsync="never"))
    inline = Log.open(tmp_path / "inline", LogConfig(fsync="always"))
    for log in (never, inline):
        log.append([b"m"])
        results: list[bool] = []
        ThreadSyncer().sync(log, results.append)  # no loop needed: nothing goes to a thread
        assert results == [True] and log.committed_offset == 0
        log.close()


class _Calls:
    """Counts the real fdatasync and syncfs calls made (each still runs for real)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, syncfs_fails: bool = False,
                 fdatasync_fails_for: set[int] | None = None) -> None:
        self.fdatasync: list[int] = []
        self.syncfs: list[int] = []
        real_fdatasync, real_syncfs = os.fdatasync, syncer_module.syncfs

        def fdatasync(fd: int) -> None:
            self.fdatasync.append(fd)
            if fdatasync_fails_for and os.fstat(fd).st_ino in fdatasync_fails_for:
                raise OSError(5, "Input/output error")
            real_fdatasync(fd)

        def syncfs(fd: int) -> None:
            self.syncfs.append(fd)
            real_syncfs(fd)
            if syncfs_fails:  # a writeback error of some file on this file system
                raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(syncer_module, "syncfs", syncfs)


def _round(syncer: ThreadSyncer, logs: list[Log], tag: bytes) -> list[bool]:
    """Append to every log, ask a sync of each at once, wait for every answer."""
    results: list[bool] = []

    async def scenario() -> None:
        for log in logs:
            log.append([tag])
            syncer.sync(log, results.append)
        async with asyncio.timeout(10):
            while len(results) < len(logs):
                await asyncio.sleep(0.005)

    asyncio.run(scenario())
    return results


def test_many_logs_share_one_syncfs_per_round_after_a_first_fdatasync_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = [Log.open(tmp_path / f"q{i}", QUEUE_LOG) for i in range(20)]
    syncer = ThreadSyncer(syncfs_from=8)
    calls = _Calls(monkeypatch)
    # each log's first round is an fdatasync of its own (its file system's descriptor is opened
    # before it, so a later syncfs is told of any writeback error of what it covers)
    assert _round(syncer, logs, b"first") == [True] * 20
    assert len(calls.fdatasync) == 20 and calls.syncfs == []
    # then: the first sync asked starts a round alone (fewer than 8 logs: fdatasync); the 19
    # asked while it ran share the next round, one syncfs
    assert _round(syncer, logs, b"second") == [True] * 20
    assert len(calls.fdatasync) == 21 and len(calls.syncfs) == 1
    assert all(log.committed_offset == 1 and log.sync_ticket() is None for log in logs)
    assert syncer.rounds == 2 + 2
    syncer.close()
    for log in logs:
        log.close()


def test_a_syncfs_rounds_tickets_hold_no_descriptor(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that syncfs's its logs takes no duplicate of their segments' descriptors (a
    fdatasync round's tickets do): so under the node's cap on open logs
    (storage/openlogs.py) the logs it covers may release their files while it runs."""
    logs = [Log.open(tmp_path / f"q{i}", QUEUE_LOG) for i in range(20)]
    syncer = ThreadSyncer(syncfs_from=8)
    assert _round(syncer, logs, b"first") == [True] * 20  # (fdatasync each: held tickets)
    segments_open: list[int] = []
    real = syncer_module.syncfs

    def counting(fd: int) -> None:
        paths = []
        for n in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # (the listing's own descriptor, closed)
                paths.append(os.readlink(f"/proc/self/fd/{n}"))
        segments_open.append(sum(path.startswith(str(tmp_path)) and path.endswith(".segment")
                                 for path in paths))
        real(fd)

    monkeypatch.setattr(syncer_module, "syncfs", counting)
    assert _round(syncer, logs, b"second") == [True] * 20
    assert segments_open == [20]  # each log's own; none of the round's tickets
    assert all(log.committed_offset == 1 for log in logs)
    syncer.close()
    for log in logs:
        log.close()


def test_a_failed_syncfs_finds_the_failed_log_by_fdatasync_and_keeps_to_fdatasync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = [Log.open(tmp_path / f"q{i}", QUEUE_LOG) for i in range(10)]
    syncer = ThreadSyncer(syncfs_from=4)
    assert _round(syncer, logs, b"first") == [True] * 10  # (the first fdatasync of each)
    broken = (tmp_path / "q7" / sorted(p.name for p in (tmp_path / "q7").iterdir()
                                       if p.suffix == ".segment")[0])
    calls = _Calls(monkeypatch, syncfs_fails=True, fdatasync_fails_for={broken.stat().st_ino})
    results = _round(syncer, logs, b"second")
    # round one: q0 alone (fdatasync); round two: q1..q9, one syncfs that fails, then an
    # fdatasync of each to find which log's bytes are lost: q7's
    assert len(calls.syncfs) == 1 and len(calls.fdatasync) == 1 + 9
    assert sorted(results) == [False] + [True] * 9
    assert [log.committed_offset for log in logs] == [1] * 7 + [0] + [1] * 2
    with pytest.raises(LogIOError):
        logs[7].append([b"after"])
    # from then on, fdatasync each: a syncfs error was consumed, and another log's bytes may
    # have been in it
    others = logs[:7] + logs[8:]
    assert _round(syncer, others, b"third") == [True] * 9
    assert len(calls.syncfs) == 1 and len(calls.fdatasync) == 10 + 9
    syncer.close()
    for log in logs:
        log.close()


def test_syncfs_writes_back_what_the_log_wrote(tmp_path: Path) -> None:
    """The real syncfs of the file system the data is on: nothing dirty is left of the log."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x" * 1_000_000)
    syncer_module.syncfs(fd)
    with pytest.raises(OSError):
        syncer_module.syncfs(-1)  # and an error is an OSError, with its errno
    os.close(fd)


def test_a_syncfs_slower_than_fdatasync_each_makes_the_next_rounds_fdatasync_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared file system: another process's dirty data makes a syncfs write it all. The
    syncer then fdatasyncs each log for BACKOFF_S (1 s), and tries syncfs again after it."""
    logs = [Log.open(tmp_path / f"q{i}", QUEUE_LOG) for i in range(12)]
    syncer = ThreadSyncer(syncfs_from=8)
    assert _round(syncer, logs, b"first") == [True] * 12  # (the first fdatasync of each)
    calls = _Calls(monkeypatch)
    real = syncer_module.syncfs
    other = tmp_path / "other"

    def with_others_dirty_data(fd: int) -> None:
        other.write_bytes(os.urandom(32 << 20))  # 32 MB someone else wrote, unsynced
        real(fd)

    monkeypatch.setattr(syncer_module, "syncfs", with_others_dirty_data)
    assert _round(syncer, logs, b"slow") == [True] * 12
    assert len(calls.syncfs) == 1 and len(calls.fdatasync) == 1
    monkeypatch.setattr(syncer_module, "syncfs", real)
    assert _round(syncer, logs, b"backed off") == [True] * 12
    assert len(calls.syncfs) == 1 and len(calls.fdatasync) == 1 + 12
    time.sleep(1.1)
    assert _round(syncer, logs, b"again") == [True] * 12
    assert len(calls.syncfs) == 2 and len(calls.fdatasync) == 1 + 12 + 1
    assert all(log.committed_offset == 3 for log in logs)
    syncer.close()
    for log in logs:
        log.close()
