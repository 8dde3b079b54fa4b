"""The sink's contract: columns to AMQP, per-row exchanges, ids, connections, progress."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sparkkit import (
    declare_stream,
    declare_super_stream,
    read_stream,
    write_input_files,
)

pytestmark = pytest.mark.spark


def test_columns_become_amqp_messages(spark, broker) -> None:
    declare_stream(broker.port, "shaped")
    df = spark.sql("""
        select 'hello' as value,
               map('tenant', 'acme', 'kind', 'invoice') as headers,
               named_struct('content_type', 'text/plain', 'message_id', 'm-1',
                            'priority', 7, 'correlation_id', 'c-9',
                            'timestamp', timestamp'2024-05-01 12:00:00') as properties,
               'eu' as filter_value,
               1 as ignored
    """)
    df.write.format("leveret").option("uri", broker.url).option("stream", "shaped").mode(
        "append").save()
    [(_offset, body, headers, props)] = read_stream(broker.port, "shaped")
    assert body == b"hello"
    assert headers["tenant"] == b"acme" or headers["tenant"] == "acme"
    assert headers["x-stream-filter-value"] in ("eu", b"eu")
    assert headers["x-stream-publishing-id"] == 0  # batch id 0, row 0
    assert headers["x-stream-publisher-name"].startswith("spark-batch-")
    assert props.content_type == "text/plain"
    assert props.message_id == "m-1"
    assert props.priority == 7
    assert props.correlation_id == "c-9"
    assert props.delivery_mode is None  # only what the row gives
    assert props.timestamp == int(spark.sql(
        "select unix_timestamp(timestamp'2024-05-01 12:00:00') as t").collect()[0].t)


def test_a_streaming_query_reports_rows_reuses_connections_and_routes_per_row(
        spark, broker, tmp_path: Path) -> None:
    declare_stream(broker.port, "audit")
    declare_super_stream(broker.port, "sales", 3)
    opened: list[object] = []
    original = broker.broker.connection_opened

    def counting(session: object) -> None:
        opened.append(session)
        original(session)

    broker.broker.connection_opened = counting
    ids = write_input_files(tmp_path / "in", 3, 200)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1200")  # 2 or 3 tasks per batch
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    source = spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(
        str(tmp_path / "in"))
    rows = source.selectExpr(
        "cast(id as string) as value",
        "case when id % 10 = 0 then '' else null end as exchange",  # every 10th: to 'audit'
        "case when id % 10 = 0 then 'audit' else cast(id % 3 as string) end as routing_key")
    query = (rows.writeStream.format("leveret").option("uri", broker.url)
             .option("exchange", "sales")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert query.exception() is None
    progress = query.recentProgress
    assert len(progress) == 3
    assert sum(p["sink"]["numOutputRows"] for p in progress) == len(ids)
    assert query.lastProgress["sink"]["numOutputRows"] == 200
    # 6 or more write tasks, run by at most two Python workers at a time (local[2])
    assert len(opened) <= 4, f"{len(opened)} connections opened"
    audit = sorted(int(b) for _o, b, _h, _p in read_stream(broker.port, "audit"))
    assert audit == [i for i in ids if i % 10 == 0]
    for p in range(3):
        got = sorted(int(b) for _o, b, _h, _p in read_stream(broker.port, f"sales-{p}"))
        assert got == [i for i in ids if i % 10 != 0 and i % 3 == p]


def test_id_column_gives_the_publishing_ids(spark, broker) -> None:
    declare_stream(broker.port, "keyed")
    df = spark.range(1, 11, 1, 1).selectExpr("cast(id as string) as value", "id * 100 as seq")
    (df.write.format("leveret").option("uri", broker.url).option("stream", "keyed")
     .option("id_column", "seq").mode("append").save())
    got = read_stream(broker.port, "keyed")
    assert [h["x-stream-publishing-id"] for _o, _b, h, _p in got] == list(range(100, 1100, 100))
    descending = spark.range(1, 11, 1, 1).selectExpr("cast(id as string) as value",
                                                     "100 - id as seq")
    with pytest.raises(Exception, match="id_column 'seq' must increase"):
        (descending.write.format("leveret").option("uri", broker.url)
         .option("stream", "keyed").option("id_column", "seq").mode("append").save())


def test_at_least_once_mode_sends_no_publisher_headers(spark, broker) -> None:
    declare_stream(broker.port, "plain")
    spark.range(0, 5, 1, 1).selectExpr("cast(cast(id as string) as binary) as value").write.format(
        "leveret").option("uri", broker.url).option("stream", "plain").option(
        "exactly_once", "false").mode("append").save()
    got = read_stream(broker.port, "plain")
    assert len(got) == 5
    assert all("x-stream-publisher-name" not in h for _o, _b, h, _p in got)


def test_big_values_span_several_body_frames(spark, broker) -> None:
    declare_stream(broker.port, "big")
    size = 300_000  # above frame_max (131072): three body frames
    spark.range(0, 3, 1, 1).selectExpr(f"repeat(cast(id as string), {size}) as value").write \
        .format("leveret").option("uri", broker.url).option("stream", "big").mode(
        "append").save()
    got = read_stream(broker.port, "big")
    assert [len(b) for _o, b, _h, _p in got] == [size] * 3
    assert got[2][1] == b"2" * size
