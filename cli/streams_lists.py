"""The `leveret-streams list_*` commands: stream connections, consumers, publishers, consumer
groups and their members, and a stream's tracking. Columns can be chosen as in RabbitMQ
(`list_stream_consumers stream offset`); an empty list prints nothing. Presentation only.

The columns and defaults are those of RabbitMQ's `rabbitmq-streams` (its info items), plus a few
of Leveret's. Stream-protocol connections, publishers and consumers come first; then, over
AMQP 0.9.1, a "stream connection" is a connection with a consumer on a stream, a consumer is
identified by its consumer tag, and a publisher is a named publisher (x-stream-publisher-name)
with its last publishing id.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from leveret.cli.streams_api import (
    Api,
    CliError,
    Columns,
    Fmt,
    Formatter,
    Host,
    Password,
    Port,
    Url,
    User,
    Vhost,
    emit_rows,
    fail,
    pick_columns,
    q,
)

# RabbitMQ's info items (rabbit_stream.hrl), and Leveret's few extras at the end
CONNECTION_COLUMNS = ["conn_name", "pid", "node", "port", "peer_port", "host",
                      "peer_cert_issuer", "peer_cert_subject", "peer_cert_serial_number",
                      "peer_cert_validity", "peer_host", "user", "vhost", "subscriptions", "ssl",
                      "ssl_cipher", "ssl_hash", "ssl_key_exchange", "ssl_protocol",
                      "connection_state", "auth_mechanism", "heartbeat", "frame_max",
                      "client_properties", "connected_at", "protocol"]
CONSUMER_COLUMNS = ["connection_pid", "node", "subscription_id", "stream", "messages_consumed",
                    "offset", "offset_lag", "credits", "active", "activity_status", "properties",
                    "reference", "stored_offset", "connection_name", "channel", "vhost"]
CONSUMER_DEFAULT = ["subscription_id", "stream", "messages_consumed", "offset", "offset_lag",
                    "credits", "active", "activity_status", "properties"]
PUBLISHER_COLUMNS = ["connection_pid", "node", "publisher_id", "stream", "reference",
                     "messages_published", "messages_confirmed", "messages_errored",
                     "last_publishing_id", "connection_name", "vhost"]
PUBLISHER_DEFAULT = ["publisher_id", "stream", "reference", "messages_published",
                     "messages_confirmed", "messages_errored"]
GROUP_COLUMNS = ["stream", "reference", "partition_index", "consumers", "vhost"]
MEMBER_COLUMNS = ["subscription_id", "connection_name", "channel", "state"]
TRACKING_COLUMNS = ["type", "name", "tracking_value"]


def _get(api: Api, path: str, missing: str | None = None,
         texts: dict[str, str] | None = None) -> Any:
    """GET a list; `texts` renames the broker's error texts where RabbitMQ's CLI words a
    command's errors differently."""
    try:
        return api.call("GET", path, missing=missing)
    except CliError as error:
        fail((texts or {}).get(str(error), str(error)))


def _connection_row(item: dict[str, Any]) -> dict[str, Any]:
    """A stream-protocol connection carries RabbitMQ's items; an AMQP 0.9.1 one is mapped."""
    row = {c: item.get(c) for c in CONNECTION_COLUMNS}
    row.update({
        "conn_name": item.get("name"),
        "pid": None,
        "auth_mechanism": item.get("auth_mechanism") or "PLAIN",
        "connection_state": item.get("connection_state", item.get("state")),
        "heartbeat": item.get("heartbeat", item.get("timeout")),
    })
    return row


def _consumer_row(item: dict[str, Any]) -> dict[str, Any]:
    details = item.get("channel_details") or item.get("connection_details") or {}
    return {
        **{k: item.get(k) for k in CONSUMER_COLUMNS},
        "connection_pid": None,
        "messages_consumed": item.get("consumed"),
        "connection_name": details.get("connection_name", details.get("name")),
        "channel": details.get("number"),
        "node": details.get("node"),
    }


def _publisher_row(item: dict[str, Any]) -> dict[str, Any]:
    details = item.get("connection_details") or {}
    return {
        **{k: item.get(k) for k in PUBLISHER_COLUMNS},
        "connection_pid": None,
        "node": details.get("node"),
        "connection_name": details.get("name"),
        "messages_published": item.get("published"),
        "messages_confirmed": item.get("confirmed"),
        "messages_errored": item.get("errored"),
    }


def list_stream_connections(
    columns: Columns = None, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """List stream-protocol connections, and AMQP 0.9.1 connections that consume from a stream
    (default columns: node, conn_name).

    Example: leveret-streams list_stream_connections conn_name user subscriptions
    """
    chosen = pick_columns(columns, ["node", "conn_name"], CONNECTION_COLUMNS)
    api = Api(url, host, port, username, password)
    items = _get(api, f"/api/stream/connections/{q(vhost)}", f"vhost '{vhost}' does not exist")
    emit_rows([_connection_row(i) for i in items], chosen, formatter)


def list_stream_consumers(
    columns: Columns = None, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """List stream consumers with their offsets: the last delivered, the stored one and the
    lag behind the committed offset.

    Example: leveret-streams list_stream_consumers subscription_id stream stored_offset
    """
    chosen = pick_columns(columns, CONSUMER_DEFAULT, CONSUMER_COLUMNS)
    api = Api(url, host, port, username, password)
    items = _get(api, f"/api/stream/consumers/{q(vhost)}", f"vhost '{vhost}' does not exist")
    emit_rows([_consumer_row(i) for i in items], chosen, formatter)


def list_stream_publishers(
    columns: Columns = None, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """List stream-protocol publishers, and the named publishers (x-stream-publisher-name) of
    each stream, with their last publishing id.

    Example: leveret-streams list_stream_publishers stream reference last_publishing_id
    """
    chosen = pick_columns(columns, PUBLISHER_DEFAULT, PUBLISHER_COLUMNS)
    api = Api(url, host, port, username, password)
    items = _get(api, f"/api/stream/publishers/{q(vhost)}", f"vhost '{vhost}' does not exist")
    emit_rows([_publisher_row(i) for i in items], chosen, formatter)


def list_stream_consumer_groups(
    columns: Columns = None, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """List the single active consumer groups of the vhost's streams.

    Example: leveret-streams list_stream_consumer_groups
    """
    chosen = pick_columns(columns, ["stream", "reference", "partition_index", "consumers"],
                          GROUP_COLUMNS)
    api = Api(url, host, port, username, password)
    items = _get(api, f"/api/leveret/consumer-groups/{q(vhost)}",
                 f"vhost '{vhost}' does not exist")
    emit_rows(items, chosen, formatter)


def list_stream_group_consumers(
    stream: Annotated[str, typer.Option("--stream", help="The stream of the group.")],
    reference: Annotated[str, typer.Option("--reference", help="The group's reference.")],
    columns: Columns = None, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """List the members of one single active consumer group, and which one is active.

    Example: leveret-streams list_stream_group_consumers --stream invoices-0 --reference app
    """
    chosen = pick_columns(columns, ["subscription_id", "connection_name", "state"],
                          MEMBER_COLUMNS)
    api = Api(url, host, port, username, password)
    group = _get(api, f"/api/leveret/consumer-groups/{q(vhost)}/{q(stream)}/{q(reference)}",
                 "The group does not exist")
    emit_rows(group["members"], chosen, formatter)


def list_stream_tracking(
    stream: Annotated[str, typer.Argument(help="The name of the stream.")],
    all_: Annotated[bool, typer.Option("--all", help="Consumer offsets and publisher "
                                       "sequences (the default).")] = False,
    offset: Annotated[bool, typer.Option("--offset", help="Consumer offsets only.")] = False,
    writer: Annotated[bool, typer.Option("--writer", help="Publisher sequences only.")] = False,
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, url: Url = None, host: Host = None,
    port: Port = None, username: User = None, password: Password = None,
) -> None:
    """List a stream's tracking: stored consumer offsets and publishers' last ids.

    Example: leveret-streams list_stream_tracking invoices-0 --offset
    """
    if sum((all_, offset, writer)) > 1:
        fail("Specify only one of --all, --offset, --writer.")
    api = Api(url, host, port, username, password)
    data = _get(api, f"/api/leveret/streams/{q(vhost)}/{q(stream)}/tracking",
                "The stream does not exist.",
                {"The stream does not exist": "The stream does not exist."})
    rows = []
    if not writer:
        rows += [{"type": "offset", "name": c["reference"], "tracking_value": c["stored_offset"]}
                 for c in data["consumers"]]
    if not offset:
        rows += [{"type": "writer", "name": p["reference"],
                  "tracking_value": p["last_publishing_id"]} for p in data["publishers"]]
    emit_rows(rows, TRACKING_COLUMNS, formatter)


def register(app: typer.Typer) -> None:
    for command in (list_stream_connections, list_stream_consumers, list_stream_publishers,
                    list_stream_consumer_groups, list_stream_group_consumers,
                    list_stream_tracking):
        app.command(command.__name__)(command)
