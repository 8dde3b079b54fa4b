"""What the source asks a broker about streams, over plain AMQP 0.9.1.

There is no AMQP method for "first offset", "next offset" or "partitions of a super stream",
so these are derived from what any stream-capable broker answers:

- the first offset: the `x-stream-offset` header of the first delivery of a consumer that
  attaches at `first` (prefetch 1, cancelled at once);
- the next offset (one past the last committed message): the first offset plus the
  message count of a passive queue.declare (which a stream reports as committed + 1 - first).
  The two are read in that order, so retention moving the first offset in between can only
  make the answer smaller, never point past committed data;
- a super stream's partitions: the exchange must exist. Leveret names them, in partition order
  and whatever their binding keys, through a basic.get on its reserved query name
  `amq.leveret.partitions?superstream=<name>`; a broker that does not know the query
  (RabbitMQ: 404) gets the naming of `add_super_stream --partitions N`: the streams
  `<name>-0`, `<name>-1`, ... up to the first that does not exist.

Runs wherever a reader needs it (the driver's reader process, a planning worker); blocking.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any
from urllib.parse import urlencode

from leveret.spark.channel import Channel, Delivery
from leveret.spark.errors import BrokerError, LeveretSparkError
from leveret.spark.options import OffsetSpec
from leveret.spark.wire import Connection

ATTACH_WAIT_S = 2.0
PARTITIONS_QUERY = "amq.leveret.partitions?"


class Probe:
    """Short questions about streams on one connection (a channel reopened after errors)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._ch: Channel | None = None

    def channel(self) -> Channel:
        if self._ch is None or self._ch.error is not None:
            self._ch = self.conn.channel()
        return self._ch

    def partitions(self, stream: str | None, superstream: str | None) -> list[str]:
        if stream is not None:
            self.message_count(stream)  # raises a clear error if it does not exist
            return [stream]
        assert superstream is not None
        try:
            self.channel().exchange_exists(superstream)
        except BrokerError as exc:
            raise LeveretSparkError(f"leveret source: super stream '{superstream}': "
                                    f"{exc.code} {exc.text}") from None
        named = self._named_partitions(superstream)
        if named:
            return named
        names: list[str] = []
        while True:
            name = f"{superstream}-{len(names)}"
            try:
                self.channel().queue_declare_passive(name)
            except BrokerError as exc:
                if exc.code != 404:
                    raise
                break
            names.append(name)
        if not names:
            raise LeveretSparkError(f"leveret source: super stream '{superstream}' has no "
                                    f"partition stream '{superstream}-0'")
        return names

    def _named_partitions(self, superstream: str) -> list[str] | None:
        """The partitions as the broker names them; None if it cannot (not Leveret, or an
        exchange that is not marked as a super stream)."""
        query = PARTITIONS_QUERY + urlencode({"superstream": superstream})
        try:
            _got, content = self.channel().basic_get(query)
        except BrokerError as exc:
            if exc.code in (404, 406):
                return None
            raise LeveretSparkError(f"leveret source: super stream '{superstream}': "
                                    f"{exc.code} {exc.text}") from None
        if content is None:
            return None
        return [str(p["stream"]) for p in json.loads(content.body)["partitions"]]

    def message_count(self, stream: str) -> int:
        try:
            return int(self.channel().queue_declare_passive(stream).message_count or 0)
        except BrokerError as exc:
            raise LeveretSparkError(f"leveret source: stream '{stream}': "
                                    f"{exc.code} {exc.text}") from None

    def attach_offset(self, stream: str, spec: Any, wait_s: float) -> int | None:
        """The offset of the first message a consumer attached with `spec` gets, or None if
        none comes within `wait_s`."""
        conn = self.conn
        ch = conn.channel()
        try:
            ch.qos(1)
            ch.consume(stream, {"x-stream-offset": spec})
            deadline = time.monotonic() + wait_s
            while not ch.deliveries:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                ch.check()
                conn.pump(remaining)
            delivery = ch.deliveries[0]
            return offset_of(delivery)
        finally:
            ch.close()

    def first_and_next(self, stream: str) -> tuple[int, int]:
        """(first offset, next offset) of a stream; (0, 0) for one never written to."""
        count = self.message_count(stream)
        if count == 0:
            return 0, 0
        first = self.attach_offset(stream, "first", 30.0)
        if first is None:
            raise LeveretSparkError(f"leveret source: stream '{stream}' reports {count} "
                                    "messages but delivers none from 'first'")
        count = self.message_count(stream)
        return first, first + count

    def resolve(self, stream: str, spec: OffsetSpec) -> int:
        """A start or end position as a concrete offset, clamped to [first, next]."""
        first, nxt = self.first_and_next(stream)
        if spec.kind == "first":
            return first
        if spec.kind == "next":
            return nxt
        if spec.kind == "offset":
            return min(max(spec.value, first), nxt)
        if first == nxt:
            return nxt
        if spec.kind == "last":
            got = self.attach_offset(stream, "last", 30.0)
        else:
            when = datetime.datetime.fromtimestamp(spec.value / 1000, tz=datetime.UTC)
            got = self.attach_offset(stream, when, ATTACH_WAIT_S)
        return nxt if got is None else min(max(got, first), nxt)


def offset_of(delivery: Delivery) -> int:
    headers = delivery.property_values().get("headers") or {}
    value = headers.get("x-stream-offset")
    if not isinstance(value, int):
        raise LeveretSparkError("leveret source: a delivery has no x-stream-offset header "
                                "(is the queue a stream?)")
    return value
