"""Super stream hash routing lands where the stream client libraries put a message.

The vectors are the ones the RabbitMQ stream clients share (Go, Java, .NET and Python test the
same table): partitions invoices-01..03, routing keys hello1..hello10 and hello88.
"""

from __future__ import annotations

import pytest

from leveret.broker.model.superstream import partition_for

# rabbitmq-stream-go-client, pkg/stream/super_stream_producer_test.go ("Partitioning using
# Murmur3"; "the table is the same for .NET, Python, Java stream clients").
CLIENT_VECTORS = {
    "hello1": "invoices-02", "hello2": "invoices-01", "hello3": "invoices-02",
    "hello4": "invoices-03", "hello5": "invoices-01", "hello6": "invoices-03",
    "hello7": "invoices-01", "hello8": "invoices-02", "hello9": "invoices-01",
    "hello10": "invoices-03", "hello88": "invoices-02",
}


@pytest.mark.parametrize(("key", "partition"), sorted(CLIENT_VECTORS.items()))
def test_hash_matches_the_stream_clients(key: str, partition: str) -> None:
    partitions = ["invoices-01", "invoices-02", "invoices-03"]
    assert partitions[partition_for(key, 3)] == partition
