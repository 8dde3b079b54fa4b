"""The source: `spark.readStream.format("leveret")` and `spark.read.format("leveret")`.

Offsets are stream offsets. A micro-batch's offset is a JSON object mapping each partition
stream's name to the next offset to read (`{"invoices-0": 120, "invoices-1": 98}`), and Spark
keeps it in the query's checkpoint, so a restarted query reads on from exactly where the last
committed batch ended: no gap, no duplicate. Each input partition reads one stream from a
start offset up to (not including) an end offset with a consumer that attaches at the start
offset (basic.qos prefetch, manual acks); it checks that the offsets it gets are contiguous
and fails (unless failOnDataLoss=false) when retention removed messages it was meant to
read. `filter` keeps the messages whose `x-stream-filter-value` is one of the given values.
Leveret filters them itself (x-stream-filter) and, told the range's end
(x-leveret-end-offset), cancels the consumer once it has passed it, so a range whose last
messages are filtered out still ends; the reading task then trusts the broker's gaps, and
checks the start against the stream's first offset instead. A broker without the
`stream_end_offset` capability (RabbitMQ) sends everything and the task filters.

`LeveretStreamReader` runs in the driver's long-lived reader process (one connection kept for
the query); `read` runs in executors' Python workers and returns Arrow record batches.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from leveret.spark import connections
from leveret.spark.channel import Delivery
from leveret.spark.errors import LeveretSparkError
from leveret.spark.options import SourceOptions
from leveret.spark.streams import ATTACH_WAIT_S, Probe

ARROW_BATCH_ROWS = 8192
PROPERTY_FIELDS = ("content_type", "content_encoding", "delivery_mode", "priority",
                   "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                   "type", "user_id", "app_id")


class StreamRange(InputPartition):
    """Read `stream` from offset `start` up to, not including, `end`."""

    def __init__(self, stream: str, index: int, start: int, end: int) -> None:
        super().__init__(None)
        self.stream = stream
        self.index = index
        self.start = start
        self.end = end


class _Reading:
    """Planning shared by the streaming and the batch reader."""

    options: SourceOptions
    _probe: Probe | None = None
    _names: list[str] | None = None

    def probe(self) -> Probe:
        conn = connections.checkout(self.options.uri)
        if self._probe is None or self._probe.conn is not conn:
            self._probe = Probe(conn)
        return self._probe

    def names(self) -> list[str]:
        if self._names is None:
            self._names = self.probe().partitions(self.options.stream, self.options.superstream)
        return self._names

    def ranges(self, start: dict[str, int], end: dict[str, int]) -> list[StreamRange]:
        out = []
        for index, name in enumerate(self.names()):
            lo, hi = start.get(name, 0), end.get(name, 0)
            if hi > lo:
                out.append(StreamRange(name, index, lo, hi))
        return out

    def read_range(self, partition: StreamRange) -> Iterator[Any]:
        yield from read_stream_range(self.options, partition)


class LeveretStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a stream or every partition of a super stream."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._target: dict[str, int] | None = None
        self._last_tails: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        probe = self.probe()
        return {name: probe.resolve(name, self.options.starting) for name in self.names()}

    def _tails(self) -> dict[str, int]:
        probe = self.probe()
        self._last_tails = {name: probe.first_and_next(name)[1] for name in self.names()}
        return self._last_tails

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._tails()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, int]:
        tails = self._target if self._target is not None else self._tails()
        if start is None:
            return tails
        # a partition added since the query started begins at its first offset (0)
        begin = {name: int(start.get(name, 0)) for name in self.names()}
        end = {name: max(begin[name], tails.get(name, 0)) for name in self.names()}
        if isinstance(limit, ReadMaxRows):
            end = cap(begin, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        """What the last latestOffset saw (for the query's progress), without asking again."""
        return self._last_tails if self._last_tails is not None else self._tails()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[StreamRange]:
        return self.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return self.read_range(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in the broker."""

    def stop(self) -> None:
        connections.close_all()


class LeveretBatchReader(_Reading, DataSourceReader):
    """`spark.read`: a bounded range, startingOffsets (default first) to endingOffsets
    (default next, i.e. what is committed when the query is planned)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[StreamRange]:
        probe = self.probe()
        start = {name: probe.resolve(name, self.options.starting) for name in self.names()}
        end = {name: probe.resolve(name, self.options.ending) for name in self.names()}
        return self.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return self.read_range(partition)


def cap(begin: dict[str, int], end: dict[str, int], max_rows: int) -> dict[str, int]:
    """Spread `max_rows` over the partitions in proportion to what each has to read."""
    available = {name: end[name] - begin[name] for name in begin}
    total = sum(available.values())
    if total <= max_rows:
        return end
    take = {name: available[name] * max_rows // total for name in begin}
    left = max_rows - sum(take.values())
    for name in sorted(begin, key=lambda n: available[n] - take[n], reverse=True):
        if left <= 0:
            break
        if take[name] < available[name]:
            take[name] += 1
            left -= 1
    return {name: begin[name] + take[name] for name in begin}


# -- reading one range (in an executor) ----------------------------------------------------


def read_stream_range(options: SourceOptions, part: StreamRange) -> Iterator[Any]:
    """Arrow record batches of the messages of one stream range, in offset order."""
    uri = options.uri
    conn = connections.checkout(uri)
    try:
        yield from _consume(conn, options, part)
    except GeneratorExit:  # Spark stopped early (a limit): the channel is closed already
        raise
    except BaseException:
        connections.discard(uri)
        raise


def _consume(conn: Any, options: SourceOptions, part: StreamRange) -> Iterator[Any]:
    import pyarrow as pa

    schema = arrow_schema()
    wanted = frozenset(options.filter_values) if options.filter_values else None
    prefetch = max(1, min(options.prefetch, part.end - part.start))
    ack_every = max(1, prefetch // 2)
    arguments: dict[str, Any] = {"x-stream-offset": part.start}
    by_broker = wanted is not None and conn.server_capabilities.get("stream_end_offset") is True
    if by_broker:
        _check_start(conn, options, part)
        arguments.update({"x-stream-filter": list(options.filter_values),
                          "x-leveret-end-offset": part.end})
    ch = conn.channel()
    ch.qos(prefetch)
    ch.consume(part.stream, arguments)
    expected = part.start
    unacked = 0
    rows = _Columns()
    try:
        while expected < part.end:
            if not ch.deliveries:
                ch.check()
                if ch.cancelled and by_broker:
                    break  # past the end of the range: the broker filtered it all
                if ch.cancelled:
                    raise LeveretSparkError(f"leveret source: the broker cancelled the consumer "
                                            f"of stream '{part.stream}' (was it deleted?)")
                conn.pump(30.0)
                continue
            delivery = ch.deliveries.popleft()
            props = delivery.property_values()
            headers = props.get("headers") or {}
            offset = headers.get("x-stream-offset")
            unacked += 1
            if unacked >= ack_every:
                ch.ack(delivery.delivery_tag, True)
                unacked = 0
            if not isinstance(offset, int) or offset < expected:
                continue
            if offset >= part.end:
                break
            if offset > expected and options.fail_on_data_loss and not by_broker:
                raise LeveretSparkError(
                    f"leveret source: stream '{part.stream}' has no offsets {expected}.."
                    f"{offset - 1} any more (removed by retention?); set failOnDataLoss=false "
                    "to read on")
            expected = offset + 1
            if wanted is not None and headers.get("x-stream-filter-value") not in wanted:
                continue
            rows.add(delivery, props, headers, offset, part)
            if rows.count >= ARROW_BATCH_ROWS:
                yield rows.to_arrow(pa, schema)
                rows = _Columns()
    finally:
        if ch.error is None and conn.closed is None:
            ch.close()
        else:
            conn.forget(ch)
    if rows.count:
        yield rows.to_arrow(pa, schema)


def _check_start(conn: Any, options: SourceOptions, part: StreamRange) -> None:
    """With the broker filtering, a gap is no sign of loss; retention is seen instead in the
    stream's first offset having moved past the range's start."""
    if not options.fail_on_data_loss or part.start == 0:
        return
    first = Probe(conn).attach_offset(part.stream, "first", ATTACH_WAIT_S)
    if first is not None and first > part.start:
        raise LeveretSparkError(
            f"leveret source: stream '{part.stream}' has no offsets {part.start}.."
            f"{min(first, part.end) - 1} any more (removed by retention?); set "
            "failOnDataLoss=false to read on")


def arrow_schema() -> Any:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    props = pa.struct([
        (name, ts if name == "timestamp" else
         pa.int32() if name in ("delivery_mode", "priority") else pa.string())
        for name in PROPERTY_FIELDS
    ])
    return pa.schema([
        ("value", pa.binary()),
        ("routing_key", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("properties", props),
        ("offset", pa.int64()),
        ("timestamp", ts),
        ("partition", pa.int32()),
        ("stream", pa.string()),
    ])


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value)


class _Columns:
    """Rows gathered column by column, then handed to Arrow in one go."""

    def __init__(self) -> None:
        self.count = 0
        self.value: list[bytes] = []
        self.routing_key: list[str] = []
        self.headers: list[list[tuple[str, str | None]]] = []
        self.properties: list[dict[str, Any]] = []
        self.offset: list[int] = []
        self.timestamp: list[datetime.datetime | None] = []
        self.partition: list[int] = []
        self.stream: list[str] = []

    def add(self, delivery: Delivery, props: dict[str, Any], headers: dict[str, Any],
            offset: int, part: StreamRange) -> None:
        self.count += 1
        self.value.append(delivery.body)
        self.routing_key.append(delivery.routing_key)
        self.headers.append([(k, _text(v)) for k, v in headers.items()])
        ts = props.get("timestamp")
        when = (datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
                if isinstance(ts, int) else None)
        if props:
            record = {name: props.get(name) for name in PROPERTY_FIELDS}
            record["timestamp"] = when
            self.properties.append(record)
        else:
            self.properties.append({})
        self.offset.append(offset)
        self.timestamp.append(when)
        self.partition.append(part.index)
        self.stream.append(part.stream)

    def to_arrow(self, pa: Any, schema: Any) -> Any:
        return pa.RecordBatch.from_arrays([
            pa.array(self.value, pa.binary()),
            pa.array(self.routing_key, pa.string()),
            pa.array(self.headers, schema.field("headers").type),
            pa.array(self.properties, schema.field("properties").type),
            pa.array(self.offset, pa.int64()),
            pa.array(self.timestamp, schema.field("timestamp").type),
            pa.array(self.partition, pa.int32()),
            pa.array(self.stream, pa.string()),
        ], schema=schema)
