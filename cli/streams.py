"""`leveret-streams`: the rabbitmq-streams-style command line (filled in by the streams CLI)."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Manage Leveret streams and super streams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()
