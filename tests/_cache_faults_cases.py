"""Helpers of the nvrtc_cache fault tests (test_cache_trust.py, test_cache_faults.py,
test_cache_disks.py): a tiny kernel to compile, a warning recorder, a planted cache entry, directory
listings, Python child processes, and the other user (root uses a real uid, 65534).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import nvrtc_cache
from nvrtc_cache import Cache

REPO = Path(nvrtc_cache.__file__).parents[1]
ELF = b"\x7fELF"
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")


def kernel(i: int = 0) -> str:
    return f'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] += {i}; }}\n'


def compile_(cache: Cache, i: int = 0, arch: str = "sm_80"):
    return cache.compile(kernel(i), arch=arch)


class Recorder:
    """Every RuntimeWarning raised inside the block (none filtered as duplicate)."""

    def __enter__(self):
        self._ctx = warnings.catch_warnings(record=True)
        self._caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)

    @property
    def messages(self) -> list[str]:
        return [str(w.message) for w in self._caught if issubclass(w.category, RuntimeWarning)]


def names(directory) -> list[str]:
    return sorted(os.listdir(directory))


def entry_names(directory) -> list[str]:
    return [n for n in names(directory) if n.endswith(".cubin-entry")]


def run_python(code: str, *args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs,
    )


@pytest.fixture(autouse=True)
def _private_default_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDATTN_CACHE_DIR", str(tmp_path / "default-cache"))


@pytest.fixture
def planted(tmp_path):
    """A cache directory holding one valid entry (for kernel(0), sm_80)."""
    directory = tmp_path / "cache"
    res = compile_(Cache(directory))
    return directory, res
