"""`leveret cluster-status`: the nodes etcd knows, like `rabbitmqctl cluster_status`.

Presentation only: parse the flags, read the membership keys through `broker.cluster.membership`,
render a rich table or JSON, and turn every operator mistake (etcd unreachable, a bad URL) into
one clear line and exit code 1. Runs its own short-lived event loop.
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
            "nodes": nodes,
        }, indent=2))
        return
    if not nodes:
        typer.echo(f"Cluster '{cluster_name}' has no known nodes.")
        return
    typer.echo(f"Cluster status of cluster '{cluster_name}'")
    rows = [{**n, "alarms": ", ".join(n["alarms"]) or "none"} for n in nodes]
    emit_rows(rows, COLUMNS, formatter)
