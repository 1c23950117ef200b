"""Point the kernel cache at an empty directory and forget every kernel already loaded, so that
the next calls compile (NVRTC) and load from scratch: the cold start that load and cold-procs test.

The disk cache is ``nvrtc_cache.default_cache()``, which re-reads ``$CUDATTN_CACHE_DIR`` on each
call (a new directory gets a new, empty in-memory cache too). In process, loaded kernels live in
``_kernels._loaded`` (per variant), ``_runtime.launch._cache`` (per cubin key) and, with their plans,
``_kernels.decode._plans``.
"""

from __future__ import annotations

import contextlib
import os

import nvrtc_cache

from cudattn._calls import call as _callpath
from cudattn._kernels import decode as _decode
from cudattn._kernels import registry as _kernels
from cudattn._runtime import launch as _launch

ENV_VAR = "CUDATTN_CACHE_DIR"


def forget_loaded_kernels() -> None:
    """Drop the in-process kernel tables (callers make sure no launch is in flight)."""
    with _kernels._loaded_lock:
        _kernels._loaded.clear()
    _decode._plans.clear()
    _callpath._plans.clear()  # recorded calls hold loaded kernels too
    _launch.clear_cache()


@contextlib.contextmanager
def cold_cache(directory: str):
    """Within: kernels compile into ``directory`` (empty) and load anew; after: the old setting."""
    if os.listdir(directory):
        raise ValueError(f"cold_cache needs an empty directory; {directory} is not")
    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = directory
    forget_loaded_kernels()
    try:
        yield nvrtc_cache.default_cache()
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old


def cache_keys(directory: str) -> set[str]:
    """Keys of the valid entries in a cache directory (a corrupt entry does not count)."""
    cache = nvrtc_cache.Cache(directory)
    return {e.key for e in cache.entries() if cache.load(e.key) is not None}


def stray_files(directory: str) -> list[str]:
    """Files in a cache directory that are not entries (e.g. a temp file a writer left behind)."""
    entries = {e.path.name for e in nvrtc_cache.Cache(directory).entries()}
    return sorted(n for n in os.listdir(directory) if n not in entries)


def loaded_keys() -> set[str]:
    """Cache keys of the kernels this process has loaded (`_runtime.launch.load_kernel` records them)."""
    return {key for (_dev, key, _name) in list(_launch._cache)}
