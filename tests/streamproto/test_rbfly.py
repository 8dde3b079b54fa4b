"""rbfly (a second asyncio stream client from PyPI), unchanged, against `leveret serve`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .conftest import StreamBroker

rbs = pytest.importorskip("rbfly.streams")
pytestmark = pytest.mark.asyncio


async def test_publish_and_consume(lev: StreamBroker, name: str) -> None:
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{lev.stream_port}")
    await client.create_stream(name)
    async with client.publisher(name) as publisher:
        await publisher.send(b"bytes")
        await publisher.send("text")
        await publisher.send({"a": 1})
    got: list[tuple[int, Any]] = []

    async def consume() -> None:
        async for message in client.subscribe(name, offset=rbs.Offset.FIRST):
            got.append((rbs.get_message_ctx().stream_offset, message))
            if len(got) == 3:
                break

    await asyncio.wait_for(consume(), 10)
    assert got == [(0, b"bytes"), (1, "text"), (2, {"a": 1})]
    async def from_offset() -> list[Any]:
        out = []
        async for message in client.subscribe(name, offset=rbs.Offset.offset(1)):
            out.append(message)
            if len(out) == 2:
                return out
        return out

    assert await asyncio.wait_for(from_offset(), 10) == ["text", {"a": 1}]
    await client.delete_stream(name)
    await client.disconnect()
