"""Readers of one Log share the chunks they read; the cache stays within its byte limit."""

from __future__ import annotations

from pathlib import Path

from leveret.storage import Log, LogConfig, OffsetSpec, ReaderFilter
from leveret.storage.cache import ChunkCache


def test_readers_of_one_log_share_checked_chunks(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "log", LogConfig())
    for n in range(5):
        log.append([b"%d-%d" % (n, i) for i in range(100)],
                   [b"even" if i % 2 == 0 else None for i in range(100)])
    first = [c.records for c in log.reader(OffsetSpec.first())]
    cache = log._cache
    misses, hits = cache.misses, cache.hits
    second = [c.records for c in log.reader(OffsetSpec.first())]
    assert second == first
    assert cache.misses == misses and cache.hits == hits + 5
    # A filtering reader still filters exactly, from the cached records.
    wanted = log.reader(OffsetSpec.first(), filter=ReaderFilter(frozenset({b"even"})))
    got = [r for c in wanted for r in c.records]
    assert got == [b"%d-%d" % (n, i) for n in range(5) for i in range(0, 100, 2)]
    log.close()


def test_the_cache_keeps_to_its_byte_limit() -> None:
    cache = ChunkCache(max_bytes=100)
    for position in range(10):
        cache.put(0, position, b"x" * 30, [b"x" * 30])
    assert cache.bytes <= 100
    assert cache.get(0, 9) is not None and cache.get(0, 0) is None
    cache.put(0, 99, b"y" * 1000, [])  # larger than the whole cache: not kept
    assert cache.get(0, 99) is None
