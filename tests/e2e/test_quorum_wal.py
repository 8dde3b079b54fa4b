"""A real `leveret serve` under LEVERET_QUEUE_FSYNC=always, 20 quorum queues published to with
confirms from 20 connections at once (so that the node's group-commit rounds hold many logs and
go to its write-ahead log), killed with -9, then a power loss simulated: every segment and index
cut back to its size when all was durable in place (kill -9 alone cannot show it: the page
cache survives a killed process). queue_wal_from = 1 sends every round to the WAL but each
log's first, so that what was durable in place is known from outside. The WAL still holds what
was confirmed since; at the restart its replay writes it back: every confirmed message is
there."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pika
import pytest
from support.amqp import connect
from support.brokers import BrokerProcess

from leveret.broker.process.config import ConfigError, load

QUEUES = 20
MESSAGES = 40  # per queue, after the first
QUORUM = {"x-queue-type": "quorum"}


def _publish(port: int, queue: str, bodies: list[bytes], confirmed: list[bytes]) -> None:
    connection = connect(port)
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:  # each waits for its confirm
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
        confirmed.append(body)
    connection.close()


def _segment_files(data_dir: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in (data_dir / "queues").rglob("*")
            if path.is_file() and path.suffix in (".segment", ".index")}


def test_confirmed_messages_survive_a_power_loss_through_the_wal(tmp_path: Path) -> None:
    # every round but a log's first (in place: its durable point is not known yet) goes to
    # the WAL, so that what is durable in place is known: the sizes after the first phase
    node = BrokerProcess(tmp_path / "data", env={"LEVERET_QUEUE_FSYNC": "always",
                                                 "LEVERET_QUEUE_WAL_FROM": "1"}).start()
    try:
        names = [f"wal-{i}" for i in range(QUEUES)]
        connection = connect(node.port)
        channel = connection.channel()
        channel.confirm_delivery()
        for name in names:
            channel.queue_declare(name, durable=True, arguments=QUORUM)
            # each log's first sync since it opened is in place: then all is durable there
            channel.basic_publish("", name, b"first", pika.BasicProperties(delivery_mode=2))
        connection.close()
        time.sleep(0.5)  # (nothing written waits: every write so far was confirmed)
        durable = _segment_files(node.data_dir)

        confirmed: dict[str, list[bytes]] = {name: [] for name in names}
        threads = [threading.Thread(target=_publish, args=(
            node.port, name, [b"%s-%d" % (name.encode(), n) for n in range(MESSAGES)],
            confirmed[name])) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert all(len(bodies) == MESSAGES for bodies in confirmed.values())
        wal_bytes = sum(p.stat().st_size for p in (node.data_dir / "wal").iterdir())
        assert wal_bytes > 8 * 1024  # the rounds went to the WAL (8: its file header)
    finally:
        node.kill()

    for path in _segment_files(node.data_dir):  # the power loss
        os_truncate(path, durable.get(path, 8))

    node.restart()
    try:
        connection = connect(node.port)
        channel = connection.channel()
        for name in names:
            got = []
            while True:
                method, _props, body = channel.basic_get(name, auto_ack=True)
                if method is None:
                    break
                got.append(body)
            assert got == [b"first", *confirmed[name]], name
        connection.close()
        log_text = node.log_path.read_text()
        assert "write-ahead log replayed" in log_text
    finally:
        node.kill()


def os_truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size)


def test_queue_wal_from_is_a_number_of_logs(tmp_path: Path) -> None:
    assert load(env={"LEVERET_QUEUE_WAL_FROM": "0"}).queue_wal_from == 0
    with pytest.raises(ConfigError, match="'queue_wal_from': a number of logs"):
        load(env={"LEVERET_QUEUE_WAL_FROM": "-1"})
