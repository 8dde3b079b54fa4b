"""Every x-argument, on queue.declare, exchange.declare, queue.bind and basic.consume, with
values of every AMQP type and at and past its limits, against a real `leveret serve`.

Each declaration either succeeds (the value is one the argument takes) or fails with 406
PRECONDITION_FAILED or 404 NOT_FOUND and a text that names the argument; never 541
INTERNAL_ERROR, never a dropped connection, and the broker's log holds no traceback. A value of
a type the argument cannot take always fails, except for the few arguments RabbitMQ itself
ignores when their type is wrong (they are listed in IGNORED, with the reason).

The cases run many at a time: each on its own channel of one connection, pipelined.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pamqp import commands
from support import fuzzwire as fw
from support.brokers import BrokerProcess
from support.rawamqp import PeerClosed, RawClient

OK = "ok"
TEN_YEARS_MS = 315_360_000_000


@dataclass(frozen=True)
class Value:
    name: str
    wire: Any  # what fuzzwire encodes
    python: Any  # what the broker decodes it to (for the expectations)


def _values() -> list[Value]:
    plain: list[tuple[str, Any]] = [
        ("true", True), ("false", False), ("zero", 0), ("minus-one", -1), ("one", 1),
        ("sixteen", 16), ("255", 255), ("256", 256), ("int32-max", 2**31 - 1),
        ("int32-min", -(2**31)), ("ten-years-ms", TEN_YEARS_MS),
        ("ten-years-ms-plus-one", TEN_YEARS_MS + 1), ("3e9", 3_000_000_001),
        ("int64-max", 2**63 - 1), ("int64-min", -(2**63)), ("float", 1.5),
        ("negative-zero", -0.0), ("nan", math.nan), ("infinity", math.inf), ("empty", ""),
        ("word", "bogus"), ("hash", "hash"), ("first", "first"), ("one-day", "1D"),
        ("zero-seconds", "0s"), ("huge-interval", "999999999999Y"), ("nul", "\x00"),
        ("true-string", "true"), ("drop-head", "drop-head"), ("all", "all"),
        ("table", {"a": 1}), ("empty-table", {}), ("array", [1, "a"]), ("empty-array", []),
        ("nested-arrays", [[[]]]), ("void", None),
        ("timestamp", datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)),
        ("decimal", decimal.Decimal("1.5")), ("byte-array", bytearray(b"x")),
    ]
    values = [Value(name, value, value) for name, value in plain]
    values += [
        Value("invalid-utf8", b"\xff\xfe", b"\xff\xfe"),
        Value("short-int", fw.Raw(b"s", b"\x00\x05"), 5),
        Value("byte", fw.Raw(b"b", b"\xff"), -1),
        Value("unsigned-int", fw.Raw(b"i", b"\xff\xff\xff\xff"), 2**32 - 1),
        Value("float32", fw.Raw(b"f", b"\x3f\xc0\x00\x00"), 1.5),
        Value("nested-101", fw.nested_table(101), "nested"),
    ]
    return values


VALUES = _values()
# A sample: a value of each type, and the limits around the common ranges.
SHORT = {"true", "zero", "minus-one", "one", "256", "ten-years-ms-plus-one", "int64-max",
         "float", "nan", "empty", "word", "hash", "first", "one-day", "table", "array", "void",
         "timestamp", "decimal", "byte-array", "invalid-utf8", "short-int", "nested-101"}


# -- what each argument takes ----------------------------------------------------------------

def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def ints(low: int, high: int = 2**63 - 1) -> Callable[[Any], bool]:
    return lambda v: is_int(v) and low <= v <= high


def one_of(*choices: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_str(v: Any) -> bool:
    return isinstance(v, str | bytes)


def never(_v: Any) -> bool:
    return False


def anything(_v: Any) -> bool:
    return True


def interval(v: Any) -> bool:
    return isinstance(v, str) and v[:-1].isdigit() and int(v[:-1]) > 0 and v[-1] in "smhDMY"


CLASSIC = {
    "x-expires": ints(1, TEN_YEARS_MS),
    "x-message-ttl": ints(0, TEN_YEARS_MS),
    "x-dead-letter-exchange": is_str,
    "x-dead-letter-routing-key": never,  # needs x-dead-letter-exchange too
    "x-max-length": ints(0),
    "x-max-length-bytes": ints(0),
    "x-max-priority": ints(0, 255),
    "x-overflow": one_of("drop-head", "reject-publish", "reject-publish-dlx"),
    "x-queue-mode": one_of("default", "lazy"),
    "x-queue-version": ints(1, 2),
    "x-single-active-consumer": is_bool,
    "x-queue-master-locator": one_of("min-masters", "client-local", "random"),
    "x-queue-leader-locator": one_of("client-local", "balanced", "random", "least-leaders",
                                     "min-masters"),
    "x-message-deduplication": lambda v: v is None or is_bool(v),
    "x-cache-size": lambda v: v is None or ints(0)(v),
    "x-cache-ttl": lambda v: v is None or ints(0)(v),
    "x-deduplication-header": lambda v: is_str(v) and v != "",
    # keys of other queue types
    "x-max-age": never, "x-stream-max-segment-size-bytes": never,
    "x-stream-filter-size-bytes": never, "x-initial-cluster-size": never,
    "x-quorum-initial-group-size": never, "x-delivery-limit": never,
    "x-dead-letter-strategy": never, "x-max-in-memory-length": never,
    "x-max-in-memory-bytes": never, "x-consumer-timeout": never,
}
STREAM = {
    "x-max-length-bytes": ints(0),
    "x-max-age": lambda v: interval(v) or v == "999999999999Y",
    "x-stream-max-segment-size-bytes": ints(0, 3_000_000_000),
    "x-stream-filter-size-bytes": ints(16, 255),
    "x-initial-cluster-size": ints(1),
    "x-queue-leader-locator": CLASSIC["x-queue-leader-locator"],
    "x-message-deduplication": CLASSIC["x-message-deduplication"],
    "x-cache-size": CLASSIC["x-cache-size"],
    "x-cache-ttl": CLASSIC["x-cache-ttl"],
    "x-deduplication-header": CLASSIC["x-deduplication-header"],
    # keys of other queue types
    "x-expires": never, "x-message-ttl": never, "x-dead-letter-exchange": never,
    "x-max-length": never, "x-max-priority": never, "x-overflow": never,
    "x-single-active-consumer": never, "x-queue-mode": never, "x-queue-master-locator": never,
}
EXCHANGE = {
    "alternate-exchange": is_str,
    "x-super-stream": is_bool,
    "x-super-stream-routing": one_of("hash"),
    "x-message-deduplication": CLASSIC["x-message-deduplication"],
    "x-cache-size": CLASSIC["x-cache-size"],
    "x-cache-ttl": CLASSIC["x-cache-ttl"],
    "x-deduplication-header": CLASSIC["x-deduplication-header"],
}
BIND = {"x-match": one_of("all", "any", "all-with-x", "any-with-x")}
CONSUME_CLASSIC = {
    "x-priority": is_int,
    "x-cancel-on-ha-failover": is_bool,
    "x-stream-offset": never, "x-stream-filter": never, "x-stream-match-unfiltered": never,
}
CONSUME_STREAM = {
    "x-stream-offset": lambda v: is_int(v) or v in ("first", "last", "next") or interval(v)
    or v == "999999999999Y" or isinstance(v, datetime.datetime),
    "x-stream-automatic-offset-tracking": lambda v: is_bool(v) or v in ("true", "false"),
    "x-single-active-consumer": is_bool,
    "x-priority": never, "x-cancel-on-ha-failover": never,
}
# Arguments whose wrong types RabbitMQ ignores (so Leveret does too), and why.
IGNORED = {
    # RabbitMQ reads a filter only from a longstr or an array; anything else means no filter.
    ("consume-stream", "x-stream-filter"): anything,
    ("consume-stream", "x-stream-match-unfiltered"): anything,
    # Unknown to RabbitMQ's classic queues (Leveret's stream extensions): ignored there.
    ("consume-classic", "x-stream-automatic-offset-tracking"): anything,
    ("consume-classic", "x-single-active-consumer"): anything,
}


# Refused alone, but valid with another argument (a string, given x-dead-letter-exchange).
DEPENDS_ON_OTHERS = {"x-dead-letter-routing-key"}


# -- the cases -----------------------------------------------------------------------------

@dataclass
class Case:
    target: str
    key: str
    value: Value
    valid: bool | None  # None: either outcome is right (combinations)
    name: str = ""
    extra: dict[str, Value] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return [self.key, *self.extra]


TABLES = {"queue-classic": CLASSIC, "queue-stream": STREAM, "exchange": EXCHANGE,
          "bind": BIND, "consume-classic": CONSUME_CLASSIC, "consume-stream": CONSUME_STREAM}


def accepts(target: str, key: str, value: Value) -> bool:
    if value.python == "nested":
        return False
    return bool(IGNORED.get((target, key), TABLES[target].get(key, anything))(value.python))


def combinations(count: int, seed: int) -> Iterator[Case]:
    """Two to four arguments at once: refused whenever one of them is refused alone (the
    outcome is left open when all are valid alone, as some depend on each other)."""
    rng = random.Random(seed)
    targets = sorted(TABLES)
    for _ in range(count):
        target = rng.choice(targets)
        keys = rng.sample(sorted(TABLES[target]), min(len(TABLES[target]), rng.randint(2, 4)))
        chosen = {key: rng.choice(VALUES) for key in keys}
        alone = [
            is_str(value.python) if key in DEPENDS_ON_OTHERS else accepts(target, key, value)
            for key, value in chosen.items()
        ]
        first, *rest = keys
        yield Case(target, first, chosen[first], None if all(alone) else False,
                   extra={key: chosen[key] for key in rest})


def cases(short: bool) -> Iterator[Case]:
    values = [v for v in VALUES if v.name in SHORT] if short else VALUES
    for target, table in TABLES.items():
        for key in table:
            for value in values:
                yield Case(target, key, value, accepts(target, key, value))
    for target, key in IGNORED:
        for value in values:
            yield Case(target, key, value, accepts(target, key, value))


SETUP_QUEUE, SETUP_STREAM, SETUP_HEADERS = "args-classic", "args-stream", "args-headers"


def methods(case: Case, name: str) -> tuple[list[Any], Any]:
    """(setup methods, the method under test) for one case on its own channel."""
    args = {case.key: case.value.wire, **{k: v.wire for k, v in case.extra.items()}}
    make = fw.make
    if case.target == "queue-classic":
        return [], make(commands.Queue.Declare, queue=name, durable=True, arguments=args)
    if case.target == "queue-stream":
        args.setdefault("x-queue-type", "stream")
        return [], make(commands.Queue.Declare, queue=name, durable=True, arguments=args)
    if case.target == "exchange":
        return [], make(commands.Exchange.Declare, exchange=name, exchange_type="direct",
                        durable=True, arguments=args)
    if case.target == "bind":
        return [], make(commands.Queue.Bind, queue=SETUP_QUEUE, exchange=SETUP_HEADERS,
                        routing_key=name, arguments=args)
    queue = SETUP_QUEUE if case.target == "consume-classic" else SETUP_STREAM
    qos = make(commands.Basic.Qos, prefetch_count=10)
    return [qos], make(commands.Basic.Consume, queue=queue, consumer_tag=name, arguments=args)


class Runner:
    """Runs cases in batches, each on its own channel of one connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.names = itertools.count()
        client = RawClient(port).handshake()
        client.open_channel(1)
        for method in (
            fw.make(commands.Queue.Declare, queue=SETUP_QUEUE, durable=True, arguments={}),
            fw.make(commands.Queue.Declare, queue=SETUP_STREAM, durable=True,
                    arguments={"x-queue-type": "stream"}),
            fw.make(commands.Exchange.Declare, exchange=SETUP_HEADERS, exchange_type="headers",
                    durable=True, arguments={}),
        ):
            client.send(fw.method_frame(1, method))
            client.next_method()
        client.close_connection()
        client.close()

    def run(self, batch: list[Case]) -> list[tuple[Any, str]]:
        client = RawClient(self.port, timeout=30).handshake()
        pending: dict[int, int] = {}  # channel -> replies still expected before the answer
        answers: dict[int, tuple[Any, str]] = {}
        out = []
        for number, case in enumerate(batch, 1):
            case.name = f"args-{next(self.names)}"
            setup, method = methods(case, case.name)
            out.append(fw.method_frame(number, commands.Channel.Open()))
            out += [fw.method_frame(number, m) for m in (*setup, method)]
            pending[number] = 1 + len(setup)
        client.send(b"".join(out))
        while len(answers) < len(batch):
            try:
                channel, method = client.next_method()
            except PeerClosed:
                for number in pending:
                    answers.setdefault(number, ("dropped", ""))
                break
            if channel == 0:
                assert isinstance(method, commands.Connection.Close), method
                for number in pending:
                    answers.setdefault(number, (method.reply_code, method.reply_text))
                break
            if isinstance(method, commands.Channel.Close):
                answers[channel] = (method.reply_code, method.reply_text)
                client.send_method(channel, commands.Channel.CloseOk())
            elif pending[channel]:
                pending[channel] -= 1
            elif channel not in answers:
                answers[channel] = (OK, type(method).__name__)
        client.close()
        return [answers[number] for number in range(1, len(batch) + 1)]

    def cleanup(self, done: list[Case], results: list[tuple[Any, str]]) -> None:
        """Delete what the successful cases declared."""
        client = RawClient(self.port, timeout=30).handshake()
        client.open_channel(1)
        out = []
        for case, (code, _text) in zip(done, results, strict=True):
            if code != OK:
                continue
            if case.target.startswith("queue"):
                out.append(fw.method_frame(1, fw.make(commands.Queue.Delete, queue=case.name)))
            elif case.target == "exchange":
                out.append(fw.method_frame(1, fw.make(commands.Exchange.Delete,
                                                      exchange=case.name)))
        client.send(b"".join(out))
        for _ in out:
            client.next_method()
        client.close()


def run_all(broker: BrokerProcess, all_cases: list[Case],
            batch_size: int = 400) -> dict[str, int]:
    runner = Runner(broker.port)
    problems: list[str] = []
    counts = {"cases": len(all_cases), "accepted": 0, "refused": 0}
    for start in range(0, len(all_cases), batch_size):
        batch = all_cases[start : start + batch_size]
        results = runner.run(batch)
        for case, (code, text) in zip(batch, results, strict=True):
            where = f"{case.target} {case.key}={case.value.name}" + "".join(
                f", {key}={value.name}" for key, value in case.extra.items())
            if code == OK:
                counts["accepted"] += 1
                if case.valid is False:
                    problems.append(f"{where}: accepted, should be refused")
                continue
            counts["refused"] += 1
            if code not in (406, 404):
                problems.append(f"{where}: {code} {text}")
            elif case.valid:
                problems.append(f"{where}: refused, should be accepted: {text}")
            elif not any(key in text for key in case.keys) and "nested more than" not in text:
                problems.append(f"{where}: {code} {text!r} does not name the argument")
        runner.cleanup(batch, results)
    log = broker.log()
    assert "Traceback" not in log and "connection crashed" not in log, log[-3000:]
    assert not problems, "\n".join(problems[:40]) + f"\n({len(problems)} problems)"
    return counts


def test_every_argument_with_wrong_types_and_limits(broker_process: BrokerProcess) -> None:
    counts = run_all(broker_process, list(cases(short=False)))
    print("argument cases:", counts)
    assert counts["cases"] > 3000


@pytest.mark.slow
def test_arguments_in_random_combinations(broker_process: BrokerProcess) -> None:
    counts = run_all(broker_process, list(combinations(100_000, seed=9)))
    print("argument combinations:", counts)
