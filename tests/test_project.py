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
    """cli -> broker -> {amqp, storage}; amqp and storage do not know each other; spark -> amqp."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is part of the test extra; pip install -e '.[test]'")
    result = run(exe)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    result = run(sys.executable, "-m", "ruff", "check", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    """mypy --strict over the five packages as they install (pyproject's [tool.mypy])."""
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_mypy_sees_across_modules(tmp_path: Path) -> None:
    """A type error that only another module's signature reveals fails the check: mypy
    resolves leveret.* itself rather than reading every project import as Any."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from leveret.amqp.frames import FrameBuffer\n"
        "from leveret.storage import LogConfig\n"
        "FrameBuffer(frame_max='131072')\n"
        "LogConfig(fsync='sometimes')\n"
    )
    result = run(sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                 str(probe))
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'probe.py:3: error: Argument "frame_max" to "FrameBuffer"' in result.stdout
    assert 'probe.py:4: error: Argument "fsync" to "LogConfig"' in result.stdout
