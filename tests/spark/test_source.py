"""The source: micro-batches over a super stream that resume from the checkpoint, and
bounded batch reads of a stream."""

from __future__ import annotations

import datetime
import time
from collections import defaultdict
from pathlib import Path

import pika
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sparkkit import declare_stream, declare_super_stream

pytestmark = pytest.mark.spark


def sink_write(spark, uri: str, first: int, count: int, exchange: str) -> None:
    df = spark.range(first, first + count, 1, 2).selectExpr(
        "cast(id as string) as value", "cast(id % 3 as string) as routing_key")
    df.write.format("leveret").option("uri", uri).option("exchange", exchange).mode(
        "append").save()


def read_query(spark, uri: str, checkpoint: Path, output: Path):  # type: ignore[no-untyped-def]
    stream = (spark.readStream.format("leveret").option("uri", uri)
              .option("superstream", "invoices").option("startingOffsets", "first")
              .option("maxMessagesPerTrigger", 400).load()
              .selectExpr("cast(value as string) as value", "offset", "partition"))
    return (stream.writeStream.format("parquet").option("path", str(output))
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def test_the_source_reads_back_what_the_sink_wrote_across_a_restart(spark, broker,
                                                                    tmp_path: Path) -> None:
    declare_super_stream(broker.port, "invoices", 3)
    sink_write(spark, broker.url, 0, 1000, "invoices")
    query = read_query(spark, broker.url, tmp_path / "ckpt", tmp_path / "out")
    assert query.awaitTermination(120)
    assert query.exception() is None
    first_run = [p["numInputRows"] for p in query.recentProgress]
    assert sum(first_run) == 1000
    assert max(first_run) <= 400  # maxMessagesPerTrigger
    sink_write(spark, broker.url, 1000, 500, "invoices")
    query = read_query(spark, broker.url, tmp_path / "ckpt", tmp_path / "out")
    assert query.awaitTermination(120)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 500
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    values = sorted(int(r.value) for r in rows)
    assert values == list(range(1500))  # each once: no gap, no duplicate
    offsets: dict[int, list[int]] = defaultdict(list)
    for r in rows:
        assert int(r.value) % 3 == r.partition
        offsets[r.partition].append(r.offset)
    for partition, seen in offsets.items():
        assert sorted(seen) == list(range(len(seen))), partition


def test_a_batch_read_takes_a_bounded_range_with_columns(spark, broker) -> None:
    declare_stream(broker.port, "events")
    stamp = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", "events", b"m%d" % i, pika.BasicProperties(
                content_type="text/plain", message_id=f"id-{i}", priority=i % 5,
                timestamp=int(stamp.timestamp()), headers={"k": i, "x-stream-filter-value":
                                                           "even" if i % 2 == 0 else "odd"}))
    df = (spark.read.format("leveret").option("uri", broker.url).option("stream", "events")
          .option("startingOffsets", "10").option("endingOffsets", "20").load())
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(10, 20))
    row = rows[0]
    assert row.value == b"m10"
    assert row.routing_key == "events"
    assert row.partition == 0 and row.stream == "events"
    assert row.headers["k"] == "10"
    assert row.properties.content_type == "text/plain"
    assert row.properties.message_id == "id-10"
    assert row.properties.priority == 0
    assert row.timestamp.timestamp() == stamp.timestamp()  # naive local time, as Spark gives
    assert row.properties.timestamp == row.timestamp
    filtered = (spark.read.format("leveret").option("uri", broker.url).option("stream", "events")
                .option("filter", "odd").load())
    assert sorted(r.offset for r in filtered.select("offset").collect()) == list(range(1, 30, 2))
    evens = (spark.read.format("leveret").option("uri", broker.url).option("stream", "events")
             .option("startingOffsets", "11").option("endingOffsets", "20")
             .option("filter", "even").load())  # the range's last message (19) is odd
    assert sorted(r.offset for r in evens.select("offset").collect()) == [12, 14, 16, 18]
    last = (spark.read.format("leveret").option("uri", broker.url).option("stream", "events")
            .option("startingOffsets", "25").load())
    assert last.count() == 5


def test_starting_offsets_next_and_a_timestamp(spark, broker, tmp_path: Path) -> None:
    declare_stream(broker.port, "ticks")
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "ticks", b"old-%d" % i)
        time.sleep(1.2)
        middle = datetime.datetime.now(tz=datetime.UTC).isoformat()
        for i in range(3):
            ch.basic_publish("", "ticks", b"new-%d" % i)
    since = (spark.read.format("leveret").option("uri", broker.url).option("stream", "ticks")
             .option("startingOffsets", middle).load())
    assert sorted(r.value for r in since.collect()) == [b"new-0", b"new-1", b"new-2"]
    query = (spark.readStream.format("leveret").option("uri", broker.url)
             .option("stream", "ticks").option("startingOffsets", "next").load()
             .writeStream.format("memory").queryName("ticks_next")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(60)
    assert spark.sql("select count(*) as n from ticks_next").collect()[0].n == 0


def test_a_super_stream_with_binding_keys_is_read_from_every_partition(spark, broker) -> None:
    """Partitions named by their binding keys (`add_super_stream --binding-keys`), not
    `<name>-0, -1, ...`: the source asks the broker for them and reads them all, in partition
    order."""
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.exchange_declare("regions", "direct", durable=True,
                            arguments={"x-super-stream": True})
        for order, key in enumerate(("emea", "amer", "apac")):
            ch.queue_declare(f"regions-{key}", durable=True,
                             arguments={"x-queue-type": "stream"})
            ch.queue_bind(f"regions-{key}", "regions", key,
                          arguments={"x-stream-partition-order": order})
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("regions", ("emea", "amer", "apac")[i % 3], b"%d" % i)
    rows = (spark.read.format("leveret").option("uri", broker.url)
            .option("superstream", "regions").load()).collect()
    assert sorted(int(r.value) for r in rows) == list(range(30))
    by_stream = {r.stream: r.partition for r in rows}
    assert by_stream == {"regions-emea": 0, "regions-amer": 1, "regions-apac": 2}


@pytest.mark.parametrize("broker_filters", [True, False])
def test_a_filtered_range_is_read_whole_by_the_broker_or_by_the_task(
    broker, broker_filters: bool
) -> None:
    """`filter`: Leveret filters on the broker (x-stream-filter, and x-leveret-end-offset to
    end the range), so the task receives only the wanted messages; a broker without the
    stream_end_offset capability (RabbitMQ) is read whole and filtered by the task. Both give
    the same rows, the range's unwanted last messages included."""
    from leveret.spark import connections
    from leveret.spark.options import SourceOptions
    from leveret.spark.source import StreamRange, read_stream_range

    declare_stream(broker.port, "colours")
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(300):
            colour = "red" if i % 10 == 0 else "blue"
            ch.basic_publish("", "colours", b"%d" % i,
                             pika.BasicProperties(headers={"x-stream-filter-value": colour}))
    options = SourceOptions.parse({"uri": broker.url, "stream": "colours", "filter": "red"},
                                  batch=True)
    conn = connections.checkout(broker.url)
    conn.server_capabilities["stream_end_offset"] = broker_filters
    stream = broker.server.broker.vhosts["/"].queues["colours"]
    delivered = stream.stats_delivered
    try:
        batches = list(read_stream_range(options, StreamRange("colours", 0, 5, 295)))
    finally:
        connections.discard(broker.url)
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(10, 291, 10))
    sent = stream.stats_delivered - delivered
    if broker_filters:  # the 29 wanted, and the one that tells failOnDataLoss the first offset
        assert sent == 30
    else:  # the whole range (and perhaps a few past it before the task cancels)
        assert sent >= 290


def test_a_batch_read_of_messages_published_over_the_stream_protocol(spark,
                                                                      tmp_path: Path) -> None:
    """Stream-protocol publishes are stored as STREAM_ENTRIES chunks (docs/FORMAT.md 3.2): the
    source reads them as RabbitMQ 3.13 delivers them over AMQP 0.9.1."""
    import struct

    from rstream import AMQPMessage
    from streamproto.raw import RawStream
    from streamproto.test_raw_protocol import confirms, create_and_declare
    from support.brokers import InProcessBroker
    from support.ports import free_port

    port = free_port()
    broker = InProcessBroker(tmp_path / "data", stream_port=port).start()
    try:
        client = RawStream(port)
        client.handshake()
        create_and_declare(client, "sp")
        messages = [bytes(AMQPMessage(body=b"s%d" % i, application_properties={"k": i}))
                    for i in range(10)]
        client.send(0x02, 1, struct.pack(">Bi", 1, 10) + b"".join(
            struct.pack(">QI", i + 1, len(m)) + m for i, m in enumerate(messages)))
        got: list[int] = []
        while len(got) < 10:
            got += confirms(client)
        client.close()
        rows = (spark.read.format("leveret").option("uri", broker.url).option("stream", "sp")
                .load().orderBy("offset").collect())
        assert [(r.offset, r.value, r.routing_key, r.headers["k"]) for r in rows] == [
            (i, b"s%d" % i, "sp", str(i)) for i in range(10)]
    finally:
        broker.stop()
