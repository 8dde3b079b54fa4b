"""amqp091-go, the Go AMQP 0.9.1 client, against Leveret and the reference RabbitMQ.

Each scenario (tests/e2e/clients/go/scenarios.go) runs once against each broker, and the client
must see the same thing on both. The client is Debian's golang-github-rabbitmq-amqp091-go-dev
(1.5.0, sources under /usr/share/gocode); scenarios.go is built once per session with Debian's
golang-go in GOPATH mode, offline, into a temp folder. Without them the tests skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import scenarios

SOURCE = Path(__file__).parent / "clients" / "go" / "scenarios.go"
GOPATH = Path("/usr/share/gocode")
CLIENT = GOPATH / "src" / "github.com" / "rabbitmq" / "amqp091-go"


@pytest.fixture(scope="session")
def go_scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenarios program, built against the Debian amqp091-go sources."""
    if shutil.which("go") is None:
        pytest.skip("Go is not installed (apt-get install golang-go)")
    if not (CLIENT / "channel.go").is_file():
        pytest.skip("amqp091-go is not installed (apt-get install "
                    "golang-github-rabbitmq-amqp091-go-dev)")
    out = tmp_path_factory.mktemp("go-scenarios")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOFLAGS": "",
           "GOENV": "off", "GOCACHE": str(out / "cache"), "CGO_ENABLED": "0"}
    binary = out / "scenarios"
    result = subprocess.run(["go", "build", "-o", str(binary), str(SOURCE)], cwd=out, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"go build failed:\n{result.stderr}"
    return binary


def run_scenario(binary: Path, port: int, scenario: str, prefix: str) -> dict[str, Any]:
    return scenarios.run_scenario([str(binary)], f"amqp://guest:guest@127.0.0.1:{port}/",
                                  scenario, prefix)


def prefix() -> str:
    return f"go-{uuid.uuid4().hex[:8]}"


def test_publish_confirm_consume(go_scenarios: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(go_scenarios, target[1], "basics", prefix())
    # deleting the queue cancels the channel's own consumer: NotifyCancel, after the 5 messages
    assert seen == {"received": ["m0", "m1", "m2", "m3", "m4", "cancelled"]}


def test_update_secret_keeps_the_consumer(go_scenarios: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(go_scenarios, target[1], "update_secret", prefix())
    assert seen == {"received": ["before", "after"], "update_secret": None}


def test_second_exclusive_consumer_from_another_channel(
    go_scenarios: Path, target: tuple[str, int]
) -> None:
    name = prefix()
    seen = run_scenario(go_scenarios, target[1], "exclusive_other_channel", name)
    refused = {"code": 403, "server": True,
               "text": f"ACCESS_REFUSED - queue '{name}-excl' in vhost '/' in exclusive use"}
    # Consume fails (no consume-ok first); only channel 2 closes, with that reason
    assert seen == {"error": refused, "channel2_closed_with": refused,
                    "channel1_open": True, "channel2_open": False, "connection_open": True}


def test_queue_deleted_under_its_consumer(go_scenarios: Path, target: tuple[str, int]) -> None:
    seen = run_scenario(go_scenarios, target[1], "delete_under_consumer", prefix())
    # In the order the client reads them off the socket: RabbitMQ answers delete-ok on the
    # deleting channel first, then tells the consumer with basic.cancel (NotifyCancel gets it).
    assert seen == {"events": ["delete-ok", "cancelled"], "cancel_notified": True,
                    "message_count": 0}
