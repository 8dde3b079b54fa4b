"""A stream's chunk bound (broker/model/stream.py ChunkBound): a turn's publishes are cut into
chunks as osiris's writer batches them (gen_batch_server: from 32 records, doubling each time
a batch fills, up to 8,192; halved when the writer runs dry), and at a bound in bytes."""

from __future__ import annotations

import pytest

from leveret.broker.model.storage_env import USER
from leveret.broker.model.stream import ChunkBound, _Batch
from leveret.broker.process.config import ConfigError, load


def sizes(batch: _Batch) -> list[int]:
    return [len(run.records) for run in batch.runs]


def test_a_burst_doubles_from_the_minimum_up_to_the_maximum() -> None:
    bound = ChunkBound(32, 8192, 1 << 30)
    batch = _Batch(bound)
    batch.extend(USER, [b"x"] * 20_000)
    assert sizes(batch) == [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 3648]
    batch.ended()  # a turn that needed the bound keeps it
    assert bound.records == 8192


def test_a_steady_load_keeps_one_chunk_a_turn() -> None:
    bound = ChunkBound(32, 8192, 1 << 30)
    first = _Batch(bound)
    first.extend(USER, [b"x"] * 500)
    first.ended()
    assert sizes(first) == [32, 64, 128, 256, 20] and bound.records == 512
    for _ in range(3):
        batch = _Batch(bound)
        batch.extend(USER, [b"x"] * 500)
        batch.ended()
        assert sizes(batch) == [500] and bound.records == 512


def test_record_by_record_as_extend() -> None:
    bound = ChunkBound(32, 8192, 1 << 30)
    batch = _Batch(bound)
    for _ in range(5000):
        run = batch.run(USER)
        run.records.append(b"x")
        run.filters.append(None)
        if len(run.records) >= run.limit:
            batch.check(run)
    assert sizes(batch) == [32, 64, 128, 256, 512, 1024, 2048, 936]


def test_a_turn_that_takes_less_than_half_halves_down_to_the_minimum() -> None:
    bound = ChunkBound(32, 8192, 1 << 30)
    bound.records = 128
    for expected in (64, 32, 32):
        batch = _Batch(bound)
        batch.extend(USER, [b"x"] * 3)
        batch.ended()
        assert bound.records == expected


def test_the_byte_bound_cuts_a_chunk_at_the_record_that_reaches_it() -> None:
    batch = _Batch(ChunkBound(32, 8192, 1000))
    batch.extend(USER, [b"x" * 300] * 10)
    assert sizes(batch) == [4, 4, 2]
    one = _Batch(ChunkBound(32, 8192, 10))
    one.extend(USER, [b"y" * 50, b"z"])  # a chunk holds at least one record
    assert sizes(one) == [1, 1]


def test_settings() -> None:
    config = load(env={"LEVERET_STREAM_CHUNK_MAX_RECORDS": "100"})
    assert (config.stream_chunk_min_records, config.stream_chunk_max_records,
            config.stream_chunk_max_bytes) == (32, 100, 8_388_608)
    with pytest.raises(ConfigError, match="stream_chunk_max_bytes"):
        load(env={"LEVERET_STREAM_CHUNK_MAX_BYTES": "0"})
