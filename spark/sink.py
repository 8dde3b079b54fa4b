"""The sink: Spark's writers for `df.writeStream.format("leveret")` and `df.write`.

`LeveretStreamWriter` (a DataSourceStreamArrowWriter) is the streaming write path: each task
gets Arrow record batches and publishes them through a `PartitionPublisher`, as publisher
`<publisher_name><query id>-<partition id>`, with the micro-batch id read from the task's
local property `streaming.sql.batchId` (as PySpark's own foreach sink reads it) and the
query id from `sql.streaming.queryId`; both survive a restart from the checkpoint, so a
replayed micro-batch re-sends the same publishing ids. `LeveretBatchWriter` (a
DataSourceArrowWriter, which is a DataSourceWriter) does the same for a batch write, with a
job id drawn when Spark plans the write: task retries are deduplicated, a second run of the
same job is a new publisher.

The writer objects hold only options and column positions, so they pickle; connections live
in `connections` in each worker process. `commit` runs on the driver and logs the batch's
counts (logger `leveret.spark`).

Runs in Spark's Python workers (write) and in the driver's Python worker (commit, abort).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from leveret.spark import connections
from leveret.spark.errors import LeveretSparkError, PublishError
from leveret.spark.options import SinkColumns, SinkOptions
from leveret.spark.publisher import Counts, PartitionPublisher

log = logging.getLogger("leveret.spark")


def _ensure_log_handler() -> None:
    """Make the batch summaries visible: Spark's Python workers have no logging setup."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(os.environ.get("LEVERET_SPARK_LOG_LEVEL", "INFO"))


@dataclass
class LeveretCommitMessage(WriterCommitMessage):
    """One task's counts, sent back to the driver with the task's result."""

    partition: int
    attempt: int
    publisher: str | None
    rows: int
    published: int
    confirmed: int
    deduplicated: int
    bytes: int
    seconds: float


def summarize(messages: list[Any]) -> dict[str, int]:
    total = {"tasks": 0, "rows": 0, "published": 0, "confirmed": 0, "deduplicated": 0,
             "bytes": 0}
    for message in messages:
        if isinstance(message, LeveretCommitMessage):
            total["tasks"] += 1
            for key in ("rows", "published", "confirmed", "deduplicated", "bytes"):
                total[key] += getattr(message, key)
    return total


def _task_context() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise LeveretSparkError("leveret sink: write() must run inside a Spark task")
    return context


class _Writing:
    """What both writers share: options, the column plan, and one task's publishing."""

    options: SinkOptions
    columns: SinkColumns

    def _prepare(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.columns = SinkColumns.of(schema, options)

    def _publish(self, batches: Iterator[Any], publisher: str | None,
                 batch_id: int) -> LeveretCommitMessage:
        import time

        context = _task_context()
        started = time.perf_counter()
        uri = self.options.uri
        try:
            conn = connections.checkout(uri)
            pub = PartitionPublisher(conn, self.options, self.columns, publisher, batch_id,
                                     on_progress=self._on_progress)
            for batch in batches:
                pub.publish_batch(batch)
            counts = pub.finish()
        except BaseException:
            connections.discard(uri)
            raise
        return LeveretCommitMessage(
            partition=context.partitionId(),
            attempt=context.attemptNumber(),
            publisher=publisher,
            seconds=time.perf_counter() - started,
            **vars(counts),
        )

    def _on_progress(self, counts: Counts) -> None:
        """Called after each slice of publishes is sent and the window allows more; a hook
        for tests that fail a task part-way through. Does nothing here."""


class LeveretStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """The streaming sink: one publisher per query and Spark partition."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._prepare(options, schema)

    def write(self, iterator: Iterator[Any]) -> LeveretCommitMessage:
        context = _task_context()
        raw_batch = context.getLocalProperty("streaming.sql.batchId")
        query_id = context.getLocalProperty("sql.streaming.queryId")
        if raw_batch is None or query_id is None:
            raise PublishError("leveret sink: the task has no streaming.sql.batchId or "
                               "sql.streaming.queryId local property (is this a micro-batch "
                               "query? continuous processing is not supported)")
        publisher = f"{self.options.publisher_name}{query_id}-{context.partitionId()}"
        return self._publish(iterator, publisher, int(raw_batch))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _ensure_log_handler()
        total = summarize(list(messages))
        log.info("leveret sink: batch %d committed: %d tasks, %d rows, %d published, "
                 "%d confirmed, %d deduplicated, %d bytes", batchId, total["tasks"],
                 total["rows"], total["published"], total["confirmed"], total["deduplicated"],
                 total["bytes"])

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _ensure_log_handler()
        total = summarize(list(messages))
        log.warning("leveret sink: batch %d aborted after %d of %d tasks succeeded; their "
                    "publishes stay in the streams and a replay is deduplicated", batchId,
                    total["tasks"], len(messages))


class LeveretBatchWriter(_Writing, DataSourceArrowWriter):
    """`df.write.format("leveret")`: one publisher per job and Spark partition."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._prepare(options, schema)
        self.job_id = "batch-" + uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> LeveretCommitMessage:
        context = _task_context()
        publisher = f"{self.options.publisher_name}{self.job_id}-{context.partitionId()}"
        return self._publish(iterator, publisher, 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _ensure_log_handler()
        total = summarize(list(messages))
        log.info("leveret sink: write %s committed: %d tasks, %d rows, %d published, "
                 "%d confirmed, %d deduplicated, %d bytes", self.job_id, total["tasks"],
                 total["rows"], total["published"], total["confirmed"], total["deduplicated"],
                 total["bytes"])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _ensure_log_handler()
        log.warning("leveret sink: write %s aborted", self.job_id)
