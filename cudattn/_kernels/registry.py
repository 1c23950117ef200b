"""Kernel registry: CUDA sources (package data) -> NVRTC cubin (disk cache) -> loaded per device.

Variants are compiled on first use, never at import; `compile_variant` needs no GPU, so the CLI's
`cache warm` and CI build every variant for any arch ahead of time.
"""

from __future__ import annotations

import functools
import importlib.resources
import threading

import nvrtc_cache

from . import traits as _traits
from .._runtime.launch import load_kernel
from .traits import Variant

# Options that change the binary; each one is part of the cache key (nvrtc_cache hashes them).
_BASE_OPTIONS = ("-lineinfo",)


@functools.lru_cache(maxsize=None)
def source_root():
    """The folder of the CUDA sources: ``cudattn.cu_src`` where cudattn is installed (the wheel puts
    the repository's top-level ``cu_src/`` there, inside cudattn's namespace), else the top-level
    ``cu_src`` of a source checkout run in place (``PYTHONPATH`` on the checkout)."""
    try:
        return importlib.resources.files("cudattn.cu_src")
    except ModuleNotFoundError:
        return importlib.resources.files("cu_src")


@functools.lru_cache(maxsize=None)
def sources(source_name: str = _traits.KERNEL_SOURCE["sm80"]) -> tuple[str, dict[str, str]]:
    """A kernel source and the headers, read from the sources' folder (:func:`source_root`)."""
    root = source_root()
    source = root.joinpath(source_name).read_text(encoding="utf-8")
    return source, _headers(root.joinpath("include", "cudattn"), "cudattn")


def _headers(folder, prefix: str) -> dict[str, str]:
    """Every ``.cuh`` under ``folder``, subfolders included, by its include path (``cudattn/sm90/x.cuh``)."""
    headers = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            headers.update(_headers(entry, f"{prefix}/{entry.name}"))
        elif entry.name.endswith(".cuh"):
            headers[f"{prefix}/{entry.name}"] = entry.read_text(encoding="utf-8")
    return headers


def options_for(variant: Variant) -> list[str]:
    return [*_BASE_OPTIONS, *(f"-D{k}={v}" for k, v in variant.defines().items())]


def compile_variant(variant: Variant, arch: str, cache: nvrtc_cache.Cache | None = None) -> nvrtc_cache.CompileResult:
    if variant.family == "sm90" and arch not in _traits.HOPPER_ARCHS:
        raise ValueError(f"the Hopper kernel family compiles only for {_traits.HOPPER_ARCHS}, not {arch}")
    source, headers = sources(variant.source)
    return nvrtc_cache.compile(source, name=variant.source, headers=headers, options=options_for(variant),
                               arch=arch, cache=cache)


def cached_variant(variant: Variant, arch: str, cache: nvrtc_cache.Cache) -> nvrtc_cache.CompileResult | None:
    """The cached build of ``variant`` for ``arch``, or ``None`` if it would have to be compiled."""
    source, headers = sources(variant.source)
    return cache.lookup(source, name=variant.source, headers=headers, options=options_for(variant), arch=arch)


#: Compile targets a kernel can be built for (the traits know their shared-memory limits).
ARCHS = tuple(sorted(_traits.ARCH_SMEM_LIMIT))


_loaded: dict = {}
_loaded_lock = threading.Lock()


def get_kernel(variant: Variant, device, device_id: int, arch: str):
    """The loaded kernel for this variant on `device`. The first call compiles (or reads the disk
    cache) and loads; later calls are one dict lookup, since hashing the sources for the cache key
    would cost more than the launch itself."""
    key = (variant, device_id)
    kernel = _loaded.get(key)
    if kernel is None:
        with _loaded_lock:
            kernel = _loaded.get(key)
            if kernel is None:
                res = compile_variant(variant, arch)
                kernel = load_kernel(res.cubin, variant.kernel_name, device=device, key=res.key,
                                     dynamic_smem=variant.smem_bytes)
                _loaded[key] = kernel
    return kernel
