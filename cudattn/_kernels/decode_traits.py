"""Compile-time variants of the split-KV decode kernel and of its two helpers.

``flash_decode`` (cu_src/flash_decode.cu, fwd_decode.cuh): sm_80+ (mma.sync, cp.async), used on
every arch, Hopper included (decode is bound by memory, which the portable kernel saturates).
Its tiles depend only on the dtype and the head-dim tile: 4 warps split each ring stage's keys
(``warp_keys`` each), ``row_frags`` 16-row fragments of packed (token, query head) rows per block.
``split_kv_combine`` (per input/output dtype pair) and ``kv_cache_append`` have no tiles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .traits import ARCH_SMEM_LIMIT, DTYPE_NAMES, FP8_ARCHS, tile_dim_for

# Head-dim tiles (a head dim uses the smallest >= it; columns past it are zero-filled).
DECODE_TILE_DIMS = (32, 64, 128, 256)
from .._spec.validate import MAX_SPLITS  # noqa: F401  (splits per call at most)


@dataclass(frozen=True)
class DecodeTiles:
    warps: int
    warp_keys: int  # keys per warp per ring stage (BLOCK_N = warps * warp_keys)
    stages: int
    row_frags: int  # 16-row fragments of packed query rows per block (BLOCK_M = 16 * row_frags)
    keys_as_m: bool = False  # 8 packed rows on the MMAs' 8-wide dimension, keys on the 16-wide one
    min_blocks: int = 2  # the kernel's __launch_bounds__ minimum of blocks an SM (its register budget)
    split_tiles_min: int = 4  # the fewest key tiles a split takes (`_kernels.decode_plan.choose_num_splits`)

    @property
    def block_n(self) -> int:
        return self.warps * self.warp_keys

    @property
    def block_m(self) -> int:
        return KEYS_AS_M_ROWS if self.keys_as_m else 16 * self.row_frags


# Per head-dim tile, fastest first; the first that fits the device's shared memory is used. A
# ring stage holds 16-32 KiB of K+V; 3 stages let two blocks share an SM of 228 KiB (H100/H200),
# so each SM keeps about 4 stages of copies in flight (at head dim 256 a stage is 64 KiB and one
# block fills the SM). The 2-stage fallbacks fit 100 KiB (sm_86/89).
_CANDIDATES = {
    32: (DecodeTiles(4, 64, 3, 2), DecodeTiles(4, 64, 2, 2)),
    64: (DecodeTiles(4, 32, 3, 2), DecodeTiles(4, 32, 2, 2)),
    128: (DecodeTiles(4, 16, 3, 2), DecodeTiles(4, 16, 2, 2)),
    256: (DecodeTiles(4, 16, 2, 1), DecodeTiles(2, 16, 2, 1)),
}
# FP8 caches: a stage holds half the bytes (the products convert them in registers), so 4 stages
# keep about as many bytes in flight as 2-3 of a 16-bit cache.
_KV8_CANDIDATES = {
    32: (DecodeTiles(4, 64, 4, 2), DecodeTiles(4, 64, 2, 2)),
    64: (DecodeTiles(4, 32, 4, 2), DecodeTiles(4, 32, 2, 2)),
    128: (DecodeTiles(4, 16, 4, 2), DecodeTiles(4, 16, 2, 2)),
    256: _CANDIDATES[256],
}
# FP8 caches, one row fragment: 8 warps of 16 (D 128) or 32 (D 64) keys and 3 stages, two blocks
# an SM, beat 4 warps and 4 stages (three blocks) by up to 25 % (H200, 32/8 heads, one token, fp16
# q: D 128, 1 x 131072 keys 2.96 -> 3.22 TB/s, 64 x 2048 2.84 -> 3.60; 8 x 8192 even). Builds with
# two fragments or modifiers keep 4 warps (8 warps and two blocks leave 128 registers a thread).
_KV8_ONE_FRAG = {
    32: _KV8_CANDIDATES[32],
    64: (DecodeTiles(8, 32, 3, 1),) + _KV8_CANDIDATES[64],
    128: (DecodeTiles(8, 16, 3, 1),) + _KV8_CANDIDATES[128],
    256: _KV8_CANDIDATES[256],
}
# Keys-as-M builds (FP8 caches, up to 8 packed rows): at D 64, 4 warps of 32 keys and 5 stages
# over 8 warps and 3 (H100, 32/8 heads, one token: 1.65/1.70/2.12 -> 1.72/1.79/2.16 TB/s); at D 128
# the one-fragment tiles (one block an SM with 4 stages of 32 KiB gained 4-10 % on contiguous
# caches but lost 3-10 % on paged ones, whose page lookups want two blocks to hide them).
_KV8_KEYS_M = {
    32: _KV8_CANDIDATES[32],
    64: (DecodeTiles(4, 32, 5, 1),) + _KV8_ONE_FRAG[64],
    128: _KV8_ONE_FRAG[128],
    256: _KV8_CANDIDATES[256],
}
_MODS_32 = {32: (DecodeTiles(4, 16, 3, 2), DecodeTiles(4, 16, 2, 2))}
# 16-bit caches, one row fragment, no modifiers, head dim 128: 8 warps of 16 keys (128-key stages,
# one block an SM, so ptxas may give it up to 255 registers), where grids of few blocks lean on
# their splits. H200, bf16, one token, GPU time: 8 query heads on 1 kv head, 8192 keys, 32 splits
# 12.6 us against 14.7 with 4 warps; 32768 keys, 64 splits 17.8 against 21.6; 32/8 heads (8 or 32
# blocks before splitting) even. A split takes 2 of its tiles at least (256 keys, as 4 tiles of
# the 4-warp build): 32 splits at 8192 keys.
_ONE_FRAG = {**_CANDIDATES,
             128: (DecodeTiles(8, 16, 3, 1, min_blocks=1, split_tiles_min=2),) + _CANDIDATES[128]}
# The same for two fragments (17-32 packed rows: 32 query heads on one kv head), no modifiers, head
# dim 128: 8 warps of 16 keys, one block an SM (200 KiB of ring), so that a grid of few blocks, one
# a split an SM, keeps 8 warps' loads in flight where the 4-warp build had 4. The registers are the
# 4-warp build's (248, no spill: each warp holds the same fragments for its own keys). Where two
# blocks of the one-fragment build fit one wave with short splits, the plan runs the rows as those
# instead (`_kernels.decode_plan._halve_row_blocks`).
_TWO_FRAG = {**_CANDIDATES,
             128: (DecodeTiles(8, 16, 3, 2, min_blocks=1, split_tiles_min=2),) + _CANDIDATES[128]}


@dataclass(frozen=True)
class DecodeVariant:
    dtype: str  # "float16" | "bfloat16"
    tile_dim: int
    tiles: DecodeTiles
    family: str = "decode"
    source: str = "flash_decode.cu"
    kernel_name: str = "flash_decode"
    mods: bool = False  # a window, softcap or ALiBi compiled in (plain calls keep the leaner build)
    kv_fp8: bool = False  # the cache holds e4m3 (sm_89+: the e4m3 -> f16 conversion)

    @property
    def threads(self) -> int:
        return self.tiles.warps * 32

    @property
    def smem_bytes(self) -> int:
        t = self.tiles  # fwd_decode.cuh's SMEM_BYTES: Q (KV8: and its fragment-ordered copy) and the
        kb = 1 if self.kv_fp8 else 2  # ring in cache bytes, or the warps' merge buffer where larger
        main = ((2 if self.kv_fp8 else 1) * t.block_m * 2 + 2 * t.stages * t.block_n * kb) * self.tile_dim
        merge = (2 * t.warps * t.block_m + t.warps * t.block_m * (self.tile_dim + 4)) * 4
        return max(main, merge)

    def defines(self) -> dict[str, int]:
        t = self.tiles
        d = {"CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"), "CUDATTN_HEAD_DIM": self.tile_dim,
             "CUDATTN_WARPS": t.warps, "CUDATTN_WARP_KEYS": t.warp_keys, "CUDATTN_STAGES": t.stages,
             "CUDATTN_ROW_FRAGS": t.row_frags}
        if self.mods:  # absent when off, so that plain builds keep their cache keys
            d["CUDATTN_DECODE_MODS"] = 1
        if self.kv_fp8:
            d["CUDATTN_KV_FP8"] = 1
        if t.keys_as_m:
            d["CUDATTN_KEYS_AS_M"] = 1
        if t.min_blocks != 2:
            d["CUDATTN_DECODE_MIN_BLOCKS"] = t.min_blocks
        return d

    def describe(self) -> str:
        t = self.tiles
        mods = (" mods" if self.mods else "") + (" kv-e4m3" if self.kv_fp8 else "")
        return f"decode {self.dtype} d{self.tile_dim} {t.block_m}x{t.block_n} w{t.warps} s{t.stages}{mods}"


@dataclass(frozen=True)
class HelperKernel:
    """A kernel with no tiles: the split combine or the cache append."""

    source: str
    kernel_name: str
    define_items: tuple[tuple[str, int], ...] = ()
    family: str = "helper"
    threads: int = 128
    smem_bytes: int = 0

    def defines(self) -> dict[str, int]:
        return dict(self.define_items)

    def describe(self) -> str:
        return f"{self.kernel_name} {dict(self.define_items)}"


# Element kinds of the combine's CUDATTN_IN / CUDATTN_OUT.
_ELEM_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


# Up to 16 packed rows (one query token, or a few with GQA: the common decode call), one 16-row
# fragment instead of two: the second held only padding, and without its products each key tile
# is done sooner (H200, 32/8 heads, D 128, one token: 2.47 -> 3.77 TB/s at 8 x 8192 keys and
# 2.58 -> 3.91 at 1 x 131072, with the splits filling two blocks an SM; 3.84 -> 4.18 at 64 x 2048).
ONE_FRAG_ROWS = 16
# Up to 8 packed rows with an FP8 cache and no modifiers: keys-as-M products (fwd_decode.cuh),
# half the MMAs and softmax work a key of one 16-row fragment.
KEYS_AS_M_ROWS = 8


def select_decode(dtype, head_dim: int, smem_limit: int, mods: bool = False, kv_fp8: bool = False,
                  rows: int | None = None) -> DecodeVariant:
    """``mods``: the call has a window, a softcap or ALiBi (sinks need no other build);
    ``kv_fp8``: an e4m3 cache (``dtype`` is then q's); ``rows``: packed query rows per (batch,
    kv head), group * seqlen_q (None: more than ONE_FRAG_ROWS)."""
    name = dtype if isinstance(dtype, str) else DTYPE_NAMES[dtype]
    d = tile_dim_for(head_dim, DECODE_TILE_DIMS)
    one_frag = rows is not None and rows <= ONE_FRAG_ROWS
    table = _CANDIDATES if mods else _ONE_FRAG if one_frag else _TWO_FRAG
    if kv_fp8:
        table = _KV8_ONE_FRAG if one_frag and not mods else _KV8_CANDIDATES
    if mods and d == 32:
        table = _MODS_32  # 64 keys a warp hold too many scores beside the window's bounds (spills on sm_80)
    keys_as_m = kv_fp8 and not mods and rows is not None and rows <= KEYS_AS_M_ROWS
    if keys_as_m:
        table = _KV8_KEYS_M
    for tiles in table[d]:
        if one_frag:
            tiles = replace(tiles, row_frags=1, keys_as_m=keys_as_m)
        v = DecodeVariant(name, d, tiles, mods=mods, kv_fp8=kv_fp8)
        if v.smem_bytes <= smem_limit:
            return v
    raise ValueError(f"no decode tiles for head_dim {head_dim} fit in {smem_limit} bytes of shared memory")


def combine_kernel(in_dtype: str, out_dtype: str) -> HelperKernel:
    return HelperKernel("split_kv_combine.cu", "split_kv_combine",
                        (("CUDATTN_IN", _ELEM_CODES[in_dtype]), ("CUDATTN_OUT", _ELEM_CODES[out_dtype])))


APPEND_KERNEL = HelperKernel("kv_cache_append.cu", "kv_cache_append")


def append_fp8_kernel(new_dtype: str) -> HelperKernel:
    """The append into an e4m3 cache from 16-bit rows of ``new_dtype`` (quantized on the way)."""
    return HelperKernel("kv_cache_append.cu", "kv_cache_append",
                        (("CUDATTN_APPEND_FP8", 1), ("CUDATTN_DTYPE_BF16", int(new_dtype == "bfloat16"))))
GATHER_KERNEL = HelperKernel("kv_cache_gather.cu", "kv_cache_gather", threads=256)


def gather_fp8_kernel(out_dtype: str) -> HelperKernel:
    """The gather out of an e4m3 cache into 16-bit buffers of ``out_dtype`` (dequantized)."""
    return HelperKernel("kv_cache_gather.cu", "kv_cache_gather",
                        (("CUDATTN_GATHER_FP8", 1), ("CUDATTN_DTYPE_BF16", int(out_dtype == "bfloat16"))), threads=256)

# The combine pairs that exist: merges of parts of one dtype (merge_attention_states; the split-KV
# decode kernel merges its own float32 partials).
COMBINE_PAIRS = (("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"))


def all_decode_kernels(arch: str) -> list:
    """Every decode-path kernel a device of this compile target can run."""
    limit = ARCH_SMEM_LIMIT[arch]
    out: list = [select_decode(dt, d, limit, mods, rows=r) for dt in DTYPE_NAMES.values() for d in DECODE_TILE_DIMS
                 for mods in (False, True) for r in _ROW_CLASSES]
    out += [combine_kernel(i, o) for i, o in COMBINE_PAIRS]
    out += [APPEND_KERNEL, GATHER_KERNEL]
    if arch in FP8_ARCHS:  # e4m3 caches: the cvt instructions are sm_89+
        out += [select_decode(dt, d, limit, mods, kv_fp8=True, rows=r) for dt in DTYPE_NAMES.values()
                for d in DECODE_TILE_DIMS for mods in (False, True) for r in _ROW_CLASSES]
        out += [append_fp8_kernel(dt) for dt in DTYPE_NAMES.values()]
        out += [gather_fp8_kernel(dt) for dt in DTYPE_NAMES.values()]
    return list(dict.fromkeys(out))  # head dim 256 has one fragment either way


_ROW_CLASSES = (KEYS_AS_M_ROWS, ONE_FRAG_ROWS, None)  # the row counts select_decode tells apart
