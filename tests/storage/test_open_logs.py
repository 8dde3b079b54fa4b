"""The process's cap on logs holding their files open (storage/openlogs.py) over real logs:
the least recently used release their active segment and index and reopen them on the next
write or sync, never while something written waits for an fsync that no ticket covers, and
what they hold (records, readers positioned in them, rolls, recovery) is unchanged by it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leveret.storage import Log, LogConfig, LogIOError, OffsetSpec
from leveret.storage.openlogs import OpenLogs

QUEUE = {"fsync": "always", "fsync_on_write": False}  # the broker's queue logs: the syncer's


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _records(log: Log, start: int = 0) -> list[bytes]:
    with log.reader(OffsetSpec.offset(start)) as reader:
        return [record for chunk in reader for _offset, record in chunk.items()]


def _logs(tmp_path: Path, count: int, cap: int, **config: object) -> tuple[OpenLogs, list[Log]]:
    open_logs = OpenLogs(cap)
    settings = LogConfig(open_logs=open_logs, folder_lock=False,  # (the broker's: one lock)
                         **config)  # type: ignore[arg-type]
    return open_logs, [Log.open(tmp_path / f"q{i}", settings) for i in range(count)]


def test_only_the_last_used_logs_hold_files_and_the_others_reopen_theirs(tmp_path: Path) -> None:
    before = _fds()
    open_logs, logs = _logs(tmp_path, 10, 4)  # (its target: 3 logs)
    for round_ in range(3):
        for i, log in enumerate(logs):
            log.append([b"%d-%d" % (i, round_)])
            assert len(open_logs) <= 3
    assert [log.files_open for log in logs] == [False] * 7 + [True] * 3
    assert _fds() - before == 2 * 3
    assert all(_records(log) == [b"%d-%d" % (i, r) for r in range(3)]
               for i, log in enumerate(logs))
    for log in logs:
        log.close()
    assert _fds() == before and len(open_logs) == 0
    again = [Log.open(tmp_path / f"q{i}", LogConfig()) for i in range(10)]
    assert [log.next_offset for log in again] == [3] * 10  # whole after recovery
    for log in again:
        log.close()


def test_an_unsynced_log_keeps_its_files_until_a_ticket_covers_them(tmp_path: Path) -> None:
    open_logs, (d, a, b, c) = _logs(tmp_path, 4, 4, **QUEUE)  # (target 3: d's released)
    a.append([b"a0"])  # written, not fsynced, no ticket yet: a must keep its files
    for log in (b, c):
        log.append([b"x"])
        log.sync()  # fsynced: nothing of b's and c's waits for their files
    d.append([b"d0"])  # past the target: a, the oldest, refuses; b releases its files
    assert a.files_open and not b.files_open and c.files_open and d.files_open
    assert (open_logs.refused, open_logs.released, open_logs.synced) == (1, 2, 0)
    assert not a.release_files()
    ticket = a.sync_ticket()  # a round holds its own descriptor now: a may release its files
    assert ticket is not None and ticket.held and a.release_files() and not a.files_open
    ticket.run()
    assert a.synced(ticket) and a.committed_offset == 0
    a.append([b"a1"])  # reopened to write
    assert a.files_open and _records(a) == [b"a0"]  # (a1 is not fsynced yet)
    later = a.sync_ticket()
    assert later is not None
    later.run()
    a.synced(later)
    assert _records(a) == [b"a0", b"a1"]
    for log in (a, b, c, d):
        log.close()


def test_written_after_the_ticket_keeps_the_files_open(tmp_path: Path) -> None:
    _open_logs, (a, b) = _logs(tmp_path, 2, 1, **QUEUE)
    a.append([b"a0"])
    ticket = a.sync_ticket()
    assert ticket is not None and a.files_open
    a.append([b"a1"])  # not covered by the ticket
    assert not a.release_files()
    ticket.run()
    a.synced(ticket)
    assert a.committed_offset == 0 and a.files_open and not a.release_files()
    for log in (a, b):
        log.close()


def test_between_the_target_and_the_cap_unsynced_logs_release_their_files_at_their_ticket(
        tmp_path: Path) -> None:
    open_logs, (a, b, c, d) = _logs(tmp_path, 4, 4, **QUEUE)  # (target 3: a's released)
    for log in (b, c, d, a):
        log.append([b"x"])  # all four wait for an fsync: past the target, not past the cap
    assert all(log.files_open for log in (a, b, c, d)) and open_logs.synced == 0
    ticket = b.sync_ticket()  # covered now: b releases its files for the target
    assert ticket is not None and not b.files_open and len(open_logs) == 3
    ticket.run()
    assert b.synced(ticket) and _records(b) == [b"x"]
    later = [log.sync_ticket() for log in (c, d, a)]
    assert len(open_logs) == 3  # (at the target: they keep theirs)
    for log, each in zip((c, d, a), later, strict=True):
        assert each is not None
        each.run()
        log.synced(each)
    for log in (a, b, c, d):
        log.close()


def test_past_the_cap_the_oldest_unsynced_log_is_fsynced_to_release_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_logs, (a, b, c) = _logs(tmp_path, 3, 1, **QUEUE)
    fsynced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (fsynced.append(fd), real(fd))[1])
    a.append([b"a0"])
    b.append([b"b0"])  # both wait for an fsync, and the cap is 1: a is fsynced and released
    assert not a.files_open and b.files_open and len(fsynced) == 1
    assert a.committed_offset == 0 and a.sync_ticket() is None  # (its round has nothing left)
    assert (open_logs.refused, open_logs.synced) == (1, 1)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    c.append([b"c0"])  # b's fsync fails: b keeps its files, and is broken
    assert b.files_open and b.committed_offset == -1 and len(open_logs) == 2
    with pytest.raises(LogIOError):
        b.append([b"b1"])
    monkeypatch.undo()
    for log in (a, b, c):
        log.close()


def test_a_ticket_without_a_descriptor_opens_the_file_to_fdatasync(tmp_path: Path) -> None:
    before = _fds()
    _open_logs, (a, b) = _logs(tmp_path, 2, 2, **QUEUE)
    a.append([b"a0"])
    b.append([b"b0"])
    ticket = a.sync_ticket(hold=False)  # a syncfs round's: no descriptor of its own
    assert ticket is not None and not ticket.held and a.release_files()
    assert _fds() - before == 2  # b's files only
    ticket.run()  # (a syncfs that failed falls back to this)
    assert ticket.error is None and a.synced(ticket) and _records(a) == [b"a0"]
    missing = b.sync_ticket(hold=False)
    assert missing is not None
    os.rename(missing.path, missing.path.with_suffix(".gone"))
    missing.run()  # the error is kept for synced, which breaks the log
    assert isinstance(missing.error, FileNotFoundError)
    with pytest.raises(LogIOError):
        b.synced(missing)
    os.rename(missing.path.with_suffix(".gone"), missing.path)
    a.close()
    b.close()


def test_a_reader_positioned_in_a_released_log_keeps_reading(tmp_path: Path) -> None:
    _open_logs, (a, b) = _logs(tmp_path, 2, 1, max_segment_chunks=4)
    for i in range(6):
        a.append([b"a%d" % i])  # (a rolled once: two segments)
    reader = a.reader(OffsetSpec.offset(0))
    first = reader.read()
    assert first is not None and list(first.items()) == [(0, b"a0")]
    b.append([b"b0"])  # a's files released
    assert not a.files_open
    for i in range(6, 10):
        a.append([b"a%d" % i])  # reopened; and a rolls again, released
        b.append([b"b%d" % i])
    seen = [record for chunk in reader for _offset, record in chunk.items()]
    assert seen == [b"a%d" % i for i in range(1, 10)]
    reader.close()
    for log in (a, b):
        log.close()


def test_a_roll_and_a_truncation_while_released(tmp_path: Path) -> None:
    _open_logs, (a, b) = _logs(tmp_path, 2, 1, max_segment_chunks=2, **QUEUE)
    for i in range(5):
        a.append([b"a%d" % i])
        a.sync()
        b.append([b"b%d" % i])
        b.sync()
    assert not a.files_open and len(a.summary()["segments"]) == 3
    a.truncate_from(3)
    assert a.next_offset == 3 and _records(a) == [b"a0", b"a1", b"a2"]
    b.append([b"b5"])
    a.append([b"a3'"])
    a.sync()
    assert _records(a) == [b"a0", b"a1", b"a2", b"a3'"]
    for log in (a, b):
        log.close()


def test_a_file_that_cannot_be_reopened_fails_the_write_and_nothing_else(tmp_path: Path) -> None:
    open_logs, (a, b) = _logs(tmp_path, 2, 1)
    a.append([b"a0"])
    b.append([b"b0"])
    assert not a.files_open
    index = next(p for p in a.directory.iterdir() if p.suffix == ".index")
    os.rename(index, index.with_suffix(".gone"))
    held = _fds()
    with pytest.raises(LogIOError) as raised:
        a.append([b"a1"])
    assert raised.value.path == index and not a.files_open
    assert _fds() == held  # the segment, reopened first, is closed again
    assert a.next_offset == 1 and len(open_logs) == 1
    os.rename(index.with_suffix(".gone"), index)
    a.append([b"a1"])  # not broken: the next write reopens the files
    assert _records(a) == [b"a0", b"a1"]
    for log in (a, b):
        log.close()


def test_bad_caps_are_refused() -> None:
    for cap in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            OpenLogs(cap)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LogConfig(open_logs=512)  # type: ignore[arg-type]
