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
from .traits import Variant

# Options that change the binary; each one is part of the cache key (nvrtc_cache hashes them).
_BASE_OPTIONS = ("-lineinfo",)


@functools.lru_cache(maxsize=None)
def sources(source_name: str = _traits.KERNEL_SOURCE["sm80"]) -> tuple[str, dict[str, str]]:
    """A kernel source and the headers, read from the installed `cu_src` package."""
    root = importlib.resources.files("cu_src")
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


def all_kernels(arch: str) -> list:
    """Every kernel the API can launch on a device of compile target ``arch``, one entry per
    distinct build: both forward families on Hopper (the portable one serves broadcast kv heads
    and ``CUDATTN_KERNEL_FAMILY=sm80``), FP8 from sm_89, split-KV decode and its combine, the
    KV-cache append, FP8 quantize/dequantize and the FP8 V transpose."""
    if arch not in _traits.ARCH_SMEM_LIMIT:
        raise ValueError(f"unknown compile target {arch!r}; cudattn builds for {', '.join(ARCHS)}")
    from . import decode_traits as _decode_traits
    from . import fp8 as _fp8
    from .._ops import quantize as _quantize

    specs = [*_traits.all_variants(arch), *_traits.all_fp8_variants(arch), *_decode_traits.all_decode_kernels(arch),
             *_quantize.all_quantize_kernels(arch)]
    if arch in _traits.FP8_ARCHS:
        specs.append(_fp8.TRANSPOSE_V_KERNEL)
    seen: set = set()
    out = []
    for spec in specs:  # fp8_amax and fp8_quantize are one build (one cubin, two entry points)
        build = (spec.source, tuple(sorted(spec.defines().items())))
        if build not in seen:
            seen.add(build)
            out.append(spec)
    return out


_loaded: dict = {}
_loaded_lock = threading.Lock()


def get_kernel(variant: Variant, device, device_id: int, arch: str):
    """The loaded kernel for this variant on `device`. The first call compiles (or reads the disk
    cache) and loads; later calls are one dict lookup, since hashing the sources for the cache key
    would cost more than the launch itself."""
    key = (variant, device_id)
    kernel = _loaded.get(key)
    if kernel is None:
        from .._runtime.launch import load_kernel

        with _loaded_lock:
            kernel = _loaded.get(key)
            if kernel is None:
                res = compile_variant(variant, arch)
                kernel = load_kernel(res.cubin, variant.kernel_name, device=device, key=res.key,
                                     dynamic_smem=variant.smem_bytes)
                _loaded[key] = kernel
    return kernel
