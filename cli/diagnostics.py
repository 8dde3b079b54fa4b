"""`leveret-diagnostics`: `rabbitmq-diagnostics`' health checks and reports for a Leveret node,
with its names, texts and exit codes (a failed check, or an unreachable node, exits 69).

Presentation only: a thin client of the node's management HTTP API (`ctl_common.Node`).
"""

from __future__ import annotations

import socket
from typing import Any

from leveret.cli import ctl_common as c
from leveret.cli.ctl_common import OPTIONS, ApiStatus, CtlError, Node
from leveret.cli.ctl_status import alarms_of, listener_line, node_report, status_command

app = c.make_app(
    "leveret-diagnostics: rabbitmq-diagnostics' checks for a Leveret node. Global options, "
    "anywhere: -n/--node NAME or HOST:PORT, -q/--quiet, --formatter table|json, "
    + c.FINDING_THE_NODE)


def _result(data: dict[str, Any], text: str) -> None:
    c.emit_report(data, [text])


@app.command("ping")
def ping() -> None:
    """Checks that the node is up and that the CLI tools can authenticate with it."""
    node = Node()
    c.banner(f"Will ping {node.base}. This only checks that the node answers on its "
             f"management port and accepts the local credential. Timeout: "
             f"{int(OPTIONS.timeout * 1000)} ms.")
    try:
        node.get("/api/healthchecks/node")
    except (CtlError, ApiStatus):
        raise CtlError(f"Failed to connect and authenticate to {node.base} in "
                       f"{int(OPTIONS.timeout * 1000)} ms", c.EX_UNAVAILABLE) from None
    _result({"result": "ok"}, "Ping succeeded")


@app.command("check_running")
def check_running() -> None:
    """Health check: the broker is running on the node."""
    node = Node()
    name = node.node_name()
    c.banner(f"Checking if Leveret is running on node {name} ...")
    _result({"result": "ok"}, f"Leveret on node {name} is fully booted and running")


@app.command("check_local_alarms")
def check_local_alarms() -> None:
    """Health check: fails if the node has a resource alarm in effect."""
    report = node_report()
    name = report.name
    c.banner(f"Asking node {name} to report any local resource alarms ...")
    alarms = alarms_of(report.me)
    if alarms:
        raise CtlError(f"Node {name} reported local alarms: {', '.join(alarms)}",
                       c.EX_UNAVAILABLE)
    _result({"result": "ok"}, f"Node {name} reported no local alarms")


@app.command("check_alarms")
def check_alarms() -> None:
    """Health check: fails if any node of the cluster has a resource alarm in effect."""
    node = Node()
    name = node.node_name()
    c.banner(f"Asking node {name} to report any local resource alarms ...")
    nodes: list[dict[str, Any]] = node.get("/api/nodes")
    alarms = [f"{n['name']}: {a}" for n in nodes for a in alarms_of(n)]
    if alarms:
        raise CtlError(f"Node {name} reported alarms: {'; '.join(alarms)}", c.EX_UNAVAILABLE)
    _result({"result": "ok"}, f"Node {name} reported no alarms, local or clusterwide")


def _connects(listener: dict[str, Any], node_host: str) -> bool:
    host = c.reachable_host(str(listener["interface"]), node_host)
    try:
        with socket.create_connection((host, int(listener["port"])),
                                      timeout=min(OPTIONS.timeout, 5.0)):
            return True
    except OSError:
        return False


@app.command("check_port_connectivity")
def check_port_connectivity() -> None:
    """Health check: a TCP connection to every listener of the node succeeds."""
    report = node_report()
    name, found = report.name, report.listeners
    c.banner(f"Testing TCP connections to all active listeners on node {name} ...")
    failed = [str(lst["port"]) for lst in found if not _connects(lst, report.node.host)]
    if failed:
        raise CtlError(f"Connection to ports {', '.join(failed)} on node {name} failed",
                       c.EX_UNAVAILABLE)
    ports = ", ".join(str(lst["port"]) for lst in found)
    _result({"result": "ok", "node": name},
            f"Successfully connected to ports {ports} on node {name}.")


@app.command("listeners")
def listeners_command() -> None:
    """Lists the node's protocol listeners."""
    report = node_report()
    name, found = report.name, report.listeners
    c.banner(f"Asking node {name} to report its protocol listeners ...")
    _result({"listeners": found, "node": name, "result": "ok"},
            "\n".join(listener_line(lst) for lst in found))


@app.command("memory_breakdown")
def memory_breakdown() -> None:
    """The node's memory use: Leveret knows its processes' resident size (RSS) as a whole,
    not per kind of object as the Erlang VM does."""
    report = node_report()
    name = report.name
    rss = int(report.me.get("mem_used") or 0)
    c.banner(f"Reporting memory breakdown on node {name}...")
    _result({"total": {"rss": rss}, "rss": rss},
            f"rss: {rss / 1e9:.4f} gb (100.0%)")


app.command("status")(status_command)


main = c.entry_point(app)


if __name__ == "__main__":
    main()
