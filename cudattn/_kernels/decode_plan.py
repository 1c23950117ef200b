"""The split-KV decode's plan: which build, how many splits, how many blocks share the merge.

Everything here is arithmetic on the problem and the device's numbers (no kernel loaded, nothing
launched), so that the C launcher's copy (cudattn.h, ``cudattn__decode_plan_of``) can be checked
against it on a machine with no GPU. `_kernels.decode` memoises the plan and launches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import decode_traits as _decode_traits
from .decode_traits import MAX_SPLITS, DecodeVariant
from .._runtime.launch import MAX_GRID_X, MAX_GRID_YZ
from .._spec.problem import Problem

#: A grid with at least this many blocks per SM gets no split.
FULL_GRID_FRACTION = 0.8
#: Among split counts, take the smallest whose wave efficiency is within this of the best.
EFFICIENCY_TOLERANCE = 0.95
#: A split gets at least this many key tiles (shorter ones cost more in set-up and merge than they
#: save); a build may ask for fewer (`DecodeTiles.split_tiles_min`: 8 warps' 128-key tiles, 2).
MIN_TILES_PER_SPLIT = 4
#: What one more split adds to the last block's merge, in hundredths of a key tile's time, for each
#: packed row a warp of that block merges (it reads every split's partials from L2). From split
#: sweeps on an H200 (bf16, D 128, one token, 8 and 32 query heads on 1 and 8 kv heads, 8192 and
#: 32768 keys, 8-128 splits): 0.6-0.8 us a key tile, 0.12-0.15 us a split at 2 rows a warp.
MERGE_COST_PER_SPLIT_ROW = 8
#: A wave's own cost beyond its tiles, in hundredths of a tile (a block's start: Q and the first
#: tiles in flight): two waves of a little fewer tiles do not beat one (H100, a one-block-an-SM
#: build, 8 kv heads, 131072 keys: 16 splits 2.77 TB/s, 33 splits 2.62).
WAVE_COST = 200
#: A single row block's splits take at most the SM count divided by this: past half the SMs one
#: block's splits ran slower, whatever the models said (H200, 8 query heads on 1 kv head, bf16, D 128,
#: one token, one block an SM: 65536 keys 64 splits 22.5 us against 86 splits' 24.7, 131072 keys 31.2
#: against 114 splits' 34.7; two blocks an SM, 2 rows a warp, 65536 keys: 48-64 splits 23.2-24.8
#: against 122 splits' 32.5). Only builds of one or two blocks an SM take the cap (FP8 caches too,
#: where one or two fit: not measured so); grids of several row blocks, and builds of three or four
#: blocks an SM (paged FP8 caches), keep the models' choice.
SINGLE_BLOCK_SM_DIVISOR = 2


#: A single row block whose merge is spread over its last blocks (`choose_merge_ctas`) takes a split
#: for each key tile up to half the SMs, and more, up to the SM count, only while each keeps at least
#: this many key tiles. With the spread merge a split costs little more than its blocks' start, and
#: the half of the SMs a single block's splits left idle paid (H200, bf16, one token, one kv head,
#: against the models' choice: 8 heads D 64 8192 keys 64 splits of one tile 10.4 us against 16
#: splits' 11.8; D 256 131072 keys 128 splits 47.6 us against 64 splits' 55.7; 32 heads D 128 131072
#: keys 128 splits 41.8 against 57 splits' 51.2), but not where a split kept fewer tiles (8 heads, D
#: 128, 65536 keys: 64 splits of 8 tiles 20.5 us, 128 of 4 21.1).
ONE_BLOCK_SPLIT_TILES = 8


def choose_num_splits(blocks: int, key_tiles: int, sm_count: int, blocks_per_sm: int = 1,
                      merge_rows_per_warp: int = 1, min_tiles: int = MIN_TILES_PER_SPLIT,
                      spread_merge: bool = False) -> int:
    """The heuristic behind ``num_splits=None``: the lower of two choices.

    ``blocks``: blocks without splitting (row blocks x kv heads x batch); ``key_tiles``: key tiles
    of the longest sequence. One split when the grid already gives most SMs a block
    (``blocks >= FULL_GRID_FRACTION * sm_count``) or there are under 2 * ``min_tiles`` tiles to
    cut (the build's `split_tiles_min`). Otherwise, over s up to min(MAX_SPLITS, key_tiles / min_tiles):

    - FlashAttention's wave model, with the tiles' rounding too: the efficiency ``(waves /
      ceil(waves)) * (tiles / ceil(tiles))``, ``waves = blocks * s / (sm_count * blocks_per_sm)`` and
      ``tiles = key_tiles / s``; the smallest s within EFFICIENCY_TOLERANCE of the best. (31
      splits of 128 tiles left some blocks 5 tiles where 32 gives each 4.)
    - The merge's cost against the tiles, in hundredths of a tile: ``ceil(waves) * (100 *
      ceil(tiles) + WAVE_COST)`` plus, with splits, ``MERGE_COST_PER_SPLIT_ROW *
      merge_rows_per_warp * s``; the cheapest, the smallest s among equals (integers, so that the
      C launcher's copy chooses the same). Alone it would pick a little more than the wave model
      on long caches, where bandwidth, not tiles, bounds the time; the lower of the two keeps the
      wave model's choice there and cuts the splits where merging them costs more than they save.

    A single row block (``blocks == 1``) of a build of one or two blocks an SM takes at most half
    the SMs' worth of splits (SINGLE_BLOCK_SM_DIVISOR); where that bound cuts the range, every
    count fills part of one wave, and the cost model alone chooses (the wave model's tolerance took
    63 splits of 2048 tiles, 33 tiles a split, where 64 give each 32: H200 50.4 us against 48.4).

    Where that single row block's merge is spread over its last blocks (``spread_merge``: the
    builds that are not short of registers, `choose_merge_ctas`), the models are not asked: a split
    a key tile up to half the SMs, past that as many as keep ONE_BLOCK_SPLIT_TILES tiles each, up to
    the SM count; then the fewest splits that keep the same tiles a split.

    ``blocks_per_sm`` comes from `_blocks_per_sm` (the build and the cache: one or two blocks, up
    to four for FP8 caches); ``merge_rows_per_warp`` from the build's warps and the packed rows.
    """
    if blocks >= FULL_GRID_FRACTION * sm_count or key_tiles < 2 * min_tiles:
        return 1
    half = max(1, sm_count // SINGLE_BLOCK_SM_DIVISOR)
    if blocks == 1 and blocks_per_sm <= 2 and spread_merge:
        return _fewest_splits_of_as_many_tiles(key_tiles, min(max(half, key_tiles // ONE_BLOCK_SPLIT_TILES),
                                                              min(MAX_SPLITS, sm_count), key_tiles))
    top = min(MAX_SPLITS, key_tiles // min_tiles)
    capped = blocks == 1 and blocks_per_sm <= 2 and top > half
    if capped:
        top = half
    slots = sm_count * blocks_per_sm
    eff = {}
    cheapest, best_cost = 1, None
    for s in range(1, top + 1):
        per_block = -(-key_tiles // s)
        waves = blocks * s / slots
        eff[s] = (waves / math.ceil(waves)) * ((key_tiles / s) / per_block)
        cost = -(-blocks * s // slots) * (100 * per_block + WAVE_COST)
        if s > 1:
            cost += MERGE_COST_PER_SPLIT_ROW * merge_rows_per_warp * s
        if best_cost is None or cost < best_cost:
            cheapest, best_cost = s, cost
    if capped:  # every count is a part of one wave: the tiles' rounding and the merge decide
        return cheapest
    best = max(eff.values())
    return min(cheapest, min(s for s, e in eff.items() if e >= EFFICIENCY_TOLERANCE * best))


def splits_filling_the_sms(blocks: int, key_tiles: int, sm_count: int) -> int:
    """The splits of a plan whose rows were halved into one-fragment blocks (`_halve_row_blocks`): a
    split a key tile, up to as many as give each of the SMs one block, then the fewest splits that
    keep the same tiles a split. The models' choice for the two-fragment build's fewer blocks left
    SMs idle once the rows were halved (H200, bf16, one token, 32 query heads on one kv head, head
    dim 64, GPU us: 2 sequences at 8192 keys, 32 splits 12.8 against the models' 11, 14.8; at 32768
    keys 32 splits 17.5 against 20's 19.9; 4 sequences at 8192 keys 16 splits 14.8 against 11's 15.4)."""
    return _fewest_splits_of_as_many_tiles(key_tiles, max(1, min(key_tiles, sm_count // blocks, MAX_SPLITS)))


def _fewest_splits_of_as_many_tiles(key_tiles: int, splits: int) -> int:
    per_split = -(-key_tiles // splits)
    return -(-key_tiles // per_split)


#: The most blocks one block of rows' merge is spread over (decode/store.cuh, combine_spread): the last
#: blocks to arrive, each merging a share of the (row, 32 columns) pieces with a warp a piece. 16, a
#: warp a piece for 32 rows of head dim 128 on 8 warps (the kernel's counter holds 16 shares): with 8,
#: each warp merged two pieces in turn (H200, bf16, one token, 32 query heads on one kv head, D 128:
#: 8192 keys, 64 splits 18.1 us against 16.4 with 16; 131072 keys, 128 splits 39.7 against 36.0;
#: 4 x 32/1 at 32768 keys, 32 splits 33.4 against 31.3).
MERGE_SPREAD_MAX = 16
#: Up to this many parts, a block of rows with a row a warp or fewer keeps the last block's merge:
#: spread, it was slower there (H200, one kv head, bf16, D 128, one token, 32 splits: 8 query heads
#: 12.5 us alone against 12.9 spread over 4, 4 x 8 heads 27.0 against 27.3), and quicker past it (64
#: splits 17.7 against 16.6) or with two rows a warp or more (16 heads, 32 splits 22.3 against 20.4).
MERGE_ALONE_PARTS = 32


def choose_merge_ctas(grid_blocks: int, splits: int, rows_in_block: int, head_dim: int, warps: int, sm_count: int,
                      tight: bool = False) -> int:
    """How many of a block of rows' last blocks to arrive share its merge: enough for a warp a piece
    (a row's 32 columns), up to MERGE_SPREAD_MAX and the split count. 1 (the last alone) without
    splits; where the last alone merges a row a warp of at most MERGE_ALONE_PARTS parts; for the
    builds whose registers are spoken for (``tight``: FP8 caches, two fragments with modifiers; the
    kernel merges alone there whatever it is told); and where the grid has more blocks than SMs: the
    waiting blocks would hold SMs that blocks not yet started need, where with the whole grid
    resident they hold only their own."""
    if splits < 2 or tight or grid_blocks > sm_count:
        return 1
    if splits <= MERGE_ALONE_PARTS and rows_in_block <= warps:
        return 1
    pieces = rows_in_block * -(-head_dim // 32)
    return max(1, min(MERGE_SPREAD_MAX, splits, -(-pieces // warps)))


@dataclass(frozen=True)
class DecodePlan:
    variant: DecodeVariant
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    rows: int  # packed query rows per (batch, kv head): group * seqlen_q
    num_m_blocks: int
    num_splits: int
    tiles_per_split: int
    merge_ctas: int  # of a block of rows' last blocks to arrive, how many share its merge


def choose_plan(problem: Problem, props) -> DecodePlan:
    """The build, grid, splits and merge sharers for this problem (no kernel loaded: the C launcher's
    copy, cudattn.h's ``cudattn__decode_plan_of``, is checked against it on the CPU)."""
    kv = problem.kv_cache
    capacity = problem.seqlen_k
    mods = problem.window is not None or problem.mods is not None and problem.mods.bits != 0
    fp8 = kv is not None and kv.fp8  # (sm_89+: checked by _kvcache before any append)
    rows = problem.group_size * problem.seqlen_q
    variant = _decode_traits.select_decode(problem.dtype, problem.head_dim, props.max_shared_memory_per_block_optin,
                                           mods, fp8, rows)
    num_m, key_tiles, splits = _rows_and_splits(problem, variant, rows, capacity, props)
    if _halvable(variant):
        # twice the row blocks of the one-fragment build (the same key tiles), their splits filling the SMs
        one = _decode_traits.select_decode(problem.dtype, problem.head_dim, props.max_shared_memory_per_block_optin,
                                           mods, fp8, _decode_traits.ONE_FRAG_ROWS)
        num_m1, key_tiles1 = _row_blocks_and_tiles(problem, one, rows, capacity)
        blocks1 = num_m1 * problem.heads_kv * problem.batch
        splits1 = problem.num_splits or splits_filling_the_sms(blocks1, key_tiles1, props.sm_count)
        if _halve_row_blocks(blocks1 * splits1, -(-key_tiles1 // splits1), splits1, props.sm_count):
            variant, num_m, key_tiles, splits = one, num_m1, key_tiles1, splits1
    t = variant.tiles
    tiles_per_split = -(-key_tiles // splits)
    grid = (num_m * splits, problem.heads_kv, problem.batch)
    if grid[0] > MAX_GRID_X or grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise ValueError(f"the decode grid {grid} (row blocks x splits, kv heads, batch) exceeds the CUDA grid "
                         f"limits (x < 2**31, y and z <= 65535); split the call")
    merge_ctas = choose_merge_ctas(grid[0] * grid[1] * grid[2], splits, min(rows, t.block_m), problem.head_dim,
                                   variant.threads // 32, props.sm_count, _merge_tight(variant))
    return DecodePlan(variant, grid, (variant.threads, 1, 1), variant.smem_bytes, rows, num_m, splits, tiles_per_split,
                      merge_ctas)


def _merge_tight(variant: DecodeVariant) -> bool:
    """decode/store.cuh's MERGE_TIGHT: builds whose registers are spoken for merge alone, unspread."""
    return variant.kv_fp8 or (variant.mods and variant.tiles.row_frags > 1)


def _row_blocks_and_tiles(problem: Problem, variant: DecodeVariant, rows: int, capacity: int) -> tuple[int, int]:
    """(row blocks, key tiles a row block visits) of ``variant`` for this problem."""
    t = variant.tiles
    return -(-rows // t.block_m), max(1, _tiles_seen(problem, capacity, t.block_m, t.block_n))


def _rows_and_splits(problem: Problem, variant: DecodeVariant, rows: int, capacity: int, props) -> tuple[int, int, int]:
    """(row blocks, key tiles a row block visits, splits) of ``variant`` for this problem."""
    num_m, key_tiles = _row_blocks_and_tiles(problem, variant, rows, capacity)
    if problem.num_splits is not None:
        return num_m, key_tiles, problem.num_splits
    t = variant.tiles
    blocks = num_m * problem.heads_kv * problem.batch
    splits = choose_num_splits(blocks, key_tiles, props.sm_count, _blocks_per_sm(variant, problem.kv_cache, props),
                               -(-min(rows, t.block_m) // (variant.threads // 32)), t.split_tiles_min,
                               spread_merge=not _merge_tight(variant))
    return num_m, key_tiles, splits


#: The two-fragment build (17-32 packed rows, 16-bit caches, no modifiers) on 8 warps (head dim 128)
#: or at head dim 64 (4 warps) runs as one-fragment row blocks instead, twice as many, with the same
#: key tiles and splits that fill the SMs (`splits_filling_the_sms`), where those blocks fit one wave
#: and each split takes at most HALVE_MAX_TILES_PER_SPLIT key tiles: the SMs the two-fragment grid
#: left idle, or its extra splits, take the second half of the rows, and each block's warp merge and
#: share of the split merge halve (H200, bf16, one token, 32 query heads on one kv head, GPU us,
#: halved against the two-fragment plan; head dim 128: 8192 keys 14.1-14.7 against 16.4, 32768 keys
#: 19.2-19.4 against 21.6, 2 x 32/1 at 8192 keys 15.9 against 19.6, 8 x 32/1 at 4096 keys 16.6
#: against 20.3 (11 splits), 16 x 32/1 at 4096 keys 22.1 against 23.5 (8 splits); head dim 64: 8192
#: keys 12.5 against 14.0, 32768 keys 15.2 against 17.3, 2 x 32/1 at 8192 keys 14.9 against 18.9,
#: 8 x 32/1 at 8192 keys 15.9 against 19.1, 16 x 32/1 at 4096 keys 17.1 against 17.8; 64 x 32/1 at 512
#: keys, unsplit, 13.3 against 28.7). With more tiles a split the doubled reads of K/V can cost more
#: than the shorter merges save, and the shapes went both ways (halved against the two-fragment
#: plan): at 12 tiles, 1 x 32/1 at 98304 keys 30.9 against 29.0, 2 x 32/1 at 49152 keys 28.2 against
#: 30.9, 8 x 32/1 at 12288 keys 25.7-27.8 against 26.6-26.8 in two runs; at 16, 1 x 32/1 at 131072
#: keys 37.8 against 36.0 (128 splits), 4 x 32/1 at 32768 keys 32.8 against 30.6, 16 x 32/1 at 8192
#: keys 31.3 against 31.7. The 4-warp head-dim-128 build (sm_80, sm_89) is left as it is: not measured.
HALVE_MAX_TILES_PER_SPLIT = 8
#: Where the halved blocks alone fill more than half the SMs (one split each), they run unsplit with
#: up to this many key tiles: no merge at all, where the two-fragment plan split its fewer blocks two
#: or three ways and merged them (H200, bf16, one token, 32 query heads on one kv head, GPU us, halved
#: unsplit against the two-fragment plan; head dim 128: 34 x 32/1 at 2048 keys 24.3 against 27.3,
#: 40 x 32/1 24.5 against 28.0, 48 x 32/1 25.0 against 30.1, 64 x 32/1 25.9 against 33.7, 48 x 32/1 at
#: 1536 keys 20.9 against 27.1, 64 x 32/1 21.7 against 30.0; head dim 64: 40 x 32/1 at 2048 keys 17.3
#: against 21.3, 48 x 32/1 17.4 against 22.8, 64 x 32/1 18.0 against 23.4, 48 x 32/1 at 1536 keys 15.1
#: against 21.1). Halved blocks that leave room for two splits keep HALVE_MAX_TILES_PER_SPLIT: 64
#: halved blocks of 16 tiles, unsplit, 24.6 against two splits' 21.8 (32 x 32/1 at 2048 keys).
HALVE_MAX_TILES_UNSPLIT = 16


def _halvable(variant: DecodeVariant) -> bool:
    t = variant.tiles
    return t.row_frags == 2 and (t.warps == 8 or variant.tile_dim == 64) and not variant.mods and not variant.kv_fp8


def _halve_row_blocks(halved_grid_blocks: int, halved_tiles_per_split: int, splits: int, sm_count: int) -> bool:
    """Whether a `_halvable` build's rows run as twice the one-fragment blocks: their grid (with its
    splits) fits one wave and each split has at most HALVE_MAX_TILES_PER_SPLIT key tiles, or, unsplit,
    at most HALVE_MAX_TILES_UNSPLIT."""
    bound = HALVE_MAX_TILES_UNSPLIT if splits == 1 else HALVE_MAX_TILES_PER_SPLIT
    return halved_grid_blocks <= sm_count and halved_tiles_per_split <= bound


def _blocks_per_sm(variant: DecodeVariant, kv, props) -> int:
    """How many blocks an SM the split count aims for (choose_num_splits): more than one where one
    block's warps cannot keep enough loads in flight alone. Paged FP8 caches: as many as fit, up to
    four (each tile's table reads and conversions are long); contiguous FP8 caches: one (longer
    blocks pay their start and merge fewer times; H200, 32/8 heads, D 128, one token: 8 x 8192
    keys 2 splits 40.6 us, 4 splits 42.2; 1 x 131072 16 splits 70.0, 32 splits 74.6; while pages
    of 16 lose 17 % with half the splits); paged 16-bit caches: two where two fit (table reads
    before the copies); one-fragment builds: two where two fit (little work a tile). Measured,
    H200, 32/8 heads, D 128, one token, one fragment: 8 x 8192 keys, 2 splits (one block an SM)
    2.66 TB/s, 4 splits (two) 3.77; 1 x 131072, 16 splits 2.83, 32 splits 3.91. Two-fragment
    16-bit builds on contiguous caches keep one (H100: 16 splits 2.77 TB/s, 33 splits 2.62)."""
    fit = props.max_shared_memory_per_multiprocessor // (variant.smem_bytes + _SMEM_RESERVED_PER_BLOCK)
    if kv is not None and kv.fp8:
        return max(1, min(4, fit)) if kv.paged else 1
    if kv is not None and kv.paged:
        return min(2, max(1, fit))
    return 2 if variant.tiles.row_frags == 1 and fit >= 2 else 1


_SMEM_RESERVED_PER_BLOCK = 1024  # shared memory the driver keeps per block (sm_80+)


def _tiles_seen(problem: Problem, capacity: int, block_m: int, block_n: int) -> int:
    """The most key tiles one block of packed rows visits: the capacity's, or with a window's left
    edge, the tiles its reach over the block's tokens can touch (the splits cut only that range,
    decode/setup.cuh, locate)."""
    whole = -(-capacity // block_n)
    if problem.window is None or problem.window[0] < 0 or problem.window[1] < 0:
        return whole
    left, right = problem.window
    tokens = min(problem.seqlen_q, -(-block_m // problem.group_size) + 1)
    return min(whole, -(-(left + tokens + right) // block_n) + 1)  # + 1: the range need not start on a tile
