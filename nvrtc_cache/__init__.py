"""NVRTC compile + on-disk CUBIN cache.

Stand-alone: knows nothing about attention, so any runtime can embed it::

    from nvrtc_cache import compile
    res = compile(src, headers={"params.cuh": text}, options=["-DHEAD_DIM=128"], arch="sm_90a")
    res.cubin, res.ptxas["_Z6kernelv"].registers, res.source  # "memory" | "disk" | "compiled"

Importing this package does no NVRTC work; the bindings load on the first compile.
"""

__version__ = "0.1.0"

from ._cache import Cache, CompileResult, compile, default_cache
from ._errors import CompileError
from ._nvrtc import nvrtc_version
from ._ptxas import PtxasReport, parse_ptxas
from ._store import CacheEntry, default_directory

__all__ = [
    "Cache",
    "CacheEntry",
    "CompileError",
    "CompileResult",
    "PtxasReport",
    "compile",
    "default_cache",
    "default_directory",
    "nvrtc_version",
    "parse_ptxas",
]
