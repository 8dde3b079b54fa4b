"""The exchange routing bench (bench/exchanges.py): its cycling publish frames decoded with
pamqp, its count checks, one tiny run of every kind against a real Leveret, a refused exchange
type as a failed run, and the tool end to end against Leveret only. No timing is asserted: this
proves the instrument is correct, not fast. The comparison itself takes minutes:
`python bench/exchanges.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pamqp import commands
from pamqp import frame as pframe
from support.bench import BENCH, bench_modules
from support.brokers import InProcessBroker

xb = bench_modules("exchanges")


def test_a_burst_cycles_over_the_keys_and_wraps() -> None:
    cycle = xb.KeyCycle(["k1", "k2", "k3"], 30, "ex")
    data = bytes(cycle.burst(2, 1000, 0))  # the longest burst, starting near the ring's end
    keys = []
    while data:
        used, _channel, value = pframe.unmarshal(data)
        data = data[used:]
        if isinstance(value, commands.Basic.Publish):
            assert value.exchange == "ex"
            keys.append(value.routing_key)
    assert keys == [f"k{(i + 2) % 3 + 1}" for i in range(1000)]
    with pytest.raises(ValueError, match="different lengths"):
        xb.KeyCycle(["k1", "k22"], 30, "ex")


def test_the_expected_shares_and_the_checks() -> None:
    direct, topic, chx = xb.KINDS["direct"], xb.KINDS["topic"], xb.KINDS["consistent-hash"]
    assert direct.keys(3, 1000) == ["0000.000000", "0001.000000", "0002.000000"]
    assert topic.keys(3, 4) == ["0000.000000", "0001.000001", "0002.000002", "0000.000003"]
    assert xb.expected(direct, 3, 1000, 10) == [4, 3, 3]
    assert xb.expected(topic, 3, 4, 10) == [5, 3, 2]  # keys 0,1,2,3(->0) twice, then 0,1
    assert xb.expected(chx, 3, 4, 10) is None
    assert xb.check(topic, [5, 3, 2], 10, [5, 3, 2]) == []
    assert xb.check(topic, [5, 2, 3], 10, [5, 3, 2]) == ["counts [5, 2, 3], expected [5, 3, 2]"]
    assert xb.check(chx, [6, 4, 0], 10, None) == ["queues [2] got nothing"]
    assert xb.check(chx, [6, 3, 0], 10, None) == [
        "the queues hold 9 messages, 10 were published", "queues [2] got nothing"]


def test_every_kind_routes_every_message_in_leveret(broker: InProcessBroker) -> None:
    args = xb.parse_args(["--messages", "3000", "--queues", "4", "--keys", "100"])
    for kind in xb.KINDS.values():
        result = xb.run_kind(broker.port, [os.getpid()], kind, args)  # the broker is in here
        assert result["ok"], result
        assert result["messages"] == result["confirmed"] == sum(result["counts"]) == 3000
        assert len(result["counts"]) == 4 and min(result["counts"]) > 0
        assert result["msgs_per_s"] > 0 and result["cpu_us_per_msg"] > 0
    again = xb.run_kind(broker.port, [], xb.KINDS["consistent-hash"], args)  # names reused
    assert again["ok"] and again["broker_cpu_pct"] is None and again["cpu_us_per_msg"] is None


def test_a_refused_exchange_type_is_a_failed_run(broker: InProcessBroker) -> None:
    args = xb.parse_args(["--messages", "10", "--queues", "2", "--keys", "10"])
    result = xb.run_kind(broker.port, [], xb.Kind("nope", "x-no-such-type", True, False), args)
    assert not result["ok"]
    assert result["errors"] == [
        "BrokerError: channel closed: 406 PRECONDITION_FAILED - unknown exchange type "
        "'x-no-such-type'"]


def test_the_tool_against_leveret_only(tmp_path: Path) -> None:
    out = tmp_path / "exchanges.json"
    run = subprocess.run(
        [sys.executable, str(BENCH / "exchanges.py"), "--only", "leveret", "--messages", "2000",
         "--rounds", "1", "--queues", "3", "--keys", "50", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert [(r["kind"], r["broker"], r["ok"]) for r in saved["results"]] == [
        (kind, "leveret", True) for kind in xb.KINDS]
    assert [row["kind"] for row in saved["table"]] == list(xb.KINDS)
    assert all(row["one_split"] for row in saved["table"])
    assert "| direct | " in run.stdout and saved["markdown"] in run.stdout


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        xb.parse_args(["--kinds", "direct,fanoutish"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        xb.parse_args(["--queues", "0"])
