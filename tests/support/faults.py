"""Helpers for fault tests: find a queue's files, damage them, read streams back, publish with
confirms and count what was acked and nacked."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from leveret.storage import inspect

JSON_LOG_LINE = "{"


def queue_dir(data_dir: Path, name: str, vhost: str = "/") -> Path:
    """The storage folder of a durable queue, from the metadata database."""
    db = sqlite3.connect(str(data_dir / "metadata.sqlite3"))
    try:
        row = db.execute(
            "SELECT storage_id FROM queues WHERE vhost = ? AND name = ?", (vhost, name)
        ).fetchone()
    finally:
        db.close()
    assert row is not None and row[0], f"no storage for queue {name!r}"
    return data_dir / "queues" / row[0]


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.segment"))


def chunks(segment: Path) -> list[dict[str, Any]]:
    """The chunks of a segment file (position, first_offset, records, size, ...)."""
    return list(inspect.dump_segment(segment))


def flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def error_lines(output: str) -> list[str]:
    """The lines of a broker's output that are not JSON log lines."""
    return [line for line in output.splitlines() if line and not line.startswith(JSON_LOG_LINE)]


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=None))


def publish_confirmed(channel: Any, queue: str, bodies: list[bytes],
                      persistent: bool = True) -> tuple[list[bytes], list[bytes]]:
    """Publish each body with confirms (channel in confirm mode); (acked, nacked)."""
    acked: list[bytes] = []
    nacked: list[bytes] = []
    props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
    for body in bodies:
        try:
            channel.basic_publish("", queue, body, props)
            acked.append(body)
        except pika.exceptions.NackError:
            nacked.append(body)
    return acked, nacked


def read_stream(port: int, name: str, offset: Any = "first", limit: int = 10**9,
                timeout: float = 5.0, idle: float = 1.0) -> tuple[list[tuple[int, bytes]], bool]:
    """Consume a stream from `offset`: ((offset, body) pairs, whether the broker cancelled the
    consumer). Stops at `limit` messages, after `idle` seconds without one, or at `timeout`."""
    conn = connect(port)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        got: list[tuple[int, bytes]] = []
        cancelled: list[Any] = []
        ch.add_on_cancel_callback(cancelled.append)

        def on_message(c: Any, method: Any, props: Any, body: bytes) -> None:
            got.append((props.headers["x-stream-offset"], body))
            c.basic_ack(method.delivery_tag)

        ch.basic_consume(name, on_message, arguments={"x-stream-offset": offset})
        deadline = time.monotonic() + timeout
        last, seen = time.monotonic(), 0
        while time.monotonic() < deadline and len(got) < limit and not cancelled:
            conn.process_data_events(time_limit=0.05)
            if len(got) != seen:
                last, seen = time.monotonic(), len(got)
            elif time.monotonic() - last > idle:
                break
        return got, bool(cancelled)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def drain_queue(port: int, name: str) -> list[tuple[bytes, bool]]:
    """basic.get every message of a classic queue (acking it): (body, redelivered) pairs."""
    conn = connect(port)
    try:
        ch = conn.channel()
        out: list[tuple[bytes, bool]] = []
        while True:
            method, _props, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                return out
            out.append((body, method.redelivered))
    finally:
        conn.close()


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size: str, read_only: bool = False) -> Iterator[bool]:
    """Mount a small tmpfs (root only); yields False, and mounts nothing, where that is not
    allowed."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


@contextlib.contextmanager
def read_only_bind(directory: Path) -> Iterator[bool]:
    """Make an existing directory read-only with a bind mount (root only); yields False
    where that is not allowed."""
    done = subprocess.run(["mount", "--bind", str(directory), str(directory)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        yield False
        return
    try:
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)],
                                 capture_output=True, check=False)
        yield remount.returncode == 0
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)
