"""The bench tools (bench/) as modules for their tests.

bench/'s modules import each other by their bare names (`from loadgen.client import ...`,
`from startup import ...`), as they do when run as scripts from bench/. Their tests import them
by file, in order (a module after the ones it imports), without putting bench/ on sys.path,
where its modules could shadow others. Must not know: what any tool measures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str, package: bool = False) -> ModuleType:
    """bench/NAME.py (or, with `package`, the package bench/NAME), imported once as `name`."""
    if name in sys.modules:
        return sys.modules[name]
    path = BENCH / name / "__init__.py" if package else BENCH / f"{name}.py"
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(BENCH / name)] if package else None)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def bench_modules(*names: str) -> ModuleType:
    """The package loadgen, the modules every tool starts with (load, startup, compare), then
    `names` in order; the last one."""
    module = bench_module("loadgen", package=True)
    for name in ("load", "startup", "compare", *names):
        module = bench_module(name)
    return module
