"""`leveret`: run the broker, and the tools that go with it.

Presentation only: parse the flags, build the config, call the broker, and turn every
operator mistake into one clear line and exit code 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from leveret.broker.process import logs
from leveret.broker.process.config import ConfigError, load
from leveret.broker.server import ServerError, serve
from leveret.cli.cluster import cluster_status

app = typer.Typer(
    help="Leveret, an AMQP 0.9.1 broker in Python.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Leveret, an AMQP 0.9.1 broker in Python."""


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command("serve")
def serve_command(
    host: Annotated[
        str | None,
        typer.Option(help="Address to listen on [default: ::, IPv4 and IPv6; env LEVERET_HOST]"),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="AMQP port [default: 5672; env LEVERET_PORT]")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir", help="Data directory [default: ./leveret-data; env LEVERET_DATA_DIR]"
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML config file")] = None,
    management_port: Annotated[
        int | None,
        typer.Option(
            "--management-port", help="Management HTTP API port, 0 to disable [default: 15672]"
        ),
    ] = None,
    stream_port: Annotated[
        int | None,
        typer.Option("--stream-port", help="Stream protocol port, 0 to disable [default: 5552]"),
    ] = None,
    stream_tls_port: Annotated[
        int | None,
        typer.Option("--stream-tls-port", help="Stream protocol TLS port, 0 to disable "
                     "[default: 5551, opened when tls_certfile and tls_keyfile are set]"),
    ] = None,
    stream_advertised_host: Annotated[
        str | None,
        typer.Option("--stream-advertised-host", help="Host that stream clients are told to "
                     "connect to [default: the address they connected to]"),
    ] = None,
    stream_advertised_port: Annotated[
        int | None,
        typer.Option("--stream-advertised-port", help="Port that stream clients are told to "
                     "connect to [default: the port they connected to]"),
    ] = None,
    definitions: Annotated[
        Path | None, typer.Option("--definitions", help="A definitions JSON file to load at boot")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Processes serving AMQP clients: 0 is one per core, 1 this "
                     "one alone, N adds N-1 wire workers [default: 0; env LEVERET_WORKERS]"),
    ] = None,
    loop: Annotated[
        str | None, typer.Option("--loop", help="Event loop: asyncio or uvloop")
    ] = None,
    log_format: Annotated[
        str | None, typer.Option("--log-format", help="auto, console or json")
    ] = None,
    etcd: Annotated[
        str | None,
        typer.Option("--etcd", help="etcd URL[,URL...]: run as a cluster node [env LEVERET_ETCD]"),
    ] = None,
    node_name: Annotated[
        str | None,
        typer.Option("--node-name", help="This node's name [default: leveret@<hostname>]"),
    ] = None,
    cluster_name: Annotated[
        str | None, typer.Option("--cluster-name", help="The cluster to join [default: leveret]")
    ] = None,
    cluster_port: Annotated[
        int | None, typer.Option("--cluster-port", help="Node-to-node port [default: 25672]")
    ] = None,
    advertise_host: Annotated[
        str | None,
        typer.Option("--advertise-host", help="Host other nodes reach this one at "
                     "[default: the hostname]"),
    ] = None,
    cluster_secret_file: Annotated[
        Path | None,
        typer.Option("--cluster-secret-file", help="File holding the cluster's shared secret "
                     "[env LEVERET_CLUSTER_SECRET_FILE, or the secret in LEVERET_CLUSTER_SECRET]"),
    ] = None,
    default_queue_type: Annotated[
        str | None,
        typer.Option("--default-queue-type", metavar="TYPE",
                     help="classic, quorum or stream: the type of a queue declared without "
                     "x-queue-type in a vhost created without its own [default: classic; env "
                     "LEVERET_DEFAULT_QUEUE_TYPE]"),
    ] = None,
    # str, not float: `load` turns a bad value into its one-line error, as from TOML or env
    cluster_heartbeat_interval_s: Annotated[
        str | None,
        typer.Option("--cluster-heartbeat-interval-s", metavar="SECONDS",
                     help="A heartbeat on each idle node-to-node link this often [default: 0.5; "
                     "env LEVERET_CLUSTER_HEARTBEAT_INTERVAL_S]"),
    ] = None,
    cluster_heartbeat_timeout_s: Annotated[
        str | None,
        typer.Option("--cluster-heartbeat-timeout-s", metavar="SECONDS",
                     help="Drop a node-to-node link that received nothing this long: the peer "
                     "is unreachable [default: 2.0; env LEVERET_CLUSTER_HEARTBEAT_TIMEOUT_S]"),
    ] = None,
) -> None:
    """Run the broker with its embedded defaults, overridden by a file, LEVERET_* and flags."""
    try:
        cfg = load(
            config,
            overrides={
                "host": host,
                "port": port,
                "data_dir": data_dir,
                "management_port": management_port,
                "definitions": definitions,
                "stream_port": stream_port,
                "stream_tls_port": stream_tls_port,
                "stream_advertised_host": stream_advertised_host,
                "stream_advertised_port": stream_advertised_port,
                "loop": loop,
                "workers": workers,
                "log_format": log_format,
                "etcd": etcd,
                "node_name": node_name,
                "cluster_name": cluster_name,
                "cluster_port": cluster_port,
                "advertise_host": advertise_host,
                "cluster_secret_file": cluster_secret_file,
                "cluster_heartbeat_interval_s": cluster_heartbeat_interval_s,
                "cluster_heartbeat_timeout_s": cluster_heartbeat_timeout_s,
                "default_queue_type": default_queue_type,
            },
        )
    except ConfigError as exc:
        fail(str(exc))
    logs.configure(cfg.log_format, cfg.log_level)
    if cfg.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            fail("--loop uvloop needs the uvloop extra: pip install 'leveret[uvloop]'")
        runner: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    elif cfg.loop == "asyncio":
        runner = asyncio.run
    else:
        fail(f"unknown event loop '{cfg.loop}'; use asyncio or uvloop")
    try:
        code = runner(serve(cfg))
    except ServerError as exc:
        fail(str(exc))
    raise typer.Exit(code)


app.command("cluster-status")(cluster_status)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
