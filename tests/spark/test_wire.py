"""The client under the sink and source, against a real broker, without Spark: publishing
with confirms and deduplication, nacks, returns, lost connections, and the stream probes."""

from __future__ import annotations

import datetime
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import pika  # noqa: E402
from pyspark.sql.types import StringType, StructField, StructType  # noqa: E402
from sparkkit import declare_stream, declare_super_stream, message_count  # noqa: E402

from leveret.spark import connections  # noqa: E402
from leveret.spark.endpoint import Endpoint  # noqa: E402
from leveret.spark.errors import (  # noqa: E402
    ConnectionLost,
    LeveretConnectionError,
    PublishError,
)
from leveret.spark.options import OffsetSpec, SinkColumns, SinkOptions  # noqa: E402
from leveret.spark.publisher import PartitionPublisher  # noqa: E402
from leveret.spark.streams import Probe  # noqa: E402
from leveret.spark.wire import Connection  # noqa: E402

pytestmark = pytest.mark.spark
SCHEMA = StructType([StructField("value", StringType()), StructField("routing_key",
                                                                     StringType())])


def batch(values: list[str], keys: list[str] | None = None):  # type: ignore[no-untyped-def]
    keys = keys if keys is not None else [None] * len(values)  # type: ignore[list-item]
    return pa.RecordBatch.from_arrays([pa.array(values, pa.string()),
                                       pa.array(keys, pa.string())],
                                      names=["value", "routing_key"])


def publisher(url: str, batch_id: int, name: str = "p", **options: str) -> PartitionPublisher:
    opts = SinkOptions.parse({"uri": url, **options})
    conn = connections.checkout(url)
    return PartitionPublisher(conn, opts, SinkColumns.of(SCHEMA, opts), name, batch_id)


def test_publish_confirm_and_replay(broker) -> None:
    declare_stream(broker.port, "s")
    pub = publisher(broker.url, 5, stream="s", max_unconfirmed="100")
    pub.publish_batch(batch([f"m{i}" for i in range(1000)]))
    counts = pub.finish()
    assert (counts.rows, counts.published, counts.confirmed, counts.deduplicated) == (
        1000, 1000, 1000, 0)
    assert counts.bytes == sum(len(f"m{i}") for i in range(1000))
    assert message_count(broker.port, "s") == 1000
    replay = publisher(broker.url, 5, stream="s")  # the same task again: all known
    replay.publish_batch(batch([f"m{i}" for i in range(1200)]))
    counts = replay.finish()
    assert (counts.published, counts.deduplicated) == (200, 1000)
    assert message_count(broker.port, "s") == 1200


def test_replay_into_a_super_stream_is_dropped_by_the_broker(broker) -> None:
    declare_super_stream(broker.port, "ss", 2)
    for _attempt in range(2):
        pub = publisher(broker.url, 1, exchange="ss")
        pub.publish_batch(batch([str(i) for i in range(100)], [str(i % 2) for i in range(100)]))
        pub.finish()
    assert message_count(broker.port, "ss-0") + message_count(broker.port, "ss-1") == 100


def test_a_nack_fails_the_task(broker) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as conn:
        conn.channel().queue_declare("full", arguments={"x-max-length": 1,
                                                        "x-overflow": "reject-publish"})
    pub = publisher(broker.url, 0, stream="full", exactly_once="false")
    pub.publish_batch(batch(["a", "b", "c"]))
    with pytest.raises(PublishError, match="nacked 2 publishes"):
        pub.finish()
    connections.discard(broker.url)


def test_a_lost_connection_fails_the_task(broker_process) -> None:
    declare_stream(broker_process.port, "s")
    pub = publisher(broker_process.url, 0, stream="s")
    pub.publish_batch(batch(["a"]))
    pub.finish()
    broker_process.kill()
    with pytest.raises((ConnectionLost, LeveretConnectionError)):
        pub2 = publisher(broker_process.url, 1, stream="s")
        for _ in range(50):
            pub2.publish_batch(batch(["x"] * 100))
            time.sleep(0.01)
        pub2.finish()
    connections.discard(broker_process.url)


def test_connections_are_reused_until_they_break(broker) -> None:
    first = connections.checkout(broker.url)
    assert connections.checkout(broker.url) is first
    first.abort()
    second = connections.checkout(broker.url)
    assert second is not first and second.is_open
    connections.close_all()


def test_login_errors_are_clear(broker) -> None:
    with pytest.raises(LeveretConnectionError, match="refused the login of user 'guest'"):
        Connection(Endpoint.parse(f"amqp://guest:nope@127.0.0.1:{broker.port}/"))
    with pytest.raises(LeveretConnectionError, match="cannot open vhost 'nowhere'"):
        Connection(Endpoint.parse(f"amqp://guest:guest@127.0.0.1:{broker.port}/nowhere"))


def test_probes_of_offsets_and_partitions(broker) -> None:
    declare_stream(broker.port, "p")
    declare_super_stream(broker.port, "sup", 3)
    conn = Connection(Endpoint.parse(broker.url))
    probe = Probe(conn)
    assert probe.first_and_next("p") == (0, 0)
    assert probe.resolve("p", OffsetSpec("last")) == 0
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as c:
        ch = c.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "p", b"%d" % i)
        time.sleep(1.1)
        middle = datetime.datetime.now(tz=datetime.UTC)
        for i in range(5, 8):
            ch.basic_publish("", "p", b"%d" % i)
    assert probe.first_and_next("p") == (0, 8)
    assert probe.resolve("p", OffsetSpec("first")) == 0
    assert probe.resolve("p", OffsetSpec("next")) == 8
    assert probe.resolve("p", OffsetSpec("offset", 3)) == 3
    assert probe.resolve("p", OffsetSpec("offset", 99)) == 8
    assert probe.resolve("p", OffsetSpec("last")) == 7  # one publish per confirm: one chunk
    assert probe.resolve("p", OffsetSpec("timestamp", int(middle.timestamp() * 1000))) == 5
    future = int(time.time() * 1000) + 3_600_000
    assert probe.resolve("p", OffsetSpec("timestamp", future)) == 8
    assert probe.partitions(None, "sup") == ["sup-0", "sup-1", "sup-2"]
    assert probe.partitions("p", None) == ["p"]
    conn.close()


def test_the_partitions_of_a_super_stream_come_from_the_broker_or_by_name(broker) -> None:
    """Leveret names a super stream's partitions (binding keys too); an exchange that is not
    marked as a super stream (406 from the query) falls back to `<name>-0, -1, ...`; a user
    who may not read the exchange gets one error that names the super stream and the 403."""
    from leveret.broker.access.auth import Permission
    from leveret.spark.errors import LeveretSparkError

    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)) as c:
        ch = c.channel()
        ch.exchange_declare("keyed", "direct", durable=True, arguments={"x-super-stream": True})
        ch.exchange_declare("unmarked", "direct", durable=True)
        for key in ("b", "a"):
            ch.queue_declare(f"keyed-{key}", durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(f"keyed-{key}", "keyed", key)
        for i in range(2):
            ch.queue_declare(f"unmarked-{i}", durable=True,
                             arguments={"x-queue-type": "stream"})
            ch.queue_bind(f"unmarked-{i}", "unmarked", str(i))
    conn = Connection(Endpoint.parse(broker.url))
    probe = Probe(conn)
    assert sorted(probe.partitions(None, "keyed")) == ["keyed-a", "keyed-b"]
    assert probe.partitions(None, "unmarked") == ["unmarked-0", "unmarked-1"]
    conn.close()

    def add_reader() -> None:
        broker.broker.add_user("no-read", "pw")
        broker.broker.set_permissions("no-read", "/", Permission(".*", ".*", "^keyed-"))
    broker.call(add_reader)
    conn = Connection(Endpoint.parse(f"amqp://no-read:pw@127.0.0.1:{broker.port}/"))
    with pytest.raises(LeveretSparkError, match=r"super stream 'keyed': 403 ACCESS_REFUSED"):
        Probe(conn).partitions(None, "keyed")
    conn.close()
