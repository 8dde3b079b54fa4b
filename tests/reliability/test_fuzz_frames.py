"""Frame-level fuzzing: random and mutated frames, oversized sizes, bad frame ends, unknown
classes and methods, methods on closed channels, deeply nested field tables, invalid UTF-8 in
short strings (the generator is in support/framefuzz.py).

Four levels, fastest first:
- FrameBuffer alone (hypothesis): frames come out exactly as they went in, whatever the chunking;
  any bytes give frames or one 501, never an exception; an oversized frame fails on its header.
- WireConnection with a null handler (hypothesis): only AMQPError or BadProtocolHeader leave it.
- The broker in process (hypothesis): a real Broker and a Session per case on a fake transport;
  no case may crash the session (541, "connection crashed") or a callback of the loop.
- A live `leveret serve` over sockets: each case its own connection; every reply code is one
  RabbitMQ uses (541 never), every connection is closed or answered, the broker's memory stays
  bounded, another connection keeps working throughout, and its log holds no traceback.

The slow variant runs over 1,000,000 cases: atheris (coverage-guided, libFuzzer) on the wire
layer, and the in-process and socket levels at scale.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.brokers import BrokerProcess
from support.framefuzz import (
    EXPECTED_CODES,
    HANDSHAKE,
    Generator,
    SessionHarness,
    close_codes,
    send_case,
)
from support.procstat import rss_mb

from leveret.amqp.connection import WireConnection
from leveret.amqp.errors import AMQPError
from leveret.amqp.frames import FrameBuffer, encode_frame
from leveret.amqp.handshake import BadProtocolHeader

FRAME_MAX = 4096
SHORT = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- FrameBuffer ------------------------------------------------------------------------------

frames_st = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 8, 0, 4, 206]), st.integers(0, 65535),
              st.binary(max_size=FRAME_MAX)),
    max_size=12,
)


def pieces(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    position, index = 0, 0
    while position < len(data):
        size = cuts[index % len(cuts)] if cuts else len(data)
        yield data[position : position + size]
        position += size
        index += 1


def reference_parse(data: bytes) -> tuple[list[tuple[int, int, bytes]], bool]:
    """Frames as the spec reads them, and whether the stream goes wrong (a size over
    FRAME_MAX, or a bad frame end) before its end."""
    frames, pos = [], 0
    while len(data) - pos >= 7:
        frame_type, channel, size = struct.unpack_from(">BHI", data, pos)
        if size > FRAME_MAX:
            return frames, True
        if len(data) - pos < 8 + size:
            return frames, False
        if data[pos + 7 + size] != 0xCE:
            return frames, True
        frames.append((frame_type, channel, data[pos + 7 : pos + 7 + size]))
        pos += 8 + size
    return frames, False


@SHORT
@given(frames_st, st.lists(st.integers(1, 700), max_size=20))
def test_frames_come_out_as_they_went_in(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    buffer = FrameBuffer(FRAME_MAX)
    got = []
    for piece in pieces(b"".join(encode_frame(*f) for f in frames), cuts):
        got += buffer.feed(piece)
    assert got == frames
    assert buffer.error is None and len(buffer) == 0


@SHORT
@given(st.binary(max_size=3 * FRAME_MAX), st.lists(st.integers(1, 300), max_size=20))
def test_any_bytes_give_frames_or_one_frame_error(data: bytes, cuts: list[int]) -> None:
    buffer = FrameBuffer(FRAME_MAX)
    got = []
    for piece in pieces(data, cuts):
        got += buffer.feed(piece)
    expected, broken = reference_parse(data)
    assert got == expected
    assert (buffer.error is not None) == broken
    if broken:
        assert buffer.error is not None and buffer.error.code == 501
        assert buffer.feed(encode_frame(8, 0, b"")) == []  # out of sync: nothing more


@pytest.mark.parametrize("size", [FRAME_MAX + 1, 2**31, 2**32 - 1])
def test_an_oversized_frame_fails_on_its_header_alone(size: int) -> None:
    buffer = FrameBuffer(FRAME_MAX)
    assert buffer.feed(struct.pack(">BHI", 1, 1, size)) == []  # no payload sent at all
    assert buffer.error is not None and buffer.error.code == 501
    assert "frame_too_large" in buffer.error.explanation


# -- WireConnection -------------------------------------------------------------------------------


class NullHandler:
    """Says yes to everything, as a broker with any login accepted."""

    def __init__(self) -> None:
        self.wire: Any = None

    def on_start_ok(self, *_args: Any) -> None:
        self.wire.start_tune()

    def on_open(self, *_args: Any) -> None:
        self.wire.open_ok()

    def on_channel_open(self, number: int) -> None:
        self.wire.channel_open_ok(number)

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args: None


def feed_wire(data: bytes, rng: random.Random) -> list[bytes]:
    out: list[bytes] = []
    handler = NullHandler()
    wire = WireConnection(handler, out.append, server_properties={})
    handler.wire = wire
    try:
        position = 0
        while position < len(data):
            size = rng.randint(1, 200) if rng.random() < 0.3 else len(data)
            wire.receive(data[position : position + size])
            position += size
    except AMQPError as error:
        wire.close_connection(error)
    except BadProtocolHeader:
        pass
    return out


seeds = st.integers(0, 2**64 - 1)  # a seed reproduces a generated case exactly


@SHORT
@given(seeds)
def test_the_wire_layer_raises_only_protocol_errors(seed: int) -> None:
    rng = random.Random(seed)
    out = feed_wire(Generator(rng).connection(setup=rng.random() < 0.5), rng)
    for code in close_codes(b"".join(out)):
        assert code in EXPECTED_CODES and code != 541


@SHORT
@given(st.binary(max_size=2000), seeds)
def test_the_wire_layer_survives_any_bytes_after_a_handshake(data: bytes, seed: int) -> None:
    feed_wire(HANDSHAKE + data, random.Random(seed))


# -- the broker in process ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, SessionHarness]]:
    loop = asyncio.new_event_loop()

    async def build() -> SessionHarness:
        return SessionHarness(tmp_path_factory.mktemp("fuzz-broker"))

    made = loop.run_until_complete(build())
    yield loop, made
    made.close()
    loop.close()


def run_in_process(harness: tuple[Any, SessionHarness], rng: random.Random) -> None:
    loop, made = harness
    data = Generator(rng).connection(setup=rng.random() < 0.5)
    loop.run_until_complete(made.run(data, rng))
    problems, made.problems = made.problems, []
    assert not problems, problems[0] + f"\ncase: {data[:2000]!r}"


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=seeds)
def test_no_case_crashes_a_session(harness: tuple[Any, SessionHarness], seed: int) -> None:
    run_in_process(harness, random.Random(seed))


def test_the_broker_in_process_after_the_cases(harness: tuple[Any, SessionHarness]) -> None:
    _loop, made = harness
    assert made.cases >= 300
    assert set(made.codes) <= EXPECTED_CODES, made.codes
    leaked = [(s.wire.state, s.closed, s.transport.closing) for s in made.broker.connections]
    assert not leaked, leaked[:5]  # every session was released


@pytest.mark.slow
def test_no_case_crashes_a_session_at_scale(harness: tuple[Any, SessionHarness]) -> None:
    rng = random.Random(20261121)
    started = time.monotonic()
    count = 150_000
    for _ in range(count):
        run_in_process(harness, random.Random(rng.random()))
    _loop, made = harness
    print(f"in-process cases: {count} in {time.monotonic() - started:.0f}s; codes "
          f"{dict(made.codes.most_common())}")


# -- a live broker over sockets -------------------------------------------------------------


class Control:
    """One well-behaved connection that publishes and gets a message back between batches."""

    def __init__(self, port: int) -> None:
        from support.faults import connect

        self.conn = connect(port)
        self.ch = self.conn.channel()
        self.ch.queue_declare("fuzz-control")
        self.trips = 0

    def round_trip(self) -> float:
        started = time.monotonic()
        self.trips += 1
        body = f"control-{self.trips}".encode()
        self.ch.basic_publish("", "fuzz-control", body)
        method, _props, got = self.ch.basic_get("fuzz-control", auto_ack=True)
        assert method is not None and got == body, "the control connection stopped working"
        return time.monotonic() - started


def live_fuzz(broker: BrokerProcess, cases: int, seed: int, batch: int = 200,
              workers: int = 8) -> dict[str, Any]:
    control = Control(broker.port)
    rng = random.Random(seed)
    codes: Counter[int] = Counter()
    unclosed = 0
    rss: list[float] = []
    slowest = 0.0
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        for done in range(0, cases, batch):
            datas = [Generator(random.Random(rng.random())).connection()
                     for _ in range(min(batch, cases - done))]
            for got, closed in pool.map(lambda d: send_case(broker.port, d), datas):
                codes.update(got)
                unclosed += not closed
            assert broker.proc is not None and broker.proc.poll() is None, "the broker died"
            slowest = max(slowest, control.round_trip())
            rss.append(rss_mb(broker.pid))
    control.conn.close()
    log = broker.log()
    assert "Traceback" not in log and "connection crashed" not in log, log[-3000:]
    assert set(codes) <= EXPECTED_CODES, codes
    assert unclosed == 0, f"{unclosed} connections were neither closed nor answered"
    warm = rss[len(rss) // 5]
    return {"cases": cases, "seconds": round(time.monotonic() - started, 1),
            "codes": dict(codes.most_common()), "rss_warm_mb": round(warm, 1),
            "rss_end_mb": round(rss[-1], 1), "rss_peak_mb": round(max(rss), 1),
            "control_slowest_s": round(slowest, 3)}


def test_live_socket_fuzz(broker_process: BrokerProcess) -> None:
    figures = live_fuzz(broker_process, cases=1200, seed=7)
    print("live socket fuzz:", figures)
    assert figures["rss_end_mb"] - figures["rss_warm_mb"] < 40
    assert figures["control_slowest_s"] < 5


@pytest.mark.slow
def test_live_socket_fuzz_at_scale(broker_process: BrokerProcess) -> None:
    figures = live_fuzz(broker_process, cases=200_000, seed=2026)
    print("live socket fuzz:", figures)
    assert figures["rss_end_mb"] - figures["rss_warm_mb"] < 40  # no leak across cases


@pytest.mark.slow
def test_atheris_on_the_wire_layer(tmp_path: Path) -> None:
    """1,000,000 coverage-guided runs on FrameBuffer and WireConnection (libFuzzer)."""
    pytest.importorskip("atheris")
    runs = int(os.environ.get("LEVERET_ATHERIS_RUNS", "1000000"))
    script = Path(__file__).with_name("atheris_wire.py")
    done = subprocess.run(
        [sys.executable, str(script), f"-runs={runs}", "-max_len=4096", "-print_final_stats=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=4 * 3600, check=False)
    tail = done.stderr[-3000:]
    print(tail)
    assert done.returncode == 0, tail
    assert f"Done {runs} runs" in done.stderr


def test_a_refused_login_ignores_what_was_pipelined_behind_it(
    broker_process: BrokerProcess,
) -> None:
    """Regression (found by the socket fuzzer): a client without the
    authentication_failure_close capability whose login is refused is dropped; the tune-ok and
    connection.open it had already sent reached the session anyway, and the open crashed the
    connection (an assertion, a traceback and 541)."""
    from pamqp import commands
    from support import fuzzwire as fw
    from support.rawamqp import RawClient

    client = RawClient(broker_process.port)
    client.send(b"AMQP\x00\x00\x09\x01" + b"".join(fw.method_frame(channel, method) for
                                                  channel, method in [
        (0, fw.make(commands.Connection.StartOk, client_properties={}, mechanism="PLAIN",
                    response=b"\x00guest\x00wrong", locale="en_US")),
        (0, fw.make(commands.Connection.TuneOk, channel_max=16, frame_max=131072, heartbeat=0)),
        (0, fw.make(commands.Connection.Open, virtual_host="/")),
        (1, commands.Channel.Open()),
        (1, fw.make(commands.Queue.Declare, queue="after-refused-login", arguments={})),
    ]))
    client.assert_closed()
    client.close()
    time.sleep(0.2)
    log = broker_process.log()
    assert "login refused" in log
    assert "connection crashed" not in log and "Traceback" not in log


# -- regressions found by the fuzzers, replayed exactly -------------------------------------------


@pytest.fixture
def raw_broker(tmp_path: Path) -> Iterator[Any]:
    from support.brokers import InProcessBroker

    server = InProcessBroker(tmp_path / "data").start()
    yield server
    server.stop()


def _publish_and_get(port: int, setup: list[Any], exchange: str, routing_key: str,
                     headers: dict[str, Any], queue: str, **properties: Any) -> Any:
    """Declare `setup` on a raw connection, publish one message with `headers`, and basic.get
    it from `queue`: the decoded headers, or the close that ended the connection."""
    from pamqp import commands
    from support import fuzzwire as fw
    from support.rawamqp import RawClient

    client = RawClient(port).handshake()
    client.open_channel(1)
    for method in setup:
        client.send(fw.method_frame(1, method))
        client.next_method()
    client.send(fw.publish(1, exchange, routing_key, b"body", headers=headers, **properties))
    time.sleep(0.2)  # let a TTL of 0 dead-letter it
    client.send(fw.method_frame(1, fw.make(commands.Basic.Get, queue=queue, no_ack=True)))
    _channel, method = client.next_method()
    if isinstance(method, commands.Connection.Close | commands.Channel.Close):
        return method
    assert isinstance(method, commands.Basic.GetOk), method
    header = client.next_frame()
    client.next_frame()  # the body
    client.close()
    from leveret.amqp import properties as props

    return props.decode(header.payload).headers


def _dead_letter_setup() -> list[Any]:
    from pamqp import commands
    from support import fuzzwire as fw

    return [
        fw.make(commands.Queue.Declare, queue="dead", arguments={}),
        fw.make(commands.Queue.Declare, queue="dying", arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",
            "x-message-ttl": 0}),
    ]


@pytest.mark.parametrize("headers", [
    {"bad": b"\xff\xfe", "x": 1},  # a longstr that is not UTF-8 (pamqp decodes it to bytes)
    {"big": 1e300},  # a double beyond the range of pamqp's 32-bit float encoding
    {"x-death": 1.5},  # x-death that is not an array
    {"x-death": [{"queue": "dying", "reason": "expired", "count": "x"}]},  # a count not an int
])
def test_dead_lettering_odd_headers(raw_broker: Any, headers: dict[str, Any]) -> None:
    """Regression: dead-lettering re-encodes the headers; these crashed the publishing
    connection (541) because pamqp cannot encode them back, or x-death was read as a list of
    tables with an integer count without checking."""
    got = _publish_and_get(raw_broker.port, _dead_letter_setup(), "", "dying", headers, "dead")
    assert isinstance(got, dict), got
    assert got["x-death"][0]["queue"] == "dying"
    for key, value in headers.items():
        if key != "x-death":
            assert got[key] == value


@pytest.mark.parametrize("header", ["CC", "BCC"])
def test_cc_and_bcc_with_invalid_utf8(raw_broker: Any, header: str) -> None:
    """Regression: a CC or BCC entry that is a longstr of invalid UTF-8 crashed routing
    (UnicodeDecodeError, 541). It can match no queue name; the message still goes by its
    routing key."""
    from pamqp import commands
    from support import fuzzwire as fw

    setup = [fw.make(commands.Queue.Declare, queue="direct-q", arguments={})]
    got = _publish_and_get(raw_broker.port, setup, "", "direct-q",
                           {header: [b"\xff", "direct-q"]}, "direct-q")
    assert isinstance(got, dict), got
    assert (header in got) is (header == "CC")  # BCC is removed, as RabbitMQ does
