"""The package's layout: no import cycles among cudattn's modules.

Module-level imports only (a function-local import runs when called, after every module has
loaded, and ``if TYPE_CHECKING:`` blocks never run). A cycle makes the import order matter and
hides which module depends on which; the call path is meant to read in one direction.
"""

from __future__ import annotations

import ast
import os

import cudattn

PKG_DIR = os.path.dirname(os.path.realpath(cudattn.__file__))


def _modules() -> dict[str, str]:
    mods = {}
    for root, dirs, files in os.walk(PKG_DIR):
        dirs[:] = [d for d in dirs if d not in ("tests", "__pycache__")]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, f), os.path.dirname(PKG_DIR))[:-3].replace(os.sep, ".")
                mods[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(root, f)
    return mods


def _module_level(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            yield from node.body + node.orelse
        elif isinstance(node, ast.Try):
            yield from node.body
        else:
            yield node


def import_graph() -> dict[str, set[str]]:
    """module -> the cudattn modules it imports at module level (relative imports)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in _module_level(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = base + ("." + node.module if node.module else "")
            subs = {f"{target}.{a.name}" for a in node.names} & mods.keys()
            graph[m] |= subs or ({target} & mods.keys())
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(import_graph())
    assert cycle is None, "import cycle among cudattn's modules: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "cudattn._ops.attention" in import_graph()["cudattn"]  # the graph sees the package's own imports
