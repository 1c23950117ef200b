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

import os
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from .._spec.modifiers import MOD_ALIBI, MOD_SOFTCAP, MOD_WINDOW
from .tile_tables import (_CANDIDATES, _FP8_CANDIDATES, _FP8_SM90_NARROW_KEYS, _FP8_SM90_TILES, _MODS_CANDIDATES,
                          _SM90_SHORT_CAUSAL, _SM90_SHORT_ROWS, _SM90_SMALL_GRID, _SM90_TILES, _SM90_TWO_CTAS,
                          CAUSAL_TWO_WAVES_ROWS, FP8_SM90_TILE_DIMS, FP8_TILE_DIMS, SM90_TILE_DIMS,
                          TWO_CTAS_TAIL_ROWS, Tiles)

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
FP8 = "float8_e4m3fn"
#: FP8 output dtypes and their CUDATTN_OUT codes (fp8.cuh).
FP8_OUT_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

# Largest dynamic shared memory a block may opt into, per compile target (bytes). Used to choose
# tiles when compiling ahead of time for an arch with no device present.
ARCH_SMEM_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90a": 232448,
                   "sm_90": 232448}


# Hopper: a block's shared memory limit, and what the O buffers leave to the static barriers
# (fwd_sm90.cuh's SMEM_OPTIN and STATIC_RESERVE).
SM90_SMEM_OPTIN, SM90_STATIC_RESERVE = ARCH_SMEM_LIMIT["sm_90a"], 1024


def small_grid_rows(dtype, head_dim: int, causal: bool, family: str, units: int, seqlen_q: int,
                    ctas: int) -> int | None:
    """The query rows a tile of the small-grid build that serves a problem of ``units`` (batch x
    query heads) sequences of ``seqlen_q`` rows on a persistent grid of ``ctas`` CTAs: the fewest
    whose tiles fit in one wave (two for 64-row causal tiles from CAUSAL_TWO_WAVES_ROWS rows); None
    where no such build applies (16-bit Hopper builds only)."""
    if family != "sm90" or _dtype_name(dtype) == FP8:
        return None
    d = tile_dim_for(head_dim, SM90_TILE_DIMS)
    for rows in (64, 128):
        waves = 2 if rows == 64 and causal and seqlen_q >= CAUSAL_TWO_WAVES_ROWS else 1
        if (d, bool(causal), rows) in _SM90_SMALL_GRID and units * -(-seqlen_q // rows) <= waves * ctas:
            return rows
    return None


def row_bounds(tile_dim: int, causal: bool, family: str = "sm90") -> list[int]:
    """The query rows a sequence at which `select` (not given ``two_ctas``: the C launcher's choice)
    may change its build at this tile width, ascending: for rows in (previous bound, b] it returns
    the build of ``seqlen_q=b``, past the last bound that of ``seqlen_q=None`` (empty: one build)."""
    if family != "sm90":
        return []
    bounds = set()
    short = _SM90_SHORT_CAUSAL.get(tile_dim)
    if causal and short is not None:
        bounds.add(short[0])
    for rows in _SM90_SHORT_ROWS.get(tile_dim, ()):
        if rows.serves(causal):
            bounds.update(b for b in (rows.above, rows.upto) if b > 0)  # above 0: no lower bound
    return sorted(bounds)


@dataclass(frozen=True)
class Variant:
    dtype: str  # "float16" | "bfloat16" | "float8_e4m3fn"
    tile_dim: int
    causal: bool
    tiles: Tiles
    family: str = "sm80"
    out_dtype: str = ""  # FP8: "bfloat16" | "float16" | "float32"; 16-bit: "" (the input dtype)
    mods: int = 0  # score modifiers compiled in: _modifiers.MOD_SOFTCAP | MOD_ALIBI | MOD_WINDOW

    @property
    def elem_bytes(self) -> int:
        return 1 if self.dtype == FP8 else 2

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
        eb = self.elem_bytes
        if self.family != "sm90":
            return (t.block_m + 2 * t.stages * t.block_n) * self.tile_dim * eb
        return self._ring_bytes + (self._o_buffer_bytes if self.stages_o else 0)

    @property
    def _ring_bytes(self) -> int:
        """The Hopper build's Q and K/V rings (fwd_sm90.cuh's RING_BYTES). The 128-byte swizzle wants
        1 KiB-aligned tiles; the kernel aligns the base itself. FP8 V stages are whole boxes of 128
        keys (V_BYTES)."""
        t, eb = self.tiles, self.elem_bytes
        v_keys = -(-t.block_n // 128) * 128 if eb == 1 else t.block_n
        return (t.q_stages * t.block_m + t.stages * (t.block_n + v_keys)) * self.tile_dim * eb + 1024

    @property
    def _o_buffer_bytes(self) -> int:
        return self.tiles.block_m * self.tile_dim * 2  # a 64-row buffer of 16-bit O a consumer

    @property
    def stages_o(self) -> bool:
        """Whether the Hopper build writes O through shared memory and a TMA store (fwd_sm90.cuh's
        STAGE_O: 16-bit inputs, head dim 128 and up, and room for the consumers' O buffers beside the rings)."""
        if self.family != "sm90" or self.elem_bytes != 2 or self.tile_dim < 128:
            return False
        return self._ring_bytes + self._o_buffer_bytes <= SM90_SMEM_OPTIN - SM90_STATIC_RESERVE

    def defines(self) -> dict[str, int]:
        t = self.tiles
        common = {
            "CUDATTN_DTYPE_BF16": int(self.dtype == "bfloat16"),
            "CUDATTN_HEAD_DIM": self.tile_dim,
            "CUDATTN_BLOCK_N": t.block_n,
            "CUDATTN_STAGES": t.stages,
            "CUDATTN_CAUSAL": int(self.causal),
        }
        if self.dtype == FP8:
            common.update(CUDATTN_DTYPE_FP8=1, CUDATTN_OUT=FP8_OUT_CODES[self.out_dtype])
        if self.mods:  # absent when 0, so that plain builds keep their cache keys
            common["CUDATTN_MODS"] = self.mods
        if self.family == "sm90":  # the warps follow from BLOCK_M (the kernel's roles)
            # BLOCK_M is 64 rows a consumer warpgroup
            # CTAs an SM: given only where it is not the kernel's default of one (the builds' options as before)
            blocks = {"CUDATTN_MIN_BLOCKS": t.min_blocks} if t.min_blocks != 1 else {}
            return {**common, "CUDATTN_PINGPONG": int(t.pingpong), "CUDATTN_Q_STAGES": t.q_stages,
                    "CUDATTN_CONSUMERS": t.block_m // 64, "CUDATTN_SMEM_BYTES": self.smem_bytes, **blocks}
        return {**common, "CUDATTN_BLOCK_M": t.block_m, "CUDATTN_WARPS": t.warps, "CUDATTN_MIN_BLOCKS": t.min_blocks}

    def describe(self) -> str:
        t = self.tiles
        extra = ""
        if self.family == "sm90":
            extra = f" q{t.q_stages}" + (f" m{t.min_blocks}" if t.min_blocks != 1 else "")  # m2: two CTAs an SM
        extra += " pingpong" if t.pingpong else ""
        out = f"->{self.out_dtype}" if self.out_dtype else ""
        mods = "".join(n for bit, n in ((MOD_SOFTCAP, " softcap"), (MOD_ALIBI, " alibi"), (MOD_WINDOW, " window"))
                       if self.mods & bit)
        return (f"{self.family} {self.dtype}{out} d{self.tile_dim} {'causal' if self.causal else 'full'} "
                f"{t.block_m}x{t.block_n} w{t.warps} s{t.stages}{extra}{mods}")


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


def key_tile(dtype, head_dim: int, causal: bool, props, out_dtype=None, mods: int = 0) -> int:
    """Keys per tile of the variant that serves such a call (``mods``: the modifiers it has,
    _modifiers.MOD_*) on a device with properties ``props``. The FP8 emulation
    (reference.attention_fp8_emulated) rounds P against the running max of the same tiles, so the
    tests pass it this."""
    return select(dtype, head_dim, causal, props.max_shared_memory_per_block_optin, family_for(props.arch),
                  out_dtype, mods=mods).tiles.block_n


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    dt = np.dtype(dtype)
    return FP8 if dt == np.dtype(ml_dtypes.float8_e4m3fn) else DTYPE_NAMES[dt]


def select(dtype: np.dtype | str, head_dim: int, causal: bool, smem_limit: int, family: str = "sm80",
           out_dtype: np.dtype | str | None = None, seqlen_q: int | None = None, mods: int = 0,
           small_rows: int | None = None, two_ctas: bool = False) -> Variant:
    """The variant for a problem; ``out_dtype`` matters only for FP8 (default bfloat16), ``seqlen_q``
    (query rows a sequence; None: long) only for the Hopper family's short-row tiles (short causal
    rows, those of `_SM90_SHORT_ROWS`, and the two-CTA ones); ``mods``: the score modifiers the
    call needs (_modifiers.MOD_*), of which the build keeps those it compiles in: MOD_WINDOW only for
    the FP8 Hopper family (every other build takes a window); ``small_rows``: `small_grid_rows`'s
    answer for the problem (the Hopper family's small-grid tiles, where they hold fewer query rows
    than the build the other rules choose); ``two_ctas``: the call may run the two-CTA tiles of its
    row range (`_SM90_TWO_CTAS`; the plan says when; not on small grids), which it does where the
    other tiles would end in one of at most TWO_CTAS_TAIL_ROWS rows. Without it the answer is the C
    launcher's build too."""
    name = _dtype_name(dtype)
    if name == FP8:
        v = _select_fp8(head_dim, causal, smem_limit, family, out_dtype)
        if family != "sm90":
            return replace(v, mods=mods & ~MOD_WINDOW)
        if mods & (MOD_WINDOW | MOD_ALIBI):
            v = replace(v, tiles=replace(v.tiles, block_n=_FP8_SM90_NARROW_KEYS[v.tile_dim]))
        return replace(v, mods=mods)
    mods &= ~MOD_WINDOW
    if mods:
        v = select(dtype, head_dim, causal, smem_limit, family, out_dtype, seqlen_q, small_rows=small_rows,
                   two_ctas=two_ctas)
        t = _MODS_CANDIDATES.get(v.tile_dim) if family != "sm90" else None
        return replace(v, mods=mods, tiles=t if t is not None else v.tiles)
    if family == "sm90":
        d = tile_dim_for(head_dim, SM90_TILE_DIMS)
        tiles = _SM90_TILES[(d, bool(causal))]
        short = _SM90_SHORT_CAUSAL.get(d)
        if causal and short is not None and seqlen_q is not None and seqlen_q <= short[0]:
            tiles = short[1]
        for rows in _SM90_SHORT_ROWS.get(d, ()) if seqlen_q is not None else ():
            if rows.above < seqlen_q <= rows.upto and rows.serves(causal):
                tiles = rows.tiles
        pair = _SM90_TWO_CTAS.get(d) if two_ctas and causal and not small_rows and seqlen_q is not None else None
        # (seqlen_q % block_m: the rows of the other tiles' last one)
        if (pair is not None and pair.above < seqlen_q <= pair.upto
                and 0 < seqlen_q % tiles.block_m <= TWO_CTAS_TAIL_ROWS):
            tiles = pair.tiles
        small = _SM90_SMALL_GRID.get((d, bool(causal), small_rows)) if small_rows else None
        if small is not None and small.block_m < tiles.block_m:
            tiles = small
        v = Variant(name, d, bool(causal), tiles, "sm90")
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


def _select_fp8(head_dim: int, causal: bool, smem_limit: int, family: str, out_dtype) -> Variant:
    out = "bfloat16" if out_dtype is None else out_dtype if isinstance(out_dtype, str) else np.dtype(out_dtype).name
    if out not in FP8_OUT_CODES:
        raise ValueError(f"FP8 kernels write float32, float16 or bfloat16; got {out}")
    if family == "sm90":
        d = tile_dim_for(head_dim, FP8_SM90_TILE_DIMS)
        v = Variant(FP8, d, bool(causal), _FP8_SM90_TILES[(d, bool(causal))], "sm90", out)
        if v.smem_bytes > smem_limit:
            raise ValueError(f"the Hopper FP8 kernel for head_dim {head_dim} needs {v.smem_bytes} bytes of shared "
                             f"memory; the device allows {smem_limit}")
        return v
    d = tile_dim_for(head_dim, FP8_TILE_DIMS)
    for tiles in _FP8_CANDIDATES[(d, bool(causal))]:
        v = Variant(FP8, d, bool(causal), tiles, "sm80", out)
        if v.smem_bytes <= smem_limit:
            return v
    raise ValueError(f"no FP8 tile configuration for head_dim {head_dim} fits in {smem_limit} bytes of shared memory")


#: Compile targets with e4m3 tensor-core instructions (mma.sync m16n8k32 e4m3 from sm_89; wgmma on sm_90a).
FP8_ARCHS = ("sm_89", "sm_90a", "sm_90")


def all_fp8_variants(arch: str) -> list[Variant]:
    """Every FP8 variant `select` can return on a device of this compile target (none before sm_89)."""
    if arch not in FP8_ARCHS:
        return []
    limit = ARCH_SMEM_LIMIT[arch]
    fams = ("sm80", "sm90") if arch in HOPPER_ARCHS else ("sm80",)
    dims = {"sm80": FP8_TILE_DIMS, "sm90": FP8_SM90_TILE_DIMS}
    return [select(FP8, d, causal, limit, fam, out) for fam in fams for d in dims[fam] for causal in (False, True)
            for out in FP8_OUT_CODES]


def _unlisted(out: list[Variant], candidates) -> list[Variant]:
    """The candidates whose builds neither ``out`` nor an earlier candidate lists."""
    listed = {v.describe() for v in out}
    new = []
    for v in candidates:
        if v.describe() not in listed:
            listed.add(v.describe())
            new.append(v)
    return new


def all_variants(arch: str) -> list[Variant]:
    """Every variant `select` can return on a device of this compile target (on Hopper, both families)."""
    limit = ARCH_SMEM_LIMIT[arch]
    out = [select(dt, d, causal, limit) for dt in DTYPE_NAMES.values() for d in TILE_DIMS for causal in (False, True)]
    if arch in HOPPER_ARCHS:
        out += [select(dt, d, causal, limit, "sm90") for dt in DTYPE_NAMES.values() for d in SM90_TILE_DIMS
                for causal in (False, True)]
        out += [select(dt, d, True, limit, "sm90", seqlen_q=1) for dt in DTYPE_NAMES.values() for d in _SM90_SHORT_CAUSAL]
        # (rows.upto, 1024 rows at head dim 64, is one the two-CTA tiles take: 192-row tiles end in 64)
        out += [select(dt, d, True, limit, "sm90", seqlen_q=rows.upto, two_ctas=True) for dt in DTYPE_NAMES.values()
                for d, rows in _SM90_TWO_CTAS.items()]
        # (the 128-row causal tiles of the short-row rule are the short causal rows')
        out += _unlisted(out, (select(dt, d, c, limit, "sm90", seqlen_q=rows.upto) for dt in DTYPE_NAMES.values()
                               for d, ranges in _SM90_SHORT_ROWS.items() for rows in ranges for c in (False, True)))
        listed = {v.describe() for v in out}
        out += [v for v in (select(dt, d, c, limit, "sm90", small_rows=rows) for dt in DTYPE_NAMES.values()
                            for d, c, rows in _SM90_SMALL_GRID) if v.describe() not in listed]
    return out


def mods_variants(arch: str) -> list[Variant]:
    """Builds with softcap and ALiBi (both: the most registers) of each family and tile width, for
    the compile checks: float16 (bfloat16 differs only in its conversions), causal and not; and
    on FP8 targets the FP8 builds with a softcap (the plain key tiles) and with all three (a window
    too: narrower key tiles), of the family such a device runs (the portable FP8 family on Hopper,
    where mma.sync e4m3 becomes conversions and 16-bit MMAs, runs only when forced, in tests: at
    head dim 256 with modifiers it spills there)."""
    limit = ARCH_SMEM_LIMIT[arch]
    fams = ("sm80", "sm90") if arch in HOPPER_ARCHS else ("sm80",)
    dims = {"sm80": TILE_DIMS, "sm90": SM90_TILE_DIMS}
    out = [select("float16", d, c, limit, fam, mods=MOD_SOFTCAP | MOD_ALIBI)
           for fam in fams for d in dims[fam] for c in (False, True)]
    if arch in HOPPER_ARCHS:  # the small-grid, short causal, two-CTA and short-row tiles
        out += [select("float16", d, c, limit, "sm90", mods=MOD_SOFTCAP | MOD_ALIBI, small_rows=rows)
                for d, c, rows in _SM90_SMALL_GRID]
        listed = {v.describe() for v in out}
        out += [v for v in (select("float16", d, True, limit, "sm90", mods=MOD_SOFTCAP | MOD_ALIBI, seqlen_q=rows,
                                   two_ctas=True)
                            for d, rows in [(d, 1) for d in _SM90_SHORT_CAUSAL] +
                            [(d, r.upto) for d, r in _SM90_TWO_CTAS.items()]) if v.describe() not in listed]
        out += _unlisted(out, (select("float16", d, c, limit, "sm90", mods=MOD_SOFTCAP | MOD_ALIBI, seqlen_q=rows.upto)
                               for d, ranges in _SM90_SHORT_ROWS.items() for rows in ranges for c in (False, True)))
    if arch in FP8_ARCHS:  # FP8 with every modifier (the window: Hopper's); one output dtype (the same code)
        fam, fp8_dims = ("sm90", FP8_SM90_TILE_DIMS) if arch in HOPPER_ARCHS else ("sm80", FP8_TILE_DIMS)
        out += [select(FP8, d, c, limit, fam, "bfloat16", mods=m)
                for m in (MOD_SOFTCAP, MOD_SOFTCAP | MOD_ALIBI | MOD_WINDOW) for d in fp8_dims for c in (False, True)]
    return out
