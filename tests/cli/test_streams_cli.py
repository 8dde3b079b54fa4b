"""`leveret-streams` with typer's CliRunner against a real in-process broker and its
management API, and the inspection commands over a data directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pika
import pytest
from support.amqp import connect, consume, drain
from support.brokers import InProcessBroker
from support.ports import free_port
from typer.testing import CliRunner

from leveret.cli.streams import app

STREAM = {"x-queue-type": "stream"}
COMMANDS = ["add_super_stream", "delete_super_stream", "stream_status", "restart_stream",
            "add_replica", "delete_replica", "list_stream_connections", "list_stream_consumers",
            "list_stream_publishers", "list_stream_group_consumers",
            "list_stream_consumer_groups", "list_stream_tracking", "reset_offset",
            "dump_chunk", "dump_index", "verify", "log_overview"]


class Cli:
    def __init__(self, broker: InProcessBroker | None = None) -> None:
        self.runner = CliRunner()
        port = broker.config.management_port if broker is not None else free_port()
        self.env = {"LEVERET_MANAGEMENT_URL": f"http://guest:guest@127.0.0.1:{port}"}

    def __call__(self, *args: str, code: int = 0) -> Any:
        result = self.runner.invoke(app, list(args), env=self.env)
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.output
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--formatter", "json").stdout)

    def error(self, *args: str) -> str:
        """A failing command: exactly one line on stderr, exit code 1; returns it."""
        result = self(*args, code=1)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: ")
        return lines[0].removeprefix("Error: ")


@pytest.fixture
def cli(managed_broker: InProcessBroker) -> Cli:
    return Cli(managed_broker)


def publish(port: int, queue: str, count: int, publisher: str | None = None) -> None:
    conn = connect(port)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        headers = ({"x-stream-publisher-name": publisher, "x-stream-publishing-id": i + 1}
                   if publisher else None)
        ch.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(headers=headers))
    conn.close()


def declare_stream(port: int, name: str, arguments: dict[str, Any] | None = None) -> None:
    conn = connect(port)
    conn.channel().queue_declare(name, durable=True, arguments={**STREAM, **(arguments or {})})
    conn.close()


# -- help and connection errors -------------------------------------------------------------------


def test_every_command_has_help() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for command in COMMANDS:
        assert command in top.stdout
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, command
        assert "Example: leveret-streams " + command in result.stdout, command


def test_an_unreachable_broker_is_one_line() -> None:
    cli = Cli()
    message = cli.error("stream_status", "s")
    assert message.startswith("cannot reach the Leveret management API at http://127.0.0.1:")
    assert "is the broker running" in message
    assert "Status of stream" not in cli("list_stream_consumers", code=1).stdout


def test_bad_credentials_and_options(managed_broker: InProcessBroker) -> None:
    cli = Cli(managed_broker)
    port = str(managed_broker.config.management_port)
    cli.env = {}
    message = cli.error("list_stream_consumers", "--host", "127.0.0.1", "--port", port,
                        "--username", "guest", "--password", "wrong")
    assert message == (f"the broker at http://127.0.0.1:{port} refused user 'guest': "
                       "Login failed")
    assert cli("list_stream_consumers", "--url", f"http://guest:guest@127.0.0.1:{port}"
               ).stdout == ""
    assert cli.error("list_stream_consumers", "--url", "ftp://x") == (
        "invalid management URL 'ftp://x'; expected e.g. http://guest:guest@localhost:15672")


# -- super streams --------------------------------------------------------------------------------


def test_add_super_stream_creates_the_seed_topology(managed_broker: InProcessBroker,
                                                    cli: Cli) -> None:
    result = cli("add_super_stream", "invoices", "--partitions", "3")
    assert result.stdout.splitlines() == ["Adding a super stream...",
                                          "Super stream invoices has been created"]
    vhost = managed_broker.broker.vhosts["/"]
    exchange = vhost.exchanges["invoices"]
    assert (exchange.type, exchange.durable, exchange.arguments) == (
        "direct", True, {"x-super-stream": True})
    assert [(k, q.name) for k, q in exchange.partition_keys()] == [
        ("0", "invoices-0"), ("1", "invoices-1"), ("2", "invoices-2")]
    assert all(vhost.queues[f"invoices-{i}"].type == "stream" for i in range(3))
    assert vhost.queues["invoices-0"].arguments["x-queue-leader-locator"] == "balanced"
    again = cli.error("add_super_stream", "invoices", "--partitions", "3")
    assert again == "there is already an exchange named invoices"


def test_add_super_stream_options(managed_broker: InProcessBroker, cli: Cli) -> None:
    cli("add_super_stream", "regions", "--binding-keys", "amer, emea,apac", "--max-age", "P7D",
        "--max-length-bytes", "20gb", "--stream-max-segment-size-bytes", "500mb",
        "--leader-locator", "client-local", "--initial-cluster-size", "1", "-q")
    vhost = managed_broker.broker.vhosts["/"]
    partition = vhost.queues["regions-emea"]
    assert partition.arguments == {
        "x-queue-type": "stream", "x-queue-leader-locator": "client-local",
        "x-max-age": "604800s", "x-max-length-bytes": 20_000_000_000,
        "x-stream-max-segment-size-bytes": 500_000_000, "x-initial-cluster-size": 1}
    assert [q.name for q in vhost.exchanges["regions"].partitions()] == [
        "regions-amer", "regions-emea", "regions-apac"]
    cli("add_super_stream", "legacy", "--routing-keys", "a,b", "-q")
    assert "legacy-b" in vhost.queues
    assert cli.json("add_super_stream", "three") == {"super_stream": "three", "vhost": "/",
                                                     "result": "created"}
    assert "three-2" in vhost.queues


@pytest.mark.parametrize(("args", "text"), [
    (["--binding-keys", "a", "--routing-keys", "b"], "Specify --binding-keys only."),
    (["--partitions", "2", "--binding-keys", "a"],
     "Specify --partitions or --binding-keys, not both."),
    (["--partitions", "0"], "The partition number must be greater than 0"),
    (["--max-length-bytes", "lots"],
     "Invalid value for --max-length-bytes, valid example values: 100gb, 50mb"),
    (["--max-age", "7 days"],
     "Invalid value for --max-age, the value must a ISO 8601 duration, e.g. e.g. PT10M30S for "
     "10 minutes 30 seconds, P5DT8H for 5 days 8 hours."),
    (["--stream-max-segment-size-bytes", "1tb"],
     "Invalid value for --stream-max-segment-size-bytes, valid example values: 100gb, 50mb"),
    (["--leader-locator", "nearest"],
     "Invalid value for --leader-locator, valid values are client-local, balanced."),
    (["--initial-cluster-size", "0"],
     "Invalid value for --initial-cluster-size, the value must be positive."),
])
def test_add_super_stream_validation(args: list[str], text: str) -> None:
    assert Cli().error("add_super_stream", "s", *args) == text


def test_delete_super_stream(managed_broker: InProcessBroker, cli: Cli) -> None:
    cli("add_super_stream", "gone", "--partitions", "2", "-q")
    assert cli("delete_super_stream", "gone").stdout.splitlines() == [
        "Deleting a super stream...", "Super stream gone has been deleted"]
    vhost = managed_broker.broker.vhosts["/"]
    assert "gone" not in vhost.exchanges and "gone-0" not in vhost.queues
    assert cli.error("delete_super_stream", "gone") == "The super stream gone does not exist"
    assert cli.error("add_super_stream", "x", "-p", "nohost") == "vhost 'nohost' does not exist"


# -- one stream -----------------------------------------------------------------------------------


def test_stream_status(managed_broker: InProcessBroker, cli: Cli) -> None:
    declare_stream(managed_broker.port, "s")
    publish(managed_broker.port, "s", 4, publisher="p1")
    [row] = cli.json("stream_status", "s")
    assert row["role"] == "writer" and row["node"].startswith("leveret@")
    assert (row["offset"], row["committed_offset"], row["first_offset"]) == (3, 3, 0)
    assert row["committed_chunk_id"] in range(0, 4) and row["segments"] == 1
    assert row["epoch"] == 1 and row["readers"] == 0
    table = cli("stream_status", "s").stdout
    assert "role" in table and "committed_chunk_id" in table and "writer" in table
    assert cli.json("stream_status", "s", "--tracking") == [
        {"type": "sequence", "reference": "p1", "value": 4}]
    assert cli.error("stream_status", "nope") == "The stream does not exist"
    conn = connect(managed_broker.port)
    conn.channel().queue_declare("classic", durable=True)
    conn.close()
    assert cli.error("stream_status", "classic") == "Cannot get stream status of a classic queue"


def test_restart_stream(managed_broker: InProcessBroker, cli: Cli) -> None:
    declare_stream(managed_broker.port, "s")
    publish(managed_broker.port, "s", 2)
    conn = connect(managed_broker.port)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got: list[int] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append(p.headers["x-stream-offset"])
        c.basic_ack(m.delivery_tag)

    ch.basic_consume("s", on_message, arguments={"x-stream-offset": "first"})
    drain(conn, lambda: len(got) == 2)
    lines = cli("restart_stream", "s").stdout.splitlines()
    assert lines[0] == "Restarting stream s in vhost / ..."
    assert lines[1].startswith("leveret@")
    assert cli.json("restart_stream", "s")["leader"] == lines[1]
    publish(managed_broker.port, "s", 2)
    drain(conn, lambda: len(got) == 4)
    assert got == [0, 1, 2, 3]
    assert cli.json("stream_status", "s")[0]["epoch"] == 3
    conn.close()


def test_replica_commands_explain_and_exit_1(managed_broker: InProcessBroker, cli: Cli) -> None:
    declare_stream(managed_broker.port, "s")
    added = cli.error("add_replica", "s", "rabbit@other")
    assert added.startswith("Leveret runs as a single node (leveret@")
    assert "stream 's' has one member" in added and "rabbit@other" in added
    deleted = cli.error("delete_replica", "s", "rabbit@other")
    assert "Cannot delete the last member of a stream" in deleted
    conn = connect(managed_broker.port)
    conn.channel().queue_declare("classic", durable=True)
    conn.close()
    assert cli.error("add_replica", "classic", "n") == "Cannot add replicas to classic queues"
    assert cli.error("delete_replica", "classic", "n") == (
        "Cannot delete replicas from a classic queue")
    assert cli.error("add_replica", "nope", "n") == "The stream does not exist"


def test_reset_offset(managed_broker: InProcessBroker, cli: Cli) -> None:
    declare_stream(managed_broker.port, "s")
    publish(managed_broker.port, "s", 5)
    conn = connect(managed_broker.port)
    consume(conn.channel(), "s", 3, prefetch=1, tag="app",
            arguments={"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
    conn.close()
    assert cli.json("list_stream_tracking", "s", "--offset") == [
        {"type": "offset", "name": "app", "tracking_value": 2}]
    assert cli("reset_offset", "--stream", "s", "--reference", "app").stdout == "Done\n"
    assert cli.error("reset_offset", "--stream", "s", "--reference", "app") == (
        "There is no stored offset for this reference, no need to reset")
    assert cli.error("reset_offset", "--stream", "nope", "--reference", "app") == (
        "The stream does not exist")
    assert cli.error("reset_offset", "--stream", "s", "--reference", "r" * 256) == (
        "The reference is too long")
    # The reset consumer starts afresh.
    conn = connect(managed_broker.port)
    again = consume(conn.channel(), "s", 5, tag="app",
                    arguments={"x-stream-automatic-offset-tracking": True,
                               "x-stream-offset": "first"})
    assert len(again) == 5
    conn.close()


# -- lists ----------------------------------------------------------------------------------------


def test_lists_are_empty_without_streams_in_use(cli: Cli) -> None:
    for command in ("list_stream_connections", "list_stream_consumers",
                    "list_stream_publishers", "list_stream_consumer_groups"):
        assert cli(command).stdout == "", command
        assert cli.json(command) == [], command


def test_lists_with_consumers_and_publishers(managed_broker: InProcessBroker, cli: Cli) -> None:
    declare_stream(managed_broker.port, "s")
    publish(managed_broker.port, "s", 3, publisher="orders-app")
    conn = connect(managed_broker.port, client_properties={"connection_name": "reader"})
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("s", lambda *a: None, consumer_tag="tail", arguments={
        "x-stream-offset": "first"})
    drain(conn, lambda: bool(cli.json("list_stream_consumers")))
    [connection] = cli.json("list_stream_connections", "conn_name", "user", "subscriptions")
    assert connection["user"] == "guest" and connection["subscriptions"] == 1
    [consumer] = cli.json("list_stream_consumers")
    assert (consumer["subscription_id"], consumer["stream"], consumer["offset"]) == (
        "tail", "s", 1)
    assert consumer["offset_lag"] == 1 and consumer["active"] is True
    assert consumer["properties"] == {"x-stream-offset": "first"}
    table = cli("list_stream_consumers", "subscription_id", "stream").stdout
    assert "subscription_id" in table and "tail" in table
    assert cli.json("list_stream_publishers", "stream", "reference", "last_publishing_id") == [
        {"stream": "s", "reference": "orders-app", "last_publishing_id": 3}]
    assert cli.json("list_stream_tracking", "s", "--writer") == [
        {"type": "writer", "name": "orders-app", "tracking_value": 3}]
    assert cli.error("list_stream_consumers", "bogus").startswith("invalid column(s): bogus")
    assert cli.error("list_stream_tracking", "s", "--offset", "--writer") == (
        "Specify only one of --all, --offset, --writer.")
    assert cli.error("list_stream_tracking", "nope") == "The stream does not exist."
    conn.close()


def test_consumer_groups(managed_broker: InProcessBroker, cli: Cli) -> None:
    cli("add_super_stream", "invoices", "--partitions", "2", "-q")
    conns = []
    for _member in range(2):
        conn = connect(managed_broker.port)
        for partition in ("invoices-0", "invoices-1"):
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1)
            ch.basic_consume(partition, lambda *a: None, consumer_tag="billing",
                             arguments={"x-single-active-consumer": True})
        conns.append(conn)
    groups = cli.json("list_stream_consumer_groups")
    assert groups == [
        {"stream": "invoices-0", "reference": "billing", "partition_index": 0, "consumers": 2},
        {"stream": "invoices-1", "reference": "billing", "partition_index": 1, "consumers": 2}]
    members = cli.json("list_stream_group_consumers", "--stream", "invoices-1",
                       "--reference", "billing")
    assert [m["state"] for m in members] == ["inactive", "active"]
    assert all(m["subscription_id"] == "billing" for m in members)
    assert cli.error("list_stream_group_consumers", "--stream", "invoices-1", "--reference",
                     "other") == "The group does not exist"
    for conn in conns:
        conn.close()


# -- inspection over a data directory -------------------------------------------------------------


@pytest.fixture
def stopped_data(tmp_path: Path) -> Path:
    """A data directory with stream `events` (6 one-message chunks: each publish waits for its
    confirm) and a stored offset, the broker stopped."""
    data = tmp_path / "data"
    broker = InProcessBroker(data).start()
    declare_stream(broker.port, "events")
    publish(broker.port, "events", 2, publisher="w")
    publish(broker.port, "events", 4)
    conn = connect(broker.port)
    consume(conn.channel(), "events", 4, prefetch=1, tag="audit",
            arguments={"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
    conn.close()
    broker.stop()
    return data


def test_inspection_commands(stopped_data: Path) -> None:
    cli = Cli()
    base = ["--data-dir", str(stopped_data), "--stream", "events"]
    chunk = cli.json("dump_chunk", *base, "--offset", "3", "--records")
    assert chunk["first_offset"] == 3 and chunk["records"] == 1 and chunk["crc_ok"] is True
    assert [r["offset"] for r in chunk["record_list"]] == [3]
    assert "crc_ok" in cli("dump_chunk", *base, "--offset", "0").stdout
    entries = cli.json("dump_index", *base)
    assert [e["first_offset"] for e in entries if e["num_records"]] == list(range(6))
    assert len(cli.json("dump_index", *base, "--offset", "2")) == len(entries)
    assert cli("verify", *base).stdout.startswith("No problems found in ")
    overview = cli.json("log_overview", *base)
    assert (overview["first_offset"], overview["last_offset"], overview["records"]) == (0, 5, 6)
    assert overview["tracking"] == {"publishers": {"w": 2}, "consumers": {"audit": 3}}
    assert "00000000000000000000.segment" in cli("log_overview", *base).stdout
    everything = cli.json("log_overview", "--data-dir", str(stopped_data))
    assert [(r["vhost"], r["stream"], r["records"]) for r in everything] == [
        ("/", "events", 6)]
    assert cli.error("dump_chunk", *base, "--offset", "99").startswith(
        "no chunk holds offset 99 in ")
    assert cli.error("verify", "--data-dir", str(stopped_data), "--stream", "nope") == (
        f"no stream 'nope' in vhost '/' in {stopped_data}")
    assert cli.error("verify", "--data-dir", str(stopped_data.parent)).startswith(
        "name a stream with --stream")
    assert cli.error("verify", "--data-dir", "/nonexistent", "--stream", "x") == (
        "/nonexistent is not a Leveret data directory (it has no metadata.sqlite3)")


def test_verify_finds_a_corrupt_chunk(stopped_data: Path) -> None:
    cli = Cli()
    [folder] = [p for p in (stopped_data / "queues").iterdir() if p.is_dir()]
    segment = folder / "00000000000000000000.segment"
    raw = bytearray(segment.read_bytes())
    raw[-3] ^= 0xFF  # a byte in the last chunk
    segment.write_bytes(bytes(raw))
    result = cli("verify", "--log-dir", str(folder), code=1)
    assert "00000000000000000000.segment at " in result.stderr
    report = json.loads(cli("verify", "--log-dir", str(folder), "--formatter", "json",
                            code=1).stdout)
    assert report["problems"] and report["segments"] == 1
