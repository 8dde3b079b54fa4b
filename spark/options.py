"""The options and input columns of the sink and the source, checked once, with one error each.

Spark hands a data source its options as a case-insensitive map of strings. `SinkOptions` and
`SourceOptions` parse that map; `SinkColumns` checks the input schema of a write against the
columns the sink understands (the same contract as Spark's Kafka sink: a required `value`,
optional `routing_key`, `headers`, `properties`, `filter_value` and `exchange`). Every problem
raises `OptionError`, whose text names the option or column.

Pure: no I/O, no Spark session; runs wherever Spark builds the writer or reader.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from leveret.spark.endpoint import Endpoint
from leveret.spark.errors import OptionError

# Options Spark itself may leave in the map; never an error.
SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
SINK_OPTIONS = ("uri", "exchange", "stream", "routing_key", "max_unconfirmed",
                "publisher_name", "id_column", "exactly_once", "confirm_timeout_s")
SOURCE_OPTIONS = ("uri", "stream", "superstream", "startingoffsets", "endingoffsets",
                  "maxmessagespertrigger", "filter", "prefetch", "failondataloss")
DEFAULT_PUBLISHER_PREFIX = "spark-"
MAX_UNCONFIRMED_DEFAULT = 10_000

STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to",
                     "expiration", "message_id", "type", "user_id", "app_id", "cluster_id")
INT_PROPERTIES = ("delivery_mode", "priority")
INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)


def _get(options: Mapping[str, str], key: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    value = str(value)
    return value


def _check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    for key in options:
        low = key.lower()
        if low not in known and low not in SPARK_OPTIONS:
            raise OptionError(key, f"unknown {what} option; the {what} knows "
                                   + ", ".join(known))


def _uri(options: Mapping[str, str]) -> str:
    uri = _get(options, "uri")
    if not uri:
        raise OptionError("uri", "required, e.g. amqp://guest:guest@localhost:5672/")
    try:
        Endpoint.parse(uri)
    except ValueError as exc:
        raise OptionError("uri", str(exc)) from None
    return uri


def _positive_int(options: Mapping[str, str], key: str, default: int | None) -> int | None:
    raw = _get(options, key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(key, f"must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise OptionError(key, f"must be a positive integer, got {raw!r}")
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = _get(options, key)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise OptionError(key, f"must be true or false, got {raw!r}")


def _name(options: Mapping[str, str], key: str) -> str | None:
    value = _get(options, key)
    if value is not None and len(value.encode("utf-8")) > 255:
        raise OptionError(key, "longer than 255 bytes")
    return value


@dataclass(frozen=True)
class SinkOptions:
    uri: str
    exchange: str | None
    stream: str | None
    routing_key: str | None
    max_unconfirmed: int
    publisher_name: str
    id_column: str | None
    exactly_once: bool
    confirm_timeout_s: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        _check_known(options, SINK_OPTIONS, "sink")
        uri = _uri(options)
        exchange = _name(options, "exchange")
        stream = _name(options, "stream")
        routing_key = _name(options, "routing_key")
        if exchange is not None and stream is not None:
            raise OptionError("stream", "give either 'exchange' or 'stream', not both "
                                        "('stream' publishes through the default exchange)")
        if stream is not None and routing_key is not None:
            raise OptionError("routing_key", "cannot be combined with 'stream' (the routing "
                                             "key is the stream's name)")
        if stream == "":
            raise OptionError("stream", "must not be empty")
        prefix = _get(options, "publisher_name")
        prefix = DEFAULT_PUBLISHER_PREFIX if prefix is None else prefix
        # prefix + a query id (36) + "-" + a partition id (up to 10 digits) within 255 bytes
        if len(prefix.encode("utf-8")) > 200:
            raise OptionError("publisher_name", "longer than 200 bytes")
        exactly_once = _bool(options, "exactly_once", True)
        id_column = _get(options, "id_column")
        if id_column is not None and not exactly_once:
            raise OptionError("id_column", "needs exactly_once=true (the ids are publishing ids)")
        timeout = _get(options, "confirm_timeout_s")
        try:
            confirm_timeout_s = float(timeout) if timeout is not None else 60.0
        except ValueError:
            raise OptionError("confirm_timeout_s", f"must be a number, got {timeout!r}") from None
        if confirm_timeout_s <= 0:
            raise OptionError("confirm_timeout_s", "must be positive")
        return cls(
            uri=uri,
            exchange=exchange,
            stream=stream,
            routing_key=routing_key,
            max_unconfirmed=_positive_int(options, "max_unconfirmed",
                                          MAX_UNCONFIRMED_DEFAULT) or MAX_UNCONFIRMED_DEFAULT,
            publisher_name=prefix,
            id_column=id_column,
            exactly_once=exactly_once,
            confirm_timeout_s=confirm_timeout_s,
        )

    @property
    def default_exchange(self) -> str | None:
        """The exchange a row without an `exchange` value goes to (None: there is none)."""
        if self.stream is not None:
            return ""
        return self.exchange

    @property
    def default_routing_key(self) -> str:
        if self.stream is not None:
            return self.stream
        return self.routing_key or ""


@dataclass(frozen=True)
class SinkColumns:
    """Where each column the sink reads sits in the input, and how to read it."""

    value: int
    value_is_string: bool
    routing_key: int | None
    headers: int | None
    properties: int | None
    property_names: tuple[str, ...]
    filter_value: int | None
    exchange: int | None
    id_column: int | None

    @classmethod
    def of(cls, schema: StructType, options: SinkOptions) -> SinkColumns:
        names = [field.name for field in schema.fields]
        types = {field.name: field.dataType for field in schema.fields}

        def index(name: str) -> int | None:
            return names.index(name) if name in types else None

        if "value" not in types:
            raise OptionError("value", "the sink needs a 'value' column (binary or string); "
                                       f"the input has {names}")
        value_type = types["value"]
        if not isinstance(value_type, BinaryType | StringType):
            raise OptionError("value", f"must be binary or string, got {value_type.simpleString()}")
        for column in ("routing_key", "filter_value", "exchange"):
            if column in types and not isinstance(types[column], StringType):
                raise OptionError(column, f"must be a string column, got "
                                          f"{types[column].simpleString()}")
        if "headers" in types:
            _check_headers_type(types["headers"])
        property_names: tuple[str, ...] = ()
        if "properties" in types:
            property_names = _check_properties_type(types["properties"])
        if "exchange" not in types and options.default_exchange is None:
            raise OptionError("exchange", "give the 'exchange' option, the 'stream' option, or "
                                          "an 'exchange' column")
        id_index = None
        if options.id_column is not None:
            if options.id_column not in types:
                raise OptionError("id_column", f"no column {options.id_column!r} in {names}")
            if not isinstance(types[options.id_column], INTEGER_TYPES):
                raise OptionError("id_column", f"column {options.id_column!r} must be an integer "
                                               f"column, got "
                                               f"{types[options.id_column].simpleString()}")
            id_index = index(options.id_column)
        value_index = index("value")
        assert value_index is not None
        return cls(
            value=value_index,
            value_is_string=isinstance(value_type, StringType),
            routing_key=index("routing_key"),
            headers=index("headers"),
            properties=index("properties"),
            property_names=property_names,
            filter_value=index("filter_value"),
            exchange=index("exchange"),
            id_column=id_index,
        )


def _check_headers_type(data_type: DataType) -> None:
    if not (isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType)
            and isinstance(data_type.valueType, StringType | BinaryType)):
        raise OptionError("headers", "must be a map<string,string> column, got "
                                     f"{data_type.simpleString()}")


def _check_properties_type(data_type: DataType) -> tuple[str, ...]:
    if not isinstance(data_type, StructType):
        raise OptionError("properties", "must be a struct of AMQP basic properties, got "
                                        f"{data_type.simpleString()}")
    names = []
    for field in data_type.fields:
        t = field.dataType
        if field.name in STRING_PROPERTIES:
            ok = isinstance(t, StringType)
        elif field.name in INT_PROPERTIES:
            ok = isinstance(t, INTEGER_TYPES)
        elif field.name == "timestamp":
            ok = isinstance(t, (TimestampType, TimestampNTZType, *INTEGER_TYPES))
        else:
            raise OptionError("properties", f"unknown AMQP property {field.name!r}; known: "
                                            + ", ".join((*STRING_PROPERTIES, *INT_PROPERTIES,
                                                         "timestamp")))
        if not ok:
            raise OptionError("properties", f"field {field.name!r} has the wrong type "
                                            f"{t.simpleString()}")
        names.append(field.name)
    return tuple(names)


# -- the source -----------------------------------------------------------------------------

_INTERVAL = re.compile(r"^(\d+)(s|m|h|D|M|Y)$")


@dataclass(frozen=True)
class OffsetSpec:
    """A starting or ending position: first, last, next (latest), an offset, or a time."""

    kind: str  # "first" | "last" | "next" | "offset" | "timestamp"
    value: int = 0  # the offset, or the timestamp in ms since the epoch

    @classmethod
    def parse(cls, option: str, raw: str) -> OffsetSpec:
        text = raw.strip()
        low = text.lower()
        if low in ("first", "earliest"):
            return cls("first")
        if low == "last":
            return cls("last")
        if low in ("next", "latest"):
            return cls("next")
        if re.fullmatch(r"-?\d+", text):
            value = int(text)
            if value < 0:
                raise OptionError(option, f"an offset must be >= 0, got {raw!r}")
            return cls("offset", value)
        match = _INTERVAL.match(text)
        if match:
            amount, unit = int(match.group(1)), match.group(2)
            seconds = {"s": 1, "m": 60, "h": 3600, "D": 86400, "M": 30 * 86400,
                       "Y": 365 * 86400}[unit]
            now_ms = int(datetime.datetime.now(tz=datetime.UTC).timestamp() * 1000)
            return cls("timestamp", now_ms - amount * seconds * 1000)
        try:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise OptionError(option, f"must be first, last, next, an offset, an ISO-8601 "
                                      f"timestamp or an interval such as 1h; got {raw!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return cls("timestamp", int(when.timestamp() * 1000))


@dataclass(frozen=True)
class SourceOptions:
    uri: str
    stream: str | None
    superstream: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    max_messages_per_trigger: int | None
    filter_values: tuple[str, ...]
    prefetch: int
    fail_on_data_loss: bool

    @classmethod
    def parse(cls, options: Mapping[str, str], batch: bool = False) -> SourceOptions:
        options = {k.lower(): v for k, v in options.items()}
        _check_known(options, SOURCE_OPTIONS, "source")
        uri = _uri(options)
        stream = _name(options, "stream")
        superstream = _name(options, "superstream")
        if (stream is None) == (superstream is None):
            raise OptionError("stream", "give exactly one of 'stream' or 'superstream'")
        default_start = "first" if batch else "next"
        starting = OffsetSpec.parse("startingOffsets",
                                    _get(options, "startingoffsets") or default_start)
        ending_raw = _get(options, "endingoffsets")
        if ending_raw is not None and not batch:
            raise OptionError("endingOffsets", "only a batch read (spark.read) takes it")
        ending = OffsetSpec.parse("endingOffsets", ending_raw or "next")
        if ending.kind in ("first", "last"):
            raise OptionError("endingOffsets", "must be next (latest), an offset or a timestamp")
        filter_raw = _get(options, "filter")
        filters: tuple[str, ...] = ()
        if filter_raw is not None:
            filters = tuple(v.strip() for v in filter_raw.split(",") if v.strip())
            if not filters:
                raise OptionError("filter", "give one value or several separated by commas")
        max_per_trigger = _positive_int(options, "maxmessagespertrigger", None)
        if max_per_trigger is not None and batch:
            raise OptionError("maxMessagesPerTrigger", "only a streaming read takes it")
        return cls(
            uri=uri,
            stream=stream,
            superstream=superstream,
            starting=starting,
            ending=ending,
            max_messages_per_trigger=max_per_trigger,
            filter_values=filters,
            prefetch=_positive_int(options, "prefetch", 2000) or 2000,
            fail_on_data_loss=_bool(options, "failondataloss", True),
        )
