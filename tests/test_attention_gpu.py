"""GPU: cudattn.attention against the float64 reference under DESIGN.md §6's rule:
max|out - ref| <= 2 * max|naive - ref| + 1e-5, where naive is the same math in the input dtype.

Fresh random inputs per case, outputs poisoned with NaN before each launch, odd sizes, every
head-dim tile, causal and not, MHA/GQA/MQA, both dtypes and layouts, strided inputs, LSE.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference
from _tile_order import counters_taken, fixed_rounds, stream_counters_read_zero

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_family")]

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


SEQLENS = [(1, 1), (1, 147), (113, 203), (128, 217), (239, 1), (799, 3), (1023, 1024), (1024, 1023), (4096, 4096)]
_seed = itertools.count(1000)


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _shapes(B, Sq, Sk, Hq, Hkv, D, layout):
    if layout == "bshd":
        return (B, Sq, Hq, D), (B, Sk, Hkv, D)
    return (B, Hq, Sq, D), (B, Hkv, Sk, D)


def _poisoned_out(shape, dtype):
    out = cudattn._arrays.array.empty(shape, dtype, device=None, stream=None)
    out.fill_nan()
    return out


def check(B, Sq, Sk, Hq, Hkv, D, dtype, causal, layout="bshd", scale=None, lse=True):
    rng = np.random.default_rng(next(_seed))
    qs, ks = _shapes(B, Sq, Sk, Hq, Hkv, D, layout)
    q, k, v = _rand(rng, qs, dtype), _rand(rng, ks, dtype), _rand(rng, ks, dtype)
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    out = _poisoned_out(qs, dtype)
    res = cudattn.attention(qd, kd, vd, causal=causal, scale=scale, layout=layout, return_lse=lse, out=out)
    o_dev, l_dev = res if lse else (res, None)
    assert o_dev.ptr == out.ptr, "attention must write into the given out"
    o = cudattn.to_host(o_dev).astype(np.float64)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, scale=scale, layout=layout, return_lse=True)
    naive = reference.attention_naive(q, k, v, causal=causal, scale=scale, layout=layout, dtype=dtype)
    assert not np.isnan(o).any(), f"{np.isnan(o).sum()} outputs unwritten or NaN"
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"max|out-ref| = {err:.3g} > bound {bound:.3g}"
    if lse:
        l = cudattn.to_host(l_dev).astype(np.float64)
        assert l.shape == (B, Hq, Sq)
        empty = np.isneginf(ref_lse)
        assert np.array_equal(np.isneginf(l), empty), "LSE must be -inf exactly on rows that see no key"
        assert not np.isnan(l).any()
        np.testing.assert_allclose(l[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)
    return err, bound


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", SEQLENS)
def test_seqlens(sq, sk, causal, dtype):
    big = sq * sk >= 4096 * 4096
    check(1 if big else 2, sq, sk, 2 if big else 3, 1 if big else 3, 128, DTYPES[dtype], causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [8, 16, 32, 40, 64, 72, 96, 128, 136, 160, 192, 200, 224, 256])
def test_head_dims(d, causal, dtype):
    check(2, 177, 301, 4, 2, d, DTYPES[dtype], causal)


# (B, Sq, Sk, Hq, Hkv, D, causal) with more than twice as many query tiles as an H100 has SMs, so
# the persistent grid hands each CTA several tiles in a row, of mixed lengths.
MANY_TILES = [
    (3, 1000, 130, 16, 4, 128, True),  # key tiles per query tile 0 (x6), 1, 2: into empty and one-tile tiles
    (5, 700, 100, 13, 13, 64, False),  # one key tile each: every tile starts beside the previous one's end
    (4, 513, 1100, 12, 3, 256, True),
    (2, 777, 801, 12, 4, 192, True),
    (2, 2100, 2150, 8, 8, 64, True),  # past the short-causal rows: three consumer warpgroups at D = 64
    # The short causal rows at the load the bench puts on them, 4-5 tiles a CTA: 192-row tiles of
    # three consumers with three K/V stages (512 rows), and 64-row tiles two CTAs an SM with two
    # stages (1024 rows). A kernel change once passed every case above and then hung in the bench
    # at 16 x 16 x 512 x 64 (5.8 tiles a CTA).
    (6, 512, 512, 32, 8, 64, True),
    (3, 1024, 1024, 24, 24, 64, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,causal", MANY_TILES)
def test_many_tiles_per_cta(B, Sq, Sk, Hq, Hkv, D, causal, dtype):
    """Consecutive tiles of one CTA (the Hopper kernel's Q ring loads a tile's Q while the
    consumers finish the one before): each must keep its own softmax state, output and LSE."""
    check(B, Sq, Sk, Hq, Hkv, D, DTYPES[dtype], causal)


# Small problems (tiles that fit in a wave or two of the grid) take the Hopper builds of fewer
# consumers (`_traits.small_grid_rows`); most shapes here are that small, so these run the other
# builds on them with that rule off, and the small-grid builds on shapes of their own.
DEFAULT_TILES = [
    (2, 177, 301, 4, 2, False, "bshd"),
    (1, 799, 3, 3, 1, False, "bhsd"),
    (2, 257, 190, 8, 8, True, "bshd"),
    (1, 1023, 1024, 2, 1, True, "bhsd"),
    (2, 113, 203, 6, 3, False, "bshd"),
    (2, 229, 240, 4, 2, True, "bshd"),
    (3, 256, 301, 4, 4, False, "bhsd"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 192, 256])
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,causal,layout", DEFAULT_TILES)
def test_default_tiles_on_small_problems(B, Sq, Sk, Hq, Hkv, causal, layout, D, dtype, monkeypatch):
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._kernels import traits as _traits

    monkeypatch.setattr(_traits, "small_grid_rows", lambda *a: None)
    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_call, "_plans", {})
    check(B, Sq, Sk, Hq, Hkv, D, DTYPES[dtype], causal, layout=layout)
    assert _plan._plans, "the call was planned afresh"
    if next(iter(_plan._plans.values())).variant.family == "sm90":
        rows = {p.variant.tiles.block_m for p in _plan._plans.values()}
        # 64-row tiles, two CTAs an SM, where 192-row tiles would end in one of 1-64 rows (tile_tables)
        two_ctas = D <= 64 and causal and 512 < Sq <= 1024 and 0 < Sq % 192 <= 64 and Sk <= Sq
        two_128 = 192 < Sq <= 256  # head dim 64: two 128-row tiles rather than 192 and 1-64 rows
        if D <= 64:
            want = {64} if two_ctas else {128} if causal and Sq <= 128 or two_128 else {192}
        elif D == 128:  # three consumers: causal past 1536 rows; without a mask past 640 rows, but for 961-1024
            want = {192} if (Sq > 1536 if causal else 640 < Sq <= 960 or Sq > 1024) else {128}
        else:  # three consumers at head dim 192 past 128 rows
            want = {192} if D == 192 and Sq > 128 else {128}
        assert rows == want


@pytest.mark.parametrize("causal,Sq,Sk", [(True, 256, 256), (True, 200, 450), (False, 193, 301), (False, 256, 77)])
def test_two_128_row_tiles_equal_the_192_row_tiles(monkeypatch, kernel_family, causal, Sq, Sk):
    """Head dim 64 at 193-256 query rows takes two 128-row tiles (tile_tables); each row sees the
    same 128-key tiles in the same order as in the 192-row build, so the two give the same bits."""
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._kernels import traits as _traits
    from cudattn._runtime import device as _device

    if kernel_family != "fastest" or _device.device_properties(0).arch not in _traits.HOPPER_ARCHS:
        pytest.skip("a rule of the Hopper builds (the small-grid rule is off here, as in 'usual-tiles')")
    monkeypatch.setattr(_traits, "small_grid_rows", lambda *a: None)
    rng = np.random.default_rng(next(_seed))
    qs, ks = _shapes(3, Sq, Sk, 6, 2, 64, "bshd")
    q, k, v = (cudattn.to_device(_rand(rng, s, ml_dtypes.bfloat16)) for s in (qs, ks, ks))

    def run(rows):
        monkeypatch.setattr(_plan, "_plans", {})
        monkeypatch.setattr(_call, "_plans", {})
        out = _poisoned_out(qs, ml_dtypes.bfloat16)
        cudattn.attention(q, k, v, causal=causal, out=out)
        assert {p.variant.tiles.block_m for p in _plan._plans.values()} == {rows}
        return cudattn.to_host(out)

    two = run(128)
    monkeypatch.setattr(_traits, "_SM90_SHORT_ROWS", {})
    one = run(192)
    assert not np.isnan(two.astype(np.float32)).any()
    assert np.array_equal(two.view(np.uint16), one.view(np.uint16))
    ref = reference.attention(*(cudattn.to_host(x) for x in (q, k, v)), causal=causal)
    naive = reference.attention_naive(*(cudattn.to_host(x) for x in (q, k, v)), causal=causal, dtype=ml_dtypes.bfloat16)
    ok, err, bound = reference.check_close(two.astype(np.float64), ref, naive)
    assert ok, (err, bound)


@pytest.mark.parametrize("D,causal,Sq,Sk,mods", [
    (128, False, 177, 301, False), (128, True, 400, 400, False), (128, True, 300, 517, True),
    (128, False, 999, 64, True), (192, False, 201, 333, False), (192, True, 450, 450, True),
    (160, True, 385, 300, False), (96, False, 250, 130, True)])
def test_three_consumers_equal_two_from_head_dim_128(monkeypatch, kernel_family, D, causal, Sq, Sk, mods):
    """From head dim 128 the long rows take three consumers, each waiting for its P V before its
    next S = Q K^T (sm90/consumer.cuh, SERIAL); shorter rows take two. A row sees the same key
    tiles in the same order in both, so the two give the same bits; forced here on short rows,
    with softcap, ALiBi and sinks in some cases (builds of their own)."""
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._kernels import traits as _traits
    from cudattn._kernels.tile_tables import RowRange
    from cudattn._runtime import device as _device

    if kernel_family != "fastest" or _device.device_properties(0).arch not in _traits.HOPPER_ARCHS:
        pytest.skip("a rule of the Hopper builds (the small-grid rule is off here, as in 'usual-tiles')")
    monkeypatch.setattr(_traits, "small_grid_rows", lambda *a: None)
    rng = np.random.default_rng(next(_seed))
    Hq, Hkv, B = 6, 2, 2
    qs, ks = _shapes(B, Sq, Sk, Hq, Hkv, D, "bshd")
    q, k, v = (cudattn.to_device(_rand(rng, s, ml_dtypes.bfloat16)) for s in (qs, ks, ks))
    kw = {}
    if mods:
        kw = dict(softcap=30.0, sinks=rng.uniform(-2, 2, Hq).astype(np.float32),
                  alibi_slopes=(2.0 ** -rng.uniform(1, 8, Hq)).astype(np.float32))

    def run(rows):
        monkeypatch.setattr(_plan, "_plans", {})
        monkeypatch.setattr(_call, "_plans", {})
        out = _poisoned_out(qs, ml_dtypes.bfloat16)
        cudattn.attention(q, k, v, causal=causal, out=out,
                          **{n: cudattn.to_device(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()})
        assert {p.variant.tiles.block_m for p in _plan._plans.values()} == {rows}
        return cudattn.to_host(out)

    dim = _traits.tile_dim_for(D, _traits.SM90_TILE_DIMS)
    monkeypatch.setitem(_traits._SM90_SHORT_ROWS, dim, (RowRange(0, 1 << 30, _traits._SM90_SHORT_ROWS[dim][0].tiles),))
    two = run(128)
    monkeypatch.setitem(_traits._SM90_SHORT_ROWS, dim, ())
    three = run(192)
    assert not np.isnan(two.astype(np.float32)).any()
    assert np.array_equal(two.view(np.uint16), three.view(np.uint16))
    host = [cudattn.to_host(x) for x in (q, k, v)]
    ref = reference.attention(*host, causal=causal, **kw)
    naive = reference.attention_naive(*host, causal=causal, dtype=ml_dtypes.bfloat16, **kw)
    ok, err, bound = reference.check_close(three.astype(np.float64), ref, naive)
    assert ok, (err, bound)


# (Sq, Sk, Hq, Hkv, D, causal, query rows a tile on a GPU of 114 to 132 SMs)
SMALL_GRIDS = [
    (2100, 2150, 4, 4, 64, True, 64),  # 132 tiles of 64 rows: causal, within two waves
    (3001, 2999, 3, 1, 64, True, 64),
    (2049, 700, 2, 2, 64, False, 64),
    (4096, 4096, 1, 1, 64, True, 64),
    (1700, 1699, 5, 5, 64, False, 128),  # 135 tiles of 64 rows, 70 of 128
    (1000, 1000, 6, 2, 128, False, 64),
    (3000, 3100, 4, 1, 128, True, 64),
    (700, 300, 8, 8, 128, True, 64),
    (333, 517, 3, 3, 128, False, 64),
    (513, 700, 8, 2, 256, False, 64),
    (700, 1501, 5, 5, 256, False, 64),
    (300, 257, 4, 4, 200, False, 64),  # head dim 200 in the 256-wide tiles
    (300, 257, 4, 4, 256, True, 128),  # causal head dim 256: its usual tiles
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Sq,Sk,Hq,Hkv,D,causal,rows", SMALL_GRIDS)
def test_small_grid_tiles(Sq, Sk, Hq, Hkv, D, causal, rows, dtype, monkeypatch, kernel_family):
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._runtime import device as _device

    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_call, "_plans", {})
    check(1, Sq, Sk, Hq, Hkv, D, DTYPES[dtype], causal)
    (p,) = _plan._plans.values()
    if kernel_family == "fastest" and p.variant.family == "sm90" and 114 <= _device.device_properties(0).sm_count <= 132:
        assert p.variant.tiles.block_m == rows, "a small grid takes the small-grid tiles"


# Causal grids too large for the small-grid rule, by query rows a sequence: (B, Sq, Sk, Hq, Hkv, D,
# the build's query rows a tile, CTAs an SM): head dim 64 from 513 to 1024 rows with no more keys
# than rows in 64-row tiles two to an SM, else (more keys too) in 192-row tiles whose consumers skip
# the keys their rows do not see; head dim 256 up to 512 rows in 128x64.
CAUSAL_ROWS = [
    (4, 600, 600, 16, 4, 64, 64, 2),
    (4, 600, 900, 16, 4, 64, 192, 1),
    (4, 1000, 999, 8, 8, 64, 64, 2),
    (2, 1500, 1499, 8, 8, 64, 192, 1),
    (3, 2048, 2048, 6, 2, 64, 192, 1),
    (8, 512, 700, 8, 8, 64, 192, 1),
    (8, 100, 300, 20, 4, 64, 128, 1),
    (8, 500, 500, 8, 8, 256, 128, 1),
    (6, 513, 513, 8, 2, 256, 128, 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D,rows,per_sm", CAUSAL_ROWS)
def test_causal_tiles_by_rows(B, Sq, Sk, Hq, Hkv, D, rows, per_sm, dtype, monkeypatch, kernel_family):
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._runtime import device as _device

    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_call, "_plans", {})
    check(B, Sq, Sk, Hq, Hkv, D, DTYPES[dtype], True)
    (p,) = _plan._plans.values()
    if kernel_family == "fastest" and p.variant.family == "sm90" and 114 <= _device.device_properties(0).sm_count <= 132:
        t = p.variant.tiles
        assert (t.block_m, t.min_blocks) == (rows, per_sm)
        assert p.grid[0] == min(-(-Sq // rows) * B * Hq, _device.device_properties(0).sm_count * per_sm)
        if D == 256:
            assert t.block_n == (64 if Sq <= 512 else 80)


def test_two_cta_builds_get_two_ctas_an_sm():
    """Each build whose plans count two CTAs an SM gets them from the driver (else its grid, twice
    the SM count, would run in two rounds at half the speed): the occupancy query, per build."""
    from cuda.bindings import driver
    from cudattn._kernels import registry, traits
    from cudattn._runtime import device as _device

    props = _device.device_properties(0)
    if props.arch not in traits.HOPPER_ARCHS:
        pytest.skip("the two-CTA builds are Hopper builds")
    builds = {v.describe(): v for v in traits.all_variants(props.arch) + traits.mods_variants(props.arch)
              if v.family == "sm90" and v.tiles.min_blocks > 1}
    assert builds, "no build runs two CTAs an SM: the test checks nothing"
    dev = _device.get_device(0)
    for name, v in builds.items():
        fn = registry.get_kernel(v, dev, 0, props.arch).function
        err, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            driver.CUfunction(fn) if isinstance(fn, int) else fn, v.threads, v.smem_bytes)
        assert err == driver.CUresult.CUDA_SUCCESS and n >= v.tiles.min_blocks, (name, err, n)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
def test_heads_and_layouts(hq, hkv, layout, causal):
    check(2, 257, 190, hq, hkv, 64, np.float16, causal, layout=layout)


@pytest.mark.parametrize("scale", [0.05, 1.0, -0.3])
def test_custom_scale(scale):
    check(1, 200, 333, 2, 1, 64, ml_dtypes.bfloat16, True, scale=scale)


def test_no_lse_requested():
    check(1, 65, 192, 2, 2, 64, np.float16, False, lse=False)


def test_causal_more_queries_than_keys_gives_zero_rows():
    """Sq > Sk with bottom-right causal: the first Sq - Sk rows see nothing -> 0 and LSE -inf."""
    err, _ = check(1, 300, 100, 2, 2, 64, np.float16, True)
    assert math.isfinite(err)


def test_error_does_not_move_between_runs():
    """Same inputs, several launches: bit-identical results (a race would move them)."""
    rng = np.random.default_rng(7)
    q, k, v = (_rand(rng, (2, 1023, 4, 128), np.float16) for _ in range(3))
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    first = cudattn.to_host(cudattn.attention(qd, kd, vd, causal=True))
    for _ in range(5):
        out = _poisoned_out(q.shape, np.float16)
        again = cudattn.to_host(cudattn.attention(qd, kd, vd, causal=True, out=out))
        assert np.array_equal(first.view(np.uint16), again.view(np.uint16))


def test_numpy_in_numpy_out():
    rng = np.random.default_rng(3)
    q, k, v = (_rand(rng, (2, 99, 4, 64), ml_dtypes.bfloat16) for _ in range(3))
    out, lse = cudattn.attention(q, k, v, causal=True, return_lse=True)
    assert type(out) is np.ndarray and out.dtype == q.dtype and out.shape == q.shape
    assert type(lse) is np.ndarray and lse.dtype == np.float32 and lse.shape == (2, 4, 99)
    ref = reference.attention(q, k, v, causal=True)
    naive = reference.attention_naive(q, k, v, causal=True, dtype=ml_dtypes.bfloat16)
    assert reference.check_close(out.astype(np.float64), ref, naive)[0]


# --- PyTorch interop: strided views, zero-copy DLPack/CAI, a non-default stream --------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("tdtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_torch_strided_inputs_on_a_side_stream(tdtype, layout):
    torch = _torch()
    dt = getattr(torch, tdtype)
    B, Sq, Sk, Hq, Hkv, D = 2, 203, 131, 4, 2, 64
    qs, ks = _shapes(B, Sq, Sk, Hq, Hkv, D, layout)
    g = torch.Generator(device="cuda").manual_seed(next(_seed))
    # Strided views: q's rows padded (last axis contiguous), k/v heads taken every other one.
    q = torch.randn(*qs[:-1], D + 24, device="cuda", dtype=dt, generator=g)[..., :D]
    kbig = torch.randn(*(ks[:2] + (2 * ks[2],) + ks[3:]) if layout == "bshd" else
                       (ks[0], 2 * ks[1]) + ks[2:], device="cuda", dtype=dt, generator=g)
    vbig = torch.randn_like(kbig)
    k = kbig[:, :, ::2] if layout == "bshd" else kbig[:, ::2]
    v = vbig[:, :, ::2] if layout == "bshd" else vbig[:, ::2]
    assert not q.is_contiguous() and not k.is_contiguous()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = torch.full(qs, float("nan"), device="cuda", dtype=dt)
        res = cudattn.attention(q, k, v, causal=True, layout=layout, out=out, stream=side)
        assert res.ptr == out.data_ptr()
    side.synchronize()
    to_np = lambda t: t.float().cpu().numpy().astype(DTYPES[tdtype])  # exact: values are already in dtype
    qn, kn, vn = to_np(q), to_np(k), to_np(v)
    ref = reference.attention(qn, kn, vn, causal=True, layout=layout)
    naive = reference.attention_naive(qn, kn, vn, causal=True, layout=layout, dtype=DTYPES[tdtype])
    ok, err, bound = reference.check_close(out.float().cpu().numpy().astype(np.float64), ref, naive)
    assert ok, (err, bound)


def test_torch_zero_copy_both_ways():
    torch = _torch()
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    res = cudattn.attention(q, q, q)
    back = torch.from_dlpack(res)
    assert back.data_ptr() == res.ptr and back.dtype == torch.bfloat16 and tuple(back.shape) == (1, 64, 2, 64)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2))
    torch.cuda.synchronize()
    assert (back.float() - ref.transpose(1, 2).float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("section", [1, 3, 5])
def test_causal_tile_order_in_sections(section, monkeypatch, kernel_family):
    """The Hopper kernel's causal tile order cuts the (batch, head) pairs into L2-sized sections;
    small shapes always fit in one, so force sections of 1, 3 and 5 of 14 pairs (an uneven last
    one): every tile must still be computed exactly once (outputs are poisoned first)."""
    from cudattn._kernels import plan as _plan

    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_plan, "_l2_section", lambda problem, l2_bytes, ctas: section)
    check(2, 700, 650, 7, 7, 64, np.float16, causal=True)
    check(2, 300, 300, 7, 7, 128, ml_dtypes.bfloat16, causal=True)


@pytest.mark.parametrize("causal,B,S,D", [(True, 3, 1500, 64), (False, 6, 1000, 64), (False, 12, 516, 128)],
                         ids=["causal", "full-192-row-tiles", "full-128-row-tiles"])
def test_tiles_taken_dynamically_equal_the_fixed_rounds(monkeypatch, kernel_family, causal, B, S, D):
    """Hopper calls whose tiles differ in length (causal ones; not causal, sequences whose last
    query block leaves whole consumers past the end: 1000 rows in 192-row tiles, 516 in 128) take
    their tiles from a counter of the stream (the dynamic order); the kernel zeroes it again for
    the next call. Calls back to back on one stream, each into a poisoned output, must all be the
    fixed rounds' result bit for bit (a tile's arithmetic does not depend on which CTA takes it),
    and the stream's counters read zero afterwards."""
    taken = counters_taken(monkeypatch, kernel_family)
    rng = np.random.default_rng(next(_seed))
    qs, ks = _shapes(B, S, S, 8, 2, D, "bshd")  # over twice the SMs' tiles
    q, k, v = (cudattn.to_device(_rand(rng, s, ml_dtypes.bfloat16)) for s in (qs, ks, ks))

    def run():
        out = _poisoned_out(qs, ml_dtypes.bfloat16)
        cudattn.attention(q, k, v, causal=causal, out=out)
        return cudattn.to_host(out)

    dynamic = [run() for _ in range(3)]
    assert taken and all(taken), "the calls took no tile counters"
    assert stream_counters_read_zero() >= 1

    fixed_rounds(monkeypatch)
    rounds = run()
    assert not np.isnan(rounds.astype(np.float32)).any()
    for d in dynamic:
        assert np.array_equal(d.view(np.uint16), rounds.view(np.uint16))
    ref = reference.attention(*(cudattn.to_host(x) for x in (q, k, v)), causal=causal)
    naive = reference.attention_naive(*(cudattn.to_host(x) for x in (q, k, v)), causal=causal, dtype=ml_dtypes.bfloat16)
    ok, err, bound = reference.check_close(rounds.astype(np.float64), ref, naive)
    assert ok, (err, bound)
