"""Helpers of the Spark tests: stream topologies, reading streams back with pika, input files.

Plain functions over pika's blocking client, independent of the code under test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pika

HERE = Path(__file__).resolve().parent
STREAM_ARGS = {"x-queue-type": "stream"}


def declare_stream(port: int, name: str) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        conn.channel().queue_declare(name, durable=True, arguments=STREAM_ARGS)


def declare_super_stream(port: int, name: str, partitions: int) -> list[str]:
    """The topology `add_super_stream --partitions N` builds, by hand."""
    names = [f"{name}-{i}" for i in range(partitions)]
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
        for i, stream in enumerate(names):
            ch.queue_declare(stream, durable=True, arguments=STREAM_ARGS)
            ch.queue_bind(stream, name, routing_key=str(i))
    return names


def message_count(port: int, name: str) -> int:
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        return int(conn.channel().queue_declare(name, passive=True).method.message_count)


def read_stream(port: int, name: str, idle_s: float = 1.0,
                expect: int | None = None) -> list[tuple[int, bytes, dict[str, Any], Any]]:
    """Every message of a stream from `first`: (offset, body, headers, properties), in order.
    Stops once `expect` messages are in (or the stream's count is reached), or after
    `idle_s` without a delivery."""
    total = message_count(port, name) if expect is None else expect
    got: list[tuple[int, bytes, dict[str, Any], Any]] = []
    if total == 0:
        return got
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)

        def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
            headers = dict(props.headers or {})
            got.append((headers.get("x-stream-offset", -1), body, headers, props))
            c.basic_ack(method.delivery_tag)

        ch.basic_consume(name, on_message, arguments={"x-stream-offset": "first"})
        last = time.monotonic()
        seen = 0
        while len(got) < total and time.monotonic() - last < idle_s:
            conn.process_data_events(time_limit=0.05)
            if len(got) != seen:
                seen, last = len(got), time.monotonic()
    return got


def write_input_files(directory: Path, files: int, rows: int) -> list[int]:
    """`files` JSON-lines files of `rows` ascending ids each; returns all the ids."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = []
    for n in range(files):
        chunk = list(range(n * rows, (n + 1) * rows))
        ids += chunk
        (directory / f"part-{n:04d}.json").write_text(
            "".join(f'{{"id": {i}}}\n' for i in chunk))
    return ids
