"""Permissions on the stream port are AMQP's: configure for Create and Delete, write for
DeclarePublisher, read for Subscribe and QueryOffset; a vhost without permissions is refused
at Open. The user and its permissions come from a definitions file loaded at boot."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from leveret.broker.access.auth import hash_password

from .conftest import StreamBroker, start_stream_broker
from .raw import RawStream, s, strmap


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamBroker]:
    base = tmp_path_factory.mktemp("perm")
    definitions = {
        "users": [
            {"name": "guest", "password_hash": hash_password("guest"), "tags": ["administrator"],
             "hashing_algorithm": "rabbit_password_hashing_sha256"},
            {"name": "app", "password_hash": hash_password("secret"), "tags": [],
             "hashing_algorithm": "rabbit_password_hashing_sha256"},
        ],
        "vhosts": [{"name": "/"}, {"name": "other"}],
        "permissions": [
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "app", "vhost": "/", "configure": "^app-", "write": "^app-",
             "read": "^app-"},
        ],
        "queues": [
            {"name": "locked", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-queue-type": "stream"}},
        ],
        "exchanges": [], "bindings": [], "policies": [], "parameters": [],
    }
    path = base / "definitions.json"
    path.write_text(json.dumps(definitions))
    broker = start_stream_broker(base / "data", "--definitions", str(path))
    yield broker
    broker.process.kill()


def app(broker: StreamBroker) -> RawStream:
    client = RawStream(broker.stream_port)
    assert client.handshake("app", "secret") == 1
    return client


def code(client: RawStream, key: int, body: bytes) -> int:
    client.request(key, body)
    return client.response(key)[1]


def test_refused_vhost(limited: StreamBroker) -> None:
    client = RawStream(limited.stream_port)
    assert client.handshake("app", "secret", vhost="other") == 12
    assert client.closed_by_server()


def test_each_command_checks_its_permission(limited: StreamBroker) -> None:
    client = app(limited)
    assert code(client, 0x0D, s("locked-2") + strmap({})) == 16
    assert code(client, 0x0D, s("app-stream") + strmap({})) == 1
    assert code(client, 0x0E, s("locked")) == 16
    assert code(client, 0x01, struct.pack(">B", 1) + s("") + s("locked")) == 16
    assert code(client, 0x01, struct.pack(">B", 1) + s("") + s("app-stream")) == 1
    subscribe = struct.pack(">B", 1) + s("locked") + struct.pack(">HH", 1, 1) + strmap({})
    assert code(client, 0x07, subscribe) == 16
    assert code(client, 0x0B, s("ref") + s("locked")) == 16
    assert code(client, 0x0E, s("app-stream")) == 1
