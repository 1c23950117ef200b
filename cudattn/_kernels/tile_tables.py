"""The tile tables of the forward kernels: for each family, head-dim tile width and case, the
query rows and keys a tile holds, its warps, ring depths and the Hopper kernel's options. The
numbers come from runs of tools/tune_tiles.py on GPUs (benchmarks/NOTES.md); `traits.select`
reads them, with the rules that choose among the Hopper tables by problem size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    warps: int
    stages: int
    # __launch_bounds__ minimum blocks per SM (caps registers at 64K / (threads * min)); sm90: 2 only for
    # one consumer, whose registers after setmaxnreg and persistent grid follow it (fwd_sm90.cuh, _plan)
    min_blocks: int
    pingpong: bool = False  # sm90: the consumer warpgroups take turns issuing their products
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


# The portable kernel with softcap or ALiBi (mods.cuh): at these widths the tiles above hold two
# 16-row fragments a warp in 255 registers and the modifiers' work spills them; one fragment a
# warp does not (tests/test_kernels_compile.py compiles them).
_MODS_CANDIDATES = {64: Tiles(64, 64, 4, 2, 2), 128: Tiles(64, 64, 4, 2, 2)}


# Hopper: a producer warpgroup + one to three consumer warpgroups of 64 rows (BLOCK_M = 64 * the
# consumers; warps = 4 a warpgroup); the key tile and ring depth per head-dim tile
# (tools/tune_tiles.py --family sm90; benchmarks/NOTES.md).
SM90_TILE_DIMS = (64, 128, 192, 256)
_SM90_TILES = {
    # Head dim 64: three consumer warpgroups (BM = 192, 16 warps); against two, +6-7 % non-causal and
    # causal +13 % at S = 8192. Causal, each consumer skips the key tiles above its own rows'
    # diagonal (fwd_sm90.cuh, SKIP_UNSEEN), which makes them as fast as the 128-row tiles at 512
    # rows (+1 %; slower by 3 % without the skip) and faster at 1500-2048 (5-10 % against the
    # two-CTA tiles, 9 % against the 128-row ones)
    (64, False): Tiles(192, 128, 16, 2, 1, True, 2),
    (64, True): Tiles(192, 128, 16, 2, 1, True, 2),
    # Head dims 128 and 192: three consumers too, each waiting for its own P V before its next
    # S = Q K^T (160 registers hold O and S but not P beside them; consumer.cuh, SERIAL), so that
    # two others' products, not its own, cover its softmax; one Q stage (two do not fit). On an H200
    # against two consumers (bf16, GPU time, cuDNN in the same process): head dim 128 from 2048 rows
    # +5-6 % (4x16x4096 1.01-1.02 -> 1.07x cuDNN), causal +5 %; head dim 192 +6-8 % at 4096 rows,
    # causal +6-8 % from 1536. Some shorter rows at head dim 128 keep two consumers (_SM90_SHORT_ROWS).
    (128, False): Tiles(192, 128, 16, 2, 1, True, 1),
    (128, True): Tiles(192, 128, 16, 2, 1, True, 1),
    (192, False): Tiles(192, 64, 16, 2, 1, True, 1),
    (192, True): Tiles(192, 64, 16, 2, 1, True, 1),
    (256, False): Tiles(128, 80, 12, 2, 1, True, 1),  # two Q stages do not fit next to 2 x 2 K/V tiles
    (256, True): Tiles(128, 80, 12, 2, 1, True, 1),
}
# Causal calls with at most this many query rows a sequence use these tiles instead: at head dim
# 64, rows that one 128-row tile covers (a 192-row tile would leave a consumer idle), and windowed
# calls (the plan asks for these tiles: three consumers take no window); at head dim 256, 80-key
# tiles cross the diagonal with more masked keys than 64-key ones (a 512-row sequence's 128-row
# tiles read 1,440 keys in 80s against 1,280 in 64s): +2.5 % at 512 rows on an H200, even at 1024,
# -3 % at 2048 (benchmarks/NOTES.md).
_SM90_SHORT_CAUSAL = {64: (128, Tiles(128, 128, 12, 3, 1, True, 2)),
                      256: (512, Tiles(128, 64, 12, 2, 1, True, 1))}


class RowRange(NamedTuple):
    above: int  # query rows a sequence: more than this ...
    upto: int  # ... and at most this
    tiles: Tiles
    causal: bool | None = None  # calls with this causal flag only (None: both)

    def serves(self, causal: bool) -> bool:
        """Whether the range applies to calls with this causal flag."""
        return self.causal is None or self.causal == bool(causal)


# Causal self-attention (no more keys than query rows) of a row range a sequence: 64-row tiles of one
# consumer, two CTAs an SM (128 x 24 + 128 x 232 registers each; min_blocks = 2), each CTA on tiles of
# its own, so that one's first loads and last store run under the other's products where two
# consumers of one 128-row tile wait together. On an H200 at head dim 64 against the 128x128 build:
# +2-3 % at 1024 rows, +1-2 % at 2048, -5 % at 512 (K and V read once a 64-row tile, twice as
# often); against the 192-row tiles whose consumers skip the keys they do not see, +2 % at 1024
# but -5 % at 2048, hence up to 1024; not kept at head dim 128 (-1 to -16 %) or without a mask (-8 to
# -10 %). The same key tile as the 192-row build, so the same bits as the C launcher's, which runs
# that one (it sizes its grids one CTA an SM); `_plan` takes it only outside an SM margin, without a
# window and with no more keys than rows (the shapes measured). Only where the 192-row tiles would
# end in one of at most 64 rows (`traits.select`, TWO_CTAS_TAIL_ROWS): a sweep of 520-1024 rows
# (causal, bf16, tune_tiles) found the two-CTA tiles 0-3 % faster where the rows a sequence leave
# 1-64 past a multiple of 192 (600, 640, 800, 832, 1000, 1024), and the 192-row tiles with three
# K/V stages 2-11 % faster everywhere else (520, 544, 576, 672, 704, 768, 864, 896, 960).
_SM90_TWO_CTAS = {64: RowRange(512, 1024, Tiles(64, 128, 8, 2, 2, False, 2))}
TWO_CTAS_TAIL_ROWS = 64  # the two-CTA tiles where the other tiles' last one would hold at most this many rows
# Tiles by query rows a sequence, causal or not (RowRange: above < seqlen_q <= upto). Head dim 64:
# - 193-256 rows: two 128-row tiles of two consumers (three K/V stages) rather than a full 192-row
#   tile and one of 1-64 rows, whose one consumer runs its chain of key tiles alone. On an H200
#   (bf16, GPU time, cuDNN in the same process): 224 rows +15 % causal (0.91 -> 1.04x cuDNN), +5 %
#   not; 256 rows +14-18 % causal (0.80-0.82 -> 0.94-0.95x), +5-8 % not. One 192-row tile (129-192
#   rows) stays 17-35 % faster, and so do 192-row tiles at 320 and 448 rows. The same key tiles as
#   the 192-row build, so the same bits.
# - 257-1024 rows: the 192-row tiles with three K/V stages (two above): 384 rows +2.0-2.4 % causal,
#   +0.5-1 % not, 512 rows 0 to +1 % (tune_tiles, three runs), 640-1024 rows causal +0.7-1.7 %; from
#   1280 rows no gain (within +-0.6 %, 2048 rows -0.5 %). (benchmarks/NOTES.md)
# Head dim 128: two consumers (128-row tiles, two Q stages) for causal rows up to 1536 (against the
# three of the long rows: causal 1024 rows -4 to -5 %, 1536 -2 %, 1664 +0.4 %), and without a mask
# for rows up to 640 and 961-1024, where the 192-row tiles' last one would be short and there are
# few of them a head. On an H200 against two consumers (bf16, GPU time, cuDNN in the same process,
# with the short last tiles taken last): 512 rows -3 %, 640 -5 %, 1024 -2 %; but 720 +8 %, 768
# +3.5-8 % (64 to 512 heads), 1408 +9 %, 1500 +8 %, 1536 +6.5 % (benchmarks/NOTES.md).
# Head dim 192, up to 128 rows (one 128-row tile): two consumers.
# Windowed calls ask for the tiles of one row (`_plan`): three consumers take no window.
_SM90_SHORT_ROWS = {64: (RowRange(192, 256, Tiles(128, 128, 12, 3, 1, True, 2)),
                         RowRange(256, 1024, Tiles(192, 128, 16, 3, 1, True, 2))),
                    128: (RowRange(0, 1536, Tiles(128, 128, 12, 2, 1, True, 2), causal=True),
                          RowRange(0, 640, Tiles(128, 128, 12, 2, 1, True, 2), causal=False),
                          RowRange(960, 1024, Tiles(128, 128, 12, 2, 1, True, 2), causal=False)),
                    192: (RowRange(0, 128, Tiles(128, 64, 12, 2, 1, True, 2)),)}
# Small grids. A problem whose tiles all fit in one wave of the persistent grid (one a CTA) takes
# the call's time from each CTA's chain of key tiles, not from the SMs' shared throughput: there
# fewer consumer warpgroups a CTA (fewer query rows a tile, more CTAs) run shorter chains. On an
# H200 against the tiles above: 64-row tiles of one consumer +10-19 % where they fit in one wave
# (1x8x512 at head dim 64 and 128), but -21 to -25 % in two (2x8x1024x128); causal tiles, of
# uneven lengths taken from a counter, balance two waves from 1024 rows (+4-5 % at 1024, +10-31 %
# at 2048-4096) but not at 512 (-3 %: short tiles, their fixed costs twice over); at head dim 64,
# 128-row tiles of two consumers +11-16 % where they fit in one wave and 192 do not fill it; head
# dim 256 not causal +19-21 % in one wave. Each keeps its width's key tile, so that a row's sums
# run over the same tiles as in the C launcher's builds (the same bits): causal head dim 256 would
# need 64 keys (80 spill), +11-23 % measured, and keeps its tiles, as does head dim 192 (not
# measured) (benchmarks/NOTES.md). (tile width, causal, query rows) -> tiles.
_SM90_SMALL_GRID = {
    (64, False, 64): Tiles(64, 128, 8, 2, 1, False, 2),
    (64, True, 64): Tiles(64, 128, 8, 2, 1, False, 2),
    (128, False, 64): Tiles(64, 128, 8, 3, 1, False, 2),
    (128, True, 64): Tiles(64, 128, 8, 3, 1, False, 2),
    (256, False, 64): Tiles(64, 80, 8, 2, 1, False, 2),
    (64, False, 128): Tiles(128, 128, 12, 2, 1, True, 2),
    (64, True, 128): _SM90_SHORT_CAUSAL[64][1],
}
CAUSAL_TWO_WAVES_ROWS = 1024  # causal problems of this many query rows and more may have two waves of 64-row tiles


# FP8 (e4m3): head-dim tiles are 32-byte k-steps of whole swizzle rows (sm90: 128 bytes, or 64 at
# head dim 64; sm80: 64); V is read transposed (Vt, keys contiguous), so the key tile is a multiple
# of 64 (sm80) or 32 (sm90).
FP8_SM90_TILE_DIMS = (64, 128, 256)
FP8_TILE_DIMS = (64, 128, 256)
_FP8_SM90_TILES = {
    # 64-byte swizzle rows for Q and K; 256 keys: +6-9 % over 192 at S >= 2048 (NOTES.md)
    (64, False): Tiles(128, 256, 12, 2, 1, True, 2),
    (64, True): Tiles(128, 256, 12, 2, 1, True, 2),
    (128, False): Tiles(128, 192, 12, 2, 1, True, 2),  # 128 keys: -4 % (NOTES.md)
    (128, True): Tiles(128, 192, 12, 2, 1, True, 2),
    (256, False): Tiles(128, 128, 12, 2, 1, True, 1),
    (256, True): Tiles(128, 128, 12, 2, 1, True, 1),
}
# FP8 Hopper builds with a window or ALiBi: their per-row bounds or diagonals beside the scores
# of 192 or 256 keys (or O of 256 columns) spill, so the key tile narrows: 128 keys (64 at head
# dim 256 would load Vt boxes of 128 keys half unused; 96 uses three quarters of them). A softcap
# alone keeps the plain tiles.
_FP8_SM90_NARROW_KEYS = {64: 128, 128: 128, 256: 96}
_FP8_CANDIDATES = {  # the portable kernel (sm_89, or any family forced to sm80)
    # One 16-row fragment per warp: two (128 x 64 x 4 warps) hold S and O of 128 columns in 255
    # registers and spill. Not yet tuned on a GPU. sm_89 registers: d64 112, d128 165, d256 233.
    (64, False): (Tiles(128, 64, 8, 2, 1),),
    (64, True): (Tiles(128, 64, 8, 2, 1),),
    (128, False): (Tiles(128, 64, 8, 2, 1),),
    (128, True): (Tiles(128, 64, 8, 2, 1),),
    (256, False): (Tiles(128, 64, 8, 2, 1), Tiles(64, 64, 4, 2, 1)),
    (256, True): (Tiles(128, 64, 8, 2, 1), Tiles(64, 64, 4, 2, 1)),
}
