"""The writer: offsets, chunks, rolling, snapshots, commit and fsync policies, tracking."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import (
    ChunkType,
    FakeClock,
    Log,
    LogClosedError,
    LogConfig,
    LogIOError,
    LogLockedError,
    OffsetSpec,
    inspect,
)

OpenLog = Callable[..., Log]


def _files(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _offsets(log: Log) -> tuple[int, int, int, int]:
    return log.first_offset, log.next_offset, log.last_offset, log.committed_offset


def _read_all(log: Log, **kwargs: object) -> list[tuple[int, bytes]]:
    reader = log.reader(OffsetSpec.first(), **kwargs)
    try:
        return [item for view in reader for item in view.items()]
    finally:
        reader.close()


def test_a_new_log_is_empty(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    assert _offsets(log) == (0, 0, -1, -1)
    directory = tmp_path / "log"
    assert _files(directory) == ["00000000000000000000.index", "00000000000000000000.segment"]
    assert (directory / "00000000000000000000.segment").read_bytes() == b"LVSG\x01\x00\x00\x00"
    assert (directory / "00000000000000000000.index").read_bytes() == b"LVIX\x01\x00\x00\x00"


def test_offsets_are_dense_and_one_append_is_one_chunk(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    assert log.append([b"a", b"b", b"c"]) == 0
    assert log.append([b"d"]) == 3
    assert _offsets(log) == (0, 4, 3, 3)
    chunks = list(inspect.dump_segment(tmp_path / "log" / "00000000000000000000.segment"))
    assert [(c["first_offset"], c["records"]) for c in chunks] == [(0, 3), (3, 1)]
    assert len(list(inspect.dump_index(tmp_path / "log" / "00000000000000000000.index"))) == 2
    assert _read_all(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"records": []}, ValueError, "records or publishers"),
        ({"records": [b"a"], "chunk_type": 1}, ValueError, "chunk type 1"),
        ({"records": [b"a"], "chunk_type": 15}, ValueError, "chunk type 15"),
        ({"records": [b"a"], "chunk_type": 256}, ValueError, "chunk type 256"),
        ({"records": [b"a"], "filter_values": []}, ValueError, "one entry per record"),
        ({"records": [b"a"], "publishers": {b"p" * 300: 1}}, ValueError, "at most 255"),
        ({"records": ["text"]}, TypeError, "bytes-like"),
    ],
)
def test_invalid_appends_write_nothing(
    open_log: OpenLog, tmp_path: Path, kwargs: dict, error: type, match: str
) -> None:
    log = open_log()
    with pytest.raises(error, match=match):
        log.append(**kwargs)
    assert log.next_offset == 0
    assert (tmp_path / "log" / "00000000000000000000.segment").stat().st_size == 8


def test_application_chunks_take_offsets_but_readers_skip_them_by_default(
    open_log: OpenLog,
) -> None:
    log = open_log()
    log.append([b"u0"])
    assert log.append([b"ack1", b"ack2"], chunk_type=16) == 1
    log.append([b"u3"])
    assert _read_all(log) == [(0, b"u0"), (3, b"u3")]
    assert _read_all(log, chunk_types=(16,)) == [(1, b"ack1"), (2, b"ack2")]
    reader = log.reader(OffsetSpec.first())
    reader.read()
    assert reader.read().first_offset == 3 and reader.position == 4


def test_rolls_by_size_with_zero_padded_names(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_size_bytes=400)
    for i in range(10):
        log.append([b"x" * 100], publishers=None)
        assert log.next_offset == i + 1
    names = [n for n in _files(tmp_path / "log") if n.endswith(".segment")]
    assert len(names) > 3
    assert names[1] == "00000000000000000002.segment"  # 8 + 2 * 152 bytes fit; a third does not
    for name in names:
        assert os.path.getsize(tmp_path / "log" / name) <= 400
    assert [o for o, _ in _read_all(log)] == list(range(10))


def test_a_chunk_bigger_than_a_segment_gets_a_segment_of_its_own(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log(max_segment_size_bytes=100)
    log.append([b"a" * 500])
    log.append([b"b" * 500])
    log.append([b"c"])
    names = [n for n in _files(tmp_path / "log") if n.endswith(".segment")]
    assert names == [f"{i:020d}.segment" for i in (0, 1, 2)]


def test_rolls_by_chunk_count(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=3)
    for _ in range(7):
        log.append([b"x"])
    names = [n for n in _files(tmp_path / "log") if n.endswith(".segment")]
    assert names == [f"{i:020d}.segment" for i in (0, 3, 6)]


def test_each_new_segment_starts_with_a_tracking_snapshot(
    open_log: OpenLog, tmp_path: Path
) -> None:
    log = open_log(max_segment_chunks=2)
    log.append([b"a"])
    log.append([b"b"])
    log.append([b"c"])  # rolls to segment 2 with empty tracking: no snapshot
    log.append([b"d"], publishers={b"pub": 41})
    log.store_offsets({b"con": 2})  # rolls to segment 4: snapshot (pub), then this delta
    log.append([b"e"])  # no roll: segment 4 holds no record yet, so a roll could not name one
    log.append([b"f"])  # rolls to segment 5: its snapshot holds both
    dumps = {
        b: list(inspect.dump_segment(tmp_path / "log" / f"{b:020d}.segment")) for b in (2, 4, 5)
    }
    assert [c["chunk_type"] for c in dumps[2]] == [ChunkType.USER, ChunkType.USER]
    assert [c["chunk_type"] for c in dumps[4]] == [2, 1, 0]
    assert [c["chunk_type"] for c in dumps[5]] == [2, 0]
    snapshot = dumps[5][0]
    assert snapshot["first_offset"] == 5 and snapshot["records"] == 0
    assert {(t["kind"], t["name"], t["value"]) for t in snapshot["tracking"]} == {
        ("publisher", b"pub", 41),
        ("consumer", b"con", 2),
    }
    assert [(t["kind"], t["name"]) for t in dumps[4][0]["tracking"]] == [("publisher", b"pub")]


def test_tracking_chunks_take_no_offset(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"])
    log.store_offsets({b"c1": 0, b"c2": 1})
    log.store_offsets({})
    log.append([b"b"])
    assert log.next_offset == 2
    chunks = list(inspect.dump_segment(tmp_path / "log" / "00000000000000000000.segment"))
    assert [(c["chunk_type"], c["first_offset"]) for c in chunks] == [(0, 0), (1, 1), (0, 1)]
    assert _read_all(log) == [(0, b"a"), (1, b"b")]


def test_tracking_survives_a_restart(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=2)
    for i in range(6):
        log.append([b"m%d" % i], publishers={b"p": i * 10, b"q%d" % (i % 2): i})
    log.store_offsets({b"c": 4})
    assert log.publisher_id(b"p") == 50 and log.consumer_offset(b"c") == 4
    before = log.tracking()
    log.close()
    again = open_log(max_segment_chunks=2)
    assert again.tracking() == before
    assert again.publisher_id(b"q1") == 5 and again.publisher_id(b"nobody") is None
    assert again.consumer_offset(b"c") == 4 and again.consumer_offset(b"x") is None


def test_chunk_timestamps_never_go_backwards(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log()
    log.append([b"a"])
    clock.advance(-5_000)
    log.append([b"b"])
    clock.advance(10_000)
    log.append([b"c"])
    reader = log.reader(OffsetSpec.first())
    stamps = [view.timestamp_ms for view in reader]
    assert stamps == [1_700_000_000_000, 1_700_000_000_000, 1_700_000_005_000]


def test_fsync_never_and_always_commit_at_once(open_log: OpenLog, tmp_path: Path) -> None:
    for policy in ("never", "always"):
        log = open_log(tmp_path / policy, fsync=policy)
        log.append([b"a"])
        assert log.committed_offset == 0
        assert log.sync_due() is False


def test_fsync_always_left_to_the_owner_commits_at_the_tickets_end(
        open_log: OpenLog, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(fsync="always", fsync_on_write=False)
    synced: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counted)
    assert log.sync_ticket() is None  # nothing written
    reader = log.reader(OffsetSpec.first())
    log.append([b"a", b"b"])
    log.append([b"c"])
    assert synced == [] and log.committed_offset == -1 and reader.read() is None
    assert log.kept_next == 0 and log.next_offset == 3
    ticket = log.sync_ticket()
    assert ticket is not None and ticket.offset == 2
    log.append([b"d"])  # written after the ticket was taken: not covered by it
    ticket.run()
    assert len(synced) == 1
    assert log.synced(ticket) is True
    assert log.committed_offset == 2 and log.kept_next == 3
    assert [v.first_offset for v in reader] == [0, 2]
    again = log.sync_ticket()
    assert again is not None and again.offset == 3
    again.run()
    assert log.synced(again) is True and log.committed_offset == 3
    assert log.sync_ticket() is None


def test_a_ticket_that_failed_breaks_the_log_and_one_from_before_a_truncation_commits_nothing(
        open_log: OpenLog) -> None:
    log = open_log(fsync="always", fsync_on_write=False)
    log.append([b"a"])
    stale = log.sync_ticket()
    assert stale is not None
    log.truncate_from(0)
    stale.run()
    assert log.synced(stale) is False and log.committed_offset == -1
    log.append([b"b"])
    failing = log.sync_ticket()
    assert failing is not None
    failing.error = OSError(5, "Input/output error")
    with pytest.raises(LogIOError):
        log.synced(failing)
    with pytest.raises(LogIOError):
        log.append([b"c"])


def test_a_ticket_is_only_for_always_left_to_the_owner(open_log: OpenLog,
                                                       tmp_path: Path) -> None:
    for name, settings in (("never", {"fsync": "never"}), ("timed", {"fsync": 100}),
                           ("inline", {"fsync": "always"})):
        log = open_log(tmp_path / name, **settings)
        log.append([b"a"])
        assert log.sync_ticket() is None
        assert log.kept_next == 1  # written (inline: fsynced as it was written)


def test_fsync_every_n_ms_commits_when_synced(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(fsync=100)
    log.append([b"a"])
    log.append([b"b"])
    assert log.committed_offset == -1
    reader = log.reader(OffsetSpec.first())
    assert reader.read() is None  # nothing committed yet
    clock.advance(99)
    assert log.sync_due() is False and log.committed_offset == -1
    clock.advance(1)
    assert log.sync_due() is True and log.committed_offset == 1
    assert log.sync_due() is False
    assert [v.first_offset for v in reader] == [0, 1]
    clock.advance(500)
    log.append([b"c"])  # due already: synced within append
    assert log.committed_offset == 2
    log.append([b"d"])
    assert log.committed_offset == 2
    log.sync()
    assert log.committed_offset == 3


def test_close_syncs_and_reopen_commits_everything(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(fsync=1000)
    log.append([b"a"])
    assert log.committed_offset == -1
    log.close()
    again = open_log(fsync=1000)
    assert again.committed_offset == 0 and _read_all(again) == [(0, b"a")]


def test_a_directory_has_one_writer(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    with pytest.raises(LogLockedError) as raised:
        Log.open(tmp_path / "log")
    assert raised.value.path == tmp_path / "log"
    log.close()
    with Log.open(tmp_path / "log") as again:
        assert again.next_offset == 0


def test_a_closed_log_refuses_work(open_log: OpenLog) -> None:
    log = open_log()
    log.close()
    log.close()
    for call in (
        lambda: log.append([b"a"]),
        lambda: log.store_offsets({b"c": 1}),
        lambda: log.reader(OffsetSpec.first()),
        log.sync,
        log.apply_retention,
        lambda: log.truncate_before(5),
    ):
        with pytest.raises(LogClosedError):
            call()


def test_summary(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=2)
    for _ in range(3):
        log.append([b"abc"], publishers={b"p": 1})
    log.store_offsets({b"c": 1})
    summary = log.summary()
    assert summary["first_offset"] == 0 and summary["last_offset"] == 2
    assert summary["committed_offset"] == 2 and summary["records"] == 3
    # 0: a b | 2: snapshot c | 3: snapshot, the consumer delta (it rolled: 2 chunks, 1 record)
    assert [s["file"] for s in summary["segments"]] == [f"{b:020d}.segment" for b in (0, 2, 3)]
    assert summary["bytes"] == sum(
        os.path.getsize(tmp_path / "log" / s["file"]) for s in summary["segments"]
    )
    assert summary["tracking"] == {"publishers": {b"p": 1}, "consumers": {b"c": 1}}
    assert inspect.summarise(tmp_path / "log") == summary


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"max_segment_size_bytes": 0}, "max_segment_size_bytes"),
        ({"max_segment_chunks": 0}, "max_segment_chunks"),
        ({"filter_size_bytes": 15}, "filter_size_bytes"),
        ({"filter_size_bytes": 256}, "filter_size_bytes"),
        ({"fsync": "sometimes"}, "fsync"),
        ({"fsync": 0}, "fsync"),
        ({"fsync": True}, "fsync"),
        ({"max_length_bytes": -1}, "max_length_bytes"),
        ({"max_age_ms": 1.5}, "max_age_ms"),
        ({"clock": 5}, "clock"),
    ],
)
def test_config_is_checked(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LogConfig(**overrides)


def test_the_real_clock_is_the_default(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log") as log:
        log.append([b"a"])
        view = log.reader(OffsetSpec.first()).read()
        assert view is not None and view.timestamp_ms > 1_600_000_000_000


def test_the_fake_clock() -> None:
    clock = FakeClock(5)
    assert clock() == 5 and clock.advance(10) == 15
    clock.set(3)
    assert clock() == 3


def test_publishers_without_records_take_no_offset(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"], publishers={b"p": 1})
    assert log.append([], publishers={b"p": 2, b"q": 9}) == 1  # all duplicates, say
    assert log.next_offset == 1 and log.committed_offset == 0
    assert log.append([b"b"]) == 1
    chunks = list(inspect.dump_segment(tmp_path / "log" / "00000000000000000000.segment"))
    assert [(c["chunk_type"], c["first_offset"], c["records"]) for c in chunks] == [
        (0, 0, 1),
        (ChunkType.TRACKING_DELTA, 1, 0),
        (0, 1, 1),
    ]
    assert _read_all(log) == [(0, b"a"), (1, b"b")]
    log.close()
    again = open_log()
    assert again.tracking().publishers == {b"p": 2, b"q": 9}


def test_marks_taken_stay_with_the_log_across_rolls_retention_and_a_restart(
    open_log: OpenLog, tmp_path: Path
) -> None:
    """`append(..., taken=...)` keeps marks in the chunk's trailer: they take no offset, a
    reader sees the records only, and the log keeps them (`taken()`) through segment rolls
    (each segment's tracking snapshot), retention of the segments that held them, and a
    reopen; marks without records are refused."""
    log = open_log(max_segment_chunks=2)
    log.append([b"a"], taken=[(b"log1", 7)])
    log.append([b"b", b"c"], taken=[(b"log1", 8), (b"log2", 3)])
    for i in range(4):
        log.append([b"m%d" % i])  # two rolls: the first segments hold no mark's chunk now
    assert log.next_offset == 7
    assert log.truncate_before(5)
    assert log.first_offset > 2
    assert _read_all(log)[0][1] in (b"m2", b"m3")
    with pytest.raises(ValueError, match="go with records"):
        log.append([], publishers={b"p": 1}, taken=[(b"log1", 9)])
    log.close()
    again = open_log()
    assert again.taken() == {b"log1": [7, 8], b"log2": [3]}
    assert again.tracking().publishers == {} and again.tracking().consumers == {}
