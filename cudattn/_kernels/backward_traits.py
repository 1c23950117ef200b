"""Compile-time variants of the backward kernels (cu_src/flash_bwd_sm80.cu), and which one serves a problem.

One build holds four entry points (the prepare pass, the main kernel, the dQ conversion and the
sinks' gradient): a `BwdKernel` names one of them, and the four of a variant share one cubin.
The main kernel runs on every sm_80+ device, Hopper included (mma.sync). Tiles per head-dim
width: BLOCK_M query rows per step, BLOCK_N keys per block (16 per warp), Q/dO stages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .._spec.modifiers import MOD_ALIBI, MOD_SOFTCAP
from .traits import ARCH_SMEM_LIMIT, DTYPE_NAMES, Tiles, _dtype_name, tile_dim_for

__all__ = ["BwdKernel", "select_backward", "all_backward_kernels", "BWD_TILE_DIMS", "ENTRIES"]

SOURCE = "flash_bwd_sm80.cu"
ENTRIES = ("flash_bwd_prepare", "flash_bwd_sm80", "flash_bwd_finish_dq", "flash_bwd_dsinks")
BWD_TILE_DIMS = (32, 64, 128)
ROW_THREADS = 128  # CUDATTN_ROW_THREADS: the row-wise kernels' blocks

# Fastest first; the first that fits the device's shared memory is used. A warp's share of the
# keys sets how often Q and dO are read from shared memory per product (the kernel's bound with
# mma.sync): 32 keys a warp up to head dim 64, where dK and dV of 32 rows fit in registers beside
# S^T and dP^T of 32 queries, with two blocks an SM; 16 at 128. With softcap or ALiBi the 128-wide build halves BLOCK_M: S^T, P^T
# and dP^T beside dK and dV spill at 64 query rows.
_CANDIDATES = {
    32: (Tiles(32, 128, 4, 2, 2), Tiles(64, 64, 4, 1, 1)),
    64: (Tiles(32, 128, 4, 2, 2), Tiles(64, 64, 4, 1, 1)),
    128: (Tiles(64, 128, 8, 2, 1), Tiles(64, 64, 4, 1, 1)),
}
_MODS_CANDIDATES = {128: (Tiles(32, 128, 8, 2, 1), Tiles(32, 64, 4, 1, 1))}
# A softcap keeps P^T apart from the scores (their tanh enters dS): at width 64, 16 keys a warp.
_SOFTCAP_CANDIDATES = {64: (Tiles(32, 64, 4, 2, 2), Tiles(32, 64, 4, 1, 1))}


@dataclass(frozen=True)
class BwdKernel:
    dtype: str  # "float16" | "bfloat16"
    tile_dim: int
    causal: bool
    tiles: Tiles
    mods: int = 0  # MOD_SOFTCAP | MOD_ALIBI compiled in (windows and sinks are read at run time)
    entry: str = "flash_bwd_sm80"
    family: str = "sm80"

    source = SOURCE

    @property
    def kernel_name(self) -> str:
        return self.entry

    @property
    def threads(self) -> int:
        return self.tiles.warps * 32 if self.entry == "flash_bwd_sm80" else 256 if self.entry == "flash_bwd_dsinks" \
            else ROW_THREADS

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of the main kernel (bwd_sm80.cuh, SMEM_BYTES); the others use none."""
        if self.entry != "flash_bwd_sm80":
            return 0
        t, d = self.tiles, self.tile_dim
        return (2 * t.block_n * d + 2 * t.stages * t.block_m * d + t.block_n * t.block_m) * 2 + 2 * t.stages * t.block_m * 4

    def entry_point(self, entry: str) -> BwdKernel:
        return replace(self, entry=entry)

    def defines(self) -> dict[str, int]:
        t = self.tiles
        d = {"CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"), "CUDATTN_HEAD_DIM": self.tile_dim,
             "CUDATTN_BLOCK_M": t.block_m, "CUDATTN_BLOCK_N": t.block_n, "CUDATTN_WARPS": t.warps,
             "CUDATTN_STAGES": t.stages, "CUDATTN_CAUSAL": int(self.causal), "CUDATTN_MIN_BLOCKS": t.min_blocks}
        if self.mods:
            d["CUDATTN_MODS"] = self.mods
        return d

    def describe(self) -> str:
        t = self.tiles
        mods = "".join(n for bit, n in ((MOD_SOFTCAP, " softcap"), (MOD_ALIBI, " alibi")) if self.mods & bit)
        return (f"backward {self.entry} {self.dtype} d{self.tile_dim} {'causal' if self.causal else 'full'} "
                f"{t.block_m}x{t.block_n} w{t.warps} s{t.stages}{mods}")


def select_backward(dtype, head_dim: int, causal: bool, smem_limit: int, mods: int = 0) -> BwdKernel:
    """The main kernel's variant for a problem (`BwdKernel.entry_point` gives its siblings)."""
    name = _dtype_name(dtype)
    d = tile_dim_for(head_dim, BWD_TILE_DIMS)
    mods &= MOD_SOFTCAP | MOD_ALIBI
    cands = _MODS_CANDIDATES.get(d, _CANDIDATES[d]) if mods else _CANDIDATES[d]
    if mods & MOD_SOFTCAP:
        cands = _SOFTCAP_CANDIDATES.get(d, cands)
    for tiles in cands:
        k = BwdKernel(name, d, bool(causal), tiles, mods)
        if k.smem_bytes <= smem_limit:
            return k
    raise ValueError(f"no backward tile configuration for head_dim {head_dim} fits in {smem_limit} bytes of shared "
                     f"memory")


def all_backward_kernels(arch: str, with_mods: bool = True) -> list[BwdKernel]:
    """Every backward build the API can launch on a device of this compile target (one entry per
    build: the main kernel's; its siblings share the cubin)."""
    limit = ARCH_SMEM_LIMIT[arch]
    mods_list = (0, MOD_SOFTCAP, MOD_ALIBI, MOD_SOFTCAP | MOD_ALIBI) if with_mods else (0,)
    return [select_backward(dt, d, c, limit, m) for dt in DTYPE_NAMES.values() for d in BWD_TILE_DIMS
            for c in (False, True) for m in mods_list]
