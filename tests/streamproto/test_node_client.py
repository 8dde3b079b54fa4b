"""The Node stream client (npm `rabbitmq-stream-js-client`, pinned in node/package.json),
unchanged, against `leveret serve`: it sends ExchangeCommandVersions right after Open, publishes
with a reference, reads its publisher sequence, consumes from first, stores and queries an
offset. Installed from the npm registry on first use; skipped without Node.js and npm."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .conftest import StreamBroker


def test_node_client(lev: StreamBroker, name: str, node_client: Path) -> None:
    result = subprocess.run(["node", str(node_client), str(lev.stream_port), name],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "sequence": 5,
        "received": [[i, f"m{i}", f"p{i}"] for i in range(5)],
        "stored": 3,
    }


def test_node_client_chunks(lev: StreamBroker, name: str, node_client: Path) -> None:
    """5,000 messages sent with a reference: each chunk's header as the client decodes it has
    epoch 1 (a fresh stream, as osiris's writer starts) and the trailer length of the
    publisher's tracking entry (10 bytes and the reference); the writer cut what it was sent
    into chunks from 32 records up, so a consumer from `last` gets the last of them, not all."""
    result = subprocess.run(["node", str(node_client.parent / "chunks.js"), str(lev.stream_port),
                             name], capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    headers = seen["headers"]
    assert headers[0] == {"first": 0, "entries": 32, "epoch": 1, "trailer": 10 + len("node-pub")}
    assert {(h["epoch"], h["trailer"]) for h in headers} == {(1, 18)}
    assert sum(h["entries"] for h in headers) == seen["first"] == 5000
    assert seen["lastOfLast"] == "m4999" and 0 < seen["last"] < 5000
