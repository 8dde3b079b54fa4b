"""Delayed exchanges (docs/DELAYED-MESSAGES.md): the plugin's `x-delayed-message` type and
LavinMQ's `x-delayed-exchange: true`, with pika, aio-pika and kombu against a real Leveret.
The kill -9 restart is in tests/reliability/test_delayed_crash.py; rates are in bench/delayed.py.
"""

from __future__ import annotations

import asyncio
import decimal
import time
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.amqp import channel_error, connect
from support.brokers import InProcessBroker
from support.management import Http

XDM = "x-delayed-message"


@pytest.fixture
def ch(broker: InProcessBroker):  # type: ignore[no-untyped-def]
    conn = connect(broker.port)
    channel = conn.channel()
    channel.confirm_delivery()
    yield channel
    if conn.is_open:
        conn.close()


def delayed(ch: Any, name: str, inner: str = "direct", **extra: Any) -> None:
    ch.exchange_declare(name, XDM, arguments={"x-delayed-type": inner, **extra})


def bound_queue(ch: Any, exchange: str, key: str = "k", **arguments: Any) -> str:
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, exchange, key, arguments=arguments or None)
    return queue


def send(ch: Any, exchange: str, body: bytes, delay: Any = None, key: str = "k",
         **headers: Any) -> None:
    if delay is not None:
        headers["x-delay"] = delay
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers or None))


def get(ch: Any, queue: str) -> tuple[Any, bytes] | None:
    method, props, body = ch.basic_get(queue, auto_ack=True)
    return None if method is None else (props, body)


def wait_for(ch: Any, queue: str, timeout: float = 5.0) -> tuple[Any, bytes]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = get(ch, queue)
        if got is not None:
            return got
        time.sleep(0.02)
    raise AssertionError(f"nothing arrived in {queue} within {timeout}s")


# -- declaring --------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "text"), [
    ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": 5}, "Invalid argument, 'x-delayed-type' must be an existing exchange "
                            "type"),
    ({"x-delayed-type": XDM}, "Invalid argument, 'x-delayed-message' can't be used for "
                              "'x-delayed-type'"),
    ({"x-delayed-type": "nope"}, "unknown exchange type 'nope'"),
    ({"x-delayed-type": "x-consistent-hash", "hash-header": "h", "hash-property": "message_id"},
     "hash-header and hash-property are mutually exclusive"),
])
def test_declare_errors_have_the_plugins_texts(ch, arguments: dict[str, Any], text: str) -> None:  # type: ignore[no-untyped-def]
    assert channel_error(lambda: ch.exchange_declare("dx", XDM, arguments=arguments)) == (
        406, f"PRECONDITION_FAILED - {text}")


def test_redeclare_is_checked_for_equivalence_as_rabbitmq_does(broker: InProcessBroker) -> None:
    """As for every exchange, the type and flags must match and, of the arguments, only
    alternate-exchange: the plugin delegates to its routing type's check, so a different
    x-delayed-type is accepted and the exchange stays as it was."""
    conn = connect(broker.port)
    ch = conn.channel()
    delayed(ch, "dx")
    delayed(ch, "dx", inner="topic")
    assert channel_error(lambda: ch.exchange_declare("dx", "direct")) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'dx' in vhost '/': "
             "received 'direct' but current is 'x-delayed-message'")
    ch = conn.channel()
    code, text = channel_error(lambda: delayed(ch, "dx", **{"alternate-exchange": "ae"}))
    assert code == 406 and "alternate-exchange" in text
    ch = conn.channel()
    queue = bound_queue(ch, "dx")
    send(ch, "dx", b"direct", 50)  # still a direct exchange: "k" matches exactly
    assert wait_for(ch, queue)[1] == b"direct"
    ch.exchange_declare("lx", "topic", arguments={"x-delayed-exchange": True})
    ch.exchange_declare("lx", "topic")
    assert channel_error(lambda: ch.exchange_declare("lx", "direct"))[0] == 406
    conn.close()


@pytest.mark.parametrize("inner", ["direct", "fanout", "topic", "headers", "x-consistent-hash",
                                   "x-modulus-hash"])
def test_each_delayed_type_routes_as_its_type_after_the_delay(ch, inner: str) -> None:  # type: ignore[no-untyped-def]
    delayed(ch, "dx", inner)
    key = {"direct": "k", "fanout": "", "topic": "a.*", "headers": "",
           "x-consistent-hash": "10", "x-modulus-hash": ""}[inner]
    args = {"x-match": "all", "h": "v"} if inner == "headers" else {}
    queue = bound_queue(ch, "dx", key, **args)
    other = bound_queue(ch, "dx", "nomatch") if inner in ("direct", "topic") else None
    started = time.monotonic()
    send(ch, "dx", b"m", 300, key="a.b" if inner == "topic" else "k", h="v")
    assert get(ch, queue) is None  # held
    _props, body = wait_for(ch, queue)
    assert body == b"m" and time.monotonic() - started >= 0.29
    if other is not None:
        assert get(ch, other) is None


def test_lavinmq_argument_makes_any_type_delayed(ch) -> None:  # type: ignore[no-untyped-def]
    ch.exchange_declare("lx", "fanout", arguments={"x-delayed-exchange": True})
    queue = bound_queue(ch, "lx", "")
    send(ch, "lx", b"later", 200)
    send(ch, "lx", b"now")
    assert get(ch, queue)[1] == b"now"  # type: ignore[index]
    assert wait_for(ch, queue)[1] == b"later"


# -- x-delay values ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "held"), [
    (None, False), (0, False), (-500, False), (True, False), (4294967296, False),
    ("250", True), ("+250", True), ("abc", False), ("2.5", False),
    (decimal.Decimal("250.5"), True), (250, True),
])
def test_x_delay_values_as_the_plugin_reads_them(ch, value: Any, held: bool) -> None:  # type: ignore[no-untyped-def]
    delayed(ch, "dx")
    queue = bound_queue(ch, "dx")
    send(ch, "dx", b"m", value)
    now = get(ch, queue)
    if not held:
        assert now is not None and now[1] == b"m"
        # routed at once: headers untouched
        assert (now[0].headers or {}).get("x-delay") == (None if value is None else value)
        return
    assert now is None
    props, _ = wait_for(ch, queue)
    assert props.headers["x-delay"] == -250  # minus the delay, as the plugin swaps it


def test_delivered_message_keeps_its_properties(ch) -> None:  # type: ignore[no-untyped-def]
    delayed(ch, "dx")
    queue = bound_queue(ch, "dx")
    ch.basic_publish("dx", "k", b"body", pika.BasicProperties(
        headers={"x-delay": 100, "a": "b", "n": 7}, content_type="text/plain",
        message_id="m-1", correlation_id="c", priority=3, delivery_mode=2))
    props, body = wait_for(ch, queue)
    assert body == b"body"
    assert props.headers == {"x-delay": -100, "a": "b", "n": 7}
    assert (props.content_type, props.message_id, props.correlation_id, props.priority,
            props.delivery_mode) == ("text/plain", "m-1", "c", 3, 2)


def test_messages_are_routed_in_due_order(ch) -> None:  # type: ignore[no-untyped-def]
    delayed(ch, "dx")
    queue = bound_queue(ch, "dx")
    for delay in (400, 100, 300, 200):
        send(ch, "dx", str(delay).encode(), delay)
    got = [wait_for(ch, queue)[1] for _ in range(4)]
    assert got == [b"100", b"200", b"300", b"400"]


def test_dedup_is_checked_at_publish_only(ch) -> None:  # type: ignore[no-untyped-def]
    ch.exchange_declare("dx", XDM, arguments={"x-delayed-type": "direct",
                                              "x-message-deduplication": True})
    queue = bound_queue(ch, "dx")
    send(ch, "dx", b"1", 100, **{"x-deduplication-header": "id"})
    send(ch, "dx", b"2", 100, **{"x-deduplication-header": "id"})  # a duplicate: dropped
    assert wait_for(ch, queue)[1] == b"1"
    time.sleep(0.3)
    assert get(ch, queue) is None


# -- mandatory, unroutable, alternate exchange ------------------------------------------------


def test_a_held_mandatory_message_is_not_returned(broker: InProcessBroker) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    delayed(ch, "dx")
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _c, _m, _p, body: returned.append(body))
    ch.basic_publish("dx", "none", b"held", pika.BasicProperties(headers={"x-delay": 100}),
                     mandatory=True)
    ch.basic_publish("dx", "none", b"now", mandatory=True)
    conn.process_data_events(time_limit=0.5)
    assert returned == [b"now"]
    conn.close()


def test_unroutable_at_due_time_is_counted_and_goes_to_the_alternate_exchange(
    managed_broker: InProcessBroker,
) -> None:
    http = Http.of(managed_broker)
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.exchange_declare("ae", "fanout")
    ae_queue = bound_queue(ch, "ae", "")
    ch.exchange_declare("dx", XDM, arguments={"x-delayed-type": "direct",
                                              "alternate-exchange": "ae"})
    ch.exchange_declare("lost", XDM, arguments={"x-delayed-type": "direct"})
    send(ch, "dx", b"to-ae", 100, key="nobody")
    send(ch, "lost", b"dropped", 100, key="nobody")
    assert wait_for(ch, ae_queue)[1] == b"to-ae"
    deadline = time.monotonic() + 5
    while http.ok("/api/exchanges/%2F/lost")["delayed_unroutable"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    view = http.ok("/api/exchanges/%2F/dx")
    assert (view["delayed_unroutable"], view["delayed_routed"]) == (0, 1)  # the AE took it
    samples = {(s.name, s.labels.get("exchange")): s.value
               for f in text_string_to_metric_families(http.get("/metrics").text)
               for s in f.samples}
    assert {(name, exchange): samples.get((f"leveret_exchange_delayed_{name}_total", exchange))
            for name in ("routed", "unroutable", "refused") for exchange in ("dx", "lost")} == {
        ("routed", "dx"): 1, ("unroutable", "dx"): 0, ("refused", "dx"): 0,
        ("routed", "lost"): 1, ("unroutable", "lost"): 1, ("refused", "lost"): 0}
    conn.close()


# -- exchange-to-exchange and alternate exchanges --------------------------------------------


def test_a_delayed_exchange_reached_through_a_binding_or_as_an_alternate_holds_once(
        broker: InProcessBroker) -> None:
    """As the plugin (its route is called for every exchange RabbitMQ's routing reaches): a
    message with x-delay that reaches a delayed exchange through an exchange-to-exchange
    binding or as the alternate exchange is held by THAT exchange and routed through its type
    at its due time, once; its other routes take it at once; once it comes out (x-delay now
    minus the delay) a delayed exchange after it routes it at once instead of holding it
    again. The publisher's confirm covers the hold; a held message is not returned."""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _c, _m, _p, body: returned.append(body))
    ch.exchange_declare("src", "direct")
    delayed(ch, "dx")
    delayed(ch, "dx2", "fanout")
    ch.exchange_bind("dx", "src", "k")
    ch.exchange_bind("dx", "src", "k2")  # two paths to dx: held once all the same
    ch.exchange_bind("dx2", "dx", "k")  # out of dx, through a second delayed exchange
    at_once = bound_queue(ch, "src")
    via_dx = bound_queue(ch, "dx")
    via_dx2 = bound_queue(ch, "dx2", "")
    ch.exchange_declare("lost", "direct", arguments={"alternate-exchange": "dx"})
    started = time.monotonic()
    for exchange, body in (("src", b"e2e"), ("lost", b"ae")):
        ch.basic_publish(exchange, "k", body, pika.BasicProperties(headers={"x-delay": 1000}),
                         mandatory=True)
    assert get(ch, at_once)[1] == b"e2e"  # type: ignore[index]
    assert get(ch, via_dx) is None and get(ch, via_dx2) is None  # held by dx
    got: dict[str, list[tuple[bytes, str, Any, float]]] = {via_dx: [], via_dx2: []}
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and not all(len(v) == 2 for v in got.values()):
        for queue, rows in got.items():
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                rows.append((body, method.exchange, props.headers, time.monotonic()))
        time.sleep(0.02)
    for queue in (via_dx, via_dx2):
        assert sorted(row[:3] for row in got[queue]) == [
            (b"ae", "lost", {"x-delay": -1000}), (b"e2e", "src", {"x-delay": -1000})]
    assert min(row[3] for row in got[via_dx]) - started >= 1.0
    # dx2 routed it as it came out of dx, not 1 s later (a second hold)
    assert max(row[3] for row in got[via_dx2]) - max(row[3] for row in got[via_dx]) < 0.7
    time.sleep(1.2)  # past a second hold's due time: nothing more comes
    assert get(ch, via_dx) is None and get(ch, via_dx2) is None
    assert get(ch, at_once) is None
    assert returned == []
    conn.close()


# -- management and Prometheus ----------------------------------------------------------------


def test_management_lists_counts_and_deletes_held_messages(
    managed_broker: InProcessBroker,
) -> None:
    http = Http.of(managed_broker)
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    delayed(ch, "dx")
    queue = bound_queue(ch, "dx")
    before = int(time.time() * 1000)
    for i, delay in enumerate((60_000, 30_000, 90_000)):
        send(ch, "dx", f"m{i}".encode(), delay)
    view = http.ok("/api/exchanges/%2F/dx")
    assert view["type"] == XDM and view["messages_delayed"] == 3
    assert before + 30_000 <= view["next_due_ms"] <= before + 31_000
    items = http.ok("/api/leveret/exchanges/%2F/dx/delayed?count=2")
    assert [i["payload"] for i in items] == ["m1", "m0"]
    assert items[0]["properties"]["headers"]["x-delay"] == 30_000
    assert items[0]["routing_key"] == "k"
    assert http.delete(f"/api/leveret/exchanges/%2F/dx/delayed/{items[0]['id']}").status == 204
    assert http.delete(f"/api/leveret/exchanges/%2F/dx/delayed/{items[0]['id']}").status == 404
    assert http.get("/api/leveret/exchanges/%2F/dx/delayed?count=x").status == 400
    assert http.get("/api/leveret/exchanges/%2F/amq.direct/delayed").status == 404
    assert [i["payload"] for i in http.ok("/api/leveret/exchanges/%2F/dx/delayed")] == ["m0", "m2"]
    assert http.ok("/api/exchanges/%2F/dx")["messages_delayed"] == 2
    metrics = http.get("/metrics").text
    samples = {(s.name, s.labels.get("exchange")): s.value
               for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples[("leveret_exchange_messages_delayed", "dx")] == 2
    assert get(ch, queue) is None
    conn.close()


def test_definitions_round_trip_delayed_exchanges_not_their_messages(
    managed_broker: InProcessBroker,
) -> None:
    http = Http.of(managed_broker)
    conn = connect(managed_broker.port)
    ch = conn.channel()
    delayed(ch, "dx", "topic")
    ch.exchange_declare("lx", "fanout", durable=True, arguments={"x-delayed-exchange": True})
    send(ch, "dx", b"m", 60_000)
    defs = http.ok("/api/definitions")
    mine = {x["name"]: x for x in defs["exchanges"] if x["name"] in ("dx", "lx")}
    assert mine["dx"]["type"] == XDM and mine["dx"]["arguments"] == {"x-delayed-type": "topic"}
    assert mine["lx"]["arguments"] == {"x-delayed-exchange": True}
    assert "delayed" not in str(defs.get("queues"))
    ch.exchange_delete("dx")
    ch.exchange_delete("lx")
    assert http.post("/api/definitions", defs).status in (200, 201, 204)
    view = http.ok("/api/exchanges/%2F/dx")
    assert view["type"] == XDM and view["messages_delayed"] == 0
    assert http.ok("/api/exchanges/%2F/lx")["messages_delayed"] == 0
    conn.close()


# -- other clients ----------------------------------------------------------------------------


def test_aio_pika_publish_with_confirms(broker: InProcessBroker) -> None:
    async def run() -> list[tuple[bytes, Any]]:
        connection = await aio_pika.connect(broker.url)
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(
            "ax", XDM, arguments={"x-delayed-type": "direct"})
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "k")
        # a double is truncated, as the plugin does (pika cannot send one)
        for delay in (300, 100.9):
            await exchange.publish(aio_pika.Message(str(int(delay)).encode(),
                                                    headers={"x-delay": delay}), "k")
        got = []
        async with queue.iterator() as messages:
            async for message in messages:
                got.append((message.body, message.headers["x-delay"]))
                await message.ack()
                if len(got) == 2:
                    break
        await connection.close()
        return got

    assert asyncio.run(asyncio.wait_for(run(), 10)) == [(b"100", -100), (b"300", -300)]


def test_kombu_producer_and_consumer(broker: InProcessBroker) -> None:
    with kombu.Connection(broker.url) as conn:
        exchange = kombu.Exchange("kx", type=XDM, arguments={"x-delayed-type": "direct"})
        queue = kombu.Queue("kq", exchange, "k", exclusive=True)
        producer = conn.Producer()
        producer.publish(b"hello", exchange=exchange, routing_key="k", declare=[queue],
                         headers={"x-delay": 200}, content_type="application/data")
        simple = conn.SimpleQueue(queue)
        started = time.monotonic()
        message = simple.get(timeout=5)
        assert message.body == b"hello" and time.monotonic() - started >= 0.15
        assert message.headers["x-delay"] == -200
        message.ack()
        simple.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_queue_takes_a_delayed_copy_once_by_its_id(  # type: ignore[no-untyped-def]
        ch, queue_type: str) -> None:
    """A routed delayed copy carries its id (x-leveret-delayed-id: exchange log and offset)
    to its target queues, which keep it without the header and drop a second copy with the
    same id (what a delayed exchange's new leader routes again after a failover:
    tests/cluster/test_delayed_cluster.py forces that); a copy of another id is taken."""
    name = f"ids-{queue_type}"
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    for body, ident in ((b"first", "log1:7"), (b"again", "log1:7"), (b"other", "log1:8"),
                        (b"other log", "log2:7")):
        ch.basic_publish("", name, body, pika.BasicProperties(
            headers={"x-leveret-delayed-id": ident, "h": 1}))
    got = []
    while (row := get(ch, name)) is not None:
        got.append((row[1], row[0].headers))
    assert got == [(b"first", {"h": 1}), (b"other", {"h": 1}), (b"other log", {"h": 1})]



def test_a_stream_takes_a_delayed_copy_once_by_its_id(broker: InProcessBroker) -> None:
    """As a queue does (above), in memory on the stream's leader: a second copy with the
    same id is not appended, and the kept copy has no id header."""
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ids-stream", durable=True, arguments={"x-queue-type": "stream"})
    for body, ident in ((b"first", "log1:7"), (b"again", "log1:7"), (b"other", "log1:8")):
        ch.basic_publish("", "ids-stream", body, pika.BasicProperties(
            headers={"x-leveret-delayed-id": ident, "h": 1}))
    ch.basic_qos(prefetch_count=10)
    got: list[tuple[bytes, dict[str, Any]]] = []
    ch.basic_consume("ids-stream", lambda _c, _m, props, body: got.append(
        (body, {k: v for k, v in props.headers.items() if k != "x-stream-offset"})),
        arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.process_data_events(0.5)
    conn.close()
    assert got == [(b"first", {"h": 1}), (b"other", {"h": 1})]


def test_a_client_cannot_declare_a_delayed_log(ch) -> None:  # type: ignore[no-untyped-def]
    """The type of a delayed exchange's log in a cluster's topology is the broker's."""
    code, text = channel_error(lambda: ch.queue_declare(
        "mine", durable=True, arguments={"x-queue-type": "x-delayed-log"}))
    assert code == 406 and "unsupported queue type 'x-delayed-log'" in text


def test_a_copy_a_full_queue_of_this_node_refuses_is_dropped_as_before(
        managed_broker: InProcessBroker) -> None:
    """A queue of this node at its limit with reject-publish refuses the copy: it is dropped
    (as the plugin's, and as before); only a copy to a queue written by another node is
    routed again (tests/cluster/test_delayed_cluster.py)."""
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    delayed(ch, "dx-full")
    ch.queue_declare("full", durable=True, arguments={"x-max-length": 1,
                                                      "x-overflow": "reject-publish"})
    ch.queue_bind("full", "dx-full", "k")
    ch.basic_publish("", "full", b"filler")
    send(ch, "dx-full", b"later", 100)
    time.sleep(1)
    assert [body for _props, body in [get(ch, "full")]] == [b"filler"]
    time.sleep(2)
    assert get(ch, "full") is None
    view = Http.of(managed_broker).ok("/api/exchanges/%2F/dx-full")
    assert view["messages_delayed"] == 0 and view["delayed_refused"] == 0
    conn.close()


def test_an_answer_to_an_older_terms_copy_records_nothing(broker: InProcessBroker,
                                                           ch: Any) -> None:
    """A leader deposed and elected again while its copies were on their way routes what
    they carried again: an answer to an older term's copy must not record the message as
    routed (only this term's answers do), or a refusal of this term's copy would find it
    recorded and a failover then would skip it."""
    delayed(ch, "dterm")
    bound_queue(ch, "dterm")
    send(ch, "dterm", b"later", delay=600_000)
    vhost = broker.broker.vhosts["/"]

    def held() -> list[int]:
        store = vhost.exchanges["dterm"].store
        head = store.index.peek(store.routed)
        return [] if head is None else [head[1]]

    def change_role() -> tuple[int, int]:
        store = vhost.exchanges["dterm"].store
        term = store.term
        store.follow()  # deposed ...
        store.lead()  # ... and elected again
        return term, store.term

    (offset,) = broker.call(held)
    old, new = broker.call(change_role)
    assert new != old
    broker.call(lambda: vhost.exchanges["dterm"].store.routed_one(offset, old))
    time.sleep(0.3)  # a ROUTED record, if one were written, is written by now
    assert broker.call(held) == [offset]
    broker.call(lambda: vhost.exchanges["dterm"].store.routed_one(offset, new))
    deadline = time.monotonic() + 5
    while broker.call(held) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.call(held) == []
