"""The import graph of a set of packages, read with `ast`, and its cycles.

Edges are counted so that an import Python might run at some point is an edge, whatever the
import sits in:

- Every `import` and `from ... import` statement anywhere in a module counts: at the top, inside
  a function or a method, under `if TYPE_CHECKING:`, inside `try:`. Nothing is executed.
- `import a.b.c` (with or without `as`) is one edge, to `a.b.c`.
- `from a.b import c` is an edge to the module `a.b.c` when that module exists (`c` is a
  submodule), and otherwise an edge to `a.b` (`c` is a name defined in `a.b`). One edge per
  imported name, so `from a.b import c, d` may give two.
- Relative imports are resolved against the importing module (a package's `__init__` counts as
  the package itself).
- Only edges between modules of the graph count; imports of anything else (the stdlib, pamqp)
  are left out, and a module importing itself is not a cycle.
- The parent packages that Python initialises on the way (`a` and `a.b` for `import a.b.c`) are
  not edges: the statement names `a.b.c`, and the packages' own imports are their own edges.

A cycle is a strongly connected component with more than one module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path


def modules_of(package: str, folder: Path) -> dict[str, Path]:
    """Module name -> file, for every `.py` file under `folder`, which imports as `package`."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports, counted as the module
    docstring says."""
    modules = set(known)
    is_package = path.name == "__init__.py"
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                edges.add(submodule if submodule in modules else base)
    return {edge for edge in edges if edge in modules and edge != name}


def _absolute(name: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    parts = name.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, module] if module else anchor)


def graph_of(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    return [component for component in _components(graph) if len(component) > 1]


def _components(graph: Mapping[str, set[str]]) -> Iterator[frozenset[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[frozenset[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            yield frozenset(component)

    for node in sorted(graph):
        if node not in index:
            yield from visit(node)


def package_cycles(packages: Mapping[str, Path]) -> list[frozenset[str]]:
    """The cycles among these packages (name -> folder), read in a fresh interpreter.

    CPython 3.11's `ast.parse` can fail with "SystemError: AST constructor recursion depth
    mismatch" (python/cpython#106905) in a process where enough compiling went before, as in a
    long test run; a child process parses with a clean state."""
    argv = [f"{name}={folder}" for name, folder in packages.items()]
    result = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                            check=True)
    return [frozenset(component) for component in json.loads(result.stdout)]


if __name__ == "__main__":  # package_cycles' child: `name=folder` arguments, JSON out
    found: dict[str, Path] = {}
    for argument in sys.argv[1:]:
        name, folder = argument.split("=", 1)
        found.update(modules_of(name, Path(folder)))
    print(json.dumps([sorted(component) for component in cycles(graph_of(found))]))
