"""Replication's storage side: a leader's chunks shipped as they are on disk into a replica's
log (records, offsets, tracking and epochs come out the same), the replica's refusals, and the
truncation of a tail that a new leader does not have."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import Log, OffsetSpec
from leveret.storage.errors import BadChunk, CorruptLogError


def _records(log: Log, spec: OffsetSpec | None = None) -> list[tuple[int, bytes]]:
    reader = log.reader(spec or OffsetSpec.first())
    records = [item for view in reader for item in view.items()]
    reader.close()
    return records


def _ship(leader: Log, replica: Log, max_bytes: int = 1 << 20) -> int:
    """Everything the replica lacks, in calls of at most `max_bytes`; returns how many calls."""
    calls = 0
    cursor = leader.ship_from(replica.next_offset)
    while True:
        data, cursor = leader.read_chunks(cursor, max_bytes)
        if not data:
            return calls
        calls += 1
        assert replica.append_chunks(data) == cursor.offset


def _leader(open_log: Callable[..., Log], tmp_path: Path, **config: object) -> Log:
    leader = open_log(tmp_path / "leader", max_segment_chunks=3, **config)
    for i in range(10):
        leader.set_epoch(1 + i // 4)
        leader.append([b"m%d-%d" % (i, j) for j in range(i % 3 + 1)],
                      publishers={b"pub": i})
        if i % 4 == 0:
            leader.store_offsets({b"reader": i})
    return leader


def test_a_replica_gets_the_same_log(open_log: Callable[..., Log], tmp_path: Path) -> None:
    leader = _leader(open_log, tmp_path)
    replica = open_log(tmp_path / "replica", max_segment_chunks=5)
    calls = _ship(leader, replica, max_bytes=100)  # about one chunk per call
    assert calls >= 10
    assert _records(replica) == _records(leader)
    assert replica.tail == leader.tail == (3, leader.next_offset)
    assert replica.publisher_id(b"pub") == 9
    assert replica.consumer_offset(b"reader") == 8
    replica.close()
    reopened = open_log(tmp_path / "replica", max_segment_chunks=5)
    assert (reopened.tail, reopened.publisher_id(b"pub")) == (leader.tail, 9)
    assert _records(reopened) == _records(leader)


def test_a_big_chunk_ships_whole(open_log: Callable[..., Log], tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    leader.append([b"x" * 10_000])
    data, cursor = leader.read_chunks(leader.ship_from(0), 10)
    assert cursor.offset == 1 and len(data) > 10_000
    assert leader.read_chunks(cursor, 10) == (b"", cursor)  # nothing after the writer's tail


def test_the_replica_refuses_what_does_not_follow(open_log: Callable[..., Log],
                                                  tmp_path: Path) -> None:
    leader = _leader(open_log, tmp_path)
    replica = open_log(tmp_path / "replica")
    first, _ = leader.read_chunks(leader.ship_from(0), 1)
    replica.append_chunks(first)
    later, _ = leader.read_chunks(leader.ship_from(10), 1)
    with pytest.raises(BadChunk, match="does not follow this log's next offset"):
        replica.append_chunks(later)
    damaged = bytearray(leader.read_chunks(leader.ship_from(replica.next_offset), 1)[0])
    damaged[-1] ^= 0xFF
    with pytest.raises(BadChunk, match="chunk CRC mismatch"):
        replica.append_chunks(damaged)
    with pytest.raises(BadChunk, match="partial chunk"):
        replica.append_chunks(bytes(damaged[:-3]))
    assert _records(replica) == _records(leader)[:1]


def test_an_older_epoch_is_refused(open_log: Callable[..., Log], tmp_path: Path) -> None:
    old = open_log(tmp_path / "old")
    old.append([b"a"])
    old.append([b"b"])
    replica = open_log(tmp_path / "replica")
    replica.set_epoch(2)
    replica.append([b"a"])
    with pytest.raises(BadChunk, match="chunk of epoch 0 after epoch 2"):
        replica.append_chunks(old.read_chunks(old.ship_from(1), 1)[0])


def test_a_divergent_tail_is_truncated_at_the_epoch_end(open_log: Callable[..., Log],
                                                        tmp_path: Path) -> None:
    """Both logs hold epoch 1's first chunks; the old leader (now a replica) also wrote two
    chunks of epoch 1 that the new leader never got, and the new leader wrote epoch 2."""
    old = open_log(tmp_path / "old", max_segment_chunks=2)
    new = open_log(tmp_path / "new", max_segment_chunks=3)
    old.set_epoch(1)
    for i in range(3):
        old.append([b"e1-%d" % i], publishers={b"p": i})
    _ship(old, new)
    old.append([b"e1-lost-a"], publishers={b"p": 100})
    old.append([b"e1-lost-b"])
    new.set_epoch(2)
    new.append([b"e2-a", b"e2-b"], publishers={b"p": 3})
    end = new.epoch_end(old.tail[0])
    assert (end, new.epoch_end(2), new.epoch_end(0)) == (3, 5, 0)
    old.truncate_from(min(end, old.next_offset))
    assert old.tail == (1, 3) and old.publisher_id(b"p") == 2
    _ship(new, old)
    assert _records(old) == _records(new)
    assert old.tail == new.tail == (2, 5) and old.publisher_id(b"p") == 3
    assert [r for _, r in _records(old, OffsetSpec.offset(3))] == [b"e2-a", b"e2-b"]


def test_truncating_everything_and_below_the_log(open_log: Callable[..., Log],
                                                 tmp_path: Path) -> None:
    log = open_log(max_segment_chunks=2)
    for i in range(5):
        log.append([b"%d" % i])
    log.truncate_from(0)
    assert (log.next_offset, _records(log)) == (0, [])
    log.append([b"again"])
    assert _records(log) == [(0, b"again")]
    log.truncate_from(7)  # beyond the tail: nothing to do
    assert log.next_offset == 1
    log.truncate_before(1)


def _files(log: Log) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(log.directory.iterdir())
            if path.is_file()}


@pytest.mark.parametrize("tracked", [True, False], ids=["with-tracking", "no-tracking"])
def test_a_replicas_files_are_the_leaders_byte_for_byte(open_log: Callable[..., Log],
                                                        tmp_path: Path, tracked: bool) -> None:
    """The replica rolls where the leader rolled and writes no snapshot of its own: with
    tracking, the leader's snapshot starts each segment on both; without, both roll by the
    size rule."""
    leader = open_log(tmp_path / "leader", max_segment_chunks=3)
    replica = open_log(tmp_path / "replica", max_segment_chunks=3)
    cursor = leader.ship_from(0)
    for i in range(11):
        leader.append([b"r%d" % i] * (i % 3 + 1), publishers={b"pub": i} if tracked else None)
        if tracked and i % 4 == 1:
            leader.store_offsets({b"reader": i})
        while True:  # chunk by chunk, as a replica keeping up gets them
            data, cursor = leader.read_chunks(cursor, 1)
            if not data:
                break
            replica.append_chunks(data)
    assert len([n for n in _files(leader) if n.endswith(".segment")]) >= 4
    assert _files(replica) == _files(leader)
    assert replica.tracking() == leader.tracking()


def test_a_replica_reset_to_an_offset_starts_there(open_log: Callable[..., Log],
                                                   tmp_path: Path) -> None:
    log = open_log(tmp_path / "r", max_segment_chunks=2)
    for i in range(5):
        log.append([b"%d" % i], publishers={b"p": i})
    log.reset_to(40)
    assert (log.first_offset, log.next_offset, _records(log)) == (40, 40, [])
    assert log.publisher_id(b"p") is None
    log.close()
    reopened = open_log(tmp_path / "r", max_segment_chunks=2)
    assert (reopened.first_offset, reopened.next_offset) == (40, 40)
    with pytest.raises(ValueError, match="negative"):
        reopened.reset_to(-1)


def test_a_replica_behind_the_leaders_retention_restarts_at_its_first_chunk(
        open_log: Callable[..., Log], tmp_path: Path) -> None:
    """The leader deleted the segments a lagging (or new) replica still lacks: shipping from
    the replica's tail is refused, so the replica starts again at the leader's first offset,
    and the leader's first segment brings the tracking snapshot with it."""
    leader = open_log(tmp_path / "leader", max_segment_chunks=3)
    for i in range(12):
        leader.append([b"m%d" % i], publishers={b"pub": i})
        if i == 2:
            leader.store_offsets({b"reader": 1})
    replica = open_log(tmp_path / "replica", max_segment_chunks=3)
    replica.append_chunks(leader.read_chunks(leader.ship_from(0), 1)[0])  # it had offset 0
    leader.truncate_before(7)
    assert leader.first_offset > replica.next_offset
    with pytest.raises(BadChunk, match="does not follow"):
        replica.append_chunks(leader.read_chunks(leader.ship_from(replica.next_offset), 1)[0])
    replica.reset_to(leader.first_offset)
    _ship(leader, replica)
    assert _records(replica) == _records(leader)
    assert replica.first_offset == leader.first_offset
    assert (replica.publisher_id(b"pub"), replica.consumer_offset(b"reader")) == (11, 1)
    assert _files(replica) == _files(leader)


def test_epoch_ranges_list_each_epoch_with_where_it_ends(open_log: Callable[..., Log],
                                                         tmp_path: Path) -> None:
    """Found by bisecting, across segments, with tracking chunks and an empty rolled segment."""
    log = open_log(tmp_path / "r", max_segment_chunks=2)
    assert log.epoch_ranges() == []
    log.set_epoch(1)
    log.append([b"a", b"b"])
    log.append([b"c"])
    log.set_epoch(4)
    log.store_offsets({b"x": 1})  # a tracking chunk of epoch 4 at offset 3
    log.append([b"d"])
    log.set_epoch(7)
    log.mark_epoch()  # nothing but its epoch, at offset 4
    assert log.epoch_ranges() == [(1, 3), (4, 4), (7, 4)]
    assert [log.epoch_end(e) for e in (0, 1, 4, 7)] == [0, 3, 4, 4]
    assert log.tail == (7, 4) and _records(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


def test_shipping_from_an_offset_starts_with_the_tracking_chunks_there(
        open_log: Callable[..., Log], tmp_path: Path) -> None:
    """Tracking chunks at an offset may end the segment before the one that holds the offset
    (it rolled after them): a replica cut at that offset gets them again, and the two logs are
    the same, file for file."""
    leader = open_log(tmp_path / "leader", max_segment_chunks=3)
    replica = open_log(tmp_path / "replica", max_segment_chunks=3)
    leader.append([b"one"])
    leader.store_offsets({b"a": 0})
    leader.store_offsets({b"b": 0})  # the segment is full: the next chunk rolls
    leader.append([b"two"])
    _ship(leader, replica)
    replica.truncate_from(1)  # the tracking chunks at 1 go too
    assert replica.tail == (0, 1) and replica.consumer_offset(b"a") is None
    cursor = leader.ship_from(1)
    while True:
        data, cursor = leader.read_chunks(cursor, 1 << 20)
        if not data:
            break
        replica.append_chunks(data)
    for name in ("00000000000000000000.segment", "00000000000000000001.segment"):
        assert (tmp_path / "replica" / name).read_bytes() == (
            tmp_path / "leader" / name).read_bytes()
    assert replica.consumer_offset(b"b") == 0


def test_truncating_at_the_next_offset_drops_the_tracking_chunks_there(
        open_log: Callable[..., Log]) -> None:
    log = open_log()
    log.append([b"one"])
    log.store_offsets({b"a": 0})
    log.truncate_from(1)
    assert log.consumer_offset(b"a") is None and log.epoch_ranges() == [(0, 1)]
    log.truncate_from(1)  # nothing there: nothing changes
    assert _records(log) == [(0, b"one")]


def test_a_fence_outlives_a_restart_and_never_goes_back(open_log: Callable[..., Log],
                                                        tmp_path: Path) -> None:
    log = open_log()
    assert log.fence == 0
    log.raise_fence(5)
    log.raise_fence(3)
    assert log.fence == 5
    log.close()
    assert open_log().fence == 5
    assert (tmp_path / "log" / "fence").read_bytes()[:4] == b"LVFN"


def test_a_damaged_fence_is_reported_not_ignored(open_log: Callable[..., Log],
                                                  tmp_path: Path) -> None:
    log = open_log()
    log.raise_fence(2)
    log.close()
    (tmp_path / "log" / "fence").write_bytes(b"LVFN\x01\x00\x00\x00\x02")
    with pytest.raises(CorruptLogError, match="9 bytes, expected 16"):
        open_log()
    (tmp_path / "log" / "fence").write_bytes(b"XXXX" + bytes(12))
    with pytest.raises(CorruptLogError, match="bad magic"):
        open_log()


def test_a_shipping_log_ships_its_newest_chunks_from_memory_as_the_file_has_them(
        open_log: Callable[..., Log], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from leveret.storage import log as log_module
    from leveret.storage import shipping
    leader = open_log(tmp_path / "leader")
    leader.append([b"before-shipping"])
    cursor = leader.ship_from(0)
    data, cursor = leader.read_chunks(cursor, 1 << 20)  # from the file: it ships from now on
    assert data
    sizes = [1, 3, 2, 40, 1] + [1] * (log_module.RECENT_CHUNKS + 2)
    for i, count in enumerate(sizes):
        leader.append([b"r%d-%d" % (i, j) * 20 for j in range(count)])
    end = leader.next_offset
    # every chunk as the file has it, in pieces of at most 300 bytes (at least one chunk)
    from_file = []
    at = cursor
    while True:
        piece, at = shipping.read_chunks(tmp_path / "leader", at, 300, end)
        if not piece:
            break
        from_file.append((piece, at))
    reads = []
    real = shipping.read_chunks
    monkeypatch.setattr(shipping, "read_chunks",
                        lambda *a, **k: (reads.append(a[1]), real(*a, **k))[1])
    shipped = []
    at = cursor
    while True:
        piece, at = leader.read_chunks(at, 300)
        if not piece:
            break
        shipped.append((piece, at))
    assert shipped == from_file
    # only what fell out of memory (the oldest of more than RECENT_CHUNKS) came from the file
    fell_out = 1 + sum(sizes[:len(sizes) - log_module.RECENT_CHUNKS])
    assert reads and all(r.offset < fell_out for r in reads)
    assert len(reads) < len(shipped) - log_module.RECENT_CHUNKS // 2
    replica = open_log(tmp_path / "replica")
    _ship(leader, replica, 300)
    assert _records(replica) == _records(leader)
