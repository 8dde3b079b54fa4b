"""The streaming job of the exactly-once tests, and a sink that fails on purpose.

Input: JSON files of `{"id": n}` lines, read one file per micro-batch (each file split into
several Spark partitions). Every input row becomes two messages: one into a stream (default
exchange), one into a 3-partition super stream routed by `id % 3`, so one query covers both
targets, through the per-row `exchange` column. Two such queries run side by side, on the
same input: one with deduplication into `orders` and `invoices`, one without it into
`orders-plain` and `invoices-plain`.

`FaultyLeveret` is the `leveret` sink with one injected failure: in micro-batch `fault_batch`,
Spark partition `fault_partition`, first attempt only, once `fault_after` publishes are
confirmed, it either raises (a failing task, which Spark retries) or writes `fault_marker`
and hangs (so that the test can kill -9 the driver mid-batch).

Run as a script, it is the driver process of the kill test (markers go to MARKERS/dedup and
MARKERS/plain):

    python exactly_once_job.py URI INPUT CHECKPOINTS [BATCH PARTITION AFTER MARKERS]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from leveret.spark.datasource import LeveretDataSource
from leveret.spark.options import SinkOptions
from leveret.spark.sink import LeveretStreamWriter

PARTITIONS = 3
VARIANTS = {True: ("orders", "invoices"), False: ("orders-plain", "invoices-plain")}
FAULT_KEYS = ("fault_batch", "fault_partition", "fault_after", "fault_mode", "fault_marker")


class FaultyWriter(LeveretStreamWriter):
    def __init__(self, options: SinkOptions, schema: Any, fault: dict[str, str]) -> None:
        super().__init__(options, schema)
        self.fault = fault

    def _on_progress(self, counts: Any) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        fault = self.fault
        if (ctx is None or ctx.attemptNumber() != 0
                or ctx.partitionId() != int(fault["fault_partition"])
                or ctx.getLocalProperty("streaming.sql.batchId") != fault["fault_batch"]
                or counts.confirmed < int(fault["fault_after"])):
            return
        if fault.get("fault_mode", "raise") == "raise":
            raise RuntimeError(f"injected failure after {counts.confirmed} confirmed publishes")
        with open(fault["fault_marker"], "w") as marker:
            marker.write(f"{os.getpid()} {counts.confirmed}\n")
        while True:  # until the test kills the driver (and this worker)
            time.sleep(0.1)


class FaultyLeveret(LeveretDataSource):
    @classmethod
    def name(cls) -> str:
        return "leveret_faulty"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        options = {k: v for k, v in self.options.items() if k not in FAULT_KEYS}
        fault = {k: self.options[k] for k in FAULT_KEYS if k in self.options}
        return FaultyWriter(SinkOptions.parse(options), schema, fault)


def start_query(spark: Any, uri: str, input_dir: str, checkpoint: str, exactly_once: bool,
                fault: dict[str, str] | None = None) -> Any:
    """Start one variant of the job (trigger availableNow); returns the StreamingQuery."""
    stream, superstream = VARIANTS[exactly_once]
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1200")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    rows = spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(input_dir)
    messages = rows.selectExpr(
        f"explode(array("
        f"named_struct('exchange', '', 'routing_key', '{stream}', 'value', cast(id as string)),"
        f"named_struct('exchange', '{superstream}',"
        f" 'routing_key', cast(id % {PARTITIONS} as string), 'value', cast(id as string))))"
        f" as m"
    ).select("m.*")
    writer = (messages.writeStream.format("leveret_faulty" if fault else "leveret")
              .option("uri", uri)
              .option("exactly_once", str(exactly_once).lower())
              .option("max_unconfirmed", "40")
              .option("checkpointLocation", checkpoint)
              .trigger(availableNow=True))
    for key, value in (fault or {}).items():
        writer = writer.option(key, value)
    return writer.start()


def main(argv: list[str]) -> int:
    from leveret.spark import local_session

    uri, input_dir, checkpoints = argv[:3]
    spark = local_session("exactly-once-job", master="local[2,4]", conf={
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    })
    spark.dataSource.register(FaultyLeveret)
    queries = []
    for exactly_once in (True, False):
        fault = None
        name = "dedup" if exactly_once else "plain"
        if len(argv) > 3:
            batch, partition, after, markers = argv[3:7]
            fault = {"fault_batch": batch, "fault_partition": partition, "fault_after": after,
                     "fault_mode": "hang", "fault_marker": os.path.join(markers, name)}
        queries.append(start_query(spark, uri, input_dir, os.path.join(checkpoints, name),
                                   exactly_once, fault))
    for query in queries:
        query.awaitTermination()
        written = sum(p["sink"]["numOutputRows"] for p in query.recentProgress)
        print(f"query {query.id}: {written} rows written", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
