"""Fixtures for the storage engine's tests: real logs in tmp_path, driven by a fake clock."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leveret.storage import FakeClock, Log, LogConfig
from leveret.storage import chunk as ck


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000_000)


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., Log]]:
    """Open (or reopen) the log in tmp_path/log with config overrides; closes what it opened."""
    opened: list[Log] = []

    def _open(directory: Path | None = None, **overrides: Any) -> Log:
        overrides.setdefault("clock", clock)
        log = Log.open(directory or tmp_path / "log", LogConfig(**overrides))
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.close()


def craft_chunk(
    n: int,
    data: bytes,
    filters: bytes = b"",
    trailer: bytes = b"",
    first_offset: int = 0,
    timestamp_ms: int = 1,
) -> bytes:
    """A USER chunk with arbitrary sections and valid CRCs, as no encoder would write it."""
    body = data + filters + trailer
    fields = [b"LVCK", ck.CHUNK_VERSION, 0, 0, 0, n, len(data), len(filters), len(trailer)]
    header = bytearray(ck.HEADER.pack(*fields, first_offset, timestamp_ms, 0, ck.crc32c(body), 0))
    struct.pack_into("<I", header, 52, ck.crc32c(bytes(header[:52])))
    return bytes(header) + body


@pytest.fixture
def craft() -> Callable[..., bytes]:
    return craft_chunk


def as_version_1(chunk: bytes) -> bytes:
    """A chunk as format version 1 wrote it, before epochs: a 48-byte header without the epoch."""
    header = bytearray(chunk[:40] + chunk[48:52] + bytes(4))
    header[4] = 1
    struct.pack_into("<I", header, 44, ck.crc32c(bytes(header[:44])))
    return bytes(header) + chunk[ck.HEADER_SIZE:]


@pytest.fixture
def version_1() -> Callable[[bytes], bytes]:
    return as_version_1
