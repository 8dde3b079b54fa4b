"""`leveret-streams`: RabbitMQ's `rabbitmq-streams` commands for Leveret, plus log inspection.

Presentation only. The stream commands talk to a running broker through its management HTTP
API (stdlib urllib; `--url`, default http://guest:guest@localhost:15672, or
LEVERET_MANAGEMENT_URL, or `--host`/`--port`/`--username`/`--password`), take `-p VHOST` and
`--formatter table|json` as RabbitMQ's CLI does, and render with rich. The inspection commands
(`dump_chunk`, `dump_index`, `verify`, `log_overview`) read a data directory directly through
the storage engine's inspection functions, and work with the broker stopped.

Every failure is one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from leveret.cli import streams_inspect, streams_lists, usage
from leveret.cli.streams_api import (
    Api,
    Fmt,
    Formatter,
    Host,
    Password,
    Port,
    Quiet,
    Url,
    User,
    Vhost,
    banner,
    emit,
    emit_rows,
    fail,
    q,
    run,
)

app = typer.Typer(
    help="Manage Leveret streams and super streams (the rabbitmq-streams commands), and "
    "inspect a stream's files.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# -- RabbitMQ's value syntaxes ------------------------------------------------------------------

_SIZE = re.compile(r"^([0-9]+)(kB|KB|MB|GB|kb|mb|gb|Kb|Mb|Gb|kiB|KiB|MiB|GiB|kib|mib|gib|KIB"
                   r"|MIB|GIB|k|K|m|M|g|G)?$")
_ISO = re.compile(r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?"
                  r"(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def parse_size(value: str) -> int | None:
    """20gb, 500mb, 1GiB or 1024, as rabbit_resource_monitor_misc reads them."""
    match = _SIZE.match(value)
    if match is None:
        return None
    number, unit = int(match.group(1)), match.group(2) or ""
    if not unit:
        return number
    base = 1000 if unit.lower() in ("kb", "mb", "gb") else 1024
    multiplier: int = base ** ("kmg".index(unit[0].lower()) + 1)
    return number * multiplier


def parse_iso_duration_s(value: str) -> int | None:
    """An ISO 8601 duration in seconds (Y = 365 days, M = 30 days, as RabbitMQ counts)."""
    match = _ISO.match(value)
    if match is None or value == "P":
        return None
    y, mo, w, d, h, mi, s = (int(g or 0) for g in match.groups())
    return (y * 365 + mo * 30 + w * 7 + d) * 86400 + h * 3600 + mi * 60 + s


def super_stream_arguments(max_length_bytes: str | None, max_age: str | None,
                           segment: str | None, leader_locator: str | None,
                           initial_cluster_size: int | None) -> dict[str, Any]:
    """RabbitMQ's validation of add_super_stream's options, in its order and with its texts."""
    arguments: dict[str, Any] = {}
    if max_length_bytes is not None:
        size = parse_size(max_length_bytes)
        if size is None:
            fail("Invalid value for --max-length-bytes, valid example values: 100gb, 50mb")
        arguments["max-length-bytes"] = size
    if max_age is not None:
        seconds = parse_iso_duration_s(max_age)
        if seconds is None:
            fail("Invalid value for --max-age, the value must a ISO 8601 duration, e.g. e.g. "
                 "PT10M30S for 10 minutes 30 seconds, P5DT8H for 5 days 8 hours.")
        arguments["max-age"] = f"{seconds}s"
    if segment is not None:
        size = parse_size(segment)
        if size is None:
            fail("Invalid value for --stream-max-segment-size-bytes, valid example values: "
                 "100gb, 50mb")
        arguments["stream-max-segment-size-bytes"] = size
    if leader_locator is not None:
        if leader_locator not in ("client-local", "balanced", "random", "least-leaders"):
            fail("Invalid value for --leader-locator, valid values are client-local, balanced.")
        arguments["queue-leader-locator"] = leader_locator
    if initial_cluster_size is not None:
        if initial_cluster_size <= 0:
            fail("Invalid value for --initial-cluster-size, the value must be positive.")
        arguments["initial-cluster-size"] = initial_cluster_size
    return arguments


# -- super streams ------------------------------------------------------------------------------


@app.command("add_super_stream")
def add_super_stream(
    name: Annotated[str, typer.Argument(help="The name of the super stream.")],
    partitions: Annotated[int | None, typer.Option(
        "--partitions", help="The number of partitions, default is 3. Mutually exclusive with "
        "--binding-keys.")] = None,
    binding_keys: Annotated[str | None, typer.Option(
        "--binding-keys", help="Comma-separated list of binding keys. Mutually exclusive with "
        "--partitions.")] = None,
    routing_keys: Annotated[str | None, typer.Option(
        "--routing-keys", help="Old name of --binding-keys.")] = None,
    max_length_bytes: Annotated[str | None, typer.Option(
        "--max-length-bytes", help="The maximum size of partition streams, example values: "
        "20gb, 500mb.")] = None,
    max_age: Annotated[str | None, typer.Option(
        "--max-age", help="The maximum age of partition stream segments, as an ISO 8601 "
        "duration, e.g. PT10M30S for 10 minutes 30 seconds, P5DT8H for 5 days 8 hours.")] = None,
    stream_max_segment_size_bytes: Annotated[str | None, typer.Option(
        "--stream-max-segment-size-bytes", help="The maximum size of partition stream "
        "segments, example values: 500mb, 1gb.")] = None,
    leader_locator: Annotated[str | None, typer.Option(
        "--leader-locator", help="Leader locator strategy for partition streams: "
        "client-local or balanced.")] = None,
    initial_cluster_size: Annotated[int | None, typer.Option(
        "--initial-cluster-size", help="The initial cluster size of partition streams.")] = None,
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Add a super stream: a direct exchange and its partition streams, bound in order.

    Example: leveret-streams add_super_stream invoices --partitions 3
    """
    if routing_keys is not None and binding_keys is not None:
        fail("Specify --binding-keys only.")
    keys = binding_keys if binding_keys is not None else routing_keys
    if partitions is not None and keys is not None:
        fail("Specify --partitions or --binding-keys, not both.")
    if partitions is not None and partitions < 1:
        fail("The partition number must be greater than 0")
    arguments = super_stream_arguments(max_length_bytes, max_age, stream_max_segment_size_bytes,
                                       leader_locator, initial_cluster_size)
    body: dict[str, Any] = {"arguments": arguments}
    if keys is not None:
        body["binding-keys"] = keys
    else:
        body["partitions"] = 3 if partitions is None else partitions
    api = Api(url, host, port, username, password)
    run(lambda: api.call("PUT", f"/api/stream/super-streams/{q(vhost)}/{q(name)}", body,
                         missing=f"vhost '{vhost}' does not exist"))
    banner("Adding a super stream...", formatter, quiet)
    emit(f"Super stream {name} has been created",
         {"super_stream": name, "vhost": vhost, "result": "created"}, formatter)


@app.command("delete_super_stream")
def delete_super_stream(
    name: Annotated[str, typer.Argument(help="The name of the super stream.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Delete a super stream: its exchange, then every partition stream bound to it.

    Example: leveret-streams delete_super_stream invoices
    """
    api = Api(url, host, port, username, password)
    run(lambda: api.call("DELETE", f"/api/leveret/super-streams/{q(vhost)}/{q(name)}",
                         missing=f"vhost '{vhost}' does not exist"))
    banner("Deleting a super stream...", formatter, quiet)
    emit(f"Super stream {name} has been deleted",
         {"super_stream": name, "vhost": vhost, "result": "deleted"}, formatter)


# -- one stream -------------------------------------------------------------------------------

STATUS_COLUMNS = ["role", "node", "epoch", "offset", "committed_offset", "committed_chunk_id",
                  "first_offset", "readers", "segments", "lag"]


@app.command("stream_status")
def stream_status(
    stream: Annotated[str, typer.Argument(help="The name of the stream.")],
    tracking: Annotated[bool, typer.Option(
        "--tracking", help="Show the tracking information (publishers' sequences and "
        "consumers' offsets) instead of the members.")] = False,
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Show a stream's status: one row per member (writer or replica), from any node; `lag`
    is how far a replica's acknowledged offset is behind the writer's.

    Example: leveret-streams stream_status invoices-0
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    run(lambda: data.update(api.call(
        "GET", f"/api/leveret/streams/{q(vhost)}/{q(stream)}/status",
        missing="The stream does not exist")))
    banner(f"Status of stream {stream} ...", formatter, quiet)
    if tracking:
        emit_rows(data["tracking"], ["type", "reference", "value"], formatter)
    else:
        emit_rows(data["members"], STATUS_COLUMNS, formatter)


@app.command("restart_stream")
def restart_stream(
    stream: Annotated[str, typer.Argument(help="The name of the stream.")],
    preferred_leader_node: Annotated[str | None, typer.Option(
        "--preferred-leader-node", help="Ignored: Leveret is one node, which leads every "
        "stream.")] = None,
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Restart a stream: store consumer offsets, close its log and reopen it; prints the
    leader node.

    Example: leveret-streams restart_stream invoices-0
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    run(lambda: data.update(api.call(
        "POST", f"/api/leveret/streams/{q(vhost)}/{q(stream)}/restart", {},
        missing="The stream does not exist")))
    banner(f"Restarting stream {stream} in vhost {vhost} ...", formatter, quiet)
    emit(data["leader"], data, formatter)


@app.command("add_replica")
def add_replica(
    stream: Annotated[str, typer.Argument(help="The name of the stream.")],
    node: Annotated[str, typer.Argument(help="The node to add a replica on.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Add a replica of a stream on a running node of the cluster: it copies the leader's log
    and then follows it. A node that already is a member is left as it is.

    Example: leveret-streams add_replica invoices-0 node-c
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    run(lambda: data.update(api.call(
        "PUT", f"/api/leveret/streams/{q(vhost)}/{q(stream)}/replicas/{q(node)}", {},
        missing="The stream does not exist")))
    banner(f"Adding a replica for stream {stream} on node {node}...", formatter, quiet)
    if formatter is Formatter.json:  # a table prints the banner only, as RabbitMQ's CLI
        emit("", {"stream": stream, "vhost": vhost, "node": node, **data}, formatter)


@app.command("delete_replica")
def delete_replica(
    stream: Annotated[str, typer.Argument(help="The name of the stream.")],
    node: Annotated[str, typer.Argument(help="The node whose replica to delete.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Delete a stream's replica on a node: it stops and its local log is deleted. The last
    member cannot be deleted, nor (in Leveret) the leader's.

    Example: leveret-streams delete_replica invoices-0 node-c
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    run(lambda: data.update(api.call(
        "DELETE", f"/api/leveret/streams/{q(vhost)}/{q(stream)}/replicas/{q(node)}",
        missing="The stream does not exist")))
    banner(f"Removing a replica of queue {stream} on node {node}...", formatter, quiet)
    if formatter is Formatter.json:  # a table prints the banner only, as RabbitMQ's CLI
        emit("", {"stream": stream, "vhost": vhost, "node": node, **data}, formatter)


@app.command("reset_offset")
def reset_offset(
    stream: Annotated[str, typer.Option("--stream", help="The name of the stream.")],
    reference: Annotated[str, typer.Option("--reference", help="The consumer reference.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, url: Url = None, host: Host = None,
    port: Port = None, username: User = None, password: Password = None,
) -> None:
    """Forget the offset stored for a consumer reference, so that it starts afresh.

    Example: leveret-streams reset_offset --stream invoices-0 --reference billing-app
    """
    if len(reference.encode("utf-8")) > 255:
        fail("The reference is too long")
    api = Api(url, host, port, username, password)
    run(lambda: api.call("POST", f"/api/leveret/streams/{q(vhost)}/{q(stream)}/reset-offset",
                         {"reference": reference}, missing="The stream does not exist"))
    emit("Done", {"result": "ok"}, formatter)


streams_lists.register(app)
streams_inspect.register(app)


def main() -> None:
    usage.run(app)  # a usage mistake is one line and exit 1 too
