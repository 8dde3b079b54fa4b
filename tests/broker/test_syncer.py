"""The syncer over real logs and a real event loop: queue logs fsynced on threads, one fsync in
flight per log, what was written meanwhile covered by the next, and a failed fsync reported."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

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
