"""`leveretctl` and `leveret-diagnostics` run in the test process (`ctl_common.run`, as their
console scripts run them) against a real node: fast enough to run every command, with the
exit code, stdout and stderr the operator would see."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pika
import pytest
import typer

from leveret.cli import ctl_common as c
from leveret.cli.ctl_common import OPTIONS, Options


class Result:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()


class Tool:
    """One of the two tools, finding its node from `data_dir` and `management_port` as
    `--data-dir` and `--management-port` give them."""

    def __init__(self, app: typer.Typer, data_dir: Path, management_port: int) -> None:
        self.app = app
        self.where = ["--data-dir", str(data_dir), "--management-port", str(management_port)]

    def attempt(self, *args: str, where: bool = True) -> Result:
        """Run a command, whatever its exit code."""
        OPTIONS.__dict__.update(Options().__dict__)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                c.run(self.app, [*args, *(self.where if where else [])])
                exit_code = 0
            except SystemExit as exit_:
                exit_code = int(exit_.code or 0)
        result = Result(exit_code, out.getvalue(), err.getvalue())
        assert "Traceback" not in result.stdout + result.stderr
        return result

    def run(self, *args: str, code: int = 0, where: bool = True) -> Result:
        result = self.attempt(*args, where=where)
        assert result.code == code, (args, result.code, result.stdout, result.stderr)
        return result

    def __call__(self, *args: str) -> Result:
        return self.run(*args)

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--formatter", "json").stdout)

    def error(self, *args: str, code: int, where: bool = True) -> str:
        """A failing command: exactly one line on stderr and the exit code; returns it."""
        result = self.run(*args, code=code, where=where)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error")
        return lines[0]


def close_connection(tool: Tool, conn: pika.BlockingConnection, name: str, *options: str) -> None:
    """`close_connection NAME "go away"` prints its banner, and the client sees its connection
    closed with that explanation."""
    assert tool("close_connection", name, "go away", *options).lines == [
        f"Closing connection {name}, reason: go away..."]
    with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
        conn.process_data_events(2)
        conn.process_data_events(2)
    assert "go away" in str(closed.value)
