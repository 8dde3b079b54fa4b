"""Write failures: a full disk, an unwritable directory, a failing fsync. Each raises a typed
error naming the file, and leaves no half-written chunk that a reader could see.

Faults are real OS errors: a file size limit (RLIMIT_FSIZE, so writes stop short and then fail
with EFBIG), or a descriptor of the log swapped (dup2) for one that cannot be written or synced.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from leveret.storage import (
    DiskFullError,
    Log,
    LogIOError,
    OffsetSpec,
    inspect,
)

OpenLog = Callable[..., Log]


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _writer_fd(path: Path) -> int:
    """The descriptor this process holds open for writing on `path` (the Log's own)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") != str(path):
                continue
            flags = int(Path(f"/proc/self/fdinfo/{name}").read_text().split()[3], 8)
        except OSError:
            continue
        if flags & (os.O_WRONLY | os.O_RDWR):  # (segments are opened O_RDWR: a WAL reads)
            return int(name)
    raise AssertionError(f"no writer descriptor for {path}")


def _offsets(log: Log) -> list[int]:
    return [o for view in log.reader(OffsetSpec.first()) for o, _ in view.items()]


def test_a_full_disk_leaves_no_partial_chunk(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a" * 100])
    segment = tmp_path / "log" / "00000000000000000000.segment"
    size = segment.stat().st_size
    reader = log.reader(OffsetSpec.next())
    with file_size_limit(size + 1000), pytest.raises(DiskFullError) as raised:
        log.append([b"b" * 5000])  # the first 1000 bytes are written, then EFBIG
    assert raised.value.path == segment and raised.value.position == size
    assert raised.value.errno == errno.EFBIG
    assert str(segment) in str(raised.value)
    assert segment.stat().st_size == size  # cut back
    assert (log.next_offset, log.committed_offset) == (1, 0)
    assert reader.read() is None
    assert log.append([b"c"]) == 1  # the log carries on once there is room
    assert _offsets(log) == [0, 1]
    log.close()
    assert inspect.verify(tmp_path / "log") == []


def test_a_full_disk_while_rolling_keeps_the_snapshot_due(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log(max_segment_chunks=1)
    log.append([b"a"], publishers={b"p": 7})
    with file_size_limit(20), pytest.raises(DiskFullError) as raised:
        log.append([b"b"])  # the new segment's files are created, its snapshot does not fit
    new_segment = tmp_path / "log" / "00000000000000000001.segment"
    assert raised.value.path == new_segment and new_segment.stat().st_size == 8
    assert log.next_offset == 1
    log.append([b"c"])
    chunks = list(inspect.dump_segment(new_segment))
    assert [c["chunk_type"] for c in chunks] == [2, 0]  # the snapshot came first after all
    log.close()
    again = open_log(max_segment_chunks=1)
    assert again.publisher_id(b"p") == 7 and _offsets(again) == [0, 1]


def test_a_roll_that_cannot_create_its_file(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=1)
    log.append([b"a"])
    blocker = tmp_path / "log" / "00000000000000000001.index"
    blocker.mkdir()  # something in the way of the next index file
    with pytest.raises(LogIOError) as raised:
        log.append([b"b"])
    assert raised.value.path == blocker and raised.value.errno == errno.EEXIST
    assert not (tmp_path / "log" / "00000000000000000001.segment").exists()  # nothing left over
    assert log.next_offset == 1 and log.committed_offset == 0
    blocker.rmdir()
    assert log.append([b"b"]) == 1


def test_a_write_that_cannot_be_undone_stops_the_log(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"])
    segment = tmp_path / "log" / "00000000000000000000.segment"
    read_only = os.open(segment, os.O_RDONLY)
    os.dup2(read_only, _writer_fd(segment))  # writes and truncation now fail (EBADF, EINVAL)
    os.close(read_only)
    with pytest.raises(LogIOError) as raised:
        log.append([b"b"])
    assert raised.value.path == segment and raised.value.errno == errno.EBADF
    with pytest.raises(LogIOError, match="reopen the log"):
        log.append([b"c"])
    assert log.committed_offset == 0
    log.close()
    again = open_log()
    assert _offsets(again) == [0] and again.append([b"b"]) == 1


def test_a_failing_fsync_does_not_commit(open_log: OpenLog, tmp_path: Path, clock) -> None:
    log = open_log(fsync=100)
    segment = tmp_path / "log" / "00000000000000000000.segment"
    read_end, write_end = os.pipe()
    os.dup2(write_end, _writer_fd(segment))  # writes succeed, fdatasync fails (EINVAL)
    os.close(write_end)
    try:
        log.append([b"a"])
        clock.advance(100)
        with pytest.raises(LogIOError) as raised:
            log.sync_due()
        assert raised.value.path == segment and raised.value.errno == errno.EINVAL
        assert log.committed_offset == -1
        with pytest.raises(LogIOError, match="reopen the log"):
            log.append([b"b"])
    finally:
        os.close(read_end)


def test_a_directory_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path / "file" / "log")
    assert raised.value.path == tmp_path / "file" / "log"
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path / "file")
    assert raised.value.path == tmp_path / "file"


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs")
def test_a_directory_in_a_read_only_place() -> None:
    with pytest.raises(LogIOError) as raised:
        Log.open("/sys/leveret-log")
    assert raised.value.path == Path("/sys/leveret-log")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir(mode=0o500)
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path / "log")
    assert raised.value.path.parent == tmp_path / "log"


def test_retention_that_cannot_delete_a_file(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=1)
    log.append([b"a"])
    log.append([b"b"])
    log.append([b"c"])
    first = tmp_path / "log" / "00000000000000000000.segment"
    first.unlink()
    first.mkdir()  # unlink() now fails with EISDIR
    with pytest.raises(LogIOError) as raised:
        log.truncate_before(2)
    assert raised.value.path == first
    first.rmdir()
    # the retry forgets the segment that is already gone and deletes the next one
    assert [p.name[:20] for p in log.truncate_before(2)] == [f"{0:020d}", f"{1:020d}"]
    assert log.first_offset == 2


def test_an_orphan_index_that_cannot_be_deleted(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log") as log:
        log.append([b"a"])
    (tmp_path / "log" / "00000000000000000009.index").mkdir()
    with pytest.raises(LogIOError) as raised:
        Log.open(tmp_path / "log")
    assert raised.value.path == tmp_path / "log" / "00000000000000000009.index"


def test_retention_failing_on_a_roll_does_not_fail_the_append(
    open_log: OpenLog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(max_segment_chunks=1)
    log.append([b"a"])
    log.append([b"b"])  # segment 0 is sealed, 1 is active
    blocked = tmp_path / "log" / "00000000000000000000.segment"
    blocked.unlink()
    blocked.mkdir()  # unlink() now fails with EISDIR
    with pytest.raises(LogIOError):
        log.set_retention(max_length_bytes=0)  # asked for explicitly: it raises
    with caplog.at_level(logging.WARNING, logger="leveret.storage"):
        assert log.append([b"c"]) == 2  # rolls; retention fails again, quietly
    assert f"retention could not delete {blocked}" in caplog.text
    blocked.rmdir()
    assert [p.name[:20] for p in log.apply_retention()] == [f"{b:020d}" for b in (0, 1)]
