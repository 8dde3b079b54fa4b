"""The project's own checks: lint, types and the dependency direction of DESIGN.md."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["amqp", "broker", "storage", "cli", "spark"]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_dependency_direction() -> None:
    """cli -> broker -> {amqp, storage}; amqp and storage do not know each other; spark alone."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is part of the test extra; pip install -e '.[test]'")
    result = run(exe)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    result = run(sys.executable, "-m", "ruff", "check", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = run(sys.executable, "-m", "mypy", *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
