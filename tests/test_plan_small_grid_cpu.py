"""CPU: which Hopper forward tiles a problem gets by its size (`_kernels.plan`,
`_traits.small_grid_rows` and `select`'s ``small_rows``): 16-bit problems at head dims 64 and 128
(and 256, not causal) whose tiles of 64 query rows fit in one wave of the persistent grid (two for
causal calls of 1024 rows or more) take the one-consumer builds; at head dim 64, those whose
128-row tiles fit in one wave the two-consumer build; larger ones keep the tiles that share an
SM's time between tiles best. FP8 and head dim 192 keep their tiles. The GPU tests run every
build against the float64 reference."""


from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

from cudattn._arrays.array import DeviceArray
from cudattn._kernels import plan, traits
from cudattn._spec.validate import validate

F16, BF16, FP8 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)
H200 = types.SimpleNamespace(arch="sm_90a", sm_count=132, max_shared_memory_per_block_optin=232448,
                             l2_cache_size=60 << 20)


def _array(shape, dtype, ptr):
    a = object.__new__(DeviceArray)
    strides, acc = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    a.ptr, a.shape, a.strides, a.dtype, a.device_id = ptr, shape, tuple(reversed(strides)), dtype, 0
    a.owner, a.stream_handle, a.readonly = None, None, False
    return a


def _plan(B, S, H, D, dtype=F16, causal=False, props=H200, window=None):
    q, k, v = (_array((B, S, H, D), dtype, 0x10000000 * (i + 1)) for i in range(3))
    problem = validate(q, k, v, causal=causal, host=False, window_size=window)
    plan._plans.clear()
    return plan.make_plan(problem, props)


@pytest.mark.parametrize("B,S,H,D,causal,rows", [
    (1, 512, 8, 64, False, 64),  # 64 tiles of 64 rows: one wave
    (1, 2048, 8, 64, False, 128),  # 256 tiles of 64 rows, 128 of 128: one wave of those
    (4, 512, 8, 64, False, 128),
    (1, 2048, 9, 64, False, 192),  # 144 tiles of 128 rows: two waves, so 99 of 192
    (16, 512, 16, 64, False, 192),
    (1, 4096, 4, 64, True, 64),  # causal: 256 tiles of 64 rows, two waves
    (2, 1024, 8, 64, True, 64),  # 256 tiles of 64 rows, 1024 rows: two waves
    (4, 512, 8, 64, True, 128),  # 256 tiles of 64 rows but 512 rows: one wave only, so the short causal tiles
    (1, 512, 8, 64, True, 64),  # 64 tiles: one wave
    (1, 4096, 5, 64, True, 192),  # 320 tiles of 64, 160 of 128
    (8, 1024, 16, 64, True, 64),  # past the small grids: 64-row tiles of one consumer, two CTAs an SM
    (8, 512, 16, 64, True, 192),  # ... but three consumers at 512 rows (each skips the keys its rows do not see)
    (1, 512, 8, 128, False, 64),
    (1, 512, 16, 128, False, 64),  # 128 tiles of 64 rows
    (2, 1024, 8, 128, False, 128),  # 256 tiles of 64 rows: two waves, not causal
    (1, 2048, 8, 128, True, 64),  # 256, causal
    (16, 4096, 16, 128, True, 192),  # past the small grids and 1536 rows: three consumers
    (16, 1024, 16, 128, False, 128),  # ... which shorter rows at head dim 128 do not take
    (4, 4096, 16, 192, False, 192),
    (64, 128, 16, 192, False, 128),  # rows one 128-row tile holds
    (1, 512, 8, 256, False, 64),
    (1, 512, 8, 256, True, 128),  # causal head dim 256 keeps its tiles (the short causal rows' 64 keys)
    (2, 1024, 8, 256, False, 128),
])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_tiles_by_waves(B, S, H, D, causal, rows, dtype):
    p = _plan(B, S, H, D, dtype, causal)
    assert p.variant.family == "sm90" and p.variant.tiles.block_m == rows
    assert p.grid[0] == min(B * H * -(-S // rows), H200.sm_count * p.variant.tiles.min_blocks)
    assert not p.variant.tiles.pingpong if rows == 64 else p.variant.tiles.pingpong  # one consumer takes no turns
    assert p.variant.tiles.min_blocks == (2 if (B, S, H, D, causal) == (8, 1024, 16, 64, True) else 1)


def test_sm_margin_and_fewer_sms_count():
    """The wave is the grid's CTAs: a device of fewer SMs (or SMs left free) has a smaller one."""
    assert _plan(1, 2048, 8, 64).variant.tiles.block_m == 128  # 128 tiles, 132 SMs
    small = types.SimpleNamespace(**{**vars(H200), "sm_count": 114})  # an H100 PCIe
    assert _plan(1, 2048, 8, 64, props=small).variant.tiles.block_m == 192
    assert _plan(1, 1024, 8, 128, props=small).variant.tiles.block_m == 128  # 128 tiles of 64 rows: two waves


@pytest.mark.parametrize("D,dtype", [(192, F16), (192, BF16), (64, FP8), (128, FP8), (256, FP8)])
def test_other_builds_keep_their_tiles(D, dtype):
    small, large = _plan(1, 512, 8, D, dtype).variant, _plan(16, 4096, 16, D, dtype).variant
    assert small.tiles == large.tiles


def test_a_window_in_a_small_grid_stays_on_hopper():
    """Windows need a Hopper build of one or two consumers: a non-causal head-dim-64 call with a
    window takes the portable kernel where it would get 192-row tiles, the small-grid tiles
    otherwise; at head dims 128 and 192 (three consumers on long rows) it takes the two-consumer
    tiles of their short rows, however long its rows."""
    assert _plan(1, 512, 8, 64, window=(100, 100)).variant.family == "sm90"
    assert _plan(16, 2048, 16, 64, window=(100, 100)).variant.family == "sm80"
    for D in (96, 128, 160, 192):
        assert _plan(4, 4096, 16, D).variant.tiles.block_m == 192
        for causal in (False, True):
            v = _plan(4, 4096, 16, D, causal=causal, window=(100, 0)).variant
            assert v.family == "sm90" and v.tiles.block_m == 128, (D, causal, v.tiles)


def test_small_grid_builds_keep_their_widths_key_tile():
    """A row's keys are summed tile by tile: a small-grid build with the key tile of its width's
    usual build gives the same bits (the C launcher, which keeps the usual builds, is compared
    with the package bit for bit)."""
    for (d, causal, rows), tiles in traits._SM90_SMALL_GRID.items():
        assert tiles.block_m == rows
        assert tiles.block_n == traits._SM90_TILES[(d, causal)].block_n, (d, causal, rows)


def test_every_plan_takes_a_listed_build():
    """What the cache warms and CI compiles (`all_variants`) covers every build a plan picks."""
    listed = {v.describe() for v in traits.all_variants("sm_90a")}
    for sms in (132, 114, 78):
        props = types.SimpleNamespace(**{**vars(H200), "sm_count": sms})
        for D in (32, 64, 96, 128, 192, 256):
            for causal in (False, True):
                for B, S, H in ((1, 512, 8), (1, 2048, 8), (2, 1024, 8), (16, 4096, 16), (1, 100, 1)):
                    for window in (None, (64, 0)):
                        for dtype in (F16, BF16):
                            v = _plan(B, S, H, D, dtype, causal, props, window).variant
                            assert v.family != "sm90" or v.describe() in listed, v.describe()


def test_the_small_grid_builds_are_listed_for_warming_and_compile_checks():
    listed = {v.describe() for v in traits.all_variants("sm_90a")}
    mods = {v.describe() for v in traits.mods_variants("sm_90a")}
    for (d, causal, rows) in traits._SM90_SMALL_GRID:
        for dt in ("float16", "bfloat16"):
            v = traits.select(dt, d, causal, 232448, "sm90", small_rows=rows)
            assert v.tiles.block_m == rows and v.describe() in listed
        assert traits.select("float16", d, causal, 232448, "sm90", mods=traits.MOD_SOFTCAP | traits.MOD_ALIBI,
                             small_rows=rows).describe() in mods


def test_two_ctas_only_for_causal_self_attention_outside_a_margin():
    """The two-CTA tiles (64 rows, two CTAs an SM) serve causal calls at head dim 64 of 513-1024
    rows with no more keys than rows, where 192-row tiles would end in one of 1-64 rows; not with
    a window, inside an SM margin (the spare CTAs would leave halves of SMs), nor with more keys
    than rows (chunked prefill: not measured)."""
    from cudattn._kernels import sm_margin

    p = _plan(8, 1024, 16, 64, causal=True)
    assert (p.variant.tiles.block_m, p.variant.tiles.min_blocks, p.grid[0]) == (64, 2, 2 * H200.sm_count)
    assert _plan(8, 1024, 16, 64, causal=True, window=(256, 0)).variant.tiles.min_blocks == 1
    with sm_margin.leave_free(8):
        p = _plan(8, 1024, 16, 64, causal=True)
    assert (p.variant.tiles.block_m, p.variant.tiles.min_blocks, p.grid[0]) == (192, 1, H200.sm_count - 8)
    q = _array((8, 1024, 16, 64), F16, 0x10000000)
    k, v = (_array((8, 1500, 16, 64), F16, 0x10000000 * (i + 2)) for i in range(2))
    plan._plans.clear()
    p = plan.make_plan(validate(q, k, v, causal=True, host=False), H200)
    assert (p.variant.tiles.block_m, p.variant.tiles.min_blocks) == (192, 1)
    assert _plan(8, 2048, 16, 64, causal=True).variant.tiles.block_m == 192  # past the two-CTA rows
    # 768 rows are four whole 192-row tiles, 704 leave a last tile of 128 rows: the 192-row tiles
    assert [_plan(8, s, 16, 64, causal=True).variant.tiles.block_m for s in (600, 704, 768, 832)] == [64, 192, 192, 64]



@pytest.mark.parametrize("B,S,H,D,causal,counter", [
    (16, 512, 16, 64, False, True),  # 192-row tiles: the last holds 128 rows, its third consumer none
    (8, 1024, 16, 64, False, True),  # 1024 = 5 x 192 + 64: two consumers past the end
    (8, 960, 16, 64, False, False),  # 960 = 5 x 192: every tile whole
    (8, 1100, 16, 64, False, False),  # 1100 = 5 x 192 + 140: three consumers have rows
    (4, 3840, 16, 128, False, False),  # 192-row tiles, 3840 = 20 x 192
    (4, 4096, 16, 128, False, True),  # 4096 = 21 x 192 + 64
    (8, 516, 16, 128, False, True),  # 128-row tiles, 516 = 4 x 128 + 4: the second consumer past the end
    (8, 900, 16, 128, False, False),  # 192-row tiles, 900 = 4 x 192 + 132: three consumers have rows
    (8, 1000, 16, 128, False, False),  # 1000 = 7 x 128 + 104: both consumers have rows
    (1, 512, 8, 64, False, False),  # one consumer a tile (the small grid): never past the end
    (8, 1024, 16, 128, True, True),  # causal: always
])
def test_tiles_of_uneven_lengths_take_the_counter(B, S, H, D, causal, counter):
    """The Hopper calls whose tiles differ in length take their tiles from the stream's counter
    (`Plan.dynamic_order`): causal ones, and padded batches whose last query block leaves whole
    64-row consumers past the end, which skip their products (sm90/consumer.cuh)."""
    q, k, v = (_array((B, S, H, D), BF16, 0x10000000 * (i + 1)) for i in range(3))
    problem = validate(q, k, v, causal=causal, host=False)
    plan._plans.clear()
    p = plan.make_plan(problem, H200)
    assert p.dynamic_order is counter, p.variant.tiles


@pytest.mark.parametrize("B,seqlens,counter", [(4, True, True), (4, False, False), (1, True, False)],
                         ids=["own-lengths", "full-caches", "one-sequence"])
def test_caches_of_their_own_lengths_take_the_counter(B, seqlens, counter):
    """A chunk against a KV cache (not causal, whole 128-row tiles): where each of several
    sequences has its own cached length, their tiles read different numbers of keys, and the
    call takes its tiles from the stream's counter; full caches, or one sequence, keep the
    fixed rounds."""
    from dataclasses import replace

    from cudattn._spec.problem import KvCache

    q, k, v = (_array((B, 1024, 16, 128), BF16, 0x10000000 * (i + 1)) for i in range(3))
    problem = validate(q, k, v, causal=False, host=False)
    kv = KvCache(False, 1024, 1, B, seqlens_ptr=0x50000000 if seqlens else 0)
    plan._plans.clear()
    p = plan.make_plan(replace(problem, kv_cache=kv), H200)
    assert p.variant.tiles.block_m == 128 and p.dynamic_order is counter
