"""The replicated-stream bench (bench/replicated.py): its failover client (one message at a time
with confirms, publishing again after a nack) against a real Leveret, what it counts as the
first confirm after a kill, the quorum-queue consumer's first delivery after a kill, its
tables, and its refusal of an unknown part. No timing is
asserted: this proves the instrument is correct, not fast. The three-node runs themselves are
not run here (they take minutes): `python bench/replicated.py --quick`."""

from __future__ import annotations

import threading
import time

import pytest
from support.bench import bench_modules
from support.brokers import InProcessBroker

rb = bench_modules("replicated")


def _run(pub: object, until: object, timeout: float = 30) -> None:
    thread = threading.Thread(target=pub.run, daemon=True)  # type: ignore[attr-defined]
    thread.start()
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)
    pub.stop.set()  # type: ignore[attr-defined]
    thread.join(10)
    assert not thread.is_alive()


def test_the_failover_client_counts_acks_and_the_first_one_after_the_kill(
        broker: InProcessBroker) -> None:
    conn = rb.connect("127.0.0.1", broker.port)
    conn.declare_queue("s.bench", arguments={"x-queue-type": "stream"})
    conn.close()
    pub = rb.OneAtATime(broker.port, "s.bench", 100, timeout=5.0)
    _run(pub, lambda: pub.acks >= 20)
    assert pub.acks >= 20 and pub.first_after is None  # nothing was killed
    assert (pub.nacks, pub.timeouts, pub.errors) == (0, 0, [])

    pub = rb.OneAtATime(broker.port, "s.bench", 100, timeout=5.0)
    pub.killed_at = time.monotonic()  # every message it sends is "after the kill"
    _run(pub, lambda: pub.first_after is not None)
    assert pub.first_after is not None and pub.first_after >= pub.killed_at


def test_the_failover_client_publishes_again_after_a_nack(broker: InProcessBroker) -> None:
    conn = rb.connect("127.0.0.1", broker.port)
    conn.declare_queue("q.full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    conn.close()
    pub = rb.OneAtATime(broker.port, "q.full", 100, timeout=5.0, retry_pause=0.0)
    pub.killed_at = 0.0
    _run(pub, lambda: pub.nacks >= 5)
    assert pub.nacks >= 5 and pub.acks == 0 and pub.first_after is None
    assert pub.errors == []


def test_the_table_has_medians_and_ratios() -> None:
    args = rb.parse_args(["--quick", "--runs", "2"])
    runs = [
        {"part": "publish", "broker": "leveret", "ok": True, "msgs_per_s": 100.0,
         "p50_ms": 1.0, "p99_ms": 2.0},
        {"part": "publish", "broker": "leveret", "ok": True, "msgs_per_s": 300.0,
         "p50_ms": 3.0, "p99_ms": 4.0},
        {"part": "publish", "broker": "rabbitmq", "ok": True, "msgs_per_s": 100.0,
         "p50_ms": 2.0, "p99_ms": 6.0},
        {"part": "publish", "broker": "rabbitmq", "ok": False, "msgs_per_s": 1.0},
        {"part": "failover", "ok": True, "failover_s": 3.0, "elected_s": 2.0},
        {"part": "failover", "ok": False, "failover_s": None, "elected_s": 9.0},
        {"part": "catchup", "ok": True, "mb_per_s": 50.0, "from_sync_s": 1.0,
         "from_restart_s": 5.0},
    ]
    text, figures = rb.report(runs, args)
    assert figures["msgs_per_s"] == {"leveret": 200.0, "rabbitmq": 100.0, "ratio": 2.0}
    assert figures["p99_ms"]["ratio"] == pytest.approx(0.5)
    assert figures["failover_s"] == 3.0 and figures["catchup_mb_per_s"] == 50.0
    assert "| 200 | 100 | 2.00 | >= 1.0x | 2/2, 1/2 |" in text
    assert "(s, default lease (10 s)) | 3.00 | | | < 5 s | 1/2 |" in text
    assert figures["elected_s"] == 5.5  # elected in both runs, confirming or not
    assert "64 MiB" in text


def test_an_unknown_part_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        rb.parse_args(["--parts", "publish,speed"])
    assert exited.value.code == 2
    assert "unknown part(s) speed" in capsys.readouterr().err


def test_the_quorum_consumer_counts_the_first_delivery_of_a_message_sent_after_the_kill(
        broker: InProcessBroker) -> None:
    conn = rb.connect("127.0.0.1", broker.port)
    conn.declare_queue("qq.bench", arguments={"x-queue-type": "quorum"})
    conn.close()
    sub = rb.Consumer(broker.port, "qq.bench")
    thread = threading.Thread(target=sub.run, daemon=True)
    thread.start()
    assert sub.subscribed.wait(10)
    pub = rb.OneAtATime(broker.port, "qq.bench", 100, timeout=5.0)
    _run(pub, lambda: pub.acks >= 10 and sub.received >= 10)
    assert sub.first_new is None and sub.first_any is None  # nothing was killed
    pub = rb.OneAtATime(broker.port, "qq.bench", 100, timeout=5.0)
    sub.killed_at = pub.killed_at = time.monotonic()
    _run(pub, lambda: sub.first_new is not None)
    sub.stop.set()
    thread.join(10)
    assert sub.first_new is not None and sub.first_new >= sub.killed_at
    assert (sub.cancels, sub.reconnects, sub.errors, sub.redelivered) == (0, 0, [], 0)


def test_the_quorum_table_has_each_body_and_the_failover_spread() -> None:
    args = rb.parse_args(["--queue-type", "quorum", "--runs", "2", "--bodies", "100,1024"])
    assert args.parts == ["publish", "failover"] and args.bodies == [100, 1024]
    runs = [
        {"part": "publish", "broker": "leveret", "body": 100, "ok": True,
         "msgs_per_s": 300.0, "p50_ms": 1.0, "p99_ms": 2.0, "broker_cpu_pct": 50.0},
        {"part": "publish", "broker": "leveret", "body": 100, "ok": True,
         "msgs_per_s": 500.0, "p50_ms": 1.0, "p99_ms": 4.0, "broker_cpu_pct": 50.0},
        {"part": "publish", "broker": "rabbitmq", "body": 100, "ok": True,
         "msgs_per_s": 200.0, "p50_ms": 2.0, "p99_ms": 6.0, "broker_cpu_pct": 90.0},
        {"part": "publish", "broker": "leveret", "body": 1024, "ok": True,
         "msgs_per_s": 100.0, "p50_ms": 1.0, "p99_ms": 2.0, "broker_cpu_pct": 50.0},
        {"part": "failover", "ok": True, "failover_s": 1.5, "delivery_s": 1.6,
         "elected_s": 1.4},
        {"part": "failover", "ok": True, "failover_s": 2.5, "delivery_s": 2.4,
         "elected_s": 2.2},
    ]
    text, figures = rb.report(runs, args)
    assert figures["msgs_per_s_100"] == {"leveret": 400.0, "rabbitmq": 200.0, "ratio": 2.0}
    assert figures["msgs_per_s_1024"]["rabbitmq"] is None
    assert figures["failover_s"] == {"median": 2.0, "min": 1.5, "max": 2.5}
    assert "| 400 (300.0-500.0) | 200 (200.0-200.0) | 2.00 | >= 2.0x | 2/2, 1/2 |" in text
    assert "first delivery on c of a message published after it (s) | 2.00 (1.60-2.40)" in text


def test_the_quorum_queue_type_has_no_catchup_part(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rb.parse_args(["--queue-type", "quorum", "--parts", "catchup"])
    assert "unknown part(s) catchup: choose from publish, failover" in capsys.readouterr().err
