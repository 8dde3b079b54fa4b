"""`leveretctl`: `rabbitmqctl`'s commands for a Leveret node, with its names, arguments, output
(a banner, then a tab-separated table with a header line; `--formatter json`; `-q`) and exit
codes (`ctl_common`).

Presentation only: every command is a thin client of the node's management HTTP API, reached
and authenticated as `ctl_common.Node` says. Errors are one line on stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from leveret.cli import ctl_common as c
from leveret.cli.ctl_common import OPTIONS, ApiStatus, CtlError, Node
from leveret.cli.ctl_status import cluster_status_command, status_command
from leveret.cli.streams_api import q

app = c.make_app(
    "leveretctl: rabbitmqctl's commands for a Leveret node. Global options, anywhere: "
    "-n/--node NAME or HOST:PORT (a node of the cluster, or its management address), "
    "-p/--vhost, -q/--quiet, --formatter table|json, --no-table-headers, " + c.FINDING_THE_NODE)

Columns = Annotated[list[str] | None, typer.Argument(help="Info items to show.",
                                                     show_default=False)]

# -- lists --------------------------------------------------------------------------------------

QUEUE_ITEMS = ["name", "durable", "auto_delete", "arguments", "policy", "pid", "owner_pid",
               "exclusive", "exclusive_consumer_pid", "exclusive_consumer_tag",
               "messages_ready", "messages_unacknowledged", "messages", "messages_ready_ram",
               "messages_unacknowledged_ram", "messages_ram", "messages_persistent",
               "message_bytes", "message_bytes_ready", "message_bytes_unacknowledged",
               "message_bytes_ram", "message_bytes_persistent", "head_message_timestamp",
               "disk_reads", "disk_writes", "consumers", "consumer_utilisation",
               "consumer_capacity", "memory", "slave_pids", "synchronised_slave_pids", "state",
               "type", "leader", "members", "online", "vhost", "node"]
EXCHANGE_ITEMS = ["name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                  "vhost"]
BINDING_ITEMS = ["source_name", "source_kind", "destination_name", "destination_kind",
                 "routing_key", "arguments", "vhost"]
CONNECTION_ITEMS = ["pid", "name", "port", "host", "peer_port", "peer_host", "ssl",
                    "ssl_protocol", "ssl_key_exchange", "ssl_cipher", "ssl_hash",
                    "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity", "state",
                    "channels", "protocol", "auth_mechanism", "user", "vhost", "timeout",
                    "frame_max", "channel_max", "client_properties", "recv_oct", "recv_cnt",
                    "send_oct", "send_cnt", "send_pend", "connected_at", "node"]
CHANNEL_ITEMS = ["pid", "connection", "name", "number", "user", "vhost", "transactional",
                 "confirm", "consumer_count", "messages_unacknowledged",
                 "messages_uncommitted", "acks_uncommitted", "messages_unconfirmed",
                 "prefetch_count", "global_prefetch_count", "node"]
CONSUMER_ITEMS = ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                  "prefetch_count", "active", "activity_status", "arguments"]
VHOST_ITEMS = ["name", "description", "tags", "tracing", "cluster_state",
               "default_queue_type"]


def _vhost_list(node: Node, path: str, missing_ok: bool = True) -> list[dict[str, Any]]:
    try:
        rows: list[dict[str, Any]] = node.get(path)
    except ApiStatus as error:
        if error.status == 404 and missing_ok:
            return []  # rabbitmqctl lists nothing, and succeeds, for an unknown vhost
        raise CtlError(error.reason) from None
    return rows


@app.command("list_queues")
def list_queues(columns: Columns = None) -> None:
    """Lists queues and their properties (default columns: name, messages)."""
    cols = c.pick_columns(columns, ["name", "messages"], QUEUE_ITEMS, "list_queues")
    c.banner(f"Timeout: {OPTIONS.timeout} seconds ...",
             f"Listing queues for vhost {OPTIONS.vhost} ...")
    rows = _vhost_list(Node(), f"/api/queues/{q(OPTIONS.vhost)}")
    c.emit_table(c.mapped(rows, lambda r: {
        "pid": r.get("pid", ""), "leader": r.get("leader", r.get("node")),
        "members": r.get("members", [r.get("node")]), "online": r.get("online", [r.get("node")]),
        "type": r.get("type", "classic")}), cols)


@app.command("list_exchanges")
def list_exchanges(columns: Columns = None) -> None:
    """Lists exchanges (default columns: name, type)."""
    cols = c.pick_columns(columns, ["name", "type"], EXCHANGE_ITEMS, "list_exchanges")
    c.banner(f"Listing exchanges for vhost {OPTIONS.vhost} ...")
    c.emit_table(_vhost_list(Node(), f"/api/exchanges/{q(OPTIONS.vhost)}"), cols)


@app.command("list_bindings")
def list_bindings(columns: Columns = None) -> None:
    """Lists all bindings on a vhost."""
    cols = c.pick_columns(columns, BINDING_ITEMS[:6], BINDING_ITEMS, "list_bindings")
    c.banner(f"Listing bindings for vhost {OPTIONS.vhost}...")
    rows = _vhost_list(Node(), f"/api/bindings/{q(OPTIONS.vhost)}")
    c.emit_table(c.mapped(rows, lambda r: {
        "source_name": r.get("source"), "source_kind": "exchange",
        "destination_name": r.get("destination"),
        "destination_kind": r.get("destination_type")}), cols)


@app.command("list_connections")
def list_connections(columns: Columns = None) -> None:
    """Lists AMQP 0.9.1 connections for the node (default: user, peer_host, peer_port, state);
    `name` is what close_connection takes."""
    cols = c.pick_columns(columns, ["user", "peer_host", "peer_port", "state"],
                          CONNECTION_ITEMS, "list_connections")
    c.banner("Listing connections ...")
    rows = _vhost_list(Node(), "/api/connections", missing_ok=False)
    c.emit_table(c.mapped(rows, lambda r: {"pid": r.get("name")}), cols)


@app.command("list_channels")
def list_channels(columns: Columns = None) -> None:
    """Lists all channels in the node (default: pid, user, consumer_count,
    messages_unacknowledged); a channel's pid is its name."""
    cols = c.pick_columns(columns, ["pid", "user", "consumer_count", "messages_unacknowledged"],
                          CHANNEL_ITEMS, "list_channels")
    c.banner("Listing channels ...")
    rows = _vhost_list(Node(), "/api/channels", missing_ok=False)
    c.emit_table(c.mapped(rows, lambda r: {
        "pid": r.get("name"),
        "connection": (r.get("connection_details") or {}).get("name")}), cols)


@app.command("list_consumers")
def list_consumers(columns: Columns = None) -> None:
    """Lists all consumers for a vhost."""
    cols = c.pick_columns(columns, CONSUMER_ITEMS, CONSUMER_ITEMS, "list_consumers")
    c.banner(f"Listing consumers in vhost {OPTIONS.vhost} ...")
    rows = _vhost_list(Node(), f"/api/consumers/{q(OPTIONS.vhost)}")
    c.emit_table(c.mapped(rows, lambda r: {
        "queue_name": (r.get("queue") or {}).get("name"),
        "channel_pid": (r.get("channel_details") or {}).get("name")}), cols)


@app.command("list_users")
def list_users() -> None:
    """List user names and tags."""
    c.banner("Listing users ...")
    rows = Node().get("/api/users")
    c.emit_table([{"user": r["name"], "tags": _tags(r.get("tags"))} for r in rows],
                 ["user", "tags"])


@app.command("list_vhosts")
def list_vhosts(columns: Columns = None) -> None:
    """Lists virtual hosts (default column: name)."""
    cols = c.pick_columns(columns, ["name"], VHOST_ITEMS, "list_vhosts")
    c.banner("Listing vhosts ...")
    rows = Node().get("/api/vhosts")
    c.emit_table(c.mapped(rows, lambda r: {
        "cluster_state": r.get("cluster_state", {}), "tracing": r.get("tracing", False)}), cols)


@app.command("list_permissions")
def list_permissions() -> None:
    """Lists user permissions in a virtual host."""
    vhost = OPTIONS.vhost
    c.banner(f'Listing permissions for vhost "{vhost}" ...')
    with c.refusals(CtlError(f"Virtual host '{vhost}' does not exist", c.EX_DATAERR)):
        rows = Node().get(f"/api/vhosts/{q(vhost)}/permissions")
    c.emit_table(rows, ["user", "configure", "write", "read"])


@app.command("list_policies")
def list_policies() -> None:
    """Lists all policies in a virtual host."""
    c.banner(f'Listing policies for vhost "{OPTIONS.vhost}" ...')
    rows = _vhost_list(Node(), f"/api/policies/{q(OPTIONS.vhost)}")
    c.emit_table(c.mapped(rows, lambda r: {"definition": json.dumps(
        r.get("definition"), separators=(",", ":"))}),
        ["vhost", "name", "pattern", "apply-to", "definition", "priority"])


def _tags(tags: Any) -> list[str]:
    if isinstance(tags, str):
        return [t for t in tags.split(",") if t]
    return list(tags or [])


# -- users --------------------------------------------------------------------------------------


def _user(node: Node, name: str) -> dict[str, Any]:
    with c.refusals(CtlError(f'User "{name}" does not exist', c.EX_NOUSER)):
        user: dict[str, Any] = node.get(f"/api/users/{q(name)}")
    return user


def _write(node: Node, method: str, path: str, body: Any = None,
           headers: dict[str, str] | None = None) -> None:
    try:
        node.call(method, path, body, headers)
    except ApiStatus as error:
        raise CtlError(error.reason, c.EX_DATAERR if error.status == 400
                       else c.EX_SOFTWARE) from None


@app.command("add_user")
def add_user(username: str, password: str) -> None:
    """Creates a new user in the internal database, with no permissions."""
    c.banner(f'Adding user "{username}" ...')
    node = Node()
    try:
        node.get(f"/api/users/{q(username)}")
    except ApiStatus as error:
        if error.status != 404:
            raise CtlError(error.reason) from None
    else:
        raise CtlError(f'User "{username}" already exists', c.EX_SOFTWARE)
    _write(node, "PUT", f"/api/users/{q(username)}", {"password": password, "tags": ""})
    c.banner("Done. Don't forget to grant the user permissions to some virtual hosts! "
             "See 'leveretctl help set_permissions' to learn more.")


@app.command("delete_user")
def delete_user(username: str) -> None:
    """Removes a user from the internal database."""
    c.banner(f'Deleting user "{username}" ...')
    node = Node()
    _user(node, username)
    _write(node, "DELETE", f"/api/users/{q(username)}")


@app.command("change_password")
def change_password(username: str, new_password: str) -> None:
    """Changes the user password."""
    c.banner(f'Changing password for user "{username}" ...')
    node = Node()
    user = _user(node, username)
    _write(node, "PUT", f"/api/users/{q(username)}",
           {"password": new_password, "tags": _tags(user.get("tags"))})


@app.command("set_user_tags")
def set_user_tags(username: str, tags: Annotated[list[str] | None, typer.Argument(
        show_default=False)] = None) -> None:
    """Sets user tags (none clears them)."""
    tags = tags or []
    c.banner(f'Setting tags for user "{username}" to [{", ".join(tags)}] ...')
    node = Node()
    user = _user(node, username)
    _write(node, "PUT", f"/api/users/{q(username)}", {
        "password_hash": user.get("password_hash", ""),
        "hashing_algorithm": user.get("hashing_algorithm"), "tags": tags})


# -- vhosts and permissions ---------------------------------------------------------------------


def _vhost_exists(node: Node, vhost: str) -> bool:
    try:
        node.get(f"/api/vhosts/{q(vhost)}")
    except ApiStatus as error:
        if error.status == 404:
            return False
        raise CtlError(error.reason) from None
    return True


@app.command("add_vhost")
def add_vhost(
    vhost: str,
    description: Annotated[str | None, typer.Option("--description")] = None,
    tags: Annotated[str | None, typer.Option("--tags", help="comma-separated")] = None,
    default_queue_type: Annotated[str | None, typer.Option("--default-queue-type")] = None,
) -> None:
    """Creates a virtual host."""
    c.banner(f'Adding vhost "{vhost}" ...')
    body: dict[str, Any] = {}
    if description is not None:
        body["description"] = description
    if tags is not None:
        body["tags"] = tags
    if default_queue_type is not None:
        body["default_queue_type"] = default_queue_type
    _write(Node(), "PUT", f"/api/vhosts/{q(vhost)}", body)


@app.command("delete_vhost")
def delete_vhost(vhost: str) -> None:
    """Deletes a virtual host."""
    c.banner(f'Deleting vhost "{vhost}" ...')
    with c.refusals(CtlError(f"Virtual host '{vhost}' does not exist", c.EX_DATAERR)):
        Node().call("DELETE", f"/api/vhosts/{q(vhost)}")


@app.command("set_permissions")
def set_permissions(username: str, conf: str, write: str, read: str) -> None:
    """Sets user permissions for a vhost (-p)."""
    vhost = OPTIONS.vhost
    c.banner(f'Setting permissions for user "{username}" in vhost "{vhost}" ...')
    node = Node()
    if not _vhost_exists(node, vhost):
        raise CtlError(f"Virtual host {vhost} does not exist", c.EX_UNAVAILABLE)
    _user(node, username)
    _write(node, "PUT", f"/api/permissions/{q(vhost)}/{q(username)}",
           {"configure": conf, "write": write, "read": read})


@app.command("clear_permissions")
def clear_permissions(username: str) -> None:
    """Revokes user permissions for a vhost (-p)."""
    vhost = OPTIONS.vhost
    c.banner(f'Clearing permissions for user "{username}" in vhost "{vhost}" ...')
    node = Node()
    _user(node, username)
    try:
        node.call("DELETE", f"/api/permissions/{q(vhost)}/{q(username)}")
    except ApiStatus as error:
        if error.status != 404:  # none to clear: done, as rabbitmqctl
            raise CtlError(error.reason) from None


# -- policies -----------------------------------------------------------------------------------


@app.command("set_policy")
def set_policy(
    name: str, pattern: str, definition: str,
    priority: Annotated[int, typer.Option("--priority")] = 0,
    apply_to: Annotated[str, typer.Option("--apply-to")] = "all",
) -> None:
    """Sets or updates a policy."""
    vhost = OPTIONS.vhost
    c.banner(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" with priority '
             f'"{priority}" for vhost "{vhost}" ...')
    try:
        parsed = json.loads(definition)
    except json.JSONDecodeError as exc:
        raise CtlError(f"the policy definition is not valid JSON: {exc}", c.EX_DATAERR) from None
    with c.refusals(CtlError(f"Virtual host {vhost} does not exist", c.EX_UNAVAILABLE),
                    c.EX_DATAERR):
        Node().call("PUT", f"/api/policies/{q(vhost)}/{q(name)}", {
            "pattern": pattern, "definition": parsed, "priority": priority,
            "apply-to": apply_to})


@app.command("clear_policy")
def clear_policy(name: str) -> None:
    """Clears (removes) a policy."""
    vhost = OPTIONS.vhost
    c.banner(f'Clearing policy "{name}" on vhost "{vhost}" ...')
    with c.refusals(CtlError("Parameter does not exist", c.EX_UNAVAILABLE)):
        Node().call("DELETE", f"/api/policies/{q(vhost)}/{q(name)}")


# -- queues and connections ---------------------------------------------------------------------


@app.command("purge_queue")
def purge_queue(queue: str) -> None:
    """Purges a queue (removes all messages in it)."""
    vhost = OPTIONS.vhost
    c.banner(f"Purging queue '{queue}' in vhost '{vhost}' ...")
    with c.refusals(CtlError("not_found", c.EX_UNAVAILABLE)):
        Node().call("DELETE", f"/api/queues/{q(vhost)}/{q(queue)}/contents")


@app.command("delete_queue")
def delete_queue(
    queue: str,
    if_empty: Annotated[bool, typer.Option("--if-empty", "-e")] = False,
    if_unused: Annotated[bool, typer.Option("--if-unused", "-u")] = False,
) -> None:
    """Deletes a queue."""
    vhost = OPTIONS.vhost
    c.banner(f"Deleting queue '{queue}' on vhost '{vhost}' ...")
    node = Node()
    path = f"/api/queues/{q(vhost)}/{q(queue)}"
    with c.refusals(CtlError("Queue not found", c.EX_USAGE)):
        ready = int(node.get(path).get("messages_ready") or 0)
        flags = [f for f, on in (("if-empty=true", if_empty), ("if-unused=true", if_unused)) if on]
        node.call("DELETE", path + ("?" + "&".join(flags) if flags else ""))
    c.say(f"Queue was successfully deleted with {ready} ready messages")


@app.command("close_connection")
def close_connection(connection: str, explanation: str) -> None:
    """Closes a connection (its name, from list_connections) with a reason for the client."""
    c.banner(f"Closing connection {connection}, reason: {explanation}...")
    with c.refusals(CtlError(f"no connection named '{connection}'", c.EX_UNAVAILABLE)):
        Node().call("DELETE", f"/api/connections/{q(connection)}",
                    headers={"X-Reason": explanation})


# -- definitions ----------------------------------------------------------------------------------


@app.command("export_definitions")
def export_definitions(path: str) -> None:
    """Exports definitions in JSON to a file, or to stdout with '-'."""
    if path == "-":
        OPTIONS.quiet = True
    c.banner(f'Exporting definitions in JSON to a file at "{path}" ...')
    data = Node().get("/api/definitions")
    text = json.dumps(data, indent=None, separators=(",", ":"), ensure_ascii=False)
    if path == "-":
        typer.echo(text)
        return
    try:
        Path(path).write_text(text + "\n")
    except OSError as exc:
        raise CtlError(f"cannot write {path}: {exc.strerror}", 73) from None  # EX_CANTCREAT


@app.command("import_definitions")
def import_definitions(path: Annotated[str, typer.Argument()] = "-") -> None:
    """Imports definitions in JSON from a file, or from stdin with '-' (the default)."""
    source = "standard input" if path == "-" else f'a file at "{path}"'
    c.banner(f"Importing definitions in JSON from {source} ...")
    try:
        raw = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CtlError(f"cannot read {path}: {exc.strerror}", c.EX_NOINPUT) from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CtlError(f"the definitions are not valid JSON: {exc}", c.EX_DATAERR) from None
    with c.refusals(code=c.EX_DATAERR):
        Node().call("POST", "/api/definitions", data)
    c.say("Successfully imported definitions")


# -- the node -------------------------------------------------------------------------------------


@app.command("await_startup")
def await_startup() -> None:
    """Waits for the node to start (up to --timeout seconds, default 60)."""
    deadline = time.monotonic() + OPTIONS.timeout
    node = Node()
    while True:
        try:
            node.call("GET", "/api/overview?columns=node", timeout=2.0)
            return
        except CtlError as error:
            if time.monotonic() >= deadline:
                raise CtlError(f"the node did not start within {OPTIONS.timeout:g} seconds "
                               f"({error})", c.EX_UNAVAILABLE) from None
        time.sleep(0.2)


@app.command("set_vm_memory_high_watermark")
def set_vm_memory_high_watermark(fraction: str) -> None:
    """Sets the vm_memory_high_watermark setting (a fraction between 0.0 and 1.0)."""
    try:
        value = float(fraction)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise CtlError("Bad argument: The threshold should be a fraction between 0.0 and 1.0",
                       c.EX_DATAERR)
    node = Node()
    c.banner(f"Setting memory threshold on {node.node_name()} to {fraction} ...")
    _write(node, "PUT", "/api/leveret/vm-memory-high-watermark", {"fraction": value})


app.command("status")(status_command)
app.command("cluster_status")(cluster_status_command)


@app.command("help")
def help_command(command: Annotated[str | None, typer.Argument()] = None) -> None:
    """Displays usage information for a command."""
    c.run(app, [command, "--help"] if command else ["--help"])


main = c.entry_point(app)


if __name__ == "__main__":
    main()
