"""One Spark task's publishing: rows in, AMQP publishes out, every one of them confirmed.

`PartitionPublisher` turns Arrow record batches into basic.publish frames on a channel in
confirm mode, keeps at most `max_unconfirmed` publishes in flight, and returns from `finish`
only when the broker has confirmed all of them. A nack, a basic.return (an unroutable row:
publishes are mandatory), a closed channel or a lost connection raises, which fails the task.

Exactly once: each publish carries `x-stream-publisher-name` (one name per query and Spark
partition) and `x-stream-publishing-id` (`batch_id << 32 | row index`, or the row's
`id_column`). The stream stores a publish only if its id is above the last id it stored for
that publisher, so a retried task or a replayed micro-batch re-sends the same ids and the
broker drops what it already has. For a stream target (the default exchange) the publisher
asks the broker for that last id first and does not even send rows at or below it: those are
the `deduplicated` count.

Runs inside a Spark Python worker; one task at a time; no threads.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leveret.amqp import codec
from leveret.amqp.content import content_frames
from leveret.amqp.properties import encode_values, long_entry
from leveret.amqp.tables import encode_entry
from leveret.spark.channel import Channel
from leveret.spark.errors import BrokerError, ConnectionLost, PublishError
from leveret.spark.options import SinkColumns, SinkOptions
from leveret.spark.wire import Connection

_ID_KEY = b"x-stream-publishing-id"
ID_LIMIT = 1 << 32


@dataclass
class Counts:
    """What one task did; summed per micro-batch on the driver."""

    rows: int = 0
    published: int = 0
    confirmed: int = 0
    deduplicated: int = 0
    bytes: int = 0


def publisher_query_name(publisher: str, stream: str) -> str:
    return "amq.leveret.publisher-id?" + urllib.parse.urlencode(
        {"stream": stream, "publisher": publisher})


class PartitionPublisher:
    """Publishes one task's rows on one confirm channel of a (reused) connection."""

    def __init__(
        self,
        connection: Connection,
        options: SinkOptions,
        columns: SinkColumns,
        publisher: str | None,
        batch_id: int,
        on_progress: Callable[[Counts], None] | None = None,
    ) -> None:
        if batch_id < 0 or batch_id >= 1 << 31:
            raise PublishError(f"leveret sink: batch id {batch_id} is outside 0..2^31-1")
        self.conn = connection
        self.options = options
        self.columns = columns
        self.publisher = publisher if options.exactly_once else None
        self.base_id = batch_id << 32
        self.on_progress = on_progress
        self.counts = Counts()
        self.channel = self._confirm_channel()
        self._start_tag = self.channel.next_tag
        self._row_index = 0
        self._last_id = 0
        self._methods: dict[tuple[str, str], bytes] = {}
        self._known_last: dict[str, int] = {}
        self._parts: list[bytes | memoryview] = []
        self._in_parts = 0
        self._slice = max(1, min(1000, options.max_unconfirmed // 4))
        self._window = max(0, options.max_unconfirmed - self._slice)
        self._pub_entry = (encode_entry("x-stream-publisher-name", self.publisher)
                           if self.publisher is not None else b"")

    # -- channels -------------------------------------------------------------------------

    def _confirm_channel(self) -> Channel:
        ch: Channel | None = self.conn.state.get("confirm_channel")
        if ch is None or ch.error is not None:
            ch = self.conn.channel()
            ch.confirm_select()
            self.conn.state["confirm_channel"] = ch
        if ch.unconfirmed:
            raise ConnectionLost("leveret sink: a reused channel still had unconfirmed publishes")
        ch.return_reasons.clear()
        ch.returns.clear()
        ch.nacked = 0
        return ch

    def _query_channel(self) -> Channel:
        ch: Channel | None = self.conn.state.get("query_channel")
        if ch is None or ch.error is not None:
            ch = self.conn.channel()
            self.conn.state["query_channel"] = ch
        return ch

    # -- targets --------------------------------------------------------------------------

    def _method_frame(self, exchange: str, routing_key: str) -> bytes:
        key = (exchange, routing_key)
        frame = self._methods.get(key)
        if frame is None:
            self._check_target(exchange, routing_key)
            try:
                frame = codec.encode_publish(self.channel.number,
                                             codec.short_str(exchange, cut=False),
                                             codec.short_str(routing_key, cut=False),
                                             mandatory=True)
            except ValueError as exc:
                raise PublishError(f"leveret sink: exchange or routing key too long: "
                                   f"{exc}") from None
            if len(self._methods) > 100_000:
                self._methods.clear()
            self._methods[key] = frame
        return frame

    def _check_target(self, exchange: str, routing_key: str) -> None:
        """A clear error up front for a missing exchange or stream (checked once per
        connection), and the publisher's last stored id for a stream target."""
        verified: set[tuple[str, str]] = self.conn.state.setdefault("verified", set())
        target = ("exchange", exchange) if exchange else ("queue", routing_key)
        if exchange and target not in verified:
            try:
                self._query_channel().exchange_exists(exchange)
            except BrokerError as exc:
                raise PublishError(f"leveret sink: exchange '{exchange}' cannot be used: "
                                   f"{exc.code} {exc.text}") from None
            verified.add(target)
        if not exchange and self.publisher is not None and routing_key not in self._known_last:
            self._known_last[routing_key] = self._stored_id(routing_key)

    def _stored_id(self, stream: str) -> int:
        try:
            _ok, content = self._query_channel().basic_get(
                publisher_query_name(self.publisher or "", stream))
        except BrokerError as exc:
            if exc.code == 404:
                raise PublishError(f"leveret sink: stream '{stream}' cannot be used: "
                                   f"{exc.code} {exc.text}") from None
            return 0  # a classic queue, say: it ignores the publisher headers
        if content is None:
            return 0
        headers = content.property_values().get("headers") or {}
        value = headers.get("x-stream-publishing-id", 0)
        return value if isinstance(value, int) else 0

    # -- publishing -----------------------------------------------------------------------

    def publish_batch(self, batch: Any) -> None:
        """Publish one pyarrow.RecordBatch."""
        n = batch.num_rows
        if n == 0:
            return
        c = self.columns
        column = batch.column

        def values_of(index: int | None) -> list[Any] | None:
            return None if index is None else column(index).to_pylist()

        value_column = column(c.value)
        if c.value_is_string:  # the UTF-8 bytes are already there: no str round trip
            value_column = value_column.cast(_binary_type())
        values = value_column.to_pylist()
        routing_keys = values_of(c.routing_key)
        exchanges = values_of(c.exchange)
        filters = values_of(c.filter_value)
        headers = values_of(c.headers)
        properties = values_of(c.properties)
        ids = values_of(c.id_column)
        default_exchange = self.options.default_exchange
        default_key = self.options.default_routing_key
        ch_number = self.channel.number
        frame_max = self.conn.frame_max
        pub_entry = self._pub_entry
        exactly_once = self.publisher is not None
        append = self._parts.append
        extend = self._parts.extend
        counts = self.counts
        fixed_exchange = exchanges is None and default_exchange is not None
        fixed_frame = (self._method_frame(default_exchange or "", default_key)
                       if fixed_exchange and routing_keys is None else None)
        for i in range(n):
            counts.rows += 1
            body = values[i]
            if body is None:
                body = b""
            if fixed_frame is not None:
                method, exchange, routing_key = fixed_frame, default_exchange, default_key
            else:
                exchange, routing_key = self._row_target(exchanges, routing_keys, i)
                method = self._method_frame(exchange, routing_key)
            table = b""
            if exactly_once:
                pid = self._publishing_id(ids, i)
                if not exchange and self._stored_already(routing_key, pid):
                    counts.deduplicated += 1
                    continue
                table = pub_entry + long_entry(_ID_KEY, pid)
            if filters is not None and filters[i] is not None:
                table += encode_entry("x-stream-filter-value", filters[i])
            if headers is not None and headers[i]:
                table += _header_entries(headers[i])
            header = encode_values(len(body), properties[i] if properties is not None else None,
                                   table or None)
            append(method)
            extend(content_frames(ch_number, header, body, frame_max))
            counts.published += 1
            counts.bytes += len(body)
            self._in_parts += 1
            if self._in_parts >= self._slice:
                self._flush()

    def _row_target(self, exchanges: list[Any] | None, routing_keys: list[Any] | None,
                    i: int) -> tuple[str, str]:
        """Row i's exchange and routing key: its columns', or the options' defaults."""
        exchange = exchanges[i] if exchanges is not None else None
        if exchange is None:
            exchange = self.options.default_exchange
            if exchange is None:
                raise PublishError(
                    "leveret sink: a row has a null 'exchange' and neither the "
                    "'exchange' nor the 'stream' option gives a default")
        key = routing_keys[i] if routing_keys is not None else None
        return exchange, self.options.default_routing_key if key is None else key

    def _publishing_id(self, ids: list[Any] | None, i: int) -> int:
        """Row i's x-stream-publishing-id: batch id and row index, or its id_column."""
        if ids is None:
            pid = self.base_id | self._row_index
            self._row_index += 1
            if self._row_index >= ID_LIMIT:
                raise PublishError("leveret sink: more than 2^32 rows in one task")
            return pid
        pid = ids[i]
        if pid is None or pid <= self._last_id:
            raise PublishError(
                f"leveret sink: id_column '{self.options.id_column}' must increase "
                f"within each Spark partition and be >= 1; {pid!r} follows "
                f"{self._last_id}")
        self._last_id = pid
        return int(pid)

    def _stored_already(self, stream: str, pid: int) -> bool:
        """Whether the stream has stored this publisher's id `pid` (asked once per stream)."""
        last = self._known_last.get(stream)
        if last is None:
            self._check_target("", stream)
            last = self._known_last[stream]
        return pid <= last and last > 0  # 0 also means "never heard of it"

    def _flush(self) -> None:
        ch = self.channel
        if self._parts:
            data = b"".join(self._parts)
            self._parts.clear()
            ch.next_tag += self._in_parts
            self._in_parts = 0
            self.conn.send_raw(data)
            self.conn.poll()
        if ch.unconfirmed > self._window:
            ch.wait_confirms(self._window, self.options.confirm_timeout_s)
        self._check()
        if self.on_progress is not None:
            self.counts.confirmed = ch.next_tag - self._start_tag - ch.unconfirmed
            self.on_progress(self.counts)

    def _check(self) -> None:
        ch = self.channel
        ch.check()
        if ch.return_reasons:
            code, text = ch.return_reasons[0]
            returned = ch.returns[0] if ch.returns else None
            where = (f" (exchange '{returned.exchange}', routing key '{returned.routing_key}')"
                     if returned is not None else "")
            raise PublishError(f"leveret sink: the broker returned an unroutable row{where}: "
                               f"{code} {text}")
        if ch.nacked:
            raise PublishError(f"leveret sink: the broker nacked {ch.nacked} publishes")

    def finish(self) -> Counts:
        """Send what is left and wait until every publish of this task is confirmed."""
        self._flush()
        self.channel.wait_confirms(0, self.options.confirm_timeout_s)
        self._check()
        self.counts.confirmed = self.channel.next_tag - self._start_tag
        return self.counts


def _binary_type() -> Any:
    import pyarrow as pa

    return pa.binary()


def _header_entries(headers: Any) -> bytes:
    """The table entries of a row's headers (a map column: a dict, or a list of pairs)."""
    items = headers.items() if isinstance(headers, dict) else headers
    return b"".join(encode_entry(key, value) for key, value in items)
