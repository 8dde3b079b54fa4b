"""Every listener of a node in the overview, as RabbitMQ's /api/overview lists them (node,
protocol, ip_address, port; by protocol): the API and the web UI's Listeners table of a
`leveret serve` with AMQP, amqps, the stream protocol and its TLS listener, and the same API
question to the reference RabbitMQ 3.10.8 with its stream and management plugins (skipped
where no local rabbitmq-server can start). The cluster link (`clustering`) is in
tests/cluster/test_cluster_management.py."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.brokers import BrokerProcess
from support.ports import free_port
from support.reference import Reference

from .conftest import UiBroker, log_in


def self_signed(directory: Path) -> tuple[Path, Path]:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem",
         "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost"],
        cwd=directory, check=True, capture_output=True)
    return directory / "cert.pem", directory / "key.pem"


class ListenersBroker(UiBroker):
    def __init__(self, base: Path) -> None:
        super().__init__(base / "data")
        cert, key = self_signed(base)
        self.ports = {"stream": free_port(), "stream/ssl": free_port(), "amqp/ssl": free_port()}
        self.process = BrokerProcess(base / "data", args=[
            "--management-port", str(self.http_port),
            "--stream-port", str(self.ports["stream"]),
            "--stream-tls-port", str(self.ports["stream/ssl"])],
            env={"LEVERET_TLS_CERTFILE": str(cert), "LEVERET_TLS_KEYFILE": str(key),
                 "LEVERET_TLS_PORT": str(self.ports["amqp/ssl"])})


@pytest.fixture(scope="module")
def ui_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiBroker]:
    broker = ListenersBroker(tmp_path_factory.mktemp("listeners")).start()
    yield broker
    broker.process.kill()


def overview(port: int) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return dict(json.loads(reply.read()))


def test_the_api_lists_every_listener(ui_broker: ListenersBroker) -> None:
    data = overview(ui_broker.http_port)
    listeners = data["listeners"]
    assert [(entry["protocol"], entry["port"]) for entry in listeners] == [
        ("amqp", ui_broker.process.port), ("amqp/ssl", ui_broker.ports["amqp/ssl"]),
        ("http", ui_broker.http_port), ("stream", ui_broker.ports["stream"]),
        ("stream/ssl", ui_broker.ports["stream/ssl"])]
    assert {entry["node"] for entry in listeners} == {data["node"]}
    assert all(set(entry) >= {"node", "protocol", "ip_address", "port"} for entry in listeners)


def test_the_ui_shows_every_listener(page: Any, ui_broker: ListenersBroker) -> None:
    from playwright.sync_api import expect

    log_in(page)
    rows = page.locator("section:has(h2:text-is('Listeners')) tbody tr")
    expect(rows).to_have_count(5, timeout=30_000)
    shown = [[cell.strip() for cell in row.split("\t")] for row in rows.all_inner_texts()]
    assert [(row[0], int(row[2])) for row in shown] == [
        ("amqp", ui_broker.process.port), ("amqp/ssl", ui_broker.ports["amqp/ssl"]),
        ("http", ui_broker.http_port), ("stream", ui_broker.ports["stream"]),
        ("stream/ssl", ui_broker.ports["stream/ssl"])]


@pytest.mark.reference
def test_rabbitmq_lists_its_stream_listener_too(stream_reference: Reference) -> None:
    data = overview(stream_reference.management_port)
    found = {entry["protocol"]: entry["port"] for entry in data["listeners"]}
    assert found["stream"] == stream_reference.stream_port
    assert found["http"] == stream_reference.management_port
    assert {"amqp", "clustering"} <= set(found)
    assert [entry["protocol"] for entry in data["listeners"]] == sorted(found)
    assert {entry["node"] for entry in data["listeners"]} == {data["node"]}
