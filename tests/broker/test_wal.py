"""The node's write-ahead log under the syncer, over real logs, real files and a real event loop:
a round of many logs is one WAL fdatasync, and what it made durable survives a simulated power
loss (each segment and index cut back to what was durable in place: kill -9 cannot show it,
the page cache survives a killed process); a FORGET keeps removed bytes from coming back; a torn
last record is ignored; a checkpoint makes the old file's segments durable in place and removes
it; a failing WAL falls back to fdatasync each."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from leveret.broker.model.syncer import ThreadSyncer
from leveret.storage import Log, LogConfig, LogIOError, OffsetSpec, wal
from leveret.storage.wal import WriteAheadLog

# the queues' logs: fsynced by the syncer; one clock value, so that a chunk brought back
# from before a truncation is not refused by recovery for its timestamp alone
QUEUE_LOG = LogConfig(fsync="always", fsync_on_write=False, clock=lambda: 1_000)
LOGS = 8
FROM = 4  # syncfs_from: a round of this many logs with a known durable point goes to the WAL


class Node:
    """A data directory with a starter log (it starts each round alone, so that the logs under
    test share the next one), LOGS logs, a WAL and a syncer."""

    def __init__(self, root: Path, max_bytes: int = wal.MAX_BYTES) -> None:
        self.root = root
        self.wal = WriteAheadLog(root / "wal", base=root, max_bytes=max_bytes)
        self.syncer = ThreadSyncer(syncfs_from=FROM, wal=self.wal)
        self.starter = Log.open(root / "queues" / "starter", QUEUE_LOG)
        self.logs = [Log.open(root / "queues" / f"q{i}", QUEUE_LOG) for i in range(LOGS)]

    def round(self, logs: list[Log], tags: list[bytes]) -> None:
        """Append one chunk to each log, sync them all in one round; wait for every answer."""
        results: list[bool] = []

        async def scenario() -> None:
            self.starter.append([b"start"])
            self.syncer.sync(self.starter, results.append)  # a round alone: the next is theirs
            for log, tag in zip(logs, tags, strict=True):
                log.append([tag])
                self.syncer.sync(log, results.append)
            async with asyncio.timeout(10):
                while len(results) < len(logs) + 1:
                    await asyncio.sleep(0.005)

        asyncio.run(scenario())
        assert results == [True] * (len(logs) + 1)

    def durable_sizes(self) -> dict[Path, int]:
        """Every segment and index file's size now: call it when all is durable in place."""
        return {path: path.stat().st_size for path in (self.root / "queues").rglob("*")
                if path.is_file()}

    def close(self) -> None:
        self.syncer.close()  # (closes the WAL: its files stay, as a crash leaves them)
        self.starter.close()
        for log in self.logs:
            log.close()


def lose_what_was_not_durable_in_place(node: Node, durable: dict[Path, int]) -> None:
    """A power loss: each segment and index goes back to its size when it was last durable in
    place (a file made since is cut to its header: seg.create fdatasyncs it and its folder)."""
    for path in (node.root / "queues").rglob("*"):
        if path.is_file() and path.suffix in (".segment", ".index"):
            os.truncate(path, durable.get(path, 8))


def contents(root: Path, name: str) -> list[bytes]:
    with Log.open(root / "queues" / name, QUEUE_LOG) as log:
        return [bytes(record) for view in log.reader(OffsetSpec.first())
                for _, record in view.items()]


def first_rounds(node: Node) -> dict[Path, int]:
    """Each log's first sync since it opened is in place (its durable point is not known yet);
    then everything is durable in place: the sizes a power loss goes back to."""
    node.round(node.logs, [b"first"] * LOGS)
    assert node.syncer.wal_rounds == 0
    return node.durable_sizes()


def test_a_round_of_many_logs_is_one_wal_fdatasync_and_survives_a_power_loss(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    durable = first_rounds(node)
    fdatasyncs = node.syncer.fdatasync_calls
    for turn in range(3):
        node.round(node.logs, [b"m%d-%d" % (i, turn) for i in range(LOGS)])
    # three rounds of eight logs: three WAL fdatasyncs, no fdatasync of any log (the starter's
    # three rounds alone are its own)
    assert node.syncer.wal_rounds == 3 and node.wal.appends == 3
    assert node.syncer.fdatasync_calls == fdatasyncs + 3
    assert all(log.committed_offset == 3 for log in node.logs)
    node.close()
    lose_what_was_not_durable_in_place(node, durable)
    assert contents(tmp_path, "q0") == [b"first"]  # without the WAL: lost
    lose_what_was_not_durable_in_place(node, durable)  # (the open above wrote nothing back)

    done = wal.replay(tmp_path / "wal")
    assert (done.files, done.records, done.applied, done.torn) == (1, 3 * LOGS, 3 * LOGS, [])
    assert wal.wal_files(tmp_path / "wal") == []
    for i in range(LOGS):
        assert contents(tmp_path, f"q{i}") == [b"first"] + [b"m%d-%d" % (i, t) for t in range(3)]


def test_a_truncated_tail_never_comes_back(tmp_path: Path) -> None:
    """A replica's uncommitted tail, cut by truncate_from (a new leader lacks it), then other
    chunks at the same offsets: replay writes the new ones and never the old, though the WAL
    holds both (its FORGET of that log comes between them)."""
    node = Node(tmp_path)
    first_rounds(node)
    node.round(node.logs, [b"old-1"] * LOGS)
    node.round(node.logs, [b"old-2"] * LOGS)
    replica = node.logs[0]
    replica.truncate_from(1)  # the FORGET: its segment durable in place, then the record
    assert wal.holding(os.path.realpath(replica.directory)) is None
    durable = node.durable_sizes()
    node.round(node.logs, [b"new-1"] * LOGS)  # same length: the old-2 after it would fit on
    # q0's first sync since the truncation reloaded it is in place (which makes the
    # truncation durable too): the WAL holds no record of it after its FORGET
    assert wal.holding(os.path.realpath(replica.directory)) is None
    durable.update((path, size) for path, size in node.durable_sizes().items()
                   if path.parent == replica.directory)
    node.close()
    lose_what_was_not_durable_in_place(node, durable)

    done = wal.replay(tmp_path / "wal")
    assert done.forgotten == 2 and done.records == 3 * LOGS - 1
    assert done.applied == 3 * LOGS - 1 - 2
    assert contents(tmp_path, "q0") == [b"first", b"new-1"]
    assert contents(tmp_path, "q1") == [b"first", b"old-1", b"old-2", b"new-1"]


def test_a_deleted_log_made_again_in_the_same_folder_gets_nothing_back(tmp_path: Path) -> None:
    """A delayed exchange's store lives in a folder named by the exchange: deleted and declared
    again, its new log must not get the old one's bytes from the WAL."""
    node = Node(tmp_path)
    first_rounds(node)
    node.round(node.logs, [b"of-the-old-log"] * LOGS)
    folder = node.logs[0].directory
    node.logs[0].discard()
    for path in folder.iterdir():
        path.unlink()
    node.logs[0] = Log.open(folder, QUEUE_LOG)
    node.logs[0].append([b"again"])
    node.logs[0].sync()
    node.close()

    done = wal.replay(tmp_path / "wal")
    assert done.forgotten == 1
    assert contents(tmp_path, "q0") == [b"again"]


@pytest.mark.parametrize("damage", ["torn", "corrupt"])
def test_a_torn_last_record_is_ignored(tmp_path: Path, damage: str) -> None:
    node = Node(tmp_path)
    durable = first_rounds(node)
    node.round(node.logs, [b"whole"] * LOGS)
    node.round(node.logs, [b"torn"] * LOGS)
    node.close()
    wal_file = wal.wal_files(tmp_path / "wal")[-1]
    if damage == "torn":  # the power went out while the last round's write was under way
        os.truncate(wal_file, wal_file.stat().st_size - 3)
    else:
        data = bytearray(wal_file.read_bytes())
        data[-2] ^= 0xFF
        wal_file.write_bytes(bytes(data))
    lose_what_was_not_durable_in_place(node, durable)

    done = wal.replay(tmp_path / "wal")
    assert done.torn == [wal_file.name] and done.applied == 2 * LOGS - 1
    last = contents(tmp_path, f"q{LOGS - 1}")  # the torn record was the last log's
    assert last == [b"first", b"whole"]
    assert all(contents(tmp_path, f"q{i}") == [b"first", b"whole", b"torn"]
               for i in range(LOGS - 1))


def test_a_checkpoint_makes_the_old_file_durable_in_place_and_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if threading.current_thread().name == "wal-checkpoint":
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    node = Node(tmp_path, max_bytes=1)  # every WAL write passes it: a new file each time
    first_rounds(node)
    node.round(node.logs, [b"m"] * LOGS)
    node.wal.wait_checkpoint(10)
    assert [p.name for p in wal.wal_files(tmp_path / "wal")] == ["wal.2"]
    assert node.wal.checkpoints == 1
    assert sorted(synced) == sorted(str(p) for log in node.logs
                                    for p in log.directory.glob("*.segment"))
    # nothing of these logs is left in a WAL: a truncation needs no FORGET
    assert all(wal.holding(os.path.realpath(log.directory)) is None for log in node.logs)
    node.close()
    assert wal.replay(tmp_path / "wal").records == 0


def test_a_failing_wal_falls_back_to_fdatasync_each(tmp_path: Path) -> None:
    node = Node(tmp_path)
    first_rounds(node)
    os.close(node.wal._fd)  # its file's descriptor is gone: the next write fails (EBADF)
    node.wal._fd = os.open(os.devnull, os.O_RDONLY)
    fdatasyncs = node.syncer.fdatasync_calls
    node.round(node.logs, [b"m"] * LOGS)
    assert node.syncer.wal_rounds == 0 and node.syncer.fdatasync_calls == fdatasyncs + 1 + LOGS
    assert all(log.committed_offset == 1 for log in node.logs)
    durable = node.durable_sizes()  # (each fdatasynced in place)
    node.round(node.logs, [b"n"] * LOGS)  # and from then on, fdatasync each
    assert node.syncer.wal_rounds == 0
    assert node.syncer.fdatasync_calls == fdatasyncs + 2 * (1 + LOGS)
    node.close()
    lose_what_was_not_durable_in_place(node, durable)
    wal.replay(tmp_path / "wal")
    assert contents(tmp_path, "q3") == [b"first", b"m"]


def test_a_replay_that_cannot_write_keeps_the_wal(tmp_path: Path) -> None:
    node = Node(tmp_path)
    first_rounds(node)
    node.round(node.logs, [b"m"] * LOGS)
    node.close()
    segment = next((tmp_path / "queues" / "q2").glob("*.segment"))
    segment.unlink()
    segment.mkdir()  # not a file that can be written
    with pytest.raises(IsADirectoryError):
        wal.replay(tmp_path / "wal")
    assert len(wal.wal_files(tmp_path / "wal")) == 1  # kept, for the next start


def test_a_write_taken_before_a_forget_is_not_written_after_it(tmp_path: Path) -> None:
    """A round read a log's bytes, then the log was truncated (its FORGET written) before the
    round's WAL write: that record must not follow the FORGET, or replay would write removed
    bytes back. (The log made them durable in place before its FORGET.)"""
    log_wal = WriteAheadLog(tmp_path / "wal", base=tmp_path)
    folder = str(tmp_path / "queues" / "q")
    taken = wal.Write(folder, folder + "/00000000000000000000.segment", 8, b"stale",
                      log_wal.forgets(folder))
    log_wal.forget(folder)
    assert log_wal.append([taken]) == 0 and log_wal.appends == 0
    fresh = wal.Write(folder, taken.segment, 8, b"fresh", log_wal.forgets(folder))
    assert log_wal.append([fresh]) == 1
    log_wal.close()
    assert wal.replay(tmp_path / "wal").records == 1


def test_a_log_taken_for_a_round_forgets_if_truncated_before_its_record_is_written(
        tmp_path: Path) -> None:
    """The syncer reserves a round's logs when it takes their bytes (on the loop's thread, the
    one that truncates them), not when the pool's thread writes their records: a truncation in
    between then writes a FORGET, and the record is left out."""
    log_wal = WriteAheadLog(tmp_path / "wal", base=tmp_path)
    log = Log.open(tmp_path / "queues" / "q", QUEUE_LOG)
    log.append([b"a"])
    log.sync()
    log.append([b"b"])
    folder = os.path.realpath(log.directory)
    ticket = log.sync_ticket()
    assert ticket is not None and ticket.start is not None
    log_wal.reserve([folder])
    taken = wal.Write(folder, str(ticket.path), ticket.start, ticket.read() or b"",
                      log_wal.forgets(folder))
    log.truncate_from(1)  # (a new leader lacks "b")
    assert log_wal.forgets(folder) == 1
    assert log_wal.append([taken]) == 0
    ticket.covered()
    log.close()
    log_wal.close()
    assert wal.replay(tmp_path / "wal").forgotten == 0  # (the FORGET came first: nothing to drop)


def test_a_round_that_fails_unexpectedly_commits_nothing(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a round (not a disk error, which is an OSError handled per log): its logs are
    answered False and broken, never committed as if durable."""
    node = Node(tmp_path)
    first_rounds(node)

    def broken(self: WriteAheadLog, writes: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(WriteAheadLog, "append", broken)
    results: list[bool] = []

    async def scenario() -> None:
        node.starter.append([b"start"])
        node.syncer.sync(node.starter, results.append)
        for log in node.logs:
            log.append([b"m"])
            node.syncer.sync(log, results.append)
        async with asyncio.timeout(10):
            while len(results) < LOGS + 1:
                await asyncio.sleep(0.005)

    asyncio.run(scenario())
    assert sorted(results) == [False] * LOGS + [True]  # (the starter's round may end last)
    assert all(log.committed_offset == 0 for log in node.logs)
    with pytest.raises(LogIOError):
        node.logs[0].append([b"after"])
    node.close()


def test_with_a_wal_a_second_round_runs_while_one_is_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The starter's round is stuck on the disk (its fdatasync waits): the logs that ask
    meanwhile do not wait for it, their WAL round runs and answers them."""
    node = Node(tmp_path)
    first_rounds(node)
    release = threading.Event()
    real = os.fdatasync
    starter_segment = next(node.starter.directory.glob("*.segment"))

    def slow_for_the_starter(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(starter_segment):
            release.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_for_the_starter)
    order: list[str] = []

    async def scenario() -> None:
        node.starter.append([b"start"])
        node.syncer.sync(node.starter, lambda ok: order.append("starter"))
        for log in node.logs:
            log.append([b"m"])
            node.syncer.sync(log, lambda ok: order.append("log"))
        async with asyncio.timeout(10):
            while len(order) < LOGS:
                await asyncio.sleep(0.005)
            release.set()
            while len(order) < LOGS + 1:
                await asyncio.sleep(0.005)

    asyncio.run(scenario())
    assert order == ["log"] * LOGS + ["starter"] and node.syncer.wal_rounds == 1
    node.close()
