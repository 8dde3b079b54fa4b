"""Errors a user meets: each fails the query with one clear message naming the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from sparkkit import declare_stream, write_input_files
from support.ports import free_port

pytestmark = pytest.mark.spark


def run_stream(spark, tmp_path: Path, select: list[str], **options: str) -> BaseException | None:
    """A one-batch streaming write with these options; the query's exception, if any."""
    if not (tmp_path / "in").exists():
        write_input_files(tmp_path / "in", 1, 10)
    rows = spark.readStream.schema("id LONG").json(str(tmp_path / "in")).selectExpr(*select)
    writer = rows.writeStream.format("leveret").option(
        "checkpointLocation", str(tmp_path / f"ckpt-{len(list(tmp_path.iterdir()))}"))
    for key, value in options.items():
        writer = writer.option(key, value)
    try:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(120)
    except Exception as exc:  # noqa: BLE001 - what the user would see
        return exc
    return query.exception()


VALUE = ["cast(id as string) as value"]


def test_an_unreachable_broker(spark, tmp_path: Path) -> None:
    port = free_port()
    error = run_stream(spark, tmp_path, VALUE, uri=f"amqp://guest:guest@127.0.0.1:{port}/",
                       stream="s")
    assert error is not None
    assert f"cannot connect to amqp://guest@127.0.0.1:{port}/%2F" in str(error)


def test_bad_credentials(spark, broker, tmp_path: Path) -> None:
    declare_stream(broker.port, "s")
    error = run_stream(spark, tmp_path, VALUE,
                       uri=f"amqp://guest:wrong@127.0.0.1:{broker.port}/", stream="s")
    assert error is not None
    assert "refused the login of user 'guest'" in str(error)
    assert "ACCESS_REFUSED" in str(error)


def test_a_missing_exchange(spark, broker, tmp_path: Path) -> None:
    error = run_stream(spark, tmp_path, VALUE, uri=broker.url, exchange="nope")
    assert error is not None
    assert "exchange 'nope' cannot be used: 404 NOT_FOUND" in str(error)


def test_a_missing_stream(spark, broker, tmp_path: Path) -> None:
    error = run_stream(spark, tmp_path, VALUE, uri=broker.url, stream="nowhere")
    assert error is not None
    assert "stream 'nowhere' cannot be used: 404" in str(error)


def test_an_unroutable_row(spark, broker, tmp_path: Path) -> None:
    with __import__("pika").BlockingConnection(
            __import__("pika").ConnectionParameters("127.0.0.1", broker.port)) as conn:
        conn.channel().exchange_declare("direct-x", "direct")
    error = run_stream(spark, tmp_path, [*VALUE, "'nobody' as routing_key"], uri=broker.url,
                       exchange="direct-x")
    assert error is not None
    assert "returned an unroutable row (exchange 'direct-x', routing key 'nobody')" in str(error)


def test_a_missing_value_column(spark, broker, tmp_path: Path) -> None:
    error = run_stream(spark, tmp_path, ["cast(id as string) as body"], uri=broker.url,
                       stream="s")
    assert error is not None
    assert "leveret: option 'value': the sink needs a 'value' column" in str(error)


@pytest.mark.parametrize(("options", "message"), [
    ({"stream": "s"}, "option 'uri': required"),
    ({"uri": "http://x/", "stream": "s"}, "option 'uri': the scheme must be amqp://"),
    ({"uri": "amqp://h/", "stream": "s", "max_unconfirmed": "lots"},
     "option 'max_unconfirmed': must be a positive integer"),
    ({"uri": "amqp://h/", "stream": "s", "exchange": "x"}, "option 'stream': give either"),
    ({"uri": "amqp://h/", "stream": "s", "max_unconfirmd": "5"},
     "option 'max_unconfirmd': unknown sink option"),
    ({"uri": "amqp://h/"}, "option 'exchange': give the 'exchange' option"),
])
def test_bad_options(spark, tmp_path: Path, options: dict[str, str], message: str) -> None:
    error = run_stream(spark, tmp_path, VALUE, **options)
    assert error is not None
    assert message in str(error)


def test_source_errors_name_the_stream(spark, broker) -> None:
    with pytest.raises(Exception, match="stream 'absent': 404 NOT_FOUND"):
        spark.read.format("leveret").option("uri", broker.url).option(
            "stream", "absent").load().collect()
    with pytest.raises(Exception, match="option 'startingOffsets': must be first, last"):
        spark.read.format("leveret").option("uri", broker.url).option(
            "stream", "absent").option("startingOffsets", "yesterday").load().collect()
