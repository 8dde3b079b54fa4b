"""`leveret-queues`: RabbitMQ's `rabbitmq-queues` commands for Leveret's quorum queues (and
streams' leaders, for `rebalance`).

Presentation only. Each command talks to one node through its management HTTP API, as
`leveret-streams` does (`--url`, default http://guest:guest@localhost:15672, or
LEVERET_MANAGEMENT_URL, or `--host`/`--port`/`--username`/`--password`): the node RabbitMQ's
`-n` names is the one the URL reaches. RabbitMQ's arguments, options (`--vhost`/`-p`,
`--vhost-pattern`, `--queue-pattern`, `--membership`, `--errors-only`, `--formatter`),
banners, column names and texts; the HTTP paths are broker/management/quorum_queues.py's.

Every failure is one line on stderr and exit code 1, never a traceback, except
`check_if_node_is_quorum_critical`, which exits 69 (EX_UNAVAILABLE) with RabbitMQ's lines when
the check fails, as RabbitMQ's does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from leveret.cli import usage
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

EX_UNAVAILABLE = 69  # rabbitmq-queues' exit code for a failed health check
STATUS_COLUMNS = ["Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
                  "Last Applied", "Commit Index", "Snapshot Index", "Term"]
RESULT_COLUMNS = ["vhost", "name", "size", "result"]
REBALANCE_TYPES = ("all", "quorum", "stream")

app = typer.Typer(
    help="Manage Leveret's quorum queues (the rabbitmq-queues commands): members, leaders, "
    "status and health checks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

QueueName = Annotated[str, typer.Argument(help="The name of the queue.")]
NodeName = Annotated[str, typer.Argument(help="A node of the cluster.")]
Membership = Annotated[str, typer.Option(
    "--membership", help="promotable (default), non_voter or voter; Leveret's members all "
    "vote, so it is checked and otherwise ignored.")]
VhostPattern = Annotated[str, typer.Option("--vhost-pattern",
                                           help="Regular expression to match vhost names.")]
QueuePattern = Annotated[str, typer.Option("--queue-pattern",
                                           help="Regular expression to match queue names.")]
ErrorsOnly = Annotated[bool, typer.Option("--errors-only",
                                          help="Only list queues which reported an error.")]


def _check_membership(membership: str) -> None:
    if membership not in ("promotable", "non_voter", "voter"):
        fail(f"voter status '{membership}' is not recognised.")


def _node_name(api: Api) -> str:
    """The name of the node the API belongs to (for RabbitMQ's banners)."""
    overview = api.call("GET", "/api/overview")
    return str(overview.get("node", "")) if isinstance(overview, dict) else ""


def _ok_json(api: Api, formatter: Formatter) -> None:
    """A command that answers nothing but success: RabbitMQ's JSON names the node asked."""
    if formatter is Formatter.json:
        nodes: list[str] = []
        run(lambda: nodes.append(_node_name(api)))
        emit("", {"result": "ok", "node": nodes[0]}, formatter)


def _missing(vhost: str, name: str) -> str:
    return f"queue '{name}' was not found in virtual host '{vhost}'"


# -- members --------------------------------------------------------------------------------------


@app.command("add_member")
def add_member(
    queue: QueueName, node: NodeName, membership: Membership = "promotable",
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Adds a quorum queue member (replica) on the given node: it copies the leader's log and
    then follows it. A node that already is a member is left as it is.

    Example: leveret-queues add_member orders node-c
    """
    _check_membership(membership)
    api = Api(url, host, port, username, password)
    run(lambda: api.call("POST", f"/api/queues/quorum/{q(vhost)}/{q(queue)}/replicas/add",
                         {"node": node, "membership": membership},
                         missing=_missing(vhost, queue)))
    banner(f"Adding a member for queue {queue} on node {node}...", formatter, quiet)
    _ok_json(api, formatter)


@app.command("delete_member")
def delete_member(
    queue: QueueName, node: NodeName, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    quiet: Quiet = False, url: Url = None, host: Host = None, port: Port = None,
    username: User = None, password: Password = None,
) -> None:
    """Removes a quorum queue member (replica) on the given node: it stops and its log is
    deleted. Removing the leader's member elects another leader first; the last member cannot
    be removed.

    Example: leveret-queues delete_member orders node-c
    """
    api = Api(url, host, port, username, password)
    run(lambda: api.call("DELETE", f"/api/queues/quorum/{q(vhost)}/{q(queue)}/replicas/delete",
                         {"node": node}, missing=_missing(vhost, queue)))
    banner(f"Removing a replica of queue {queue} on node {node}...", formatter, quiet)
    _ok_json(api, formatter)


def _results(rows: list[dict[str, Any]], errors_only: bool, formatter: Formatter) -> None:
    if errors_only:
        rows = [row for row in rows if str(row.get("result", "")).startswith("error")]
    emit_rows(rows, RESULT_COLUMNS, formatter)


@app.command("grow")
def grow(
    node: Annotated[str, typer.Argument(help="Node name to place replicas on.")],
    strategy: Annotated[str, typer.Argument(
        help="all: add a member to every matching queue; even: only to those with an even "
        "number of members.", metavar="<all | even>")],
    vhost_pattern: VhostPattern = ".*", queue_pattern: QueuePattern = ".*",
    membership: Membership = "promotable", errors_only: ErrorsOnly = False,
    formatter: Fmt = Formatter.table, quiet: Quiet = False, url: Url = None, host: Host = None,
    port: Port = None, username: User = None, password: Password = None,
) -> None:
    """Grows all matching quorum queues by adding a member (replica) on the specified node.

    Example: leveret-queues grow node-c all --queue-pattern '^orders'
    """
    if strategy not in ("all", "even"):
        fail(f"strategy '{strategy}' is not recognised.")
    _check_membership(membership)
    api = Api(url, host, port, username, password)
    rows: list[dict[str, Any]] = []
    run(lambda: rows.extend(api.call(
        "POST", f"/api/queues/quorum/replicas/on/{q(node)}/grow",
        {"strategy": strategy, "vhost_pattern": vhost_pattern, "queue_pattern": queue_pattern,
         "membership": membership})))
    banner(f"Growing {strategy} queues on {node}...", formatter, quiet)
    _results(rows, errors_only, formatter)


@app.command("shrink")
def shrink(
    node: Annotated[str, typer.Argument(help="Node name to remove replicas from.")],
    errors_only: ErrorsOnly = False, formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Shrinks quorum queue clusters by removing any members (replicas) on the given node.

    Example: leveret-queues shrink node-c
    """
    api = Api(url, host, port, username, password)
    rows: list[dict[str, Any]] = []
    run(lambda: rows.extend(api.call(
        "DELETE", f"/api/queues/quorum/replicas/on/{q(node)}/shrink")))
    banner(f"Shrinking queues on {node}...", formatter, quiet)
    _results(rows, errors_only, formatter)


# -- leaders --------------------------------------------------------------------------------------


@app.command("rebalance")
def rebalance(
    queue_type: Annotated[str, typer.Argument(
        help="Queue type, must be one of: all, quorum, stream.",
        metavar="<all | quorum | stream>")],
    vhost_pattern: VhostPattern = ".*", queue_pattern: QueuePattern = ".*",
    formatter: Fmt = Formatter.table, quiet: Quiet = False, url: Url = None, host: Host = None,
    port: Port = None, username: User = None, password: Password = None,
) -> None:
    """Re-balances leaders of replicated queues (quorum queues and streams) across up-and-running
    cluster nodes; prints how many each node leads.

    Example: leveret-queues rebalance quorum
    """
    if queue_type not in REBALANCE_TYPES:
        fail(f"type {queue_type} is not supported. Try one of all, quorum, stream.")
    api = Api(url, host, port, username, password)
    rows: list[dict[str, Any]] = []
    run(lambda: rows.extend(api.call(
        "POST", f"/api/leveret/rebalance/{queue_type}",
        {"vhost_pattern": vhost_pattern, "queue_pattern": queue_pattern})))
    # (RabbitMQ's banner clause for a string: `... of all queues...`, `... of stream queues...`)
    banner(f"Re-balancing leaders of {queue_type} queues...", formatter, quiet)
    if formatter is Formatter.json:  # each node with the counts it has, as RabbitMQ's
        typer.echo(json.dumps(rows, indent=2))
        return
    columns = ["Node name"] + [c for c in ("Number of quorum queues", "Number of streams")
                               if any(c in row for row in rows)]
    emit_rows(rows, columns, formatter)


@app.command("transfer_leadership")
def transfer_leadership(
    queue: Annotated[str, typer.Argument(help="Quorum queue name.")],
    node: Annotated[str, typer.Argument(help="Node to transfer the leadership to.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Transfers the leadership of a quorum queue to the given node (a member that holds
    everything committed); prints the new leader.

    Example: leveret-queues transfer_leadership orders node-b
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    run(lambda: data.update(api.call(
        "POST", f"/api/leveret/queues/{q(vhost)}/{q(queue)}/transfer-leadership",
        {"node": node}, missing=_missing(vhost, queue))))
    banner(f"Transferring leadership of quorum queue {queue} to node {node}...", formatter,
           quiet)
    if formatter is Formatter.json:  # RabbitMQ's: the node asked, and the new leader
        nodes: list[str] = []
        run(lambda: nodes.append(_node_name(api)))
        emit("", {"result": "ok", "node": nodes[0], "value": data.get("leader")}, formatter)
        return
    typer.echo(str(data.get("leader", "")))


# -- status, peek, health -------------------------------------------------------------------------


@app.command("quorum_status")
def quorum_status(
    queue: QueueName, vhost: Vhost = "/", formatter: Fmt = Formatter.table,
    quiet: Quiet = False, url: Url = None, host: Host = None, port: Port = None,
    username: User = None, password: Password = None,
) -> None:
    """Displays the quorum status of a queue: one row per member, as its leader knows them
    (docs/QUORUM-QUEUES.md says how RabbitMQ's Raft columns map to Leveret's log).

    Example: leveret-queues quorum_status orders
    """
    api = Api(url, host, port, username, password)
    rows: list[dict[str, Any]] = []
    node: list[str] = []
    run(lambda: rows.extend(api.call(
        "GET", f"/api/queues/quorum/{q(vhost)}/{q(queue)}/status",
        missing=_missing(vhost, queue))))
    if formatter is Formatter.table and not quiet:
        run(lambda: node.append(_node_name(api)))
        banner(f"Status of queue {queue} on node {node[0]} ...", formatter, quiet)
    emit_rows(rows, STATUS_COLUMNS, formatter)


@app.command("peek")
def peek(
    queue: QueueName,
    position: Annotated[str, typer.Argument(help="Position in the queue, starts at 1.")],
    vhost: Vhost = "/", formatter: Fmt = Formatter.table, quiet: Quiet = False,
    url: Url = None, host: Host = None, port: Port = None, username: User = None,
    password: Password = None,
) -> None:
    """Peeks at the given position of a quorum queue (1: the next message to be delivered),
    without taking it: its properties, routing keys, exchange, first 64 bytes and headers.

    Example: leveret-queues peek orders 1
    """
    try:
        number = int(position)
    except ValueError:
        number = 0
    if number < 1:
        fail("position value must be a positive integer")
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}
    missing = f"Target queue was not found in virtual host '{vhost}'"
    run(lambda: data.update(api.call(
        "GET", f"/api/leveret/queues/{q(vhost)}/{q(queue)}/peek/{number}", missing=missing)))
    pairs = [(str(k), v) for k, v in data.get("message", [])]
    banner(f"Peeking at quorum queue {queue} at position {number} on node "
           f"{data.get('node', '')} ...", formatter, quiet)
    if formatter is Formatter.json:
        emit("", {"result": "ok", "message": dict(pairs)}, formatter)
        return
    emit_rows([{"keys": k, "values": ", ".join(map(str, v)) if isinstance(v, list) else v}
               for k, v in pairs], ["keys", "values"], formatter)


@app.command("check_if_node_is_quorum_critical")
def check_if_node_is_quorum_critical(
    formatter: Fmt = Formatter.table, quiet: Quiet = False, url: Url = None, host: Host = None,
    port: Port = None, username: User = None, password: Password = None,
) -> None:
    """Health check that exits with a non-zero code (69) if there are queues/streams with
    minimum online quorum (queues/streams that will lose their quorum if the target node shuts
    down). The target node is the one the management URL reaches.

    Example: leveret-queues check_if_node_is_quorum_critical --url http://guest:guest@node-c:15672
    """
    api = Api(url, host, port, username, password)
    data: dict[str, Any] = {}

    run(lambda: data.update(api.call("GET", "/api/health/checks/node-is-quorum-critical",
                                     accept=(503,))))
    node = str(data.get("node", ""))
    banner(f"Checking if node {node} is critical for quorum of any queues/streams ...",
           formatter, quiet)
    if data.get("status") == "ok":
        single = data.get("reason") == "single node cluster"
        if formatter is Formatter.json:
            answer = {"result": "ok"}
            if single:
                answer["message"] = ("Target node seems to be the only one in a single node "
                                     "cluster, the check does not apply")
            emit("", answer, formatter)
        elif single:
            typer.echo(f"Node {node} seems to be the only one in a single node cluster, the "
                       "check does not apply")
        else:
            typer.echo(f"Node {node} reported no queues/streams with minimum quorum")
        return
    queues = data.get("queues") or []
    if formatter is Formatter.json:
        typer.echo(json.dumps({"result": "error", "queues": queues, "message":
                               f"Node {node} reported local queues with minimum online "
                               "quorum"}), err=True)
    else:
        for item in queues:
            typer.echo(f"{item.get('readable_name')} will become unavailable if node {node} "
                       "stops", err=True)
    raise typer.Exit(EX_UNAVAILABLE)


def main() -> None:
    usage.run(app)  # a usage mistake is one line and exit 1 too


__all__ = ["app", "main"]
