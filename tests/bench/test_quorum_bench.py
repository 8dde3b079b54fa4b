"""The quorum-queue benches (bench/quorum_many.py, bench/quorum_restart.py): the many-queues
clients (consumers on many channels of one connection, a paced publisher with confirms) against
a real Leveret, the fsync counters' parsers, and the restart tool's node, its first basic.get
and its profile summary. No timing is asserted: this proves the instruments are correct, not
fast. The runs themselves take minutes: `python bench/quorum_many.py`, `python
bench/quorum_restart.py`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from support.bench import bench_modules
from support.brokers import InProcessBroker

qm = bench_modules("replicated", "quorum_many")
qr = bench_modules("quorum_restart")


def test_the_many_queues_clients_confirm_and_deliver_everything(
        broker: InProcessBroker) -> None:
    queues = qm.queue_names(7, "test")
    qm.declare_all([broker.port], queues)
    clients = qm.Clients(100)
    try:
        clients.consume(broker.port, queues, channels=3)  # three connections: 3 + 3 + 1
        assert len(clients.conns) == 3
        clients.publisher("a", broker.port, queues)
        clients.start_publishing(rate=10.0)
        clients.publish_for(1.0)
        clients.publish_for(0.5)  # the schedule goes on where it was
        deadline = time.monotonic() + 20
        while not clients.settled() and time.monotonic() < deadline:
            clients.pump(0.1)
        assert clients.settled(), (clients.published, clients.confirmed, clients.received)
        assert 70 <= clients.published <= 120  # 7 queues x 10 msgs/s x 1.5 s, give or take
        assert clients.confirmed == clients.received == clients.published
        assert clients.nacked == 0 and clients.errors == []
        p50, p99 = clients.confirm_latency()
        assert p50 is not None and p99 is not None and p50 <= p99
    finally:
        clients.close()


def test_a_node_probe_reads_rss_fds_and_the_open_files_limit() -> None:
    probe = qm.NodeProbe("me", os.getpid())
    row = probe.snapshot()
    assert row["rss_mb"] > 0 and row["fds"] > 3 and row["processes"] >= 1
    assert row["nofile_limit"] is not None and row["nofile_limit"] > 0


def test_the_fsync_counters_outputs_are_parsed(tmp_path: Path) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    perf = tmp_path / "perf"
    perf.write_text("# started on ...\n\n12,,syscalls:sys_enter_fsync,100,100.00,,\n"
                    "30,,syscalls:sys_enter_fdatasync,100,100.00,,\n"
                    "2,,syscalls:sys_enter_syncfs,100,100.00,,\n")
    row = qm._stop_counter("perf", done, perf, time.monotonic() - 2.0)
    assert row["fsync_calls"] == {"fsync": 12, "fdatasync": 30, "syncfs": 2}
    assert 20.0 <= row["fsyncs_per_s"] <= 22.0 and not perf.exists()
    strace = tmp_path / "strace"
    strace.write_text(
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 99.00    0.010000          10      1000           fdatasync\n"
        "  1.00    0.000100          10        10           fsync\n"
        "  0.00    0.000000          10         1           syncfs\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.010100          10      1010           total\n")
    row = qm._stop_counter("strace", done, strace, time.monotonic() - 10.0)
    assert row["fsync_calls"] == {"fdatasync": 1000, "fsync": 10, "syncfs": 1}
    assert 99.0 <= row["fsyncs_per_s"] <= 101.2


def test_the_restart_tool_times_the_first_get_of_a_filled_queue(tmp_path: Path) -> None:
    node = qr.Node(tmp_path, None, {}, ["--workers", "1"])
    node.spawn()
    try:
        conn = None
        deadline = time.monotonic() + 60
        while conn is None:
            try:
                conn = qr.connect("127.0.0.1", node.port, timeout=30)
            except OSError:
                assert time.monotonic() < deadline, node.log_tail()
                time.sleep(0.2)
        conn.declare_queue("qq.restart", durable=True, arguments=qr.QUORUM)
        conn.close()
        opts = qr.Options(port=node.port, body=100, window=100, queue="qq.restart")
        assert qr.prefill(opts, "qq.restart", 500).ok
        assert node.stop() >= 0.0
        node.spawn()
        row = qr.first_get(node, "qq.restart", 60.0)
        assert row["get_reply"] == "Basic.GetOk" and row["message_count"] == 499
        assert 0 < row["port_s"] <= row["get_s"]
        row = qr.first_get(node, "qq.restart", 60.0)  # the nack put it back, first
        assert row["message_count"] == 499
        # stopped with SIGTERM: the snapshot written at the close covers every record
        assert qr.recovered_log(node) == {"messages": 500, "snapshot": 500, "records_read": 0}
        assert node.rss()["rss_mb"] > 0
        assert qr.disk(node.data)["disk_mb"] > 0
    finally:
        node.stop()


def test_the_profile_summary_merges_lines_of_a_function(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (cli/app.py:10);_recover (model/durable.py:383) 6\n"
        "main (cli/app.py:10);_recover (model/durable.py:384) 2\n"
        "main (cli/app.py:10);contains (model/intervals.py:24) 2\n")
    top = qr.top_functions(raw)
    assert top["samples"] == [("all", 10.0)]
    assert top["self"][0] == ("_recover [model/durable.py]", 80.0)
    assert ("main [cli/app.py]", 100.0) in top["inclusive"]
