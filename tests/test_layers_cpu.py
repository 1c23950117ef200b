"""The package's architecture, checked on the installed source: subpackages in layers, imports one way.

An ``ast`` walk over every module of ``cudattn`` (imports inside functions included; those under
``if TYPE_CHECKING:`` never run and are left out) finds each module's imports of other cudattn
modules. The layers, top to bottom, are the ones docs/DESIGN.md draws; a module may import its
own layer and the layers below, never one above, and no chain of imports may come back to where
it started.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import cudattn

ROOT = pathlib.Path(cudattn.__file__).parent

#: Top to bottom. The tools (CLI, export, bench, selfcheck), the reference and the torch adapter
#: sit above the library and may use any of it; nothing in the library uses them.
LAYERS = ("_ops", "_numpy", "_calls", "_kernels", "_arrays", "_spec", "_runtime")
APPLICATIONS = ("_tools", "bench", "_selfcheck", "reference", "torch", "distributed", "__init__", "__main__")
#: Imports inside functions are for optional third-party packages and the CLI's start-up only.
LAZY_ALLOWED = ("_tools", "bench", "_selfcheck")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Package data, no code: the CUDA sources, which the wheel installs as cudattn.cu_src (a checkout
#: keeps them at the repository's top level).
DATA = ("cu_src",)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py")) if p.relative_to(ROOT).parts[0] not in DATA}


MODULES = _modules()


def _type_checking_only(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _in_function(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
    return False


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, bool, int]]:
    """``(imported cudattn module, inside a function, line)`` for each import of ``name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.append((t, _in_function(node, parents), node.lineno))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_is_in_a_layer_or_an_application():
    tops = {_top(n) for n in MODULES}
    assert tops <= set(LAYERS) | set(APPLICATIONS), sorted(tops - set(LAYERS) - set(APPLICATIONS))


def _find_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """A chain of imports that comes back to where it started, or None (depth first)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_loop_finder_finds_a_loop():
    assert _find_loop({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_loop({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_loop_lazy_imports_included():
    loop = _find_loop({n: {t for t, _, _ in edges} for n, edges in GRAPH.items()})
    assert loop is None, "import loop: " + " -> ".join(loop or ())


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_the_layers_below(layer):
    rank = LAYERS.index(layer)
    wrong = [f"{n}:{line} imports {t}" for n, edges in GRAPH.items() if _top(n) == layer
             for t, _, line in edges if _top(t) in APPLICATIONS or
             _top(t) in LAYERS and LAYERS.index(_top(t)) < rank]
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_are_for_the_cli_only():
    lazy = [f"{n}:{line} imports {t} inside a function" for n, edges in GRAPH.items()
            if _top(n) not in LAZY_ALLOWED for t, inside, line in edges if inside]
    assert not lazy, "\n".join(lazy)


def test_each_subpackage_says_its_job_and_the_top_level_stays_small():
    entries = sorted(p.name for p in ROOT.iterdir() if p.name not in ("__init__.py", "__main__.py", "py.typed", *DATA)
                     and not p.name.startswith(".") and p.name != "__pycache__")
    assert len(entries) <= 13, entries  # seven layers, six applications (tools, bench, selfcheck, reference, torch, distributed)
    for p in ROOT.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            doc = ast.get_docstring(ast.parse((p / "__init__.py").read_text(encoding="utf-8")))
            assert doc, f"{p.name}/__init__.py has no docstring saying its job"


def test_no_hand_written_module_is_over_400_lines():
    long = [f"{n}: {len(p.read_text(encoding='utf-8').splitlines())} lines" for n, p in MODULES.items()
            if len(p.read_text(encoding="utf-8").splitlines()) > 400]
    assert not long, long
