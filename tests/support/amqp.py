"""Small helpers for tests that drive pika's blocking client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest


def connect(port: int, **params: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **params))


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def channel_error(call: Callable[[], Any]) -> tuple[int, str]:
    """Run a call that must fail with channel.close; return (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        call()
    return info.value.reply_code, info.value.reply_text


def connection_error(call: Callable[[], Any]) -> tuple[int, str]:
    """Run a call that must fail with connection.close; return (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        call()
    return info.value.reply_code, info.value.reply_text


def drain(connection: pika.BlockingConnection, until: Callable[[], bool],
          timeout: float = 5.0) -> None:
    """Process events until a condition holds, or the timeout passes."""
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)


def consume(channel: Any, queue: str, count: int, *, arguments: dict[str, Any] | None = None,
            prefetch: int = 100, ack: bool = True, timeout: float = 5.0,
            tag: str = "") -> list[tuple[Any, Any, bytes]]:
    """Consume up to `count` messages (acking them) and cancel; returns (method, props, body)."""
    channel.basic_qos(prefetch_count=prefetch)
    got: list[tuple[Any, Any, bytes]] = []

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((method, props, body))
        if ack:
            ch.basic_ack(method.delivery_tag)

    ctag = channel.basic_consume(queue, on_message, arguments=arguments or {},
                                 consumer_tag=tag or None)
    drain(channel.connection, lambda: len(got) >= count, timeout)
    channel.basic_cancel(ctag)
    return got


def offsets(messages: list[tuple[Any, Any, bytes]]) -> list[int]:
    return [props.headers["x-stream-offset"] for _m, props, _b in messages]
