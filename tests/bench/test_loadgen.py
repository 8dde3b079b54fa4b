"""The load generator (bench/loadgen): its hand-written frames against pamqp, and tiny real runs.

The generator's hot-path bytes are written with struct; these tests decode them with pamqp (and
parse pamqp's bytes with the generator's parsers), then run bench/load.py for a second or two
against the discard server and against an in-process Leveret and check that each reports
ok:true. No timing is asserted: this proves the instrument is correct, not fast.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from support.bench import BENCH, bench_module

bench_module("loadgen", package=True)
from loadgen import wire  # noqa: E402


def _frames(data: bytes) -> list[tuple[int, object]]:
    out = []
    while data:
        used, channel, value = pframe.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def test_publish_burst_decodes_with_pamqp() -> None:
    template = wire.publish_template(
        1,
        "bench.x",
        100,
        publisher_id=7,
        kind=wire.KIND_WANTED,
        persistent=True,
        filter_value="wanted",
    )
    frames = _frames(bytes(template.burst(41, 3, 123456789)))
    assert len(frames) == 9
    for i in range(3):
        (c1, method), (c2, header), (c3, body) = frames[3 * i : 3 * i + 3]
        assert (c1, c2, c3) == (1, 1, 1)
        assert isinstance(method, commands.Basic.Publish)
        assert (method.exchange, method.routing_key, method.mandatory) == ("", "bench.x", False)
        assert isinstance(header, ContentHeader) and header.body_size == 100
        assert header.properties.delivery_mode == 2
        assert header.properties.headers == {"x-stream-filter-value": "wanted"}
        assert isinstance(body, ContentBody) and len(body.value) == 100
        assert wire.BODY.unpack_from(body.value) == (7, 41 + i, 123456789, wire.KIND_WANTED)


def test_large_body_is_split_at_frame_max() -> None:
    template = wire.publish_template(1, "q", 10_000, frame_max=4096)
    frames = _frames(template.data)
    bodies = [v for _, v in frames if isinstance(v, ContentBody)]
    assert [len(b.value) for b in bodies] == [4088, 4088, 1824]


def test_ack_frame_matches_pamqp() -> None:
    for tag, multiple in ((1, False), (500, True), (2**40, True)):
        ours = wire.ack_frame(3, tag, multiple)
        assert ours == pframe.marshal(commands.Basic.Ack(tag, multiple), 3)


def test_confirm_and_deliver_parsers_read_pamqp_bytes() -> None:
    for method in (commands.Basic.Ack(99, True), commands.Basic.Nack(12, False, True)):
        raw = pframe.marshal(method, 1)
        assert wire.parse_confirm(7, raw) == (method.delivery_tag, method.multiple)
    deliver = commands.Basic.Deliver("amq.ctag-abc", 2**33 + 5, False, "ex", "rk")
    raw = pframe.marshal(deliver, 1)
    assert wire.deliver_tag(7, raw) == 2**33 + 5
    assert wire.deliver_frame(1, "amq.ctag-abc", 2**33 + 5, "ex", "rk") == raw


def _load(*args: str, timeout: float = 60) -> list[dict]:
    out = subprocess.run(
        [sys.executable, str(BENCH / "load.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=BENCH.parent / "tests",
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result from load.py {args}: {out.stderr[-2000:]}"
    return lines


@pytest.mark.parametrize(
    "scenario",
    [
        ["a", "--duration", "1"],
        ["b", "--messages", "20000"],
        ["e", "--messages", "5000"],
        ["h", "--duration", "0.5"],
    ],
)
def test_tiny_runs_against_the_discard_server(scenario: list[str]) -> None:
    for result in _load("--scenario", *scenario, "--against-discard"):
        assert result["ok"], result
        assert result["messages"] > 0


def test_tiny_runs_against_leveret(broker) -> None:  # type: ignore[no-untyped-def]
    port = str(broker.port)
    results = _load("--scenario", "a", "--duration", "1", "--port", port)
    results += _load("--scenario", "b", "--messages", "3000", "--port", port)
    results += _load("--scenario", "e", "--messages", "2000", "--port", port)
    assert [r["scenario"] for r in results] == ["a", "b", "e.publish", "e.consume"]
    for result in results:
        assert result["ok"], result
        assert result["messages"] > 0


def test_issue_17_scenarios_against_leveret(broker) -> None:  # type: ignore[no-untyped-def]
    """(h) four publishers into one stream, (i) into four streams, (j) connections that each
    publish into and consume from their own classic queue, multiplexed over two processes:
    every confirm came and every message arrived once, in order, at its own connection."""
    port = str(broker.port)
    results = _load("--scenario", "h", "--duration", "0.5", "--port", port)
    results += _load("--scenario", "i", "--duration", "0.5", "--port", port)
    results += _load(
        "--scenario", "j", "--duration", "0.5", "--connections", "20",
        "--mux-processes", "2", "--body", "1024", "--port", port,
    )  # fmt: skip
    assert [r["scenario"] for r in results] == ["h", "i", "j"]
    for result in results:
        assert result["ok"], result
        assert result["messages"] > 0
    h, i, j = results
    assert (h["publishers"], h["streams"], i["publishers"], i["streams"]) == (4, 1, 4, 4)
    assert (j["connections"], j["load_processes"]) == (20, 2)
    assert j["published"] == j["confirmed"] == j["messages"]
    assert j["latency"] == "publish-to-deliver" and j["p99_ms"] is not None


def test_scenario_q_against_leveret(broker) -> None:  # type: ignore[no-untyped-def]
    """(q) a quorum queue, one publisher with confirms and one consumer with acks at once:
    every message confirmed and delivered once, in order; both latencies reported."""
    (result,) = _load(
        "--scenario", "q", "--messages", "3000", "--body", "1024", "--port", str(broker.port),
        "--stream-arg", "x-delivery-limit=5",
    )  # fmt: skip
    assert result["ok"], result
    assert result["scenario"] == "q" and result["messages"] == 3000
    assert result["queue_arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": 5}
    assert result["latency"] == "publish-to-confirm" and result["p99_ms"] is not None
    assert result["deliver_p99_ms"] is not None and result["publish_msgs_per_s"] > 0


def test_a_bad_scenario_j_configuration_is_one_failed_line() -> None:
    (result,) = _load("--scenario", "j", "--connections", "0", "--port", "1")
    assert not result["ok"]
    assert result["errors"] == [
        "ValueError: scenario j needs at least one connection and a window of at least 1"
    ]


def test_compare_refuses_an_unknown_scenario_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "--scenarios", "h,x", "--only", "leveret"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == "unknown scenario x: choose from a,b,c,d,e,f,g,m,h,i,j,q"
