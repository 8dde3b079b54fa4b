"""A delayed exchange's held messages survive kill -9 and a clean stop of a real `leveret
serve`, and each is routed once: at its due time, or right after the restart if it fell due
while the broker was down (docs/DELAYED-MESSAGES.md, "Restarts")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pika
import pytest
from support.brokers import BrokerProcess

N_SHORT = 100
N_LONG = 100


async def publish_confirmed(url: str) -> None:
    """Every publish awaited until its confirm: each held message is committed."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange("dx")
    persistent = aio_pika.DeliveryMode.PERSISTENT
    sends = [exchange.publish(aio_pika.Message(f"s{i}".encode(), headers={"x-delay": 200},
                                               delivery_mode=persistent), "k")
             for i in range(N_SHORT)]
    sends += [exchange.publish(aio_pika.Message(f"l{i}".encode(),
                                                headers={"x-delay": 2500 + i},
                                                delivery_mode=persistent), "k")
              for i in range(N_LONG)]
    await asyncio.wait_for(asyncio.gather(*sends), timeout=10)
    await connection.close()


def channel(broker: BrokerProcess) -> tuple[pika.BlockingConnection, object]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def count(ch: object, queue: str) -> int:
    return ch.queue_declare(queue, durable=True, passive=True).method.message_count  # type: ignore[attr-defined]


def wait_count(ch: object, queue: str, wanted: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (got := count(ch, queue)) < wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def bodies(ch: object) -> list[bytes]:
    out = []
    while True:
        method, _props, body = ch.basic_get("dq", auto_ack=True)  # type: ignore[attr-defined]
        if method is None:
            return out
        out.append(body)


@pytest.mark.parametrize(("policy", "stop"), [("never", "kill"), ("always", "kill"),
                                              ("200", "kill"), ("200", "term")])
def test_held_messages_are_routed_once_across_a_restart(tmp_path: Path, policy: str,
                                                        stop: str) -> None:
    broker = BrokerProcess(tmp_path / "data", env={"LEVERET_QUEUE_FSYNC": policy}).start()
    try:
        conn, ch = channel(broker)
        ch.exchange_declare("dx", "x-delayed-message", durable=True,  # type: ignore[attr-defined]
                            arguments={"x-delayed-type": "direct"})
        ch.queue_declare("dq", durable=True)  # type: ignore[attr-defined]
        ch.queue_bind("dq", "dx", "k")  # type: ignore[attr-defined]
        asyncio.run(publish_confirmed(broker.url))
        published = time.monotonic()
        assert wait_count(ch, "dq", N_SHORT, 5) == N_SHORT  # the short ones were routed
        conn.close()
        if stop == "kill":
            broker.kill()
        else:
            assert broker.stop() == 0
        time.sleep(max(0.0, published + 3.0 - time.monotonic()))  # the long ones fall due
        broker.restart()
        restarted = time.monotonic()
        conn, ch = channel(broker)
        got = wait_count(ch, "dq", N_SHORT + N_LONG, 10)
        late = time.monotonic() - restarted
        time.sleep(0.5)  # anything routed twice would show up here
        received = bodies(ch)
        conn.close()
        assert got == N_SHORT + N_LONG
        assert sorted(received) == sorted([f"s{i}".encode() for i in range(N_SHORT)]
                                          + [f"l{i}".encode() for i in range(N_LONG)])
        assert late < 5, late  # overdue: routed right after the restart
    finally:
        broker.kill()


def test_a_deleted_held_message_stays_deleted_and_counts_stay_exact(tmp_path: Path) -> None:
    """Deleted while its entry is in a bucket file (not loaded): the count drops at once,
    and after a clean stop and a kill -9 it is neither counted nor routed."""
    import json
    import urllib.request

    from support.ports import free_port

    mport = free_port()
    # the last --management-port given wins over BrokerProcess's own "0"
    broker = BrokerProcess(tmp_path / "data", args=["--management-port", str(mport)]).start()

    def api(method: str, path: str) -> tuple[int, object]:
        request = urllib.request.Request(f"http://127.0.0.1:{mport}{path}", method=method)
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                data = reply.read()
                return reply.status, json.loads(data) if data else None
        except urllib.error.HTTPError as error:
            return error.code, None
        except urllib.error.URLError:  # not listening yet
            return 0, None

    try:
        conn, ch = channel(broker)
        ch.exchange_declare("dx", "x-delayed-message", durable=True,  # type: ignore[attr-defined]
                            arguments={"x-delayed-type": "direct"})
        for i, delay in enumerate((60_000, 3_600_000, 7_200_000)):
            ch.basic_publish("dx", "k", f"m{i}".encode(), pika.BasicProperties(  # type: ignore[attr-defined]
                headers={"x-delay": delay}))
        conn.close()
        deadline = time.monotonic() + 10
        while api("GET", "/api/exchanges/%2F/dx")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        _status, items = api("GET", "/api/leveret/exchanges/%2F/dx/delayed")
        assert [i["payload"] for i in items] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
        assert api("DELETE", f"/api/leveret/exchanges/%2F/dx/delayed/{items[2]['id']}")[0] == 204  # type: ignore[index]
        assert api("GET", "/api/exchanges/%2F/dx")[1]["messages_delayed"] == 2  # type: ignore[index]
        for restart in ("term", "kill"):
            if restart == "term":
                assert broker.stop() == 0
            else:
                broker.kill()
            broker.start()
            deadline = time.monotonic() + 10
            while api("GET", "/api/exchanges/%2F/dx")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert api("GET", "/api/exchanges/%2F/dx")[1]["messages_delayed"] == 2, restart  # type: ignore[index]
            listed = [i["payload"] for i in api("GET", "/api/leveret/exchanges/%2F/dx/delayed")[1]]  # type: ignore[union-attr]
            assert listed == ["m0", "m1"], restart
    finally:
        broker.kill()


def test_a_lavinmq_style_delayed_exchange_survives_a_restart(tmp_path: Path) -> None:
    """`x-delayed-exchange: true` on a topic exchange: its arguments round-trip through the
    metadata store, and what it held is routed after a kill -9."""
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        conn, ch = channel(broker)
        ch.exchange_declare("lx", "topic", durable=True,  # type: ignore[attr-defined]
                            arguments={"x-delayed-exchange": True})
        ch.queue_declare("dq", durable=True)  # type: ignore[attr-defined]
        ch.queue_bind("dq", "lx", "a.#")  # type: ignore[attr-defined]
        ch.basic_publish("lx", "a.b", b"held", pika.BasicProperties(  # type: ignore[attr-defined]
            headers={"x-delay": 1500}, delivery_mode=2))
        conn.close()
        broker.kill()
        broker.restart()
        conn, ch = channel(broker)
        ch.exchange_declare("lx", "topic", durable=True,  # type: ignore[attr-defined]
                            arguments={"x-delayed-exchange": True})  # equivalent: restored
        assert wait_count(ch, "dq", 1, 10) == 1
        _method, props, body = ch.basic_get("dq", auto_ack=True)  # type: ignore[attr-defined]
        assert (body, props.headers) == (b"held", {"x-delay": -1500})
        conn.close()
    finally:
        broker.kill()


@pytest.mark.parametrize("queue_type", ["classic", "stream"])
def test_a_queue_keeps_the_delayed_ids_it_took_across_kill_9(tmp_path: Path,
                                                              queue_type: str) -> None:
    """A durable classic queue (TAKEN records in its log) and a stream (the ids in its
    chunks' tracking trailers) drop, after a `kill -9` and a restart, a copy whose
    `x-leveret-delayed-id` they took before it (a client may set the header: the publish is
    then treated as a delayed exchange's copy); a copy with another id is kept."""
    broker = BrokerProcess(tmp_path / "data").start()
    persistent = 2

    def send(ch: object, ident: str, body: bytes) -> None:
        ch.basic_publish("", "tq", body, pika.BasicProperties(  # type: ignore[attr-defined]
            delivery_mode=persistent, headers={"x-leveret-delayed-id": ident}))

    try:
        conn, ch = channel(broker)
        ch.queue_declare("tq", durable=True,  # type: ignore[attr-defined]
                         arguments={"x-queue-type": queue_type})
        send(ch, "0123456789abcdef0123456789abcdef:7", b"first")
        send(ch, "0123456789abcdef0123456789abcdef:7", b"again")  # dropped: taken
        assert count(ch, "tq") == 1
        conn.close()
        broker.kill()
        broker.restart()
        conn, ch = channel(broker)
        send(ch, "0123456789abcdef0123456789abcdef:7", b"after the restart")  # dropped
        send(ch, "0123456789abcdef0123456789abcdef:8", b"another id")  # kept
        got = count(ch, "tq")
        conn.close()
        assert got == 2, got
    finally:
        broker.kill()
