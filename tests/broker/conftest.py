"""Fixtures shared by the rooms' unit tests: a broker's model composed without any listener."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leveret.broker.broker import Broker
from leveret.broker.process.config import Config


@pytest.fixture
async def local_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """One node as `leveret serve` composes its model (the default vhost and user, the
    SQLite metadata store in a temporary data directory), and no AMQP, stream or HTTP
    listener."""
    (tmp_path / "data").mkdir()
    broker = Broker(Config(data_dir=tmp_path / "data", port=0, node_name="solo"),
                    asyncio.get_running_loop())
    yield broker
    broker.close()
