"""Epochs in the log: every chunk carries its writer's epoch (docs/FORMAT.md 3.1), the log's
tail is (last epoch, next offset), and logs written before epochs (format version 1) still open,
read, recover and take new chunks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from leveret.storage import Log, OffsetSpec, inspect

SEGMENT = "00000000000000000000.segment"
INDEX = "00000000000000000000.index"


def _records(log: Log, spec: OffsetSpec | None = None) -> list[bytes]:
    reader = log.reader(spec or OffsetSpec.first())
    records = [record for view in reader for _offset, record in view.items()]
    reader.close()
    return records


def test_chunks_carry_the_epoch_they_were_written_in(open_log: Callable[..., Log],
                                                     tmp_path: Path) -> None:
    log = open_log()
    log.append([b"a"])
    log.set_epoch(3)
    log.append([b"b", b"c"], publishers={b"p": 1})
    log.store_offsets({b"c": 0})
    assert (log.epoch, log.tail) == (3, (3, 3))
    log.close()
    epochs = [c["epoch"] for c in inspect.dump_segment(tmp_path / "log" / SEGMENT)]
    assert epochs == [0, 3, 3]
    reopened = open_log()
    assert (reopened.epoch, reopened.tail) == (3, (3, 3))
    assert _records(reopened) == [b"a", b"b", b"c"]


def test_the_epoch_never_goes_back(open_log: Callable[..., Log]) -> None:
    log = open_log()
    log.set_epoch(5)
    log.append([b"a"])
    with pytest.raises(ValueError, match="epoch 4 is older than the log's last epoch 5"):
        log.set_epoch(4)
    log.set_epoch(5)  # the same term again is fine
    assert log.tail == (5, 1)


def test_a_new_segment_keeps_the_tail_epoch(open_log: Callable[..., Log]) -> None:
    log = open_log(max_segment_chunks=2)
    log.set_epoch(7)
    for i in range(5):
        log.append([b"x%d" % i], publishers={b"p": i})
    log.close()
    reopened = open_log(max_segment_chunks=2)
    assert reopened.tail == (7, 5)
    assert len(reopened.summary()["segments"]) > 1


def _rewrite_as_version_1(directory: Path, version_1: Callable[[bytes], bytes]) -> None:
    """Every chunk of the segment rewritten in format version 1; the index (a derived cache)
    removed, so it is rebuilt from the segment."""
    segment = directory / SEGMENT
    data = segment.read_bytes()
    chunks = list(inspect.dump_segment(segment))
    out = data[:chunks[0]["position"]]
    for chunk in chunks:
        out += version_1(data[chunk["position"]:chunk["position"] + chunk["size"]])
    segment.write_bytes(out)
    os.unlink(directory / INDEX)


def test_a_version_1_log_opens_reads_and_takes_new_chunks(
    open_log: Callable[..., Log], tmp_path: Path, version_1: Callable[[bytes], bytes]
) -> None:
    log = open_log()
    log.append([b"old-1", b"old-2"], publishers={b"pub": 9})
    log.store_offsets({b"con": 1})
    log.close()
    _rewrite_as_version_1(tmp_path / "log", version_1)
    old = open_log()
    assert old.tail == (0, 2)
    assert (old.publisher_id(b"pub"), old.consumer_offset(b"con")) == (9, 1)
    assert _records(old) == [b"old-1", b"old-2"]
    old.set_epoch(1)
    old.append([b"new"])
    old.close()
    sizes = [c["size"] - c["bloom_bytes"] - c["data_bytes"] - c["filter_bytes"]
             - c["trailer_bytes"] for c in inspect.dump_segment(tmp_path / "log" / SEGMENT)]
    assert sizes == [48, 48, 56]  # two version 1 headers, then a version 2 one
    mixed = open_log()
    assert mixed.tail == (1, 3)
    assert _records(mixed) == [b"old-1", b"old-2", b"new"]
    assert _records(mixed, OffsetSpec.offset(2)) == [b"new"]


def test_a_torn_version_2_tail_after_version_1_chunks_is_cut(
    open_log: Callable[..., Log], tmp_path: Path, version_1: Callable[[bytes], bytes]
) -> None:
    log = open_log()
    log.append([b"old"])
    log.close()
    _rewrite_as_version_1(tmp_path / "log", version_1)
    log = open_log()
    log.append([b"new-and-torn"])
    log.close()
    segment = tmp_path / "log" / SEGMENT
    segment.write_bytes(segment.read_bytes()[:-5])  # a crash in the middle of the last write
    recovered = open_log()
    assert recovered.tail == (0, 1)
    assert _records(recovered) == [b"old"]
