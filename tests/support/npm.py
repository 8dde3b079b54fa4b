"""Node.js clients for the tests: installed from npm beside their scenario scripts on first use."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def installed(directory: Path, package: str) -> None:
    """`npm install` in `directory` unless `package` is there already. Skips the test when
    Node.js or npm is missing (apt-get install nodejs npm); a failed install fails it."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed (apt-get install nodejs npm)")
    if (directory / "node_modules" / package).is_dir():
        return
    result = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--no-package-lock"],
        cwd=directory, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"npm install failed:\n{result.stderr[-2000:]}"
