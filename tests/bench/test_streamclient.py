"""The stream-protocol bench client (bench/streamclient.py): its stamped Publish frames read back
with Leveret's decoder, and a tiny real publish and consume against `leveret serve`. No timing
is asserted: this proves the instrument is correct, not fast."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamproto.conftest import StreamBroker, start_stream_broker
from support.bench import bench_module

from leveret.broker.streamproto import frames as f

sc = bench_module("streamclient")


def _read_publish(frame: bytes) -> list[tuple[int, int]]:
    """(publishing id, body sequence number) of each entry of a Publish v1 frame."""
    d = f.Decoder(frame, 4)
    assert (d.u16(), d.u16()) == (0x02, 1)
    d.u8()
    out = []
    for _ in range(d.count()):
        publishing_id = d.u64()
        message = d.raw(d.u32())
        out.append((publishing_id, sc.BODY.unpack_from(sc.body_of(message), 0)[1]))
    d.done()
    return out


@pytest.mark.parametrize("numpy", [True, False])
def test_stamped_batches_decode(numpy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not numpy:
        monkeypatch.setattr(sc, "np", None)
    elif sc.np is None:
        pytest.skip("numpy is not installed")
    batch = sc.PublishBatch(3, 4, 100)
    assert _read_publish(bytes(batch.stamp(10))) == [(i, i) for i in range(10, 14)]
    assert _read_publish(bytes(batch.stamp(500))) == [(i, i) for i in range(500, 504)]


@pytest.fixture(scope="module")
def lev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamBroker]:
    broker = start_stream_broker(tmp_path_factory.mktemp("bench") / "data")
    yield broker
    broker.process.kill()


def test_publish_then_consume_from_first(lev: StreamBroker) -> None:
    conn = sc.StreamConnection("127.0.0.1", lev.stream_port)
    conn.create("bench.check")
    conn.declare_publisher(1, "bench.check")
    published = sc.publish(conn, 1, body_size=100, batch=100, window=300, count=1050)
    assert published.ok, published.errors
    assert (published.published, published.confirmed) == (1050, 1050)
    assert sum(published.latency_weight) == 1050
    for _ in range(2):  # the second subscriber reads what the first one was sent
        reader = sc.StreamConnection("127.0.0.1", lev.stream_port)
        reader.subscribe(1, "bench.check", credit=2)
        got = sc.consume(reader, 1, 1050, initial_credit=2)
        assert (got.received, got.errors) == (1050, [])
        assert got.chunks >= 1
        reader.close()
    conn.delete("bench.check")
    conn.close()


def test_a_consumer_that_starts_late_is_not_ok(lev: StreamBroker) -> None:
    conn = sc.StreamConnection("127.0.0.1", lev.stream_port)
    conn.create("bench.late")
    conn.declare_publisher(1, "bench.late")
    assert sc.publish(conn, 1, body_size=100, batch=10, window=100, count=30).ok
    reader = sc.StreamConnection("127.0.0.1", lev.stream_port)
    reader.subscribe(1, "bench.late", credit=5, offset=10)
    got = sc.consume(reader, 1, 20, initial_credit=5, idle_timeout=5)
    assert got.errors and "expected 0" in got.errors[0]
    reader.close()
    conn.delete("bench.late")
    conn.close()
