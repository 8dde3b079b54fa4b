"""What `leveretctl` and `leveret-diagnostics` share: their global options, the local node and
its credential, the management API client, rabbitmqctl's exit codes and its output formats.

Presentation only. The node is found from the same settings as `leveret serve`
(`broker.config.load`: a TOML file, LEVERET_* and flags); the credential is the token the node
writes into its data directory (docs/CLI.md#the-local-credential); `--node NAME` is looked up
in the local node's /api/nodes (docs/CLI.md#finding-the-node). Stdlib urllib for HTTP.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import platform
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit
from urllib.request import Request, urlopen

import typer

from leveret.broker.management.local_token import TOKEN_FILE
from leveret.broker.process.config import ConfigError, load
from leveret.cli.streams_api import error_reason, requested_columns

# rabbitmqctl's exit codes (sysexits.h), as it gives them
EX_OK = 0
EX_USAGE = 64  # a usage mistake: unknown command or option, missing argument, bad column
EX_DATAERR = 65  # bad data: an unknown vhost for some commands, a bad JSON definition
EX_NOINPUT = 66  # an input file that cannot be read
EX_NOUSER = 67  # an unknown user
EX_UNAVAILABLE = 69  # the node cannot be reached, a failed health check, some "not found"s
EX_SOFTWARE = 70  # what RabbitMQ reports as an internal error (e.g. a user that exists)


class CtlError(Exception):
    """A failure to report in one line, with its exit code."""

    def __init__(self, message: str, code: int = EX_SOFTWARE) -> None:
        super().__init__(message)
        self.code = code


class ApiStatus(Exception):
    """The management API answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# -- the two tools' typer apps -------------------------------------------------------------------

FINDING_THE_NODE = ("-t/--timeout SECONDS, and `leveret serve`'s --config, --data-dir and "
                    "--management-port to find the local node.")


def make_app(tool_help: str) -> typer.Typer:
    """A tool's app: no completion or pretty tracebacks (a mistake is one line), -h as --help."""
    return typer.Typer(
        help=tool_help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


# -- global options: anywhere on the command line, as rabbitmqctl takes them ------------------

VALUED = {"-n": "node", "--node": "node", "--formatter": "formatter", "-p": "vhost",
          "--vhost": "vhost", "-t": "timeout", "--timeout": "timeout", "--config": "config",
          "--data-dir": "data_dir", "--management-port": "management_port"}
FLAGS = {"-q": "quiet", "--quiet": "quiet", "--no-table-headers": "no_headers",
         "-s": "silent", "--silent": "silent"}


@dataclass
class Options:
    node: str | None = None
    formatter: str = "table"
    vhost: str = "/"
    timeout: float = 60.0
    config: str | None = None
    data_dir: str | None = None
    management_port: str | None = None
    quiet: bool = False
    silent: bool = False
    no_headers: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def json(self) -> bool:
        return self.formatter == "json"


OPTIONS = Options()


def usage_error(message: str) -> NoReturn:
    typer.echo(f"Error (argument validation): {message}", err=True)
    sys.exit(EX_USAGE)


def split_globals(argv: list[str]) -> list[str]:
    """Take the global options out of argv into OPTIONS; the rest is for the command."""
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            rest.append(arg)
            rest.extend(args)
            break
        name, eq, inline = arg.partition("=")
        if arg in FLAGS:
            setattr(OPTIONS, FLAGS[arg], True)
        elif name in VALUED:
            value = inline if eq else next(args, None)
            if value is None:
                usage_error(f"option {name} needs a value")
            setattr(OPTIONS, VALUED[name], value)
        else:
            rest.append(arg)
    if OPTIONS.formatter not in ("table", "json"):
        usage_error(f"unsupported formatter '{OPTIONS.formatter}'; use table or json")
    try:
        OPTIONS.timeout = float(OPTIONS.timeout)
    except ValueError:
        usage_error(f"invalid timeout '{OPTIONS.timeout}'")
    OPTIONS.quiet = OPTIONS.quiet or OPTIONS.silent
    return rest


def run(app: typer.Typer, argv: list[str] | None = None) -> None:
    """Run a command: usage mistakes exit 64, CtlError its own code, each in one line."""
    args = split_globals(list(sys.argv[1:] if argv is None else argv))
    try:
        code = app(args=args, standalone_mode=False)
    except CtlError as error:
        typer.echo(f"Error: {error}", err=True)
        sys.exit(error.code)
    except ApiStatus as error:  # a refusal the command has no word of its own for
        typer.echo(f"Error: {error.reason}", err=True)
        sys.exit(EX_SOFTWARE)
    except typer.Abort:
        typer.echo("Error: aborted", err=True)
        sys.exit(EX_SOFTWARE)
    except typer.TyperException as error:  # click's UsageError, BadParameter, NoSuchOption
        format_message = getattr(error, "format_message", None)
        message = format_message() if callable(format_message) else str(error)
        usage_error(" ".join(message.split()))
    sys.exit(code if isinstance(code, int) else EX_OK)


def entry_point(app: typer.Typer) -> Callable[[], None]:
    """A console script's `main`: runs `app` on sys.argv, as `run` does."""
    def main() -> None:
        run(app)
    return main


# -- the node and its credential ----------------------------------------------------------------


class Node:
    """The management API of the target node, with the local node's token: the local node
    from `leveret serve`'s settings, or `--node HOST:PORT` / `--node http://HOST:PORT`, or
    `--node NAME`, a node of the local node's cluster (found in its /api/nodes)."""

    def __init__(self) -> None:
        try:
            config = load(Path(OPTIONS.config) if OPTIONS.config else None, overrides={
                "data_dir": OPTIONS.data_dir, "management_port": OPTIONS.management_port})
        except ConfigError as exc:
            raise CtlError(str(exc), EX_USAGE) from None
        self.token_path = config.data_dir / TOKEN_FILE
        self.name: str | None = None
        address = _node_url(OPTIONS.node) if OPTIONS.node else None
        if address is None and not config.management_port:  # the local API is needed
            raise CtlError("the node's management API is disabled (management_port = 0); "
                           "Leveret's CLI tools talk to it", EX_UNAVAILABLE)
        host = reachable_host(config.management_host or config.host)
        self.local_base = f"http://{_url_host(host)}:{config.management_port}"
        # None for a node's name, looked up through the local node at first use
        self._base = address if OPTIONS.node else self.local_base

    @property
    def base(self) -> str:
        """The target's management URL; a node named by `--node` is looked up at first use."""
        if self._base is None:
            self._base = self._named_node_url(str(OPTIONS.node))
        return self._base

    def _named_node_url(self, name: str) -> str:
        nodes: list[dict[str, Any]] = self._request(self.local_base, "GET", "/api/nodes")
        found = next((n for n in nodes if n.get("name") == name), None)
        if found is None:
            names = ", ".join(str(n.get("name")) for n in nodes)
            raise CtlError(f"no node named '{name}' in the cluster of the local node "
                           f"(its nodes: {names})", EX_UNAVAILABLE)
        if "os_pid" in found:  # the node answering lists itself in full: the local node
            return self.local_base
        return management_url_of(found)

    def _authorization(self) -> str:
        try:
            token = self.token_path.read_text().strip()
        except FileNotFoundError:
            raise CtlError(f"no local credential at {self.token_path}: is the node running "
                           "with this data directory (--data-dir, LEVERET_DATA_DIR)?",
                           EX_UNAVAILABLE) from None
        except OSError as exc:
            raise CtlError(f"cannot read the local credential {self.token_path} "
                           f"({exc.strerror}): run as the node's user", 77) from None
        return f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, timeout: float | None = None) -> Any:
        return self._request(self.base, method, path, body, headers, timeout)

    def _request(self, base: str, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = Request(base + path, data=data, method=method)
        request.add_header("Authorization", self._authorization())
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urlopen(request, timeout=timeout or OPTIONS.timeout) as response:
                raw = response.read()
        except HTTPError as error:
            status = ApiStatus(error.code, error_reason(error))
            if error.code == 401:
                raise CtlError(f"the node at {base} refused the local credential "
                               f"({status.reason}); is it the node of this data directory?",
                               EX_UNAVAILABLE) from None
            raise status from None
        except (URLError, OSError) as error:
            cause = getattr(error, "reason", error)
            raise CtlError(f"unable to perform an operation on node {base} ({cause}); "
                           "is the node running with its management port open?",
                           EX_UNAVAILABLE) from None
        return json.loads(raw) if raw.strip() else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    @property
    def host(self) -> str:
        """The host the node's API is reached at."""
        return urlsplit(self.base).hostname or "127.0.0.1"

    def node_name(self) -> str:
        if self.name is None:
            self.name = str(self.get("/api/overview?columns=node")["node"])
        return self.name


def reachable_host(host: str, wildcard: str = "127.0.0.1") -> str:
    """Where a listener bound to `host` is reached: a wildcard address (every interface) at
    `wildcard`, the address its node is reached at."""
    return wildcard if host in ("", "::", "0.0.0.0", "[::]") else host


def management_url_of(node: dict[str, Any]) -> str:
    """Another node's management URL, from its /api/nodes entry: its advertised host and
    management port; a host that is this machine is reached at 127.0.0.1, where the local
    credential is accepted."""
    name = node.get("name")
    if not node.get("running"):
        raise CtlError(f"node '{name}' is not running", EX_UNAVAILABLE)
    port = node.get("management_port")
    if not port:
        raise CtlError(f"node '{name}' has no management API (management_port = 0)",
                       EX_UNAVAILABLE)
    host = str(node.get("advertise_host") or "127.0.0.1")
    return f"http://{_url_host('127.0.0.1' if on_this_machine(host) else host)}:{port}"


def on_this_machine(host: str) -> bool:
    """`host` is this machine: localhost, its host name, or an address it can bind to."""
    if host in ("localhost", socket.gethostname(), platform.node()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_address(node: str) -> bool:
    """`--node`'s value is a management address (a URL, or HOST:PORT), not a node's name."""
    host, colon, port = node.rpartition(":")
    return "://" in node or bool(colon and host and port.isdigit())


def _node_url(node: str) -> str | None:
    """`--node`'s value as a management URL, or None when it names a node."""
    if not _is_address(node):
        return None
    url = node if "://" in node else f"http://{node}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        usage_error(f"--node takes a node's name or its management address, HOST:PORT or "
                    f"http://HOST:PORT, not '{node}'")
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


@contextmanager
def refusals(missing: CtlError | None = None, code: int = EX_SOFTWARE) -> Iterator[None]:
    """The API's refusal as the command's one-line error: a 404 as `missing` (when given),
    any other status as its reason with `code`."""
    try:
        yield
    except ApiStatus as error:
        if error.status == 404 and missing is not None:
            raise missing from None
        raise CtlError(error.reason, code) from None


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- output, as rabbitmqctl's -------------------------------------------------------------------


def banner(*lines: str) -> None:
    """The lines rabbitmqctl prints before a result; none with -q or --formatter json."""
    if not OPTIONS.quiet and not OPTIONS.json:
        for line in lines:
            typer.echo(line)


def say(text: str) -> None:
    """A result line of a command that changes something (not printed with -q)."""
    if not OPTIONS.quiet:
        typer.echo(text)


def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def emit_report(data: dict[str, Any], lines: Iterable[str]) -> None:
    """A report of one object: its JSON with --formatter json, else its lines."""
    if OPTIONS.json:
        typer.echo(json.dumps(data, separators=(",", ":")))
        return
    for line in lines:
        typer.echo(line)


def json_rows(rows: Iterable[dict[str, Any]]) -> str:
    """rabbitmqctl's JSON for a list: one object a line, the comma leading."""
    items = [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in rows]
    return "[\n" + "\n,".join(items) + ("\n" if items else "") + "]"


def emit_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    rows = [{c: r.get(c) for c in columns} for r in rows]
    if OPTIONS.json:
        typer.echo(json_rows(rows))
        return
    if not rows:
        return
    if not OPTIONS.no_headers:
        typer.echo("\t".join(columns))
    for row in rows:
        typer.echo("\t".join(cell(row[c]) for c in columns))


def pick_columns(requested: list[str] | None, default: list[str], valid: list[str],
                 command: str) -> list[str]:
    columns, unknown = requested_columns(requested, default, valid)
    if unknown:
        usage_error(f"Info key(s) {','.join(unknown)} are not supported (valid for {command}: "
                    f"{', '.join(valid)})")
    return columns


def mapped(rows: list[dict[str, Any]], mapping: Callable[[dict[str, Any]], dict[str, Any]],
           ) -> list[dict[str, Any]]:
    return [{**row, **mapping(row)} for row in rows]
