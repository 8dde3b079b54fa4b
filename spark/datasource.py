"""`LeveretDataSource`: the PySpark Python Data Source registered under the name `leveret`.

It only parses options and hands out the sink's writers and the source's readers; the work
is in `sink.py`, `publisher.py` and `source.py`. Spark pickles the instance to the workers
that build writers and readers, so it holds nothing but its options.

Runs in the driver and in Spark's Python workers; no I/O.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from leveret.spark.errors import OptionError
from leveret.spark.options import SinkOptions, SourceOptions

SOURCE_SCHEMA = (
    "value BINARY, routing_key STRING, headers MAP<STRING, STRING>, "
    "properties STRUCT<content_type: STRING, content_encoding: STRING, delivery_mode: INT, "
    "priority: INT, correlation_id: STRING, reply_to: STRING, expiration: STRING, "
    "message_id: STRING, timestamp: TIMESTAMP, type: STRING, user_id: STRING, app_id: STRING>, "
    "offset BIGINT, timestamp TIMESTAMP, partition INT, stream STRING"
)


class LeveretDataSource(DataSource):
    """Streams and super streams of a Leveret (or RabbitMQ) broker, over AMQP 0.9.1."""

    @classmethod
    def name(cls) -> str:
        return "leveret"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from leveret.spark.sink import LeveretBatchWriter

        if overwrite:
            raise OptionError("mode", "a stream is append-only: use mode('append')")
        return LeveretBatchWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from leveret.spark.sink import LeveretStreamWriter

        return LeveretStreamWriter(SinkOptions.parse(self.options), schema)

    def reader(self, schema: StructType) -> Any:
        from leveret.spark.source import LeveretBatchReader

        return LeveretBatchReader(SourceOptions.parse(self.options, batch=True), schema)

    def streamReader(self, schema: StructType) -> Any:
        from leveret.spark.source import LeveretStreamReader

        return LeveretStreamReader(SourceOptions.parse(self.options), schema)
