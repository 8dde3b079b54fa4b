"""Option and column checks: every problem is one OptionError naming the option."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import StructType

from leveret.spark.endpoint import Endpoint
from leveret.spark.errors import OptionError
from leveret.spark.options import OffsetSpec, SinkColumns, SinkOptions, SourceOptions

pytestmark = pytest.mark.spark
URI = "amqp://guest:guest@localhost:5672/"


def sink(**options: str) -> SinkOptions:
    return SinkOptions.parse({"uri": URI, **options})


def test_sink_defaults_and_targets() -> None:
    opts = sink(stream="events")
    assert (opts.default_exchange, opts.default_routing_key) == ("", "events")
    assert opts.exactly_once and opts.max_unconfirmed == 10_000
    assert opts.publisher_name == "spark-"
    opts = sink(exchange="invoices", routing_key="eu")
    assert (opts.default_exchange, opts.default_routing_key) == ("invoices", "eu")
    assert sink().default_exchange is None  # rows must say where they go


@pytest.mark.parametrize(("options", "option"), [
    ({"uri": ""}, "uri"),
    ({"uri": "amqp://h:notaport/"}, "uri"),
    ({"stream": "s", "routing_key": "k"}, "routing_key"),
    ({"max_unconfirmed": "0"}, "max_unconfirmed"),
    ({"exactly_once": "maybe"}, "exactly_once"),
    ({"exactly_once": "false", "id_column": "id"}, "id_column"),
    ({"publisher_name": "x" * 201}, "publisher_name"),
    ({"confirm_timeout_s": "-1"}, "confirm_timeout_s"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_sink_options(options: dict[str, str], option: str) -> None:
    with pytest.raises(OptionError) as info:
        SinkOptions.parse({"uri": URI, **options})
    assert info.value.option == option
    assert str(info.value).startswith(f"leveret: option '{option}': ")


@pytest.mark.parametrize(("ddl", "option"), [
    ("body string", "value"),
    ("value int", "value"),
    ("value string, routing_key int", "routing_key"),
    ("value string, headers map<string,int>", "headers"),
    ("value string, properties struct<colour: string>", "properties"),
    ("value string, properties struct<priority: string>", "properties"),
    ("value string, exchange binary", "exchange"),
])
def test_bad_columns(spark, ddl: str, option: str) -> None:
    with pytest.raises(OptionError) as info:
        SinkColumns.of(StructType.fromDDL(ddl), sink(stream="s"))
    assert info.value.option == option


def test_columns_and_id_column(spark) -> None:
    columns = SinkColumns.of(StructType.fromDDL(
        "value binary, routing_key string, seq long, properties struct<priority: int, "
        "timestamp: timestamp, message_id: string>"), sink(stream="s", id_column="seq"))
    assert (columns.value, columns.routing_key, columns.id_column) == (0, 1, 2)
    assert columns.property_names == ("priority", "timestamp", "message_id")
    with pytest.raises(OptionError, match=r"'id_column'.*must be an integer"):
        SinkColumns.of(StructType.fromDDL("value binary, seq string"),
                       sink(stream="s", id_column="seq"))
    with pytest.raises(OptionError, match="'exchange'"):
        SinkColumns.of(StructType.fromDDL("value binary"), sink())
    assert SinkColumns.of(StructType.fromDDL("value binary, exchange string"), sink()).exchange


def test_source_options() -> None:
    opts = SourceOptions.parse({"uri": URI, "superStream": "invoices",
                                "startingOffsets": "first", "maxMessagesPerTrigger": "10",
                                "filter": "eu, us"})
    assert opts.superstream == "invoices" and opts.stream is None
    assert opts.starting == OffsetSpec("first")
    assert opts.max_messages_per_trigger == 10
    assert opts.filter_values == ("eu", "us")
    assert SourceOptions.parse({"uri": URI, "stream": "s"}).starting == OffsetSpec("next")
    assert SourceOptions.parse({"uri": URI, "stream": "s"}, batch=True).starting.kind == "first"
    for bad, option in [({"stream": "s", "superstream": "x"}, "stream"),
                        ({}, "stream"),
                        ({"stream": "s", "startingOffsets": "soon"}, "startingOffsets"),
                        ({"stream": "s", "endingOffsets": "5"}, "endingOffsets"),
                        ({"stream": "s", "maxMessagesPerTrigger": "-2"},
                         "maxmessagespertrigger")]:
        with pytest.raises(OptionError) as info:
            SourceOptions.parse({"uri": URI, **bad})
        assert info.value.option == option


def test_offset_specs() -> None:
    assert OffsetSpec.parse("o", "42") == OffsetSpec("offset", 42)
    assert OffsetSpec.parse("o", "latest") == OffsetSpec("next")
    assert OffsetSpec.parse("o", "2024-05-01T12:00:00Z") == OffsetSpec("timestamp",
                                                                       1714564800000)
    assert OffsetSpec.parse("o", "1h").kind == "timestamp"
    with pytest.raises(OptionError):
        OffsetSpec.parse("o", "-3")


def test_uris() -> None:
    ep = Endpoint.parse("amqps://u%40x:p%3A@example.com/prod?heartbeat=5&verify=verify_none")
    assert (ep.host, ep.port, ep.username, ep.password, ep.vhost) == (
        "example.com", 5671, "u@x", "p:", "prod")
    assert ep.heartbeat_s == 5 and ep.tls == {"verify": "verify_none"}
    assert Endpoint.parse("amqp://localhost").vhost == "/"
    assert Endpoint.parse("amqp://localhost/%2F").vhost == "/"
    assert Endpoint.parse("amqp://localhost/").display == "amqp://guest@localhost:5672/%2F"


def test_writers_pickle_without_a_connection(spark) -> None:
    import pickle

    from leveret.spark.sink import LeveretBatchWriter, LeveretStreamWriter

    schema = StructType.fromDDL("value string")
    for cls in (LeveretStreamWriter, LeveretBatchWriter):
        writer = cls(sink(stream="s"), schema)
        copy = pickle.loads(pickle.dumps(writer))
        assert copy.options == writer.options and copy.columns == writer.columns
