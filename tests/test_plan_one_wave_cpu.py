"""CPU: which Hopper forward tiles a problem gets by its size (`_kernels.plan`, `_traits.select`'s
``one_wave``): 16-bit head-dim-64 problems whose tiles of 128 query rows all fit in one wave of the
persistent grid take the two-consumer builds (128 rows a tile); larger ones the three-consumer
builds (192 rows), whose CTAs share an SM's time between tiles; FP8 and other head dims keep
their tiles. The GPU tests run both builds against the float64 reference."""

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


@pytest.mark.parametrize("B,S,H,causal,rows", [
    (1, 512, 8, False, 128),  # 32 tiles of 128 rows: one wave
    (1, 2048, 8, False, 128),  # 128 tiles
    (4, 512, 8, False, 128),  # 128 tiles
    (1, 2048, 9, False, 192),  # 144 tiles of 128 rows: two waves, so 99 of 192
    (16, 512, 16, False, 192),
    (1, 4096, 4, True, 128),  # causal past the short-causal rows, in one wave
    (1, 4096, 5, True, 192),  # 160 tiles of 128
    (8, 1024, 16, True, 128),  # short causal rows: 128 rows whatever the grid
])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_head_dim_64_tiles_by_waves(B, S, H, causal, rows, dtype):
    p = _plan(B, S, H, 64, dtype, causal)
    assert p.variant.family == "sm90" and p.variant.tiles.block_m == rows
    assert p.grid[0] == min(B * H * -(-S // rows), H200.sm_count)


def test_sm_margin_and_fewer_sms_count():
    """The wave is the grid's CTAs: a device of fewer SMs (or SMs left free) has a smaller one."""
    assert _plan(1, 2048, 8, 64).variant.tiles.block_m == 128  # 128 tiles, 132 SMs
    small = types.SimpleNamespace(**{**vars(H200), "sm_count": 114})  # an H100 PCIe
    assert _plan(1, 2048, 8, 64, props=small).variant.tiles.block_m == 192


@pytest.mark.parametrize("D,dtype", [(128, F16), (256, BF16), (64, FP8), (128, FP8)])
def test_other_builds_keep_their_tiles(D, dtype):
    small, large = _plan(1, 512, 8, D, dtype).variant, _plan(16, 4096, 16, D, dtype).variant
    assert small.tiles == large.tiles


def test_a_window_in_one_wave_stays_on_hopper():
    """Windows need a two-consumer Hopper build: a non-causal head-dim-64 call with a window takes
    the portable kernel past one wave (192-row tiles) and the Hopper one-wave tiles within it."""
    assert _plan(1, 512, 8, 64, window=(100, 100)).variant.family == "sm90"
    assert _plan(16, 2048, 16, 64, window=(100, 100)).variant.family == "sm80"


def test_the_one_wave_builds_are_listed_for_warming_and_compile_checks():
    listed = {v.describe() for v in traits.all_variants("sm_90a")}
    for dt in ("float16", "bfloat16"):
        for causal in (False, True):
            assert traits.select(dt, 64, causal, 232448, "sm90", one_wave=True).describe() in listed
    mods = {v.describe() for v in traits.mods_variants("sm_90a")}
    assert traits.select("float16", 64, False, 232448, "sm90", mods=traits.MOD_SOFTCAP | traits.MOD_ALIBI,
                         one_wave=True).describe() in mods
