"""Differential: a delayed exchange reached through an exchange-to-exchange binding or as an
alternate exchange, against RabbitMQ 3.10.8 with the delayed-message plugin 3.10.2, with pika.
Debian's package has no such plugin: the test compiles it from the source that
LEVERET_DELAYED_PLUGIN_SRC names (the src/ folder of a checkout of
rabbitmq/rabbitmq-delayed-message-exchange at tag 3.10.2) and is skipped without it.

Both must agree on what goes where and when: the message is held by the delayed exchange it
reaches (its other routes take it at once), routed through that exchange's type once at its
due time with the exchange it was published to, and a delayed exchange after it routes it at
once (not held a second time). They differ, as documented (docs/DELAYED-MESSAGES.md), in the
`x-delay` a consumer reads after the delay: the plugin 3.10.2 on RabbitMQ 3.10.8 leaves the
published value on the wire (its swap to minus the delay changes only the decoded copy that
routing reads), Leveret gives minus the delay (what the plugin 4.x sends).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from support.brokers import InProcessBroker
from support.reference import Reference, running, start_delayed_reference

DELAY_MS = 1000


@pytest.fixture(scope="module")
def delayed_reference() -> Iterator[Reference]:
    yield from running(start_delayed_reference)


def scenario(url: str) -> dict[str, Any]:
    """What each queue got, and when (whole multiples of the delay after publishing)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("src", "direct")
    ch.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.exchange_declare("dx2", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    ch.exchange_declare("lost", "direct", arguments={"alternate-exchange": "dx"})
    ch.exchange_bind("dx", "src", "k")
    ch.exchange_bind("dx2", "dx", "k")
    queues = {}
    for name, exchange, key in (("now", "src", "k"), ("dx", "dx", "k"), ("dx2", "dx2", "")):
        queues[name] = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queues[name], exchange, key)
    started = time.monotonic()
    for exchange, body in (("src", b"e2e"), ("lost", b"ae")):
        ch.basic_publish(exchange, "k", body, pika.BasicProperties(
            headers={"x-delay": DELAY_MS, "h": "v"}))
    got: dict[str, list[tuple[bytes, str, Any, int]]] = {name: [] for name in queues}
    deadline = started + 3 * DELAY_MS / 1000
    while time.monotonic() < deadline:
        for name, queue in queues.items():
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                waited = round((time.monotonic() - started) / (DELAY_MS / 1000))
                headers = dict(props.headers or {})
                delay = headers.pop("x-delay")
                assert abs(delay) == DELAY_MS
                got[name].append((body, method.exchange, headers, waited))
        time.sleep(0.02)
    conn.close()
    return {name: sorted(rows) for name, rows in got.items()}


@pytest.mark.slow  # a RabbitMQ node boots for it (about 14 s): over the CI budget
def test_e2e_and_alternate_exchange_holds_match_the_plugin(
        broker: InProcessBroker, delayed_reference: Reference) -> None:
    leveret = scenario(f"amqp://guest:guest@127.0.0.1:{broker.port}/")
    rabbitmq = scenario(delayed_reference.url)
    assert leveret == rabbitmq
    assert leveret == {
        "now": [(b"e2e", "src", {"h": "v"}, 0)],
        "dx": [(b"ae", "lost", {"h": "v"}, 1), (b"e2e", "src", {"h": "v"}, 1)],
        "dx2": [(b"ae", "lost", {"h": "v"}, 1), (b"e2e", "src", {"h": "v"}, 1)],
    }
