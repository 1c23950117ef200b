"""Compile-time variants of the forward kernels, and which one serves a problem.

Two families: "sm80", the portable kernel (cu_src/flash_fwd_sm80.cu: mma.sync, cp.async), and
"sm90", the Hopper kernel (cu_src/flash_fwd_sm90.cu: TMA, wgmma, warp specialization), which
serves every problem on an sm_90 device. One place lists every compile-time parameter (the
CUDATTN_* macros). Head dims are served by a few padded tile widths (as FlashAttention rounds
up): the kernels zero-fill the columns past the real head dim and never store them.

``CUDATTN_KERNEL_FAMILY=sm80`` (read at import; tests and the bench set ``FORCED_FAMILY``) makes
an sm_90 device run the portable kernel, to compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

import os

FAMILIES = ("sm80", "sm90")
KERNEL_SOURCE = {"sm80": "flash_fwd_sm80.cu", "sm90": "flash_fwd_sm90.cu"}
KERNEL_NAME = {"sm80": "flash_fwd_sm80", "sm90": "flash_fwd_sm90"}
HOPPER_ARCHS = ("sm_90a",)

#: None: the fastest family the device has; "sm80": the portable kernel everywhere.
FORCED_FAMILY: str | None = os.environ.get("CUDATTN_KERNEL_FAMILY") or None
if FORCED_FAMILY not in (None, *FAMILIES):
    raise ImportError(f"CUDATTN_KERNEL_FAMILY must be one of {FAMILIES}; got {FORCED_FAMILY!r}")

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
    pingpong: bool = False  # sm90: the two consumer warpgroups take turns issuing their products
    q_stages: int = 1  # sm90: Q tiles in flight (2: the next tile's Q loads during this one)


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


# Hopper: BLOCK_M = 128 (two consumer warpgroups of 64 rows) + a producer warpgroup; the key
# tile and ring depth per head-dim tile (tools/tune_tiles.py --family sm90; benchmarks/NOTES.md).
SM90_TILE_DIMS = (64, 128, 192, 256)
_SM90_TILES = {
    (64, False): Tiles(128, 128, 12, 3, 1, True, 2),
    (64, True): Tiles(128, 128, 12, 3, 1, True, 2),
    (128, False): Tiles(128, 128, 12, 2, 1, True, 2),
    (128, True): Tiles(128, 128, 12, 2, 1, True, 2),
    (192, False): Tiles(128, 64, 12, 2, 1, True, 2),
    (192, True): Tiles(128, 64, 12, 2, 1, True, 2),
    (256, False): Tiles(128, 80, 12, 2, 1, True, 1),  # two Q stages do not fit next to 2 x 2 K/V tiles
    (256, True): Tiles(128, 80, 12, 2, 1, True, 1),
}


@dataclass(frozen=True)
class Variant:
    dtype: str  # "float16" | "bfloat16"
    tile_dim: int
    causal: bool
    tiles: Tiles
    family: str = "sm80"

    @property
    def source(self) -> str:
        return KERNEL_SOURCE[self.family]

    @property
    def kernel_name(self) -> str:
        return KERNEL_NAME[self.family]

    @property
    def threads(self) -> int:
        return self.tiles.warps * 32

    @property
    def smem_bytes(self) -> int:
        t = self.tiles
        if self.family != "sm90":
            return (t.block_m + 2 * t.stages * t.block_n) * self.tile_dim * 2
        # The 128-byte swizzle wants 1 KiB-aligned tiles; the kernel aligns the base itself.
        return (t.q_stages * t.block_m + 2 * t.stages * t.block_n) * self.tile_dim * 2 + 1024

    def defines(self) -> dict[str, int]:
        t = self.tiles
        common = {
            "CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"),
            "CUDATTN_HEAD_DIM": self.tile_dim,
            "CUDATTN_BLOCK_N": t.block_n,
            "CUDATTN_STAGES": t.stages,
            "CUDATTN_CAUSAL": int(self.causal),
        }
        if self.family == "sm90":  # BLOCK_M and the warps are fixed by the kernel's roles
            return {**common, "CUDATTN_PINGPONG": int(t.pingpong), "CUDATTN_Q_STAGES": t.q_stages}
        return {**common, "CUDATTN_BLOCK_M": t.block_m, "CUDATTN_WARPS": t.warps, "CUDATTN_MIN_BLOCKS": t.min_blocks}

    def describe(self) -> str:
        t = self.tiles
        extra = (f" q{t.q_stages}" if self.family == "sm90" else "") + (" pingpong" if t.pingpong else "")
        return (f"{self.family} {self.dtype} d{self.tile_dim} {'causal' if self.causal else 'full'} "
                f"{t.block_m}x{t.block_n} w{t.warps} s{t.stages}{extra}")


def tile_dim_for(head_dim: int, dims=TILE_DIMS) -> int:
    for d in dims:
        if head_dim <= d:
            return d
    raise ValueError(f"head_dim {head_dim} exceeds the largest supported ({dims[-1]})")


def family_for(arch: str) -> str:
    """The kernel family a device of this compile target runs (FORCED_FAMILY may pick the portable one)."""
    if FORCED_FAMILY == "sm80" or arch not in HOPPER_ARCHS:
        return "sm80"
    return "sm90"


def select(dtype: np.dtype | str, head_dim: int, causal: bool, smem_limit: int, family: str = "sm80") -> Variant:
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES[np.dtype(dtype)]
    if family == "sm90":
        d = tile_dim_for(head_dim, SM90_TILE_DIMS)
        v = Variant(name, d, bool(causal), _SM90_TILES[(d, bool(causal))], "sm90")
        if v.smem_bytes > smem_limit:
            raise ValueError(f"the Hopper kernel for head_dim {head_dim} needs {v.smem_bytes} bytes of shared "
                             f"memory; the device allows {smem_limit}")
        return v
    d = tile_dim_for(head_dim)
    for tiles in _CANDIDATES[(d, bool(causal))]:
        v = Variant(name, d, bool(causal), tiles)
        if v.smem_bytes <= smem_limit:
            return v
    raise ValueError(f"no tile configuration for head_dim {head_dim} fits in {smem_limit} bytes of shared memory")


def all_variants(arch: str) -> list[Variant]:
    """Every variant `select` can return on a device of this compile target (on Hopper, both families)."""
    limit = ARCH_SMEM_LIMIT[arch]
    out = [select(dt, d, causal, limit) for dt in DTYPE_NAMES.values() for d in TILE_DIMS for causal in (False, True)]
    if arch in HOPPER_ARCHS:
        out += [select(dt, d, causal, limit, "sm90") for dt in DTYPE_NAMES.values() for d in SM90_TILE_DIMS
                for causal in (False, True)]
    return out
