"""Exactly once under failure: a failing task, and the driver killed mid-batch.

The job (exactly_once_job.py) writes every one of N input rows into the stream `orders` and
into the 3-partition super stream `invoices`. A task fails part-way through a micro-batch on
its first attempt (Spark retries it), or the driver process is killed -9 part-way through a
micro-batch and the query restarts from its checkpoint. With deduplication on, each stream
then holds each row exactly once, in the order of its Spark partition; with it off, the same
runs leave duplicates, which shows that the checks can fail.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sparkkit import (
    HERE,
    declare_stream,
    declare_super_stream,
    read_stream,
    write_input_files,
)

pytestmark = pytest.mark.spark

FILES, ROWS = 4, 300
N = FILES * ROWS


def setup_topology(port: int, job: Any) -> None:
    for stream, superstream in job.VARIANTS.values():
        declare_stream(port, stream)
        declare_super_stream(port, superstream, job.PARTITIONS)


def stream_names(job: Any, exactly_once: bool) -> list[str]:
    stream, superstream = job.VARIANTS[exactly_once]
    return [stream] + [f"{superstream}-{p}" for p in range(job.PARTITIONS)]


def check_exactly_once(port: int, job: Any, ids: list[int]) -> None:
    """Each id once in `orders`, once in the right `invoices` partition, every publisher's
    ids ascending, and the rows of one Spark partition of one micro-batch in input order."""
    names = stream_names(job, True)
    streams = {names[0]: ids}
    for p in range(job.PARTITIONS):
        streams[names[1 + p]] = [i for i in ids if i % job.PARTITIONS == p]
    for name, expected in streams.items():
        messages = read_stream(port, name)
        values = [int(body) for _o, body, _h, _p in messages]
        duplicates = [v for v, n in Counter(values).items() if n > 1]
        assert not duplicates, f"{name}: {len(duplicates)} duplicated ids, e.g. {duplicates[:5]}"
        assert sorted(values) == expected, f"{name}: {len(values)} messages, {len(expected)} ids"
        by_publisher: dict[str, list[int]] = defaultdict(list)
        by_task: dict[tuple[str, int], list[int]] = defaultdict(list)
        for _offset, body, headers, _props in messages:
            publisher, pid = headers["x-stream-publisher-name"], headers["x-stream-publishing-id"]
            by_publisher[publisher].append(pid)
            by_task[(publisher, pid >> 32)].append(int(body))  # one Spark partition, one batch
        for publisher, pids in by_publisher.items():
            assert pids == sorted(pids), f"{name}: {publisher} out of order"
        for (publisher, batch), values in by_task.items():
            assert values == sorted(values), f"{name}: {publisher} batch {batch} out of order"


def count_without_dedup(port: int, job: Any, ids: list[int]) -> int:
    """How many messages the query without deduplication left; each id is there at least
    once (at-least-once holds either way)."""
    total = 0
    for name in stream_names(job, False):
        values = [int(b) for _o, b, _h, _p in read_stream(port, name)]
        total += len(values)
    return total


def test_a_task_failing_on_its_first_attempt(spark, broker, job, tmp_path: Path) -> None:
    """Both variants run side by side; partition 0 of micro-batch 1 fails once, after 60 of
    its publishes are confirmed, and Spark retries it."""
    setup_topology(broker.port, job)
    ids = write_input_files(tmp_path / "in", FILES, ROWS)
    fault = {"fault_batch": "1", "fault_partition": "0", "fault_after": "60",
             "fault_mode": "raise"}
    queries = {exactly_once: job.start_query(spark, broker.url, str(tmp_path / "in"),
                                             str(tmp_path / f"ckpt-{exactly_once}"),
                                             exactly_once, fault=fault)
               for exactly_once in (True, False)}
    for query in queries.values():
        assert query.awaitTermination(180)
        assert query.exception() is None
        written = sum(p["sink"]["numOutputRows"] for p in query.recentProgress)
        assert written == 2 * N  # query.lastProgress reports the rows the sink wrote
    check_exactly_once(broker.port, job, ids)
    assert count_without_dedup(broker.port, job, ids) > 2 * N  # the retry's publishes, twice


def run_job(broker_url: str, tmp_path: Path, log: Path,
            fault: list[str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(HERE / "exactly_once_job.py"), broker_url, str(tmp_path / "in"),
           str(tmp_path / "ckpt"), *(fault or [])]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def kill_tree(proc: subprocess.Popen[bytes], extra_pids: list[int]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in extra_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def test_the_driver_killed_mid_batch_then_restarted(broker, job, tmp_path: Path) -> None:
    """The driver runs both variants; each hangs in partition 0 of micro-batch 2 after 60
    confirmed publishes; then the test kills -9 the driver (and its Python workers) and
    starts it again on the same checkpoints."""
    setup_topology(broker.port, job)
    ids = write_input_files(tmp_path / "in", FILES, ROWS)
    markers = tmp_path / "markers"
    markers.mkdir()
    first = run_job(broker.url, tmp_path, tmp_path / "run1.log",
                    fault=["2", "0", "60", str(markers)])
    wanted = [markers / "dedup", markers / "plain"]
    deadline = time.monotonic() + 180
    while (not all(m.exists() for m in wanted) and first.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.1)
    log1 = (tmp_path / "run1.log").read_text(errors="replace")
    time.sleep(0.2)
    kill_tree(first, [int(m.read_text().split()[0]) for m in wanted if m.exists()])
    assert all(m.exists() for m in wanted), f"the job never hung:\n{log1[-3000:]}"
    for exactly_once in (True, False):
        before = sum(len(read_stream(broker.port, n)) for n in stream_names(job, exactly_once))
        assert 2 * N * 2 // FILES < before < 2 * N  # batches 0 and 1, and part of batch 2
    second = run_job(broker.url, tmp_path, tmp_path / "run2.log")
    try:
        assert second.wait(240) == 0, (tmp_path / "run2.log").read_text()[-3000:]
    finally:
        kill_tree(second, [])
    log2 = (tmp_path / "run2.log").read_text(errors="replace")
    assert "leveret sink: batch 3 committed" in log2  # the driver logs each batch's counts
    assert re.search(r"batch 2 committed: .* [1-9]\d* deduplicated", log2), log2[-3000:]
    check_exactly_once(broker.port, job, ids)
    assert count_without_dedup(broker.port, job, ids) > 2 * N  # batch 2's first part, twice
