"""Frame fuzzing: generators of hostile AMQP byte streams, and harnesses that feed them to the
broker (in process through its Session, or over a live socket) and report what went wrong.

A case is one connection's worth of bytes after a valid handshake (or, sometimes, instead of
one): methods of every kind with arguments of every type, publishes with odd properties, frames
on closed and unopened channels, deeply nested tables, invalid UTF-8 in short strings, and
random mutations of all of these (flipped, dropped and inserted bytes, sizes that lie, bad frame
ends). Everything is drawn from a `random.Random`, so a seed reproduces a case.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import socket
import struct
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pamqp import commands as C
from support import fuzzwire as fw

# Reply codes RabbitMQ closes a channel or connection with; 541 (internal error) is a bug.
EXPECTED_CODES = frozenset({200, 312, 320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505,
                            506, 530, 540})

HANDSHAKE = (
    b"AMQP\x00\x00\x09\x01"
    + fw.method_frame(0, fw.make(
        C.Connection.StartOk,
        client_properties={"product": "fuzz", "capabilities": {"consumer_cancel_notify": True,
                                                               "basic.nack": True}},
        mechanism="PLAIN", response=b"\x00guest\x00guest", locale="en_US"))
    + fw.method_frame(0, fw.make(C.Connection.TuneOk, channel_max=16, frame_max=131072,
                                 heartbeat=0))
    + fw.method_frame(0, fw.make(C.Connection.Open, virtual_host="/"))
    + fw.method_frame(1, C.Channel.Open())
)

NAMES: list[str | bytes] = [
    "", "q", "s", "e", "h", "dl", "pq", "ss", "ss-0", "amq.direct", "amq.gen-x", "x" * 255,
    "é", b"\xff\xfe", b"\xc3", "a\x00b", "amq.leveret.publisher-id?stream=s&publisher=p",
    "amq.leveret.consumer-offset?stream=s&consumer=c",
]
KEYS = [
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow",
    "x-single-active-consumer", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes", "x-queue-type", "x-message-deduplication", "x-cache-size",
    "x-cache-ttl", "x-deduplication-header", "alternate-exchange", "x-super-stream",
    "x-super-stream-routing", "x-priority", "x-stream-offset", "x-stream-offset",
    "x-stream-filter", "x-stream-match-unfiltered", "x-stream-automatic-offset-tracking",
    "x-match", "x-stream-partition-order", "x-stream-publisher-name", "x-stream-publishing-id",
    "x-stream-filter-value", "CC", "BCC", "x-death", "x-cache-ttl", "a",
]
SCALARS: list[Any] = [
    True, 0, -1, 2**63 - 1, -(2**63), 1.5, 1e300, "first", "last", "next", "1h", "hash", "any",
    b"\xff", None, datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), decimal.Decimal("1.23"),
    bytearray(b"x"), "",
]

# Topology every other in-process case starts with, so that methods find things to act on.
SETUP = b"".join(fw.method_frame(1, m) for m in [
    fw.make(C.Queue.Declare, queue="q", durable=True, arguments={}),
    fw.make(C.Queue.Declare, queue="s", durable=True, arguments={"x-queue-type": "stream"}),
    fw.make(C.Exchange.Declare, exchange="h", exchange_type="headers", durable=True,
            arguments={}),
    fw.make(C.Exchange.Declare, exchange="e", exchange_type="topic",
            arguments={"x-message-deduplication": True}),
    fw.make(C.Exchange.Declare, exchange="ss", exchange_type="direct", durable=True,
            arguments={"x-super-stream": True, "x-super-stream-routing": "hash"}),
    fw.make(C.Queue.Declare, queue="ss-0", durable=True, arguments={"x-queue-type": "stream"}),
    fw.make(C.Queue.Bind, queue="ss-0", exchange="ss", routing_key="0", arguments={}),
    fw.make(C.Queue.Bind, queue="q", exchange="e", routing_key="#", arguments={}),
    fw.make(C.Queue.Bind, queue="s", exchange="h", routing_key="",
            arguments={"x-match": "any", "a": 1}),
    fw.make(C.Queue.Declare, queue="dl", arguments={"x-dead-letter-exchange": "e",
                                                    "x-message-ttl": 0}),
    fw.make(C.Queue.Bind, queue="dl", exchange="h", routing_key="",
            arguments={"x-match": "any", "a": 1}),
    fw.make(C.Queue.Declare, queue="pq", durable=True, arguments={
        "x-max-priority": 5, "x-max-length": 3, "x-dead-letter-exchange": "h"}),
    fw.make(C.Queue.Bind, queue="pq", exchange="e", routing_key="#", arguments={}),
    fw.make(C.Basic.Qos, prefetch_count=10),
])


def mutate(rng: Any, data: bytes) -> bytes:
    """A few random edits: a byte changed, dropped or inserted, a run inserted, or the frame
    size rewritten to match (or not) the payload."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif op == 1 and out:
            del out[rng.randrange(len(out))]
        elif op == 2:
            out.insert(rng.randrange(len(out) + 1), rng.randrange(256))
        elif op == 3 and len(out) > 11:
            at = rng.randrange(7, len(out) - 1)
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
        elif len(out) >= 8:
            struct.pack_into(">I", out, 3, len(out) - 8 if rng.random() < 0.7 else
                             rng.choice([0, 2**31, 2**32 - 1, 131073]))
    return bytes(out)


class Generator:
    """Hostile bytes for one connection, drawn from `rng`."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def name(self) -> Any:
        return self.rng.choice(NAMES)

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        roll = rng.random()
        if roll < 0.02:
            return fw.nested_table(rng.choice([50, 101, 480, 2000]))
        if roll < 0.04:
            return fw.nested_array(rng.choice([50, 101, 480, 2000]))
        if roll < 0.07:  # any type letter, any payload
            return fw.Raw(bytes((rng.randrange(256),)),
                          bytes(rng.randrange(256) for _ in range(rng.randrange(10))))
        if depth < 3 and roll < 0.15:
            return {self.rng.choice(KEYS): self.value(depth + 1)}
        if depth < 3 and roll < 0.22:
            return [self.value(depth + 1) for _ in range(rng.randrange(3))]
        return rng.choice(SCALARS)

    def table(self) -> dict[str, Any]:
        table = {self.rng.choice(KEYS): self.value() for _ in range(self.rng.randrange(4))}
        if self.rng.random() < 0.3:
            table["x-queue-type"] = self.rng.choice(["stream", "classic"])
        return table

    def flag(self) -> bool:
        return self.rng.random() < 0.3

    def method(self) -> Any:
        """One channel-level method with random fields, chosen evenly among 22 kinds."""
        builders = self._method_builders()
        return builders[self.rng.randrange(len(builders))]()

    def _method_builders(self) -> list[Callable[[], Any]]:
        rng, make, name, flag, table = self.rng, fw.make, self.name, self.flag, self.table
        return [
            lambda: make(C.Queue.Declare, queue=name(), durable=not flag(), exclusive=flag(),
                         auto_delete=flag(), passive=flag(), arguments=table()),
            lambda: make(C.Exchange.Declare, exchange=name(),
                         exchange_type=rng.choice(["direct", "topic", "headers", "fanout", "x"]),
                         durable=flag(), auto_delete=flag(), passive=flag(), internal=flag(),
                         arguments=table()),
            lambda: make(C.Queue.Bind, queue=name(), exchange=name(), routing_key=name(),
                         arguments=table()),
            lambda: make(C.Basic.Consume, queue=name(),
                         consumer_tag=rng.choice(["", "c", "amq.ctag-1"]), no_ack=flag(),
                         exclusive=flag(), arguments=table()),
            lambda: make(C.Basic.Qos, prefetch_count=rng.choice([0, 1, 10]), global_=flag()),
            lambda: make(C.Basic.Ack, delivery_tag=rng.randrange(5), multiple=flag()),
            lambda: make(C.Basic.Nack, delivery_tag=rng.randrange(5), multiple=flag(),
                         requeue=flag()),
            lambda: make(C.Basic.Reject, delivery_tag=rng.randrange(5), requeue=flag()),
            lambda: make(C.Basic.Get, queue=name(), no_ack=flag()),
            lambda: make(C.Basic.Cancel, consumer_tag=rng.choice(["", "c"])),
            lambda: make(C.Queue.Delete, queue=name(), if_unused=flag(), if_empty=flag()),
            lambda: make(C.Exchange.Delete, exchange=name()),
            lambda: make(C.Queue.Purge, queue=name()),
            C.Tx.Select,
            C.Tx.Commit,
            C.Tx.Rollback,
            lambda: make(C.Confirm.Select, nowait=flag()),
            lambda: make(C.Basic.Recover, requeue=not flag()),
            lambda: make(C.Exchange.Bind, destination=name(), source=name(),
                         routing_key=name(), arguments=table()),
            lambda: make(C.Queue.Unbind, queue=name(), exchange=name(), routing_key=name(),
                         arguments=table()),
            lambda: make(C.Channel.Flow, active=flag()),
            lambda: make(C.Channel.Close, reply_code=200, reply_text="", class_id=0,
                         method_id=0),
        ]

    def publish(self, channel: int) -> bytes:
        rng = self.rng
        headers = {rng.choice(KEYS): self.value() for _ in range(rng.randrange(4))}
        body = b"x" * rng.choice([0, 1, 10, 200_000])
        return fw.publish(
            channel, self.name(), self.name(), body, mandatory=self.flag(),
            headers=headers or None, delivery_mode=rng.choice([None, 1, 2]),
            expiration=rng.choice([None, "", "0", "100", "-1", "x", b"\xff"]),
            priority=rng.choice([None, 0, 9, 255]), user_id=rng.choice([None, "guest", "x"]),
            content_type=rng.choice([None, "t", b"\xc3"]))

    def frames(self, setup: bool) -> bytes:
        """The frames after the handshake."""
        rng = self.rng
        parts = [SETUP] if setup else []
        for _ in range(rng.randint(1, 12)):
            channel = rng.choice([1, 1, 1, 1, 1, 2, 0])
            roll = rng.random()
            if roll < 0.3:
                part = self.publish(channel)
            elif roll < 0.33:  # a frame type, size or end that is wrong on its own
                part = fw.frame(rng.choice([0, 1, 2, 3, 4, 8, 9, 206]), channel,
                                bytes(rng.randrange(256) for _ in range(rng.randrange(20))),
                                end=rng.choice([b"\xce", b"\x00"]))
            elif roll < 0.35:  # an unknown class or method
                part = fw.frame(1, channel, struct.pack(">HH", rng.randrange(256),
                                                        rng.randrange(256)))
            else:
                part = fw.method_frame(channel, self.method())
            if rng.random() < 0.1:
                part = mutate(rng, part)
            if rng.random() < 0.05:
                part = fw.method_frame(channel, C.Channel.Open()) + part
            parts.append(part)
        return b"".join(parts)

    def connection(self, setup: bool = False) -> bytes:
        """All a connection sends: usually the handshake and then frames; sometimes a
        mutated handshake."""
        rng = self.rng
        data = HANDSHAKE + self.frames(setup)
        if rng.random() < 0.05:
            cut = rng.randrange(len(HANDSHAKE))
            data = data[:cut] + mutate(rng, data[cut:cut + 40]) + data[cut + 40:]
        return data


# -- in process --------------------------------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """Collects what the session writes; close() reports the connection lost."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.session.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class SessionHarness:
    """A real Broker on the running loop; each case is one Session on a FakeTransport.
    `problems` collects every crash: the session's "connection crashed" (541) and any
    exception in a callback of the loop (timers, flushes)."""

    def __init__(self, data_dir: Path) -> None:
        from leveret.broker.broker import Broker
        from leveret.broker.process.config import Config
        from leveret.broker.session import connection as session_module

        self.session_module = session_module
        self.loop = asyncio.get_running_loop()
        self.broker = Broker(Config(data_dir=data_dir, port=0), self.loop)
        self.problems: list[str] = []
        self.codes: Counter[int] = Counter()
        self.cases = 0
        self.loop.set_exception_handler(self._loop_error)
        self._log_exception = session_module.log.exception
        session_module.log.exception = self._crashed

    def _crashed(self, *args: Any, **kwargs: Any) -> None:
        self.problems.append("connection crashed:\n" + traceback.format_exc())

    def _loop_error(self, _loop: Any, context: dict[str, Any]) -> None:
        error = context.get("exception")
        detail = "".join(traceback.format_exception(error)) if error else ""
        self.problems.append(f"loop error: {context.get('message')}\n{detail}")

    async def run(self, data: bytes, rng: Any) -> None:
        """Feed one connection's bytes, in random pieces, and let the broker react."""
        self.cases += 1
        session = self.session_module.Session(self.broker)
        transport = FakeTransport(session)
        session.connection_made(transport)
        position = 0
        while position < len(data) and not transport.closing:
            size = rng.randint(1, len(data) - position) if rng.random() < 0.3 else len(data)
            session.data_received(data[position : position + size])
            position += size
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        for code in close_codes(b"".join(transport.out)):
            self.codes[code] += 1
        if not transport.closing:
            transport.close()
        await asyncio.sleep(0)

    def close(self) -> None:
        self.session_module.log.exception = self._log_exception
        self.loop.set_exception_handler(None)
        self.broker.close()


def close_codes(data: bytes) -> list[int]:
    """The reply codes of the channel.close and connection.close frames in `data`."""
    codes = []
    pos = 0
    while pos + 7 <= len(data):
        frame_type, _channel, size = struct.unpack_from(">BHI", data, pos)
        payload = data[pos + 7 : pos + 7 + size]
        if frame_type == 1 and len(payload) >= 6:
            index = struct.unpack_from(">I", payload)[0]
            if index in (0x000A0032, 0x00140028):  # connection.close, channel.close
                codes.append(struct.unpack_from(">H", payload, 4)[0])
        pos += 8 + size
    return codes


# -- over a socket -------------------------------------------------------------------------------


def send_case(port: int, data: bytes, timeout: float = 5.0) -> tuple[list[int], bool]:
    """One connection: send everything, half-close, read until the broker closes. Returns
    the close codes it sent and whether it closed the socket in time."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the broker may close first: that is one of the allowed outcomes
        received = bytearray()
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            return close_codes(bytes(received)), False
        except OSError:
            pass
    return close_codes(bytes(received)), True
