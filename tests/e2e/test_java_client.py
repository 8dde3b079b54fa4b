"""The RabbitMQ Java client against Leveret and the reference RabbitMQ.

Each scenario (tests/e2e/clients/java/Scenarios.java) runs once against each broker, and the
client must see the same thing on both. The client is Debian's librabbitmq-client-java (5.0.0,
/usr/share/java/amqp-client.jar, with slf4j from libslf4j-java); Scenarios.java is compiled once
per session into a temp folder with javac. Without the jars or a JDK the tests skip.

There is no update-secret scenario: the 5.0.0 client has no Connection.updateSecret.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import scenarios

SOURCE = Path(__file__).parent / "clients" / "java" / "Scenarios.java"
JARS = [Path("/usr/share/java") / name
        for name in ("amqp-client.jar", "slf4j-api.jar", "slf4j-nop.jar")]


@pytest.fixture(scope="session")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The classpath that runs Scenarios: the compiled class and the Debian jars."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("no JDK (apt-get install openjdk-17-jdk-headless)")
    missing = [str(jar) for jar in JARS if not jar.is_file()]
    if missing:
        pytest.skip(f"the Java client is not installed, no {', '.join(missing)} "
                    "(apt-get install librabbitmq-client-java)")
    classpath = ":".join(str(jar) for jar in JARS)
    out = tmp_path_factory.mktemp("java-scenarios")
    result = subprocess.run(["javac", "-d", str(out), "-cp", classpath, str(SOURCE)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"javac failed:\n{result.stderr}"
    return f"{out}:{classpath}"


def run_scenario(classpath: str, port: int, scenario: str, prefix: str) -> dict[str, Any]:
    # No trailing slash: to the Java client "amqp://host:port/" means the vhost "".
    return scenarios.run_scenario(["java", "-cp", classpath, "Scenarios"],
                                  f"amqp://guest:guest@127.0.0.1:{port}", scenario, prefix)


def prefix() -> str:
    return f"java-{uuid.uuid4().hex[:8]}"


def test_publish_confirm_consume(java_classpath: str, target: tuple[str, int]) -> None:
    seen = run_scenario(java_classpath, target[1], "basics", prefix())
    # deleting the queue cancels the channel's own consumer: handleCancel, after the 5 messages
    assert seen == {"received": ["m0", "m1", "m2", "m3", "m4", "cancelled"]}


def test_second_exclusive_consumer_from_another_channel(
    java_classpath: str, target: tuple[str, int]
) -> None:
    name = prefix()
    seen = run_scenario(java_classpath, target[1], "exclusive_other_channel", name)
    refused = {"code": 403, "hard": False,
               "text": f"ACCESS_REFUSED - queue '{name}-excl' in vhost '/' in exclusive use"}
    # basicConsume throws (no consume-ok first); only channel 2 closes, with that reason
    assert seen == {"error": refused, "channel2_closed_with": refused,
                    "channel1_open": True, "channel2_open": False, "connection_open": True}


def test_queue_deleted_under_its_consumer(java_classpath: str, target: tuple[str, int]) -> None:
    seen = run_scenario(java_classpath, target[1], "delete_under_consumer", prefix())
    # In the order the client's reader thread reads them: RabbitMQ answers delete-ok on the
    # deleting channel first, then tells the consumer with basic.cancel.
    assert seen == {"events": ["delete-ok", "cancelled"], "message_count": 0}
