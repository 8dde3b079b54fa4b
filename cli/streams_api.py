"""What the `leveret-streams` commands share: the management API client, the common options,
and rendering (rich tables or JSON). Presentation only; stdlib urllib for HTTP.
"""

from __future__ import annotations

import base64
import contextlib
import json
from enum import StrEnum
from typing import Annotated, Any, NoReturn
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlsplit
from urllib.request import Request, urlopen

import typer
from rich.console import Console
from rich.table import Table

DEFAULT_URL = "http://guest:guest@localhost:15672"


class Formatter(StrEnum):
    table = "table"
    json = "json"


class CliError(Exception):
    """A failure to report in one line."""


def fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(1)


# -- options shared by the commands that talk to the broker ------------------------------------

Vhost = Annotated[str, typer.Option("--vhost", "-p", help="Virtual host.")]
Fmt = Annotated[Formatter, typer.Option("--formatter", help="Output format: table or json.")]
Url = Annotated[str | None, typer.Option(
    "--url", envvar="LEVERET_MANAGEMENT_URL",
    help=f"Management API URL, with credentials [default: {DEFAULT_URL}].")]
Host = Annotated[str | None, typer.Option("--host", help="Management API host.")]
Port = Annotated[int | None, typer.Option("--port", help="Management API port.")]
User = Annotated[str | None, typer.Option("--username", help="User name.")]
Password = Annotated[str | None, typer.Option("--password", help="Password.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No banners.")]
Columns = Annotated[list[str] | None, typer.Argument(help="Columns to show.", show_default=False)]


class Api:
    """The management API of one broker, over urllib."""

    def __init__(self, url: str | None, host: str | None, port: int | None,
                 username: str | None, password: str | None) -> None:
        parts = urlsplit(url or DEFAULT_URL)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            fail(f"invalid management URL '{url}'; expected e.g. {DEFAULT_URL}")
        self.scheme = parts.scheme
        self.host = host or parts.hostname
        try:
            self.port = port or parts.port or 15672
        except ValueError:
            fail(f"invalid port in management URL '{url}'")
        self.username = username or unquote(parts.username or "guest")
        self.password = password if password is not None else unquote(parts.password or "guest")

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def call(self, method: str, path: str, body: Any = None, missing: str | None = None,
             accept: tuple[int, ...] = ()) -> Any:
        """The answer's JSON; CliError for a failure, but an error status in `accept` (a
        health check's 503) is answered with its JSON body too."""
        data = json.dumps(body).encode() if body is not None else None
        request = Request(self.base + path, data=data, method=method)
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urlopen(request, timeout=30) as response:
                raw = response.read()
        except HTTPError as error:
            if error.code in accept:
                with contextlib.suppress(json.JSONDecodeError, OSError):
                    return json.loads(error.read() or b"{}")
            reason = error_reason(error)
            if error.code == 401:
                raise CliError(f"the broker at {self.base} refused user '{self.username}': "
                               f"{reason}") from None
            if error.code == 404 and reason in ("Not Found", "vhost_not_found"):
                raise CliError(missing or f"not found: {path}") from None
            raise CliError(reason) from None
        except (URLError, OSError) as error:
            cause = getattr(error, "reason", error)
            raise CliError(f"cannot reach the Leveret management API at {self.base} ({cause}); "
                           "is the broker running with its management port open?") from None
        return json.loads(raw) if raw.strip() else None


def error_reason(error: HTTPError) -> str:
    """The management API's `reason` for a failed request, or its HTTP status line."""
    try:
        body = json.loads(error.read() or b"{}")
    except (json.JSONDecodeError, OSError):
        body = {}
    reason = body.get("reason") if isinstance(body, dict) else None
    return str(reason or f"HTTP {error.code} {error.reason}").strip()


def q(value: str) -> str:
    return quote(value, safe="")


def run(action: Any) -> None:
    """Run one command's body, turning CliError into one line and exit code 1."""
    try:
        action()
    except CliError as error:
        fail(str(error))


# -- rendering --------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if value is None:
        return ""
    return str(value)


def emit_rows(rows: list[dict[str, Any]], columns: list[str], fmt: Formatter) -> None:
    """A list: a rich table, or JSON; a table of nothing prints nothing."""
    rows = [{c: row.get(c) for c in columns} for row in rows]
    if fmt is Formatter.json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        return
    table = Table(*columns, box=None, header_style="bold", pad_edge=False)
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    Console(highlight=False, width=max(120, Console().width)).print(table)


def emit(message: str, data: Any, fmt: Formatter) -> None:
    typer.echo(json.dumps(data, indent=2) if fmt is Formatter.json else message)


def banner(text: str, fmt: Formatter, quiet: bool) -> None:
    if fmt is Formatter.table and not quiet:
        typer.echo(text)


def requested_columns(requested: list[str] | None, default: list[str],
                      valid: list[str]) -> tuple[list[str], list[str]]:
    """The columns asked for (each argument may list several, comma-separated), or `default`;
    and those of them not in `valid`."""
    if not requested:
        return default, []
    columns = [c for item in requested for c in item.split(",") if c]
    return columns, [c for c in columns if c not in valid]


def pick_columns(requested: list[str] | None, default: list[str], valid: list[str]) -> list[str]:
    columns, unknown = requested_columns(requested, default, valid)
    if unknown:
        fail(f"invalid column(s): {', '.join(unknown)}; valid columns are {', '.join(valid)}")
    return columns
