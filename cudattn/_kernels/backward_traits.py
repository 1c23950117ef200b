"""Compile-time variants of the backward kernels, and which one serves a problem.

Two families, as the forward's: "sm80", the portable kernel (cu_src/flash_bwd_sm80.cu: mma.sync,
cp.async) that every sm_80+ device runs, and on Hopper "sm90" (cu_src/flash_bwd_sm90.cu: TMA,
wgmma, warp specialization) for every head dim without softcap or ALiBi (those compile into
the portable kernel only). One build holds four entry points (the prepare pass, the main kernel,
the dQ conversion and the sinks' gradient): a `BwdKernel` names one of them, and the four of a
variant share one cubin. Portable tiles per head-dim width: BLOCK_M query rows per step, BLOCK_N
keys per block (16 per warp), Q/dO stages; the Hopper kernel's are fixed by its width
(bwd_sm90.cuh).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from .._spec.modifiers import MOD_ALIBI, MOD_SOFTCAP
from .traits import ARCH_SMEM_LIMIT, DTYPE_NAMES, HOPPER_ARCHS, Tiles, _dtype_name, family_for, tile_dim_for

__all__ = ["BwdKernel", "select_backward", "all_backward_kernels", "BWD_TILE_DIMS", "SM90_BWD_TILE_DIMS", "ENTRIES"]

SOURCES = {"sm80": "flash_bwd_sm80.cu", "sm90": "flash_bwd_sm90.cu"}
MAIN = {"sm80": "flash_bwd_sm80", "sm90": "flash_bwd_sm90"}
ENTRIES = ("flash_bwd_prepare", "flash_bwd_sm80", "flash_bwd_finish_dq", "flash_bwd_dsinks")  # the portable build's
BWD_TILE_DIMS = (32, 64, 128, 192, 256)
SM90_BWD_TILE_DIMS = (64, 128, 256)
# The Hopper kernel's shape per width (bwd_sm90.cuh): BLOCK_M, BLOCK_N, 12 warps, 2 stages.
_SM90_TILES = {64: Tiles(128, 128, 12, 2, 1), 128: Tiles(64, 128, 12, 2, 1), 256: Tiles(64, 64, 12, 2, 1)}
ROW_THREADS = 128  # CUDATTN_ROW_THREADS: the row-wise kernels' blocks


@functools.lru_cache(maxsize=None)
def row_lanes(tile_dim: int) -> int:
    """Lanes per query row in the row-wise kernels (bwd/rows.cuh, RowLanes): a power of two, at most
    32, that splits the row's 8-element pieces evenly."""
    pieces = tile_dim // 8
    return 32 if pieces >= 32 else next(n for n in (16, 8, 4, 2) if pieces % n == 0)

# Fastest first; the first that fits the device's shared memory is used. A warp's share of the
# keys sets how often Q and dO are read from shared memory per product (the kernel's bound with
# mma.sync): 32 keys a warp up to head dim 64, where dK and dV of 32 rows fit in registers beside
# S^T and dP^T of 32 queries, with two blocks an SM; 16 at 128. With softcap or ALiBi the 128-wide build halves BLOCK_M: S^T, P^T
# and dP^T beside dK and dV spill at 64 query rows.
_CANDIDATES = {
    32: (Tiles(32, 128, 4, 2, 2), Tiles(64, 64, 4, 1, 1)),
    64: (Tiles(32, 128, 4, 2, 2), Tiles(64, 64, 4, 1, 1)),
    128: (Tiles(64, 128, 8, 2, 1), Tiles(64, 64, 4, 1, 1)),
    # Wider heads: dK and dV of 16 keys x D would not fit a warp's registers, so the warps split the
    # block's columns in two (bwd_sm80.cuh): 4 x 2 warps over 64 keys; 2 x 2 over 32 where shared
    # memory is 99 KB.
    192: (Tiles(64, 64, 8, 2, 1), Tiles(64, 64, 8, 1, 1), Tiles(32, 32, 4, 2, 1), Tiles(32, 32, 4, 1, 1)),
    256: (Tiles(64, 64, 8, 2, 1), Tiles(64, 64, 8, 1, 1), Tiles(32, 32, 4, 1, 1)),
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

    @property
    def source(self) -> str:
        return SOURCES[self.family]

    @property
    def kernel_name(self) -> str:
        return self.entry

    @property
    def main(self) -> str:
        """The main kernel's entry point of this build."""
        return MAIN[self.family]

    @property
    def entries(self) -> tuple[str, ...]:
        """The build's entry points in launch order (the last one only with sinks)."""
        return ("flash_bwd_prepare", self.main, "flash_bwd_finish_dq", "flash_bwd_dsinks")

    @property
    def threads(self) -> int:
        return self.tiles.warps * 32 if self.entry == self.main else 256 if self.entry == "flash_bwd_dsinks" \
            else ROW_THREADS

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of the main kernel (bwd_sm80.cuh and bwd_sm90.cuh, SMEM_BYTES); the
        others use none."""
        if self.entry != self.main:
            return 0
        t, d = self.tiles, self.tile_dim
        if self.family == "sm90":  # K, V; Q and dO stages; two dS^T tiles; dQ's float32 tile; lse2 and D; alignment
            # 256 (bwd_sm90.cuh, WIDE): one dO stage, two P^T tiles beside dS^T's, half of dQ's tile
            wide = d == 256
            do_stages = 1 if wide else t.stages
            return (2 * t.block_n * d + (t.stages + do_stages) * t.block_m * d
                    + (4 if wide else 2) * t.block_n * t.block_m) * 2 \
                + t.block_m * (d // 2 if wide else d) * 4 + 2 * t.stages * t.block_m * 4 + 1024
        split = t.block_n // 16 < t.warps  # warps split the columns: P^T goes through shared memory too
        return (2 * t.block_n * d + 2 * t.stages * t.block_m * d + (2 if split else 1) * t.block_n * t.block_m) * 2 \
            + 2 * t.stages * t.block_m * 4

    def entry_point(self, entry: str) -> BwdKernel:
        return replace(self, entry=entry)

    def defines(self) -> dict[str, int]:
        t = self.tiles
        d = {"CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"), "CUDATTN_HEAD_DIM": self.tile_dim,
             "CUDATTN_BLOCK_M": t.block_m, "CUDATTN_BLOCK_N": t.block_n, "CUDATTN_WARPS": t.warps,
             "CUDATTN_STAGES": t.stages, "CUDATTN_CAUSAL": int(self.causal), "CUDATTN_MIN_BLOCKS": t.min_blocks,
             # the main kernel's shared memory as the host sizes it; the build asserts it is the kernel's
             "CUDATTN_SMEM_BYTES": self.entry_point(self.main).smem_bytes}
        if self.mods:
            d["CUDATTN_MODS"] = self.mods
        return d

    def describe(self) -> str:
        t = self.tiles
        mods = "".join(n for bit, n in ((MOD_SOFTCAP, " softcap"), (MOD_ALIBI, " alibi")) if self.mods & bit)
        return (f"backward {self.entry} {self.dtype} d{self.tile_dim} {'causal' if self.causal else 'full'} "
                f"{t.block_m}x{t.block_n} w{t.warps} s{t.stages}{mods}")


def select_backward(dtype, head_dim: int, causal: bool, smem_limit: int, mods: int = 0,
                    family: str = "sm80") -> BwdKernel:
    """The main kernel's variant for a problem (`BwdKernel.entry_point` gives its siblings).
    ``family`` "sm90" (a Hopper device: `family_for`) picks the Hopper kernel where it serves the
    problem, else the portable one."""
    name = _dtype_name(dtype)
    mods &= MOD_SOFTCAP | MOD_ALIBI
    if family == "sm90" and not mods and head_dim <= SM90_BWD_TILE_DIMS[-1]:
        d = tile_dim_for(head_dim, SM90_BWD_TILE_DIMS)
        k = BwdKernel(name, d, bool(causal), _SM90_TILES[d], 0, MAIN["sm90"], "sm90")
        if k.smem_bytes <= smem_limit:
            return k
    d = tile_dim_for(head_dim, BWD_TILE_DIMS)
    cands = _MODS_CANDIDATES.get(d, _CANDIDATES[d]) if mods else _CANDIDATES[d]
    if mods & MOD_SOFTCAP:
        cands = _SOFTCAP_CANDIDATES.get(d, cands)
    for tiles in cands:
        k = BwdKernel(name, d, bool(causal), tiles, mods)
        if k.smem_bytes <= smem_limit:
            return k
    raise ValueError(f"no backward tile configuration for head_dim {head_dim} fits in {smem_limit} bytes of shared "
                     f"memory")


def select_for_device(dtype, head_dim: int, causal: bool, props, mods: int = 0, tma: bool = True) -> BwdKernel:
    """`select_backward` for a device with properties ``props`` (its family, `traits.FORCED_FAMILY`
    honoured); ``tma`` False (operands TMA cannot map: `plan.tma_can_map`) keeps to the portable kernel."""
    return select_backward(dtype, head_dim, causal, props.max_shared_memory_per_block_optin, mods,
                           family_for(props.arch) if tma else "sm80")


def all_backward_kernels(arch: str, with_mods: bool = True) -> list[BwdKernel]:
    """Every backward build the API can launch on a device of this compile target (one entry per
    build: the main kernel's; its siblings share the cubin): the portable ones, and on Hopper the
    Hopper kernel's too."""
    limit = ARCH_SMEM_LIMIT[arch]
    mods_list = (0, MOD_SOFTCAP, MOD_ALIBI, MOD_SOFTCAP | MOD_ALIBI) if with_mods else (0,)
    out = [select_backward(dt, d, c, limit, m) for dt in DTYPE_NAMES.values() for d in BWD_TILE_DIMS
           for c in (False, True) for m in mods_list]
    if arch in HOPPER_ARCHS:
        out += [select_backward(dt, d, c, limit, 0, "sm90") for dt in DTYPE_NAMES.values() for d in SM90_BWD_TILE_DIMS
                for c in (False, True)]
    return out
