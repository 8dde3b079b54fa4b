"""Invoices into a Leveret super stream with Spark, and back out into a count by partition.

    pip install -e '.[spark]'                 # pyspark and pyarrow; Java 17+ must be installed
    leveret serve &                           # a broker on localhost:5672
    python examples/invoices_pipeline.py      # or --source rate --seconds 20

1. Sets up the super stream `invoices` (3 partitions) over AMQP, unless it exists.
2. Writes a few JSON files of invoices into ./leveret-example/input (files source), or uses
   Spark's rate source (--source rate).
3. A streaming query reads them, computes the total with tax and a partition key from the
   customer id (pmod(hash(customer), 3): explicit partition keys, which any super stream
   routes), and writes them into `invoices` with the `leveret` sink (exactly once).
4. A second streaming query reads every partition of `invoices` with the `leveret` source from
   the first offset and counts the invoices of each partition.

Checkpoints live in ./leveret-example/checkpoints: run it again and both queries go on from
where they stopped: a second run writes nothing and counts the same, unless `--more` adds
new input files first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from leveret.spark import local_session
from leveret.spark.admin import declare_super_stream

SUPER_STREAM = "invoices"
PARTITIONS = 3


def write_input(directory: Path, files: int, rows: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    start = len(list(directory.glob("*.json"))) * rows
    rng = random.Random(start)
    for n in range(files):
        lines = []
        for i in range(start + n * rows, start + (n + 1) * rows):
            lines.append(json.dumps({"invoice": i, "customer": f"c{rng.randrange(500)}",
                                     "amount": round(rng.uniform(5, 500), 2)}))
        path = directory / f"invoices-{start // rows + n:05d}.json"
        path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default=os.environ.get("LEVERET_URI",
                                                        "amqp://guest:guest@localhost:5672/"))
    parser.add_argument("--dir", default="leveret-example", type=Path)
    parser.add_argument("--source", choices=["files", "rate"], default="files")
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2000, help="invoices per file")
    parser.add_argument("--seconds", type=int, default=15, help="how long the rate source runs")
    parser.add_argument("--more", action="store_true", help="add --files new input files")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    declare_super_stream(args.uri, SUPER_STREAM, PARTITIONS, wait_s=60)
    spark = local_session("leveret-invoices", master=args.master,
                          conf={"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("WARN")

    if args.source == "files":
        if args.more or not list((args.dir / "input").glob("*.json")):
            write_input(args.dir / "input", args.files, args.rows)
        invoices = (spark.readStream.schema("invoice LONG, customer STRING, amount DOUBLE")
                    .option("maxFilesPerTrigger", 1).json(str(args.dir / "input")))
    else:
        invoices = (spark.readStream.format("rate").option("rowsPerSecond", 2000).load()
                    .selectExpr("value as invoice", "concat('c', value % 500) as customer",
                                "round(rand(42) * 495 + 5, 2) as amount"))

    # the transformation: tax, a JSON body, a header, and the partition key
    messages = invoices.selectExpr(
        "to_json(named_struct('invoice', invoice, 'customer', customer,"
        " 'total', round(amount * 1.2, 2))) as value",
        f"cast(pmod(hash(customer), {PARTITIONS}) as string) as routing_key",
        "map('customer', customer) as headers",
        "named_struct('content_type', 'application/json',"
        " 'message_id', cast(invoice as string)) as properties",
    )
    sink = (messages.writeStream.format("leveret")
            .option("uri", args.uri)
            .option("exchange", SUPER_STREAM)
            .option("checkpointLocation", str(args.dir / "checkpoints" / "sink")))
    if args.source == "files":
        writing = sink.trigger(availableNow=True).start()
        writing.awaitTermination()
    else:
        writing = sink.trigger(processingTime="2 seconds").start()
        time.sleep(args.seconds)
        writing.stop()
    batches = [p for p in writing.recentProgress if p["numInputRows"] > 0]
    written = sum(p["sink"]["numOutputRows"] for p in batches)
    print(f"sink: {written} invoices written into '{SUPER_STREAM}' in {len(batches)} "
          "micro-batches")

    counts = (spark.readStream.format("leveret")
              .option("uri", args.uri)
              .option("superstream", SUPER_STREAM)
              .option("startingOffsets", "first")
              .option("maxMessagesPerTrigger", 5000)
              .load()
              .groupBy("partition").count())
    reading = (counts.writeStream.format("memory").queryName("invoice_counts")
               .outputMode("complete")
               .option("checkpointLocation", str(args.dir / "checkpoints" / "counts"))
               .trigger(availableNow=True).start())
    reading.awaitTermination()
    read = sum(p["numInputRows"] for p in reading.recentProgress)
    print(f"source: {read} new invoices read")
    if read:
        spark.sql("select partition, count from invoice_counts order by partition").show()
    else:  # nothing new since the last run: count the whole super stream with a batch read
        (spark.read.format("leveret").option("uri", args.uri)
         .option("superstream", SUPER_STREAM).load()
         .groupBy("partition").count().orderBy("partition").show())
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
