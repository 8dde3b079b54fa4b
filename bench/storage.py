"""Benchmark of the storage engine (leveret.storage): append, read, attach, open, memory.

    python bench/storage.py            # the full run: a 10 GB log in ~100 segments
    python bench/storage.py --quick    # under 30 s: a 400 MB log in ~100 segments

It appends 100-byte records in chunks of 1,000 (fsync "never"), reads them all back from
`first` (every chunk's CRC checked), attaches readers at random offsets and timestamps, closes
the log and times opening it again. It prints one JSON line. MB are 10^6 bytes of record
payload; `append_disk_mb_per_s` counts the bytes written to segment files instead. The
`*_per_cpu_s` figures divide by this process's CPU time (user + system) rather than wall time,
which shows the engine's own cost when other work shares the machine.

When it may (as root), it also drops the page cache and times a cold open and cold attaches
(`open_cold_s`, `attach_cold_ms_max`, which include reading the first chunk from disk).

It never runs as part of the test suite. It writes to a temporary directory under /tmp (or
--dir) and deletes it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from leveret.storage import FakeClock, Log, LogConfig, OffsetSpec

RECORD_BYTES = 100
CHUNK_RECORDS = 1_000
ATTACHES = 200


def _append(directory: Path, total_bytes: int, segment_bytes: int) -> tuple[dict, FakeClock]:
    clock = FakeClock(1_700_000_000_000)
    config = LogConfig(max_segment_size_bytes=segment_bytes, clock=clock)
    records = [bytes([i % 251]) * RECORD_BYTES for i in range(CHUNK_RECORDS)]
    chunks = total_bytes // (RECORD_BYTES * CHUNK_RECORDS)
    with Log.open(directory, config) as log:
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(chunks):
            log.append(records)
            clock.advance(1)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        disk_bytes = log.summary()["bytes"]
        count = log.next_offset
        segments = len(log.summary()["segments"])
    return {
        "records": count,
        "segments": segments,
        "log_bytes": disk_bytes,
        "append_s": round(elapsed, 3),
        "append_records_per_s": round(count / elapsed),
        "append_mb_per_s": round(count * RECORD_BYTES / elapsed / 1e6, 1),
        "append_disk_mb_per_s": round(disk_bytes / elapsed / 1e6, 1),
        "append_records_per_cpu_s": round(count / cpu),
    }, clock


def _read(directory: Path) -> dict:
    with Log.open(directory) as log:
        reader = log.reader(OffsetSpec.first())
        records = payload = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while (view := reader.read()) is not None:
            records += len(view.records)
            payload += sum(map(len, view.records))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        reader.close()
        assert records == log.next_offset, (records, log.next_offset)
    return {
        "read_records_per_s": round(records / elapsed),
        "read_mb_per_s": round(payload / elapsed / 1e6, 1),
        "read_records_per_cpu_s": round(records / cpu),
    }


def _attach(directory: Path, clock: FakeClock) -> dict:
    rng = random.Random(7)
    by_offset: list[float] = []
    by_timestamp: list[float] = []
    with Log.open(directory) as log:
        first_ts, last_ts = 1_700_000_000_000, clock()
        for _ in range(ATTACHES):
            for spec, times in (
                (OffsetSpec.offset(rng.randrange(log.first_offset, log.next_offset)), by_offset),
                (OffsetSpec.timestamp(rng.randrange(first_ts, last_ts)), by_timestamp),
            ):
                started = time.perf_counter()
                reader = log.reader(spec)
                view = reader.read()  # the first chunk is part of attaching
                times.append((time.perf_counter() - started) * 1000)
                assert view is not None
                reader.close()
    both = by_offset + by_timestamp
    return {
        "attach_ms": round(statistics.mean(both), 3),
        "attach_offset_ms_p99": round(_p99(by_offset), 3),
        "attach_timestamp_ms_p99": round(_p99(by_timestamp), 3),
        "attach_ms_max": round(max(both), 3),
    }


def _p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99) - 1]


def _open(directory: Path) -> dict:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        log = Log.open(directory)
        times.append(time.perf_counter() - started)
        log.close()
    return {"open_s": round(min(times), 4), "open_s_max": round(max(times), 4)}


def _cold(directory: Path, clock: FakeClock) -> dict:
    """Open and attach with an empty page cache (needs root: /proc/sys/vm/drop_caches)."""
    if not _drop_caches():
        return {"open_cold_s": None, "attach_cold_ms_max": None}
    started = time.perf_counter()
    log = Log.open(directory)
    opened = time.perf_counter() - started
    rng = random.Random(11)
    attaches = []
    try:
        for i in range(20):
            if i % 2:
                spec = OffsetSpec.offset(rng.randrange(log.first_offset, log.next_offset))
            else:
                spec = OffsetSpec.timestamp(rng.randrange(1_700_000_000_000, clock()))
            _drop_caches()
            started = time.perf_counter()
            reader = log.reader(spec)
            reader.read()
            attaches.append((time.perf_counter() - started) * 1000)
            reader.close()
    finally:
        log.close()
    return {"open_cold_s": round(opened, 4), "attach_cold_ms_max": round(max(attaches), 3)}


def _drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a run under 30 s (400 MB)")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary log")
    parser.add_argument("--gb", type=float, default=None, help="log size in GB (default 10)")
    args = parser.parse_args()
    total = int((args.gb or (0.4 if args.quick else 10)) * 1e9)
    segment_bytes = total // 100  # about 100 segments
    parent = tempfile.mkdtemp(prefix="leveret-bench-", dir=args.dir or "/tmp")
    directory = Path(parent) / "log"
    try:
        result: dict = {"mode": "quick" if args.quick else "full"}
        appended, clock = _append(directory, total, segment_bytes)
        result |= appended
        result |= _read(directory)
        result |= _attach(directory, clock)
        result |= _open(directory)
        result |= _cold(directory, clock)
        result["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
