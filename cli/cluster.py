"""`leveret cluster-status`: the nodes etcd knows, like `rabbitmqctl cluster_status`.

Presentation only: parse the flags, read the membership keys through `broker.cluster.membership`,
render a rich table (with the alarms under it) or JSON (rabbitmqctl's keys: running and disk
nodes, versions, alarms, listeners, partitions, maintenance status, plus Leveret's `nodes`
rows), and turn every operator mistake (etcd unreachable or silent, a bad URL, no URL) into one
clear line and exit code 1. Runs its own short-lived event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, NoReturn

import typer

from leveret.broker.cluster.etcd import EtcdClient, EtcdException, EtcdUnavailable
from leveret.broker.cluster.membership import (
    MembershipError,
    cluster_nodes,
    parse_endpoints,
    unreachable,
)
from leveret.cli.streams_api import Fmt, Formatter, emit_rows

COLUMNS = ["name", "state", "version", "advertise_host", "amqp_port", "cluster_port", "alarms"]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


async def _read(endpoints: list[str], cluster: str) -> list[dict[str, Any]]:
    async with EtcdClient(endpoints, timeout_s=5.0, connect_timeout_s=2.0) as client:
        return await cluster_nodes(client, cluster)


def listeners(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A running node's listeners, as `rabbitmqctl cluster_status` lists them."""
    host = node.get("advertise_host")
    out = []
    for protocol, field, purpose in (
            ("amqp", "amqp_port", "AMQP 0-9-1 and AMQP 1.0"),
            ("clustering", "cluster_port", "inter-node and CLI tool communication"),
            ("http", "management_port", "HTTP API")):
        port = node.get(field)
        if port:
            out.append({"interface": host, "port": port, "protocol": protocol,
                        "purpose": purpose})
    return out


def cluster_status(
    etcd: Annotated[str | None, typer.Option(
        "--etcd", envvar="LEVERET_ETCD", help="etcd URL[,URL...] of the cluster.")] = None,
    cluster_name: Annotated[str, typer.Option(
        "--cluster-name", envvar="LEVERET_CLUSTER_NAME", help="The cluster's name.")] = "leveret",
    formatter: Fmt = Formatter.table,
) -> None:
    """The nodes of a cluster: running (a live record in etcd) or down, versions and alarms."""
    if not etcd:
        _fail("no etcd given; pass --etcd http://HOST:2379 or set LEVERET_ETCD")
    try:
        nodes = asyncio.run(_read(parse_endpoints([etcd]), cluster_name))
    except MembershipError as exc:
        _fail(str(exc))
    except EtcdUnavailable as exc:
        _fail(str(unreachable(exc)))
    except EtcdException as exc:
        _fail(f"etcd refused the request: {exc}")
    if formatter is Formatter.json:
        running = [n["name"] for n in nodes if n["state"] == "running"]
        typer.echo(json.dumps({
            "cluster_name": cluster_name,
            "disk_nodes": [n["name"] for n in nodes],
            "running_nodes": running,
            "versions": {n["name"]: n["version"] for n in nodes if n["name"] in running},
            "alarms": [{"node": n["name"], "alarms": n["alarms"]} for n in nodes if n["alarms"]],
            "ram_nodes": [],
            "partitions": {},
            "listeners": {n["name"]: listeners(n) for n in nodes if n["name"] in running},
            "maintenance_status": {n["name"]: "not under maintenance" for n in nodes
                                   if n["name"] in running},
            "nodes": nodes,
        }, indent=2))
        return
    if not nodes:
        typer.echo(f"Cluster '{cluster_name}' has no known nodes.")
        return
    typer.echo(f"Cluster status of cluster '{cluster_name}'")
    rows = [{**n, "alarms": ", ".join(n["alarms"]) or "none"} for n in nodes]
    emit_rows(rows, COLUMNS, formatter)
    alarms = [f"{n['name']}: {', '.join(n['alarms'])}" for n in nodes if n["alarms"]]
    typer.echo("Alarms: " + ("; ".join(alarms) if alarms else "(none)"))
