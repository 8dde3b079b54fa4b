"""`status` (of `leveretctl` and `leveret-diagnostics`) and `leveretctl cluster_status`:
rabbitmqctl's sections and JSON keys, from the management API's /api/overview and /api/nodes.
Presentation only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leveret.cli import ctl_common as c
from leveret.cli.ctl_common import Node
from leveret.cli.streams_api import q

PURPOSES = {"amqp": "AMQP 0-9-1 and AMQP 1.0", "amqp/ssl": "AMQP 0-9-1 and AMQP 1.0 over TLS",
            "http": "HTTP API", "stream": "stream", "stream/ssl": "stream over TLS",
            "clustering": "inter-node and CLI tool communication"}


def listeners(overview: dict[str, Any]) -> list[dict[str, Any]]:
    """The node's listeners, as rabbitmq-diagnostics lists them."""
    return [{"interface": lst.get("ip_address"), "node": lst.get("node"),
             "port": lst.get("port"), "protocol": lst.get("protocol"),
             "purpose": PURPOSES.get(str(lst.get("protocol")), str(lst.get("protocol")))}
            for lst in overview.get("listeners", [])]


def listener_line(listener: dict[str, Any], first: str = "Interface") -> str:
    return (f"{first}: {listener['interface']}, port: {listener['port']}, protocol: "
            f"{listener['protocol']}, purpose: {listener['purpose']}")


@dataclass(frozen=True)
class NodeReport:
    """What the target node says of itself: its /api/overview and its /api/nodes entry."""

    node: Node
    overview: dict[str, Any]
    me: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.overview["node"])

    @property
    def listeners(self) -> list[dict[str, Any]]:
        return listeners(self.overview)


def node_report(node: Node | None = None) -> NodeReport:
    node = node or Node()
    overview: dict[str, Any] = node.get("/api/overview")
    me: dict[str, Any] = node.get(f"/api/nodes/{q(overview['node'])}")
    node.name = overview["node"]
    return NodeReport(node, overview, me)


def alarms_of(me: dict[str, Any]) -> list[str]:
    return [name for name, key in (("memory", "mem_alarm"), ("disk", "disk_free_alarm"))
            if me.get(key)]


def _gb(value: Any) -> str:
    return f"{int(value or 0) / 1e9:.4f} gb"


def status_command() -> None:
    """Displays status of a node."""
    report = node_report()
    overview, me, name = report.overview, report.me, report.name
    alarms = alarms_of(me)
    data: dict[str, Any] = {
        "pid": int(me.get("os_pid") or 0), "os": "Linux", "product_name": "Leveret",
        "product_version": overview.get("product_version"),
        "rabbitmq_version": overview.get("rabbitmq_version"), "uptime": int(me["uptime"]) // 1000,
        "data_directory": me.get("db_dir"), "listeners": report.listeners,
        "alarms": [{"node": name, "resource": a} for a in alarms],
        "memory": {"total": {"rss": me.get("mem_used")}, "strategy": "rss"},
        "vm_memory_high_watermark_limit": me.get("mem_limit"),
        "disk_free": me.get("disk_free"), "disk_free_limit": me.get("disk_free_limit"),
        "file_descriptors": {"total_used": me.get("fd_used"), "total_limit": me.get("fd_total"),
                             "sockets_used": me.get("sockets_used")},
        "totals": {"virtual_host_count": len(report.node.get("/api/vhosts")),
                   "connection_count": overview["object_totals"]["connections"],
                   "queue_count": overview["object_totals"]["queues"]},
        "is_under_maintenance": False,
    }
    c.banner(f"Status of node {name} ...")
    c.emit_report(data, [
        "Runtime", "", f"OS PID: {data['pid']}", "OS: Linux",
        f"Uptime (seconds): {data['uptime']}", "Is under maintenance?: false",
        f"Leveret version: {data['product_version']} (RabbitMQ compatibility "
        f"{data['rabbitmq_version']})", f"Node name: {name}", "",
        "Data directory", "", f"Node data directory: {data['data_directory']}", "",
        "Listeners", "", *[listener_line(lst) for lst in data["listeners"]], "",
        "Memory", "", f"Total memory used: {_gb(me.get('mem_used'))}",
        "Calculation strategy: rss", f"Memory high watermark limit: {_gb(me.get('mem_limit'))}",
        "", "Free Disk Space", "",
        f"Low free disk space watermark: {_gb(me.get('disk_free_limit'))}",
        f"Free disk space: {_gb(me.get('disk_free'))}", "",
        "File Descriptors", "", f"Total: {me.get('fd_used')}, limit: {me.get('fd_total')}", "",
        "Alarms", "", *(alarms or ["(none)"]), "",
        "Totals", "", f"Connection count: {data['totals']['connection_count']}",
        f"Queue count: {data['totals']['queue_count']}",
        f"Virtual host count: {data['totals']['virtual_host_count']}",
    ])


def cluster_status_command() -> None:
    """Displays all the nodes in the cluster, and those running."""
    report = node_report()
    overview, name = report.overview, report.name
    nodes: list[dict[str, Any]] = report.node.get("/api/nodes")
    running = [n["name"] for n in nodes if n.get("running")]
    version = overview.get("product_version")
    data: dict[str, Any] = {
        "cluster_name": overview.get("cluster_name"),
        "disk_nodes": [n["name"] for n in nodes],
        "running_nodes": running,
        "ram_nodes": [],
        "versions": {n["name"]: {"leveret_version": n.get("version", version),
                                 "rabbitmq_name": "Leveret"} for n in nodes
                     if n["name"] in running},
        "alarms": [{"node": n["name"], "resource": a} for n in nodes for a in alarms_of(n)],
        "partitions": {},
        "listeners": {name: report.listeners},
        "maintenance_status": {n: "not under maintenance" for n in running},
    }
    c.banner(f"Cluster status of node {name} ...")
    c.emit_report(data, [
        "Basics", "", f"Cluster name: {data['cluster_name']}", "",
        "Disk Nodes", "", *data["disk_nodes"], "",
        "Running Nodes", "", *running, "",
        "Versions", "", *[f"{n}: Leveret {v['leveret_version']}"
                          for n, v in data["versions"].items()], "",
        "Maintenance status", "", *[f"Node: {n}, status: not under maintenance"
                                    for n in running], "",
        "Alarms", "", *([f"Node {a['node']}: {a['resource']} alarm" for a in data["alarms"]]
                        or ["(none)"]), "",
        "Network Partitions", "", "(none)", "",
        "Listeners", "", *[f"Node: {name}, " + listener_line(lst, "interface")
                           for lst in report.listeners],
    ])
