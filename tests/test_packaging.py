"""The wheel holds every file the installed package needs.

A file left out of the wheel works from a checkout and fails everywhere else, so this builds a
wheel from the source tree and compares: every file of the packages ``cudattn`` and
``nvrtc_cache`` and of the CUDA sources (the repository's top-level ``cu_src/``, which the wheel
installs as ``cudattn/cu_src/``: Python modules, CUDA sources and headers, ``py.typed``) must be
inside, and so must the license; no other top-level name is installed. A control builds a wheel whose configuration
leaves the subpackages out and checks that the comparison catches it.

The source tree is the checkout these tests sit in, or ``$CUDATTN_SOURCE_TREE`` when they run
from an installed package (CI sets it); without either they skip. ``$CUDATTN_WHEEL`` (CI sets it
to the wheel it installed) is checked too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGE_ROOTS = ("cudattn", "nvrtc_cache", "cu_src")
IN_WHEEL = {"cu_src": "cudattn/cu_src"}  # where the wheel puts a package root, when not at its name


def _source_tree() -> Path | None:
    env = os.environ.get("CUDATTN_SOURCE_TREE")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[1])  # tests/ -> the checkout
    for tree in candidates:
        if (tree / "pyproject.toml").is_file() and (tree / "cu_src").is_dir():
            return tree
    return None


TREE = _source_tree()
needs_tree = pytest.mark.skipif(TREE is None, reason="no cudattn source tree (set CUDATTN_SOURCE_TREE)")


def expected_files(tree: Path) -> set[str]:
    """Every file under the package roots, as a wheel names it (caches and bytecode excluded)."""
    out = set()
    for root in PACKAGE_ROOTS:
        for path in (tree / root).rglob("*"):
            rel = path.relative_to(tree)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix not in (".pyc", ".so") \
                    and not any(part.startswith(".") for part in rel.parts):  # .so: a developer's in-place build
                out.add(rel.as_posix().replace(root, IN_WHEEL.get(root, root), 1))
    return out


def missing_from_wheel(wheel: Path, tree: Path) -> list[str]:
    """What the wheel lacks: files of the packages, and the license in its metadata."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = sorted(expected_files(tree) - names)
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        missing.append("*.dist-info/licenses/LICENSE")
    return missing


def build_wheel(tree: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)],
                   check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = out.glob("cudattn-*.whl")
    return wheel


def _copy_tree(tree: Path, dest: Path) -> Path:
    """The files a wheel is built from (not .git, not build outputs)."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(tree / name, dest / name)
    for root in PACKAGE_ROOTS:
        shutil.copytree(tree / root, dest / root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    return dest


@needs_tree
def test_wheel_holds_every_package_and_kernel_source(tmp_path):
    tree = _copy_tree(TREE, tmp_path / "src")  # a clean copy: no build/ or egg-info left by others
    wheel = build_wheel(tree, tmp_path / "dist")
    expected = expected_files(tree)
    assert {"cudattn/_selfcheck/__init__.py", "cudattn/bench/__init__.py", "cudattn/_calls/__init__.py",
            "cudattn/reference/__init__.py", "cudattn/cu_src/include/cudattn/params.cuh", "cudattn/py.typed"} <= expected
    assert missing_from_wheel(wheel, tree) == []
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
        entry_points = zf.read(meta.replace("METADATA", "entry_points.txt")).decode()
        top_level = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" not in n}
    assert top_level == {"cudattn", "nvrtc_cache"}, f"the wheel installs other top-level names: {top_level}"
    assert "License-Expression: Apache-2.0" in text
    assert "cudattn = cudattn.__main__:main" in entry_points
    if shutil.which("cc") or shutil.which("gcc"):  # a compiler here: the compiled warm path, stable ABI
        with zipfile.ZipFile(wheel) as zf:
            built = [n for n in zf.namelist() if n.startswith("cudattn/_calls/_warm") and n.endswith(".so")]
        assert built == ["cudattn/_calls/_warm.abi3.so"], built
        assert "-cp310-abi3-" in wheel.name, wheel.name


@pytest.mark.skipif(not os.environ.get("CUDATTN_WHEEL"), reason="CUDATTN_WHEEL not set (CI sets it)")
@needs_tree
def test_installed_wheel_holds_every_file():
    assert missing_from_wheel(Path(os.environ["CUDATTN_WHEEL"]), TREE) == []


@needs_tree
def test_check_catches_a_package_left_out(tmp_path):
    """The control: a configuration that names only the top-level packages (as this project's
    once did) builds a wheel without cudattn._selfcheck, and the comparison reports it."""
    tree = _copy_tree(TREE, tmp_path / "src")
    conf = tree / "setup.py"
    text = conf.read_text()
    find = 'packages=[*find_packages(include=["cudattn", "cudattn.*", "nvrtc_cache", "nvrtc_cache.*"]), "cudattn.cu_src"]'
    assert find in text, "update this control to setup.py's package list"
    conf.write_text(text.replace(find, 'packages=["cudattn", "cudattn.bench", "nvrtc_cache", "cudattn.cu_src"]'))
    missing = missing_from_wheel(build_wheel(tree, tmp_path / "dist"), tree)
    assert "cudattn/_selfcheck/__init__.py" in missing and "cudattn/_calls/call.py" in missing
