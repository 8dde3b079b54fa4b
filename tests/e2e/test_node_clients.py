"""amqplib, the Node AMQP 0.9.1 client, against Leveret and the reference RabbitMQ.

Each scenario (tests/e2e/clients/node/scenarios.js) runs once against each broker, and the
client must see the same thing on both. amqplib is installed from the npm registry into that
folder on first use (pinned in its package.json); without Node.js and npm the tests skip.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from support import npm, scenarios
from support.brokers import BrokerProcess

NODE_DIR = Path(__file__).parent / "clients" / "node"


@pytest.fixture(scope="session")
def amqplib() -> Path:
    """The scenarios script, with amqplib installed beside it."""
    npm.installed(NODE_DIR, "amqplib")
    return NODE_DIR / "scenarios.js"


def run_scenario(script: Path, port: int, scenario: str,
                 host: str = "127.0.0.1") -> dict[str, Any]:
    return scenarios.run_scenario(["node", str(script)], f"amqp://guest:guest@{host}:{port}/",
                                  scenario, f"node-{uuid.uuid4().hex[:8]}")


def test_publish_confirm_consume(amqplib: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(amqplib, target[1], "basics")
    # deleting the queue cancels the channel's own consumer: amqplib hands it a null message
    assert seen == {"received": ["m0", "m1", "m2", "m3", "m4", "cancelled"]}


def test_ipv6_loopback_on_the_default_listener(amqplib: Path, tmp_path: Path) -> None:
    """Node 17+ tries ::1 first for localhost: `leveret serve` with no --host must answer
    there (a dual-stack listener), as RabbitMQ does."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir, host=None).start()
    try:
        for host in ("[::1]", "127.0.0.1", "localhost"):
            seen = run_scenario(amqplib, broker.port, "basics", host=host)
            assert seen == {"received": ["m0", "m1", "m2", "m3", "m4", "cancelled"]}, host
    finally:
        broker.kill()


def test_close_with_publishes_still_buffered(amqplib: Path, target: tuple[str, int]) -> None:
    """amqplib writes connection.close ahead of a channel's buffered publishes. RabbitMQ
    reads on (and drops them) after its close-ok until the client closes the socket; a broker
    that closes at once resets the client's writes: EPIPE, and close() never resolves
    (amqplib's own callback_api suite hung on 'find high watermark')."""
    seen = run_scenario(amqplib, target[1], "close_behind_publishes")
    assert seen == {"filled": True, "close": "closed", "errors": []}


def test_update_secret_keeps_the_consumer(amqplib: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(amqplib, target[1], "update_secret")
    assert seen == {"received": ["before", "after"]}




def test_update_secret_with_a_wrong_password(amqplib: Path, target: tuple[str, int]) -> None:
    """Any new secret of an internal user is taken (RabbitMQ re-checks it only with a backend
    whose credentials expire): update-secret-ok, and the connection stays open."""
    seen = run_scenario(amqplib, target[1], "update_secret_wrong_password")
    assert seen == {"error": None, "first": "update-secret-ok"}


def test_second_exclusive_consumer_from_another_channel(
    amqplib: Path, target: tuple[str, int]
) -> None:
    seen = run_scenario(amqplib, target[1], "exclusive_other_channel")
    assert seen["error"]["code"] == 403
    assert "in exclusive use" in seen["error"]["message"]


def test_queue_deleted_under_its_consumer(amqplib: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(amqplib, target[1], "delete_under_consumer")
    # Both come: the consumer's basic.cancel and delete-ok. amqplib runs the consumer callback
    # at once but resolves deleteQueue's promise a microtask later, so the order it shows
    # is not the frames' order; test_java_client and test_go_client check that order.
    assert sorted(seen["events"]) == ["cancelled", "delete-ok"]
    assert seen["message_count"] == 0
