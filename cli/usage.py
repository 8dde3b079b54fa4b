"""Running a typer app so that a usage mistake (an unknown option, a missing one, a bad value)
is one line on stderr and exit code 1, as every other failure of the CLI; help and normal
exits are unchanged. Presentation only.
"""

from __future__ import annotations

import sys

import typer


def run(app: typer.Typer, args: list[str] | None = None) -> None:
    try:
        code = app(args=args, standalone_mode=False)
    except typer.Abort:
        typer.echo("Error: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as error:  # typer's click: UsageError, BadParameter, ...
        format_message = getattr(error, "format_message", None)
        message = format_message() if callable(format_message) else str(error)
        typer.echo(f"Error: {message}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
