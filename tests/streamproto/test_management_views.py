"""Stream-protocol connections, publishers and consumers in the management API (RabbitMQ's
rabbitmq_stream_management paths and shapes, as RabbitMQ 3.10.8 answers them) and in
`leveret-streams list_stream_*`, against a real `leveret serve` with raw stream clients."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.management import Http, q
from support.ports import free_port, wait_for_port
from typer.testing import CliRunner

from leveret.cli import usage
from leveret.cli.streams import app

from .conftest import LOOPBACK_NAME, StreamBroker, start_stream_broker
from .raw import RawStream, s, strmap


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StreamBroker, Http]]:
    port = free_port()
    broker = start_stream_broker(tmp_path_factory.mktemp("mgmt") / "data",
                                 "--management-port", str(port))
    wait_for_port(port, 30)
    yield broker, Http(port)
    broker.process.kill()


def create(client: RawStream, name: str) -> None:
    client.request(0x0D, s(name) + strmap({}))
    assert client.response(0x0D)[1] == 1


def declare_publisher(client: RawStream, pid: int, reference: str, stream: str) -> None:
    client.request(0x01, struct.pack(">B", pid) + s(reference) + s(stream))
    assert client.response(0x01)[1] == 1


def subscribe(client: RawStream, sid: int, stream: str, props: dict[str, str]) -> None:
    client.request(0x07, struct.pack(">B", sid) + s(stream) + struct.pack(">HH", 1, 7)
                   + strmap(props))
    assert client.response(0x07)[1] == 1


def mine(items: list[dict], client: RawStream) -> list[dict]:
    """The items of this raw client's connection (by its local port)."""
    port = client.sock.getsockname()[1]
    return [i for i in items if i.get("peer_port") == port
            or i.get("connection_details", {}).get("peer_port") == port
            or i.get("channel_details", {}).get("peer_port") == port]


def test_connections_publishers_consumers(managed: tuple[StreamBroker, Http], name: str) -> None:
    broker, http = managed
    client = broker.raw()
    create(client, name)
    declare_publisher(client, 3, "ref-a", name)
    subscribe(client, 4, name, {"name": "reader"})

    [conn] = mine(http.get("/api/stream/connections").body, client)
    assert conn["protocol"] == "stream" and conn["user"] == "guest" and conn["vhost"] == "/"
    assert conn["client_properties"] == {"product": "raw"}
    assert conn["frame_max"] == 1048576 and conn["timeout"] == 0 and conn["ssl"] is False
    assert conn["auth_mechanism"] == "PLAIN" and conn["subscriptions"] == 1
    assert conn["name"] == f"127.0.0.1:{conn['peer_port']} -> 127.0.0.1:{broker.stream_port}"
    assert mine(http.get(f"/api/stream/connections/{q('/')}").body, client) == [conn]
    # RabbitMQ lists stream connections in /api/connections too
    assert [c["name"] for c in mine(http.get("/api/connections").body, client)] == [conn["name"]]
    path = f"/api/stream/connections/{q('/')}/{q(conn['name'])}"
    one = http.get(path)
    assert one.status == 200 and one.body["name"] == conn["name"]
    assert http.get(f"/api/connections/{q(conn['name'])}").body["protocol"] == "stream"

    details = {"name": conn["name"], "user": "guest", "node": conn["node"],
               "peer_host": "127.0.0.1", "peer_port": conn["peer_port"]}
    [publisher] = http.get(path + "/publishers").body
    assert {k: publisher[k] for k in ("publisher_id", "reference", "queue", "published",
                                      "confirmed", "errored", "connection_details")} == {
        "publisher_id": 3, "reference": "ref-a", "queue": {"name": name, "vhost": "/"},
        "published": 0, "confirmed": 0, "errored": 0, "connection_details": details}
    assert mine(http.get("/api/stream/publishers").body, client) == [publisher]
    assert http.get(f"/api/stream/publishers/{q('/')}/{name}").body == [publisher]
    [consumer] = http.get(path + "/consumers").body
    assert {k: consumer[k] for k in ("subscription_id", "credits", "consumed", "offset",
                                     "offset_lag", "properties", "queue", "active",
                                     "activity_status", "connection_details")} == {
        "subscription_id": 4, "credits": 7, "consumed": 0, "offset": 0, "offset_lag": 0,
        "properties": {"name": "reader"}, "queue": {"name": name, "vhost": "/"},
        "active": True, "activity_status": "up", "connection_details": details}
    assert mine(http.get(f"/api/stream/consumers/{q('/')}").body, client) == [consumer]
    [api_consumer] = mine(http.get("/api/consumers").body, client)
    assert api_consumer["consumer_tag"] == "stream.subid-4"
    assert api_consumer["channel_details"]["number"] == 0

    # DELETE closes it: RabbitMQ's reader stops, the socket closes
    assert http.delete(path).status == 204
    assert client.closed_by_server()
    assert http.get(path).status == 404
    assert mine(http.get("/api/stream/connections").body, client) == []


def test_errors_and_visibility(managed: tuple[StreamBroker, Http], name: str) -> None:
    broker, http = managed
    assert http.get("/api/stream/connections/nope").status == 404
    assert http.get(f"/api/stream/connections/{q('/')}/nobody").status == 404
    assert http.delete(f"/api/stream/connections/{q('/')}/nobody").status == 404
    assert http.get(f"/api/stream/publishers/{q('/')}/no-such-stream").status == 404
    assert http.get("/api/stream/consumers/nope").status == 404
    assert http.get("/api/stream/connections", auth=False).status == 401
    for user, tags in (("watcher", "monitoring"), ("owner", "management"),
                       ("other", "management")):
        assert http.put(f"/api/users/{user}", {"password": "pw", "tags": tags}).status in (
            201, 204)
        assert http.put(f"/api/permissions/{q('/')}/{user}",
                        {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    owner = RawStream(broker.stream_port)
    assert owner.handshake("owner", "pw") == 1
    create(owner, name)
    declare_publisher(owner, 1, "", name)
    port = owner.sock.getsockname()[1]
    [conn] = [c for c in http.get("/api/stream/connections").body if c["peer_port"] == port]
    path = f"/api/stream/connections/{q('/')}/{q(conn['name'])}"
    watcher, other, own = (http.as_user(u, "pw") for u in ("watcher", "other", "owner"))
    # a management user sees only its own; monitoring users see everything but cannot close
    assert [c["peer_port"] for c in other.get("/api/stream/connections").body
            if c["peer_port"] == port] == []
    assert other.get("/api/stream/publishers").body == []
    assert other.get(path).status == 401
    assert other.get(path).body["reason"] == "User not authorised to access object"
    assert other.delete(path).status == 401
    assert watcher.get(path).status == 200
    assert len(watcher.get(path + "/publishers").body) == 1
    assert watcher.delete(path).status == 401
    assert own.get(path).status == 200
    assert own.delete(path).status == 204
    assert owner.closed_by_server()


class Cli:
    def __init__(self, port: int) -> None:
        self.runner = CliRunner()
        self.env = {"LEVERET_MANAGEMENT_URL": f"http://guest:guest@127.0.0.1:{port}"}

    def json(self, *args: str) -> list[dict]:
        result = self.runner.invoke(app, [*args, "--formatter", "json"], env=self.env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)


def test_cli_lists(managed: tuple[StreamBroker, Http], name: str) -> None:
    broker, http = managed
    cli = Cli(http.port)
    client = broker.raw()
    create(client, name)
    declare_publisher(client, 2, "cli-ref", name)
    subscribe(client, 5, name, {"single-active-consumer": "true", "name": "grp"})
    port = client.sock.getsockname()[1]
    conns = cli.json("list_stream_connections", "conn_name", "peer_port", "user", "protocol",
                     "subscriptions", "auth_mechanism", "heartbeat", "connection_state")
    [conn] = [c for c in conns if c["peer_port"] == port]
    assert conn == {"conn_name": f"127.0.0.1:{port} -> 127.0.0.1:{broker.stream_port}",
                    "peer_port": port, "user": "guest", "protocol": "stream",
                    "subscriptions": 1, "auth_mechanism": "PLAIN", "heartbeat": 0,
                    "connection_state": "running"}
    assert all(list(c) == ["node", "conn_name"] for c in cli.json("list_stream_connections"))
    publishers = [p for p in cli.json("list_stream_publishers", "-p", "/") if p["stream"] == name]
    assert publishers == [{"publisher_id": 2, "stream": name, "reference": "cli-ref",
                           "messages_published": 0, "messages_confirmed": 0,
                           "messages_errored": 0}]
    consumers = [c for c in cli.json("list_stream_consumers") if c["stream"] == name]
    assert consumers == [{"subscription_id": 5, "stream": name, "messages_consumed": 0,
                          "offset": 0, "offset_lag": 0, "credits": 7, "active": True,
                          "activity_status": "single_active",
                          "properties": {"single-active-consumer": "true", "name": "grp"}}]
    [group] = [g for g in cli.json("list_stream_consumer_groups") if g["stream"] == name]
    assert group == {"stream": name, "reference": "grp", "partition_index": -1, "consumers": 1}
    [member] = cli.json("list_stream_group_consumers", "--stream", name, "--reference", "grp")
    assert member["state"] == "active"
    assert member["connection_name"] == conn["conn_name"]
    client.close()


def confirmed_ids(client: RawStream, count: int) -> list[int]:
    """The publishing ids of PublishConfirm frames, until `count` of them arrived."""
    ids: list[int] = []
    while len(ids) < count:
        frame = client.next(0x03)
        n = struct.unpack(">i", frame[5:9])[0]
        ids += [struct.unpack(">Q", frame[9 + 8 * i : 17 + 8 * i])[0] for i in range(n)]
    return ids


def test_publisher_counters(managed: tuple[StreamBroker, Http], name: str) -> None:
    """published, confirmed and errored count a publisher's publishing ids, in the API and
    in `list_stream_publishers`; a publish for an unknown publisher id counts for no one."""
    broker, http = managed
    client = broker.raw()
    create(client, name)
    declare_publisher(client, 1, "counted", name)
    # five in one frame, two in another, then 3 again: a duplicate, confirmed all the same
    body = b"".join(struct.pack(">QI", i, 1) + b"m" for i in range(1, 6))
    client.send(0x02, 1, struct.pack(">Bi", 1, 5) + body)
    client.send(0x02, 1, struct.pack(">Bi", 1, 2) + struct.pack(">QI", 6, 1) + b"m"
                + struct.pack(">QI", 7, 1) + b"m")
    client.send(0x02, 1, struct.pack(">Bi", 1, 1) + struct.pack(">QI", 3, 1) + b"m")
    assert sorted(confirmed_ids(client, 8)) == [1, 2, 3, 3, 4, 5, 6, 7]
    client.send(0x02, 1, struct.pack(">Bi", 9, 1) + struct.pack(">QI", 8, 1) + b"m")
    frame = client.next(0x04)
    assert struct.unpack(">BiQH", frame[4:19]) == (9, 1, 8, 18)  # PUBLISHER_DOES_NOT_EXIST

    [publisher] = http.get(f"/api/stream/publishers/{q('/')}/{name}").body
    assert {k: publisher[k] for k in ("publisher_id", "published", "confirmed", "errored",
                                      "last_publishing_id")} == {
        "publisher_id": 1, "published": 8, "confirmed": 8, "errored": 0,
        "last_publishing_id": 7}
    conn = publisher["connection_details"]["name"]
    path = f"/api/stream/connections/{q('/')}/{q(conn)}/publishers"
    assert http.get(path).body == [publisher]
    cli = Cli(http.port)
    rows = [p for p in cli.json("list_stream_publishers") if p["stream"] == name]
    assert rows == [{"publisher_id": 1, "stream": name, "reference": "counted",
                     "messages_published": 8, "messages_confirmed": 8,
                     "messages_errored": 0}]
    client.close()


@pytest.mark.parametrize("args", [
    ["list_stream_connections", "bogus"],
    ["list_stream_consumers", "--bogus"],
    ["list_stream_publishers", "--formatter", "xml"],
    ["list_stream_group_consumers", "--stream", "s"],
    ["list_stream_consumers", "-p"],
])
def test_cli_mistakes_are_one_line(args: list[str], capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        usage.run(app, [*args, "--url", f"http://127.0.0.1:{free_port()}"]
                  if args[-1] != "-p" else args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: "), err


@pytest.mark.asyncio
async def test_rstream_clients_are_listed(managed: tuple[StreamBroker, Http], name: str) -> None:
    broker, http = managed
    from rstream import AMQPMessage, Consumer, Producer

    async with Producer(LOOPBACK_NAME, port=broker.stream_port, username="guest",
                        password="guest") as producer:
        await producer.create_stream(name)
        await producer.send_wait(name, AMQPMessage(body=b"one"))
        consumer = Consumer(LOOPBACK_NAME, port=broker.stream_port, username="guest",
                            password="guest")
        await consumer.start()
        await consumer.subscribe(name, lambda message, context: None)
        try:
            [publisher] = http.get(f"/api/stream/publishers/{q('/')}/{name}").body
            assert publisher["queue"] == {"name": name, "vhost": "/"}
            assert isinstance(publisher["publisher_id"], int)
            [sub] = [c for c in http.get("/api/stream/consumers").body if c["stream"] == name]
            assert (sub["subscription_id"], sub["properties"]) == (0, {})
            conns = {c["name"]: c for c in http.get("/api/stream/connections").body
                     if c["protocol"] == "stream"}
            assert publisher["connection_details"]["name"] in conns
            assert sub["connection_details"]["name"] in conns
            consumer_conn = conns[sub["connection_details"]["name"]]
            assert consumer_conn["client_properties"]["product"] == "RabbitMQ Stream"
            assert consumer_conn["user_provided_name"] == "rstream-consumer"
            assert consumer_conn["subscriptions"] == 1
        finally:
            await consumer.close()
