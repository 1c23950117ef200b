"""Compile-time variants of the portable forward kernel, and which one serves a problem.

One place lists every compile-time parameter (the CUDATTN_* macros of cu_src/flash_fwd_sm80.cu).
Head dims are served by a few padded tile widths (as FlashAttention rounds up): the kernel
zero-fills the columns past the real head dim and never stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

KERNEL_SOURCE = "flash_fwd_sm80.cu"
KERNEL_NAME = "flash_fwd_sm80"

# Tile widths compiled; a head dim D uses the smallest width >= D.
TILE_DIMS = (32, 64, 128, 192, 256)
SUPPORTED_HEAD_DIMS = tuple(range(8, 257, 8))

DTYPE_NAMES = {np.dtype(np.float16): "float16", np.dtype(ml_dtypes.bfloat16): "bfloat16"}

# Largest dynamic shared memory a block may opt into, per compile target (bytes). Used to choose
# tiles when compiling ahead of time for an arch with no device present.
ARCH_SMEM_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90a": 232448,
                   "sm_90": 232448}


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    warps: int
    stages: int
    min_blocks: int  # __launch_bounds__ minimum blocks per SM (caps registers at 64K / (threads * min))


# Preferred tiles per (tile width, causal), fastest first; the first whose shared memory fits is
# used. Every variant compiles without register spills (tests/test_kernels_compile.py); the
# choices come from tools/tune_tiles.py on an H200 (see benchmarks/NOTES.md).
_FALLBACK_256 = (Tiles(64, 64, 4, 2, 1), Tiles(64, 32, 4, 2, 1))
_CANDIDATES = {
    (32, False): (Tiles(128, 128, 4, 2, 2),),
    (32, True): (Tiles(64, 64, 4, 2, 2),),
    (64, False): (Tiles(128, 128, 4, 2, 2), Tiles(128, 64, 4, 2, 2)),
    (64, True): (Tiles(64, 64, 4, 2, 2),),
    (128, False): (Tiles(128, 48, 4, 2, 2),),
    (128, True): (Tiles(128, 48, 4, 2, 2),),
    (192, False): (Tiles(128, 64, 8, 2, 1),) + _FALLBACK_256,
    (192, True): (Tiles(128, 64, 8, 2, 1),) + _FALLBACK_256,
    (256, False): (Tiles(128, 64, 8, 2, 1),) + _FALLBACK_256,
    (256, True): (Tiles(128, 64, 8, 2, 1),) + _FALLBACK_256,
}


@dataclass(frozen=True)
class Variant:
    dtype: str  # "float16" | "bfloat16"
    tile_dim: int
    causal: bool
    tiles: Tiles

    @property
    def threads(self) -> int:
        return self.tiles.warps * 32

    @property
    def smem_bytes(self) -> int:
        t = self.tiles
        return (t.block_m + 2 * t.stages * t.block_n) * self.tile_dim * 2

    def defines(self) -> dict[str, int]:
        t = self.tiles
        return {
            "CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"),
            "CUDATTN_HEAD_DIM": self.tile_dim,
            "CUDATTN_BLOCK_M": t.block_m,
            "CUDATTN_BLOCK_N": t.block_n,
            "CUDATTN_WARPS": t.warps,
            "CUDATTN_STAGES": t.stages,
            "CUDATTN_CAUSAL": int(self.causal),
            "CUDATTN_MIN_BLOCKS": t.min_blocks,
        }

    def describe(self) -> str:
        t = self.tiles
        return (f"{self.dtype} d{self.tile_dim} {'causal' if self.causal else 'full'} "
                f"{t.block_m}x{t.block_n} w{t.warps} s{t.stages}")


def tile_dim_for(head_dim: int) -> int:
    for d in TILE_DIMS:
        if head_dim <= d:
            return d
    raise ValueError(f"head_dim {head_dim} exceeds the largest supported ({TILE_DIMS[-1]})")


def select(dtype: np.dtype | str, head_dim: int, causal: bool, smem_limit: int) -> Variant:
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES[np.dtype(dtype)]
    d = tile_dim_for(head_dim)
    for tiles in _CANDIDATES[(d, bool(causal))]:
        v = Variant(name, d, bool(causal), tiles)
        if v.smem_bytes <= smem_limit:
            return v
    raise ValueError(f"no tile configuration for head_dim {head_dim} fits in {smem_limit} bytes of shared memory")


def all_variants(arch: str) -> list[Variant]:
    """Every variant `select` can return on a device of this compile target."""
    limit = ARCH_SMEM_LIMIT[arch]
    return [select(dt, d, causal, limit) for dt in DTYPE_NAMES.values() for d in TILE_DIMS for causal in (False, True)]
