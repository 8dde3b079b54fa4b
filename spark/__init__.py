"""The Spark data source for Leveret: a sink and a source, registered as format `leveret`.

    from leveret.spark import register
    register(spark)                      # spark.dataSource.register(LeveretDataSource)
    df.writeStream.format("leveret").option("uri", ...).option("stream", "events")...

It runs in Spark's Python workers and talks to the broker over AMQP 0.9.1 only; it imports
nothing from leveret.broker, leveret.storage, leveret.amqp or leveret.cli. `pyspark` (and
`pyarrow`) come with the `spark` extra: `pip install 'leveret[spark]'`.
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
