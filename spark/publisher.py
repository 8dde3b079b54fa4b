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

import struct
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leveret.spark import frames as f
from leveret.spark.channel import Channel
from leveret.spark.errors import BrokerError, ConnectionLost, PublishError
from leveret.spark.options import SinkColumns, SinkOptions
from leveret.spark.wire import Connection

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_HEADER_HEAD = struct.Struct(">BHIHHQ")
_BODY_HEAD = struct.Struct(">BHI")
_END = f.END
_ID_KEY = f.shortstr("x-stream-publishing-id") + b"l"
_FILTER_KEY = f.shortstr("x-stream-filter-value") + b"S"
_HEADERS_ONLY = struct.pack(">H", f.PROPERTY_FLAGS["headers"])
_NO_PROPERTIES = b"\x00\x00"
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
        self._parts: list[bytes] = []
        self._in_parts = 0
        self._slice = max(1, min(1000, options.max_unconfirmed // 4))
        self._window = max(0, options.max_unconfirmed - self._slice)
        self._pub_entry = (f.table_entry_str("x-stream-publisher-name", publisher)
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
                frame = f.method_frame_publish(self.channel.number, f.shortstr(exchange),
                                               f.shortstr(routing_key))
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
        headers = f.decode_properties(content.properties).get("headers") or {}
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
        body_limit = frame_max - 8
        pub_entry = self._pub_entry
        exactly_once = self.publisher is not None
        parts = self._parts
        append = parts.append
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
                method = fixed_frame
                exchange = default_exchange
                routing_key = default_key
            else:
                exchange = exchanges[i] if exchanges is not None else None
                if exchange is None:
                    exchange = default_exchange
                    if exchange is None:
                        raise PublishError(
                            "leveret sink: a row has a null 'exchange' and neither the "
                            "'exchange' nor the 'stream' option gives a default")
                routing_key = routing_keys[i] if routing_keys is not None else None
                if routing_key is None:
                    routing_key = default_key
                method = self._method_frame(exchange, routing_key)
            if exactly_once:
                if ids is None:
                    pid = self.base_id | self._row_index
                    self._row_index += 1
                    if self._row_index >= ID_LIMIT:
                        raise PublishError("leveret sink: more than 2^32 rows in one task")
                else:
                    pid = ids[i]
                    if pid is None or pid <= self._last_id:
                        raise PublishError(
                            f"leveret sink: id_column '{self.options.id_column}' must increase "
                            f"within each Spark partition and be >= 1; {pid!r} follows "
                            f"{self._last_id}")
                    self._last_id = pid
                if not exchange:
                    last = self._known_last.get(routing_key)
                    if last is None:
                        self._check_target("", routing_key)
                        last = self._known_last[routing_key]
                    if pid <= last and last > 0:  # 0 also means "never heard of it"
                        counts.deduplicated += 1
                        continue
                table = pub_entry + _ID_KEY + _I64.pack(pid)
            else:
                table = b""
            if filters is not None and filters[i] is not None:
                raw = filters[i].encode("utf-8")
                table += _FILTER_KEY + _U32.pack(len(raw)) + raw
            if headers is not None and headers[i]:
                table += _header_entries(headers[i])
            if properties is not None and properties[i] is not None:
                props = _properties(properties[i], table)
            elif table:
                props = _HEADERS_ONLY + _U32.pack(len(table)) + table
            else:
                props = _NO_PROPERTIES
            size = len(body)
            append(method)
            append(_HEADER_HEAD.pack(2, ch_number, 12 + len(props), 60, 0, size))
            append(props)
            if 0 < size <= body_limit:
                append(_END + _BODY_HEAD.pack(3, ch_number, size))
                append(body)
                append(_END)
            else:
                append(_END)
                if size:
                    parts.extend(f.content_frames(ch_number, props, body, frame_max)[3:])
            counts.published += 1
            counts.bytes += size
            self._in_parts += 1
            if self._in_parts >= self._slice:
                self._flush()

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
    items = headers.items() if isinstance(headers, dict) else headers
    out = []
    for key, value in items:
        if value is None:
            out.append(f.shortstr(key) + b"V")
        else:
            out.append(f.table_entry_str(key, value))
    return b"".join(out)


def _properties(values: dict[str, Any], table: bytes) -> bytes:
    return f.encode_properties(values, f.table([table]) if table else None)
