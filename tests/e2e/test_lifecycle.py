"""`leveret serve` as an operator runs it: SIGTERM closes every connection with 320 and exits
0; a port that is taken is one line and exit 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands
from support.brokers import BrokerProcess
from support.rawamqp import RawClient

SHUTDOWN = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"


def test_sigterm_closes_connections_with_320_and_exits_0(broker_process: BrokerProcess) -> None:
    port = broker_process.port
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"hello")
    with RawClient(port) as raw, RawClient(port) as handshaking:
        raw.handshake()
        raw.open_channel(1)
        handshaking.begin()  # not yet open: simply dropped
        assert broker_process.proc is not None
        broker_process.proc.send_signal(signal.SIGTERM)

        close = raw.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            320,
            SHUTDOWN,
            0,
            0,
        )
        raw.send_method(0, commands.Connection.CloseOk())
        raw.assert_closed(2.0)
        handshaking.assert_closed(2.0)

        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.1)
        assert (info.value.reply_code, info.value.reply_text) == (320, SHUTDOWN)

    assert broker_process.proc.wait(15) == 0
    log = broker_process.log()
    assert '"event": "shutting down"' in log
    assert '"event": "stopped"' in log


def test_sigterm_with_a_client_that_never_answers_still_exits_0(
    broker_process: BrokerProcess,
) -> None:
    """A client that ignores connection.close cannot hold the broker up."""
    with RawClient(broker_process.port) as raw:
        raw.handshake()
        assert broker_process.proc is not None
        started = time.monotonic()
        broker_process.proc.send_signal(signal.SIGTERM)
        assert raw.expect(commands.Connection.Close, 0).reply_code == 320
        assert broker_process.proc.wait(15) == 0
        assert time.monotonic() - started < 5
        raw.assert_closed(1.0)


def test_second_broker_on_a_taken_port_says_so_in_one_line(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    port = broker_process.port
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERET_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "leveret.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "second"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert str(port) in lines[0]
    assert "already in use" in lines[0]
    assert "Traceback" not in lines[0]
    # and the first broker never noticed
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    connection.channel().queue_declare("", exclusive=True)
    connection.close()


def test_the_uvloop_event_loop_serves_clients(tmp_path: Path) -> None:
    """Regression: `--loop uvloop` refused every connection (its transports are not
    asyncio.Transport subclasses, and an assertion said they must be)."""
    pytest.importorskip("uvloop")
    broker = BrokerProcess(tmp_path / "data", args=["--loop", "uvloop"]).start()
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("uv-stream", durable=True, arguments={"x-queue-type": "stream"})
        for i in range(100):
            channel.basic_publish("", "uv-stream", b"%d" % i)
        channel.basic_qos(prefetch_count=50)
        got: list[int] = []
        for method, _props, body in channel.consume(
            "uv-stream", arguments={"x-stream-offset": "first"}, inactivity_timeout=10
        ):
            assert method is not None, "no delivery within 10 s"
            got.append(int(body))
            channel.basic_ack(method.delivery_tag)
            if len(got) == 100:
                break
        assert got == list(range(100))
        connection.close()
        assert "Traceback" not in broker.log()
    finally:
        broker.kill()
