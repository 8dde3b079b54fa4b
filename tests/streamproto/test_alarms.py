"""A resource alarm blocks stream-protocol publishers as it blocks AMQP ones: the publish that
met the alarm is taken, then the socket is not read until the alarm clears."""

from __future__ import annotations

import struct
from pathlib import Path

from support.brokers import InProcessBroker
from support.ports import free_port

from .raw import RawStream, s


def test_memory_alarm_blocks_stream_publishers(tmp_path: Path) -> None:
    port = free_port()
    broker = InProcessBroker(tmp_path / "data", stream_port=port,
                             vm_memory_high_watermark=0.0000001).start()
    try:
        assert broker.call(lambda: broker.broker.alarm) == "low on memory"
        client = RawStream(port, timeout=1.0)
        assert client.handshake() == 1
        client.request(0x0D, s("alarmed") + struct.pack(">i", 0))
        assert client.response(0x0D)[1] == 1
        client.request(0x01, struct.pack(">B", 1) + s("") + s("alarmed"))
        assert client.response(0x01)[1] == 1

        def publish(pid: int) -> None:
            client.send(0x02, 1, struct.pack(">BiQI", 1, 1, pid, 1) + b"x")

        publish(1)
        assert client.next(0x03)[9:17] == struct.pack(">Q", 1)  # taken, then blocked
        publish(2)
        try:
            client.next(0x03)
            raise AssertionError("a blocked publisher was read")
        except TimeoutError:
            pass

        def clear() -> None:
            alarms = broker.broker.alarms
            alarms.memory_high_watermark = 1.0
            alarms.sample()

        broker.call(clear)
        client.sock.settimeout(5)
        assert client.next(0x03)[9:17] == struct.pack(">Q", 2)
    finally:
        broker.stop()
