"""CPU: which Hopper forward builds write O through shared memory and a TMA store (`Variant.stages_o`,
fwd_sm90.cuh's STAGE_O), what that adds to their shared memory, and which outputs a TMA map can
describe (`_kernels.plan._axes_mappable` with 16-byte units; the others are stored from registers). The kernel asserts
the host's byte count at compile time (CUDATTN_SMEM_BYTES); test_kernels_compile.py builds them."""

from __future__ import annotations

import pytest

from cudattn._kernels import plan, traits
from cudattn._spec.geometry import TensorGeom

SM90 = [v for v in traits.all_variants("sm_90a") + traits.mods_variants("sm_90a") if v.family == "sm90"]


@pytest.mark.parametrize("v", SM90, ids=[v.describe().replace(" ", "-") for v in SM90])
def test_staged_builds_are_16_bit_head_dim_128_that_fit(v):
    t = v.tiles
    ring = (t.q_stages * t.block_m + 2 * t.stages * t.block_n) * v.tile_dim * v.elem_bytes + 1024
    fits = ring + t.block_m * v.tile_dim * 2 <= traits.SM90_SMEM_OPTIN - traits.SM90_STATIC_RESERVE
    assert v.stages_o == (v.elem_bytes == 2 and v.tile_dim >= 128 and fits)
    if v.stages_o:
        assert v.smem_bytes == ring + t.block_m * v.tile_dim * 2  # one 64-row buffer a consumer
        assert v.smem_bytes <= traits.ARCH_SMEM_LIMIT["sm_90a"]
    assert v.defines()["CUDATTN_SMEM_BYTES"] == v.smem_bytes


def test_head_dim_128_stages_and_64_256_do_not():
    staged = {v.tile_dim for v in SM90 if v.stages_o}
    assert staged == {128}


@pytest.mark.parametrize("geom,sizes,want", [
    (TensorGeom(512 * 16 * 128, 16 * 128, 128), (512, 16, 4), True),  # contiguous (B, S, H, D)
    (TensorGeom(512 * 16 * 136, 16 * 136, 136), (512, 16, 4), True),  # rows padded to 136: 272 bytes
    (TensorGeom(512 * 16 * 132, 16 * 132, 132), (512, 16, 4), False),  # 264-byte head stride: not 16-byte units
    (TensorGeom(0, 16 * 128, 128), (512, 16, 1), True),  # a batch of one: its stride is never used
    (TensorGeom(0, 16 * 128, 128), (512, 16, 2), False),  # a broadcast batch
    (TensorGeom(1 << 40, 16 * 128, 128), (512, 16, 2), False),  # past TMA's stride bound
])
def test_which_outputs_a_map_describes(geom, sizes, want):
    assert plan._axes_mappable(geom, 2, sizes, 16) is want
