"""A wire worker's split (broker/workers/split.py) against the wire layer reading the bytes itself.

The promise of `--workers`: a client sees the same replies, errors and order whether the main
process reads its bytes or a worker splits them first. Each case is one connection's hostile
bytes (support/framefuzz.py), cut into the same reads both ways; one WireConnection takes them
with `receive`, the other through a Splitter and `receive_split` (after marshal, as the pipe
carries them). What each writes and every call it makes on its handler must be the same.
The messages between the processes (ipc.py) are checked here too.
"""

from __future__ import annotations

import marshal
import random
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.framefuzz import HANDSHAKE, Generator
from support.fuzzwire import frame, method_frame

from leveret.amqp.connection import WireConnection
from leveret.amqp.errors import AMQPError
from leveret.amqp.handshake import BadProtocolHeader
from leveret.broker.workers import ipc
from leveret.broker.workers.split import Splitter, gather

FRAME_MAX = 131072


class RecordingHandler:
    """Says yes to every login and channel, and records every call the wire machine makes."""

    def __init__(self) -> None:
        self.wire: Any = None
        self.calls: list[tuple[Any, ...]] = []

    def on_start_ok(self, *args: Any) -> None:
        self.calls.append(("start_ok", *args))
        self.wire.start_tune()

    def on_open(self, *args: Any) -> None:
        self.calls.append(("open", *args))
        self.wire.open_ok()

    def on_channel_open(self, number: int) -> None:
        self.calls.append(("channel_open", number))
        self.wire.channel_open_ok(number)

    def on_publish_run(self, number: int, *args: Any) -> None:
        """As the handler protocol defines it: on_publish for each publish of the run."""
        *fields, run = args
        for j in range(2, len(run), 2):
            self.on_publish(number, *fields, run[j], run[j + 1])

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *map(described, args)))


def described(value: Any) -> Any:
    """A call's argument as a comparable value (a pamqp method by its class and fields)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "__dict__"):
        return type(value).__name__, sorted((k, repr(v)) for k, v in vars(value).items())
    return value


class FailingHandler(RecordingHandler):
    """Refuses the `fail_at`-th publish (1-based) with `code`, as a session's channel would."""

    def __init__(self, fail_at: int, code: int) -> None:
        super().__init__()
        self.fail_at, self.code, self.published = fail_at, code, 0

    def on_publish(self, number: int, *args: Any) -> None:
        self.calls.append(("on_publish", number, *map(described, args)))
        self.published += 1
        if self.published == self.fail_at:
            raise AMQPError(self.code, f"publish {self.published} refused")

    def on_publish_run(self, number: int, *args: Any) -> None:
        *fields, run = args
        for at, j in enumerate(range(2, len(run), 2)):
            try:
                self.on_publish(number, *fields, run[j], run[j + 1])
            except AMQPError as exc:
                exc.at = at
                raise


def machine(handler: RecordingHandler | None = None,
            ) -> tuple[WireConnection, RecordingHandler, list[bytes]]:
    out: list[bytes] = []
    handler = handler or RecordingHandler()
    wire = WireConnection(handler, out.append, server_properties={}, frame_max=FRAME_MAX)
    handler.wire = wire
    return wire, handler, out


def run(pieces: list[bytes], split: bool, handler: RecordingHandler | None = None,
        ) -> tuple[bytes, list[tuple[Any, ...]]]:
    """What the wire machine wrote, and every call it made. (Not its frame count: after a
    connection error, how many of the frames behind it are counted depends on how the reads
    were cut, with or without a worker.)"""
    wire, handler, out = machine(handler)
    splitter = Splitter(FRAME_MAX)
    try:
        for piece in pieces:
            messages = splitter.feed(piece) if split else [(ipc.DATA, piece)]
            for kind, payload in messages:
                try:
                    if kind == ipc.DATA:
                        wire.receive(payload)
                    else:
                        assert kind == ipc.FRAMES
                        wire.receive_split(marshal.loads(payload[4:]))
                except AMQPError as error:
                    wire.close_connection(error)
    except BadProtocolHeader as bad:
        out.append(b"bad header: " + bad.reply)
    return b"".join(out), handler.calls


def cut(data: bytes, rng: random.Random) -> list[bytes]:
    pieces, position = [], 0
    while position < len(data):
        size = rng.randint(1, 300) if rng.random() < 0.4 else len(data)
        pieces.append(data[position : position + size])
        position += size
    return pieces


seeds = st.integers(0, 2**64 - 1)
CASES = settings(max_examples=300, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@CASES
@given(seeds)
def test_a_split_connection_gets_what_a_read_one_gets(seed: int) -> None:
    rng = random.Random(seed)
    pieces = cut(Generator(rng).connection(setup=rng.random() < 0.5), rng)
    assert run(pieces, split=True) == run(pieces, split=False)


@CASES
@given(st.binary(max_size=3000), seeds)
def test_any_bytes_after_a_handshake_split_or_not(data: bytes, seed: int) -> None:
    pieces = cut(HANDSHAKE + data, random.Random(seed))
    assert run(pieces, split=True) == run(pieces, split=False)


def publish(channel: int, body: bytes, routing_key: str = "q") -> bytes:
    from pamqp import commands
    header = struct.pack(">HHQH", 60, 0, len(body), 0)
    return (method_frame(channel, commands.Basic.Publish(exchange="", routing_key=routing_key))
            + frame(2, channel, header) + frame(3, channel, body))


@pytest.mark.parametrize("code", [406, 503])  # a channel error, and a connection error
@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_a_publish_refused_inside_a_run_ends_it_as_it_ends_frames(fail_at: int,
                                                                   code: int) -> None:
    """Six publishes alike in one read are one run; the session refusing the `fail_at`-th
    must close the same channel or connection, after the same publishes, as from bytes, and
    the frames behind it (another channel's publish, the client's connection.close) must
    meet the same fate."""
    from pamqp import commands
    opened = HANDSHAKE + method_frame(2, commands.Channel.Open())
    burst = b"".join(publish(1, b"m%d" % n) for n in range(6)) + publish(2, b"other")
    closing = method_frame(0, commands.Connection.Close(reply_code=200, reply_text="bye"))
    pieces = [opened, burst + closing]
    split_run = run(pieces, True, FailingHandler(fail_at, code))
    assert split_run == run(pieces, False, FailingHandler(fail_at, code))
    published = [call for call in split_run[1] if call[0] == "on_publish"]
    # the refused one and those before it; a channel error spares channel 2's publish
    assert len(published) == fail_at + (1 if code == 406 else 0)


def test_publishes_alike_in_a_row_travel_as_one_run() -> None:
    splitter = Splitter(FRAME_MAX)
    splitter.feed(b"AMQP\x00\x00\x09\x01")
    wire_bytes = (publish(1, b"a") + publish(1, b"b") + publish(1, b"c", "other")
                  + publish(2, b"d") + publish(2, b"e"))
    (_, payload), = splitter.feed(wire_bytes)
    items = marshal.loads(payload[4:])
    assert [(item[0], item[3::2]) for item in items] == [
        (1, [b"a", b"b"]), (1, [b"c"]), (2, [b"d", b"e"])]


def test_publishes_travel_as_one_item_each_and_other_frames_as_frames() -> None:
    splitter = Splitter(FRAME_MAX)
    assert splitter.feed(b"AMQP\x00\x00\x09\x01") == [(ipc.DATA, b"AMQP\x00\x00\x09\x01")]
    heartbeat = frame(8, 0, b"")
    wire_bytes = publish(1, b"one") + heartbeat + publish(2, b"two", "r")
    (kind, payload), = splitter.feed(wire_bytes)
    assert kind == ipc.FRAMES
    assert struct.unpack(">I", payload[:4])[0] == len(wire_bytes)  # the bytes on the wire
    items = marshal.loads(payload[4:])
    assert [len(item) for item in items] == [4, 3, 4]  # a run of one, a frame, a run of one
    assert items[0][0] == 1 and items[0][3] == b"one"
    assert items[1] == (8, 0, b"")
    assert items[2][0] == 2 and items[2][3] == b"two"


def test_a_publish_cut_between_reads_goes_as_its_frames() -> None:
    """Only a publish whose three frames came in one read is gathered; the main process
    assembles the others frame by frame, as it does from bytes."""
    splitter = Splitter(FRAME_MAX)
    splitter.feed(b"AMQP\x00\x00\x09\x01")
    data = publish(1, b"body")
    (_, first), = splitter.feed(data[:20])  # the method frame is 19 bytes
    (_, second), = splitter.feed(data[20:])
    assert [item[0] for item in marshal.loads(first[4:])] == [1]
    assert [item[0] for item in marshal.loads(second[4:])] == [2, 3]


def test_a_publish_whose_frames_are_on_other_channels_stays_frames() -> None:
    method = publish(1, b"x")
    header_on_2 = method.replace(b"\x02\x00\x01", b"\x02\x00\x02", 1)
    frames = [(1, 1, b"\x00\x3c\x00\x28"), (2, 2, b"h" * 14), (3, 1, b"x")]
    assert gather(frames) == frames
    assert header_on_2 != method


def test_a_header_split_over_reads_goes_whole_to_the_main_process() -> None:
    splitter = Splitter(FRAME_MAX)
    assert splitter.feed(b"AMQ") == [(ipc.DATA, b"AMQ")]
    assert splitter.feed(b"P\x00\x00\x09\x01" + frame(8, 0, b""))[0] == (
        ipc.DATA, b"P\x00\x00\x09\x01")


@pytest.mark.parametrize("bad", [
    frame(1, 1, b"\x00" * (FRAME_MAX + 1)),  # larger than the broker's frame_max
    frame(8, 0, b"", end=b"\x00"),  # a wrong frame end
])
def test_framing_that_cannot_be_right_goes_on_as_bytes_from_that_frame(bad: bytes) -> None:
    splitter = Splitter(FRAME_MAX)
    splitter.feed(b"AMQP\x00\x00\x09\x01")
    good = frame(8, 0, b"")
    messages = splitter.feed(good + bad + b"later")
    assert messages[0][0] == ipc.FRAMES
    assert messages[1] == (ipc.DATA, bad + b"later")
    assert splitter.feed(b"more") == [(ipc.DATA, b"more")]  # and everything after it


def test_the_message_stream_survives_any_cut() -> None:
    stream = (ipc.message(ipc.DATA, 7, b"hello") + ipc.message(ipc.LOST, 7)
              + ipc.message(ipc.FRAMES, 1 << 31, b"x" * 70000))
    for size in (1, 5, 9, 100, len(stream)):
        decoder, got = ipc.Decoder(), []
        for i in range(0, len(stream), size):
            got += decoder.feed(stream[i : i + size])
        assert got == [(ipc.DATA, 7, b"hello"), (ipc.LOST, 7, b""),
                       (ipc.FRAMES, 1 << 31, b"x" * 70000)]


@pytest.mark.parametrize("head", [
    struct.pack(">BII", 0, 1, 0),  # no such kind
    struct.pack(">BII", 99, 1, 0),
    struct.pack(">BII", ipc.DATA, 1, ipc.MAX_PAYLOAD + 1),  # a length no process sends
])
def test_a_message_head_no_process_sends_is_refused(head: bytes) -> None:
    with pytest.raises(ipc.IPCError):
        ipc.Decoder().feed(head)
