"""Layering inside leveret.*: no import cycles, and import-linter's contracts (pyproject's
[tool.importlinter]) can fail. Each check is run on a deliberate violation, to show it can fail;
that the contracts hold on this tree is test_project.py's test_dependency_direction.

Edges are counted as `support/import_graph.py` says: every import statement anywhere in a module
(at the top, in a function, under `if TYPE_CHECKING:`) is an edge, `from pkg import submodule`
is an edge to the submodule, and `from pkg import name` an edge to `pkg`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from support.import_graph import package_cycles

ROOT = Path(__file__).resolve().parent.parent
PARTS = ["amqp", "storage", "broker", "cli", "spark"]


def leveret_cycles(root: Path) -> set[frozenset[str]]:
    """The cycles among the five packages under `root`, named without the `leveret.` prefix."""
    found = package_cycles({f"leveret.{part}": root / part for part in PARTS})
    return {frozenset(m.removeprefix("leveret.") for m in c) for c in found}


def test_no_import_cycle_in_leveret() -> None:
    assert leveret_cycles(ROOT) == set()


def test_a_new_cycle_in_leveret_fails(copy: Path) -> None:
    """storage.log imports storage.bloom (through chunk); bloom importing log in a function
    closes a cycle, which the check reports."""
    path = copy / "leveret" / "storage" / "bloom.py"
    original = path.read_text()
    path.write_text(original + "\n\ndef _violation() -> None:\n    import leveret.storage.log\n")
    try:
        found = leveret_cycles(copy / "leveret")
    finally:
        path.write_text(original)
    assert len(found) == 1 and {"storage.bloom", "storage.log"} <= next(iter(found)), found


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("back_edge", [
    "import pkg.a\n",
    "def later():\n    from pkg import a\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
    "from . import a\n",
    "from .a import A\n",
])
def test_cycle_check_finds_every_kind_of_import(tmp_path: Path, back_edge: str) -> None:
    """pkg.a imports pkg.b at the top; pkg.b imports pkg.a in one of the counted ways."""
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "a.py", "from pkg.b import B\nclass A: ...\n")
    write(tmp_path / "pkg" / "b.py", back_edge + "class B: ...\n")
    assert package_cycles({"pkg": tmp_path / "pkg"}) == [frozenset({"pkg.a", "pkg.b"})]


def test_cycle_check_passes_a_package_without_cycles(tmp_path: Path) -> None:
    """A package __init__ re-exporting its submodules, which import each other through
    `from pkg import submodule`, has no cycle: that names the submodule, not the package."""
    write(tmp_path / "pkg" / "__init__.py", "from pkg.a import A\nfrom pkg.b import B\n")
    write(tmp_path / "pkg" / "a.py", "from pkg import b\nclass A: ...\n")
    write(tmp_path / "pkg" / "b.py", "import os\nclass B: ...\n")
    assert package_cycles({"pkg": tmp_path / "pkg"}) == []


def test_cycle_check_counts_a_name_from_the_package_as_the_package(tmp_path: Path) -> None:
    """`from pkg import B` in pkg.a, where B is defined by pkg/__init__ importing pkg.a."""
    write(tmp_path / "pkg" / "__init__.py", "from pkg.a import A\nclass B: ...\n")
    write(tmp_path / "pkg" / "a.py", "from pkg import B\nclass A: ...\n")
    assert package_cycles({"pkg": tmp_path / "pkg"}) == [frozenset({"pkg", "pkg.a"})]


def lint_imports(pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with pyproject's contracts, on the `leveret` folder under `pythonpath`."""
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is part of the test extra; pip install -e '.[test]'")
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=pythonpath, env=env, capture_output=True, text=True, timeout=300)


# One violation per contract of pyproject.toml: (the file that gains an import, what it imports).
VIOLATIONS = {
    "cli -> broker -> {amqp, storage}": ("storage/clock.py", "leveret.cli.app"),
    "amqp imports pamqp and the stdlib only": ("amqp/tables.py", "asyncio"),
    "storage knows nothing of AMQP or asyncio": ("storage/bloom.py", "leveret.amqp.tables"),
    "the broker model never sees pamqp": ("broker/model/intervals.py", "pamqp"),
    "spark imports nothing of leveret but the amqp wire layer": (
        "spark/errors.py", "leveret.storage.clock"),
    "the cluster layer never sees the AMQP wire layer": ("broker/cluster/etcd_types.py", "pamqp"),
    "the broker model knows no front end, no cluster and no server": (
        "broker/model/intervals.py", "leveret.broker.cluster.etcd_types"),
    "nothing below the server imports the management HTTP API": (
        "broker/session/errors.py", "leveret.broker.management.http"),
    "the wire workers are reached only by the server": (
        "broker/cluster/etcd_types.py", "leveret.broker.workers.ipc"),
    "the wire workers know no broker room": (
        "broker/workers/ipc.py", "leveret.broker.model.errors"),
    "the topology port knows no front end": (
        "broker/topology/port.py", "leveret.broker.session.errors"),
    "the session reaches remote queues only through the queue-type interface": (
        "broker/session/topology.py", "leveret.broker.remote.remote_queue"),
}


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the five packages as `leveret/`, for lint-imports to read; returns its parent."""
    parent = tmp_path_factory.mktemp("layers")
    for part in PARTS:
        shutil.copytree(ROOT / part, parent / "leveret" / part,
                        ignore=shutil.ignore_patterns("__pycache__", "static"))
    return parent


def test_the_copy_keeps_every_contract(copy: Path) -> None:
    """Without a violation the copy passes: what breaks below is the violation's doing."""
    result = lint_imports(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(VIOLATIONS)} kept, 0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_each_import_linter_contract_fails_on_its_violation(copy: Path, contract: str) -> None:
    """One import inside a function, added to one module of the copy, breaks `contract`."""
    file, target = VIOLATIONS[contract]
    path = copy / "leveret" / file
    original = path.read_text()
    path.write_text(original + f"\n\ndef _violation() -> None:\n    import {target}  # noqa\n")
    try:
        result = lint_imports(copy)
    finally:
        path.write_text(original)
    assert result.returncode != 0, result.stdout
    assert re.search(rf"^{re.escape(contract)} BROKEN$", result.stdout, re.MULTILINE), \
        result.stdout


def test_every_contract_has_a_violation() -> None:
    """A contract added to pyproject.toml needs its line in VIOLATIONS."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [contract["name"] for contract in config["tool"]["importlinter"]["contracts"]]
    assert sorted(names) == sorted(VIOLATIONS)
