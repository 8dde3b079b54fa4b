"""The Spark data source for Leveret: a sink and a source, registered as format `leveret`.

    from leveret.spark import register
    register(spark)                      # spark.dataSource.register(LeveretDataSource)
    df.writeStream.format("leveret").option("uri", ...).option("stream", "events")...

It runs in Spark's Python workers and talks to the broker over AMQP 0.9.1 only. Of Leveret it
uses the wire layer alone (`leveret.amqp`, which is pure: pamqp and the standard library), for
its frame buffer and its struct codecs rather than a copy of them; it imports nothing from
leveret.broker, leveret.storage or leveret.cli (an import-linter contract in pyproject.toml).
`pyspark` (and `pyarrow`) come with the `spark` extra: `pip install 'leveret[spark]'`.

Modules, from the bottom up:

- `errors`: typed errors, each carrying the data its message needs;
- `endpoint`: an amqp:// or amqps:// URI parsed, and its TLS context;
- `options`: the sink's and the source's options and input columns, checked once;
- `channel`: one AMQP channel of a connection: synchronous methods, confirms, deliveries;
- `wire`: a small blocking AMQP 0.9.1 client, the connection that owns the channels;
- `connections`: connections kept per Python worker process and reused by its tasks;
- `admin`: declaring streams and super streams over AMQP;
- `publisher`: one task's publishing: rows in, confirmed publishes out;
- `streams`: what the source asks a broker about streams;
- `sink`, `source`: Spark's writers and readers;
- `datasource`: `LeveretDataSource`, the Python Data Source registered as `leveret`;
- `session`: a Spark session that can use the data source.

It must not know the broker's insides, its storage or its CLI. Threading: a connection and its
channels are used by one thread at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.spark.errors import (
    BrokerError,
    ConnectionLost,
    LeveretConnectionError,
    LeveretSparkError,
    OptionError,
    PublishError,
)
from leveret.spark.session import check_java, local_session, register

if TYPE_CHECKING:
    from leveret.spark.datasource import LeveretDataSource

__all__ = [
    "BrokerError",
    "ConnectionLost",
    "LeveretConnectionError",
    "LeveretDataSource",
    "LeveretSparkError",
    "OptionError",
    "PublishError",
    "check_java",
    "local_session",
    "register",
]


def __getattr__(name: str) -> Any:
    if name == "LeveretDataSource":
        from leveret.spark.datasource import LeveretDataSource

        return LeveretDataSource
    raise AttributeError(name)
