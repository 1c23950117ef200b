"""cudattn.quantize_fp8 / cudattn.dequantize on the host (NumPy): the conversion rule, per-tensor
and per-head descales, the round trip within the e4m3 error, and a property test. The device
results are compared bit for bit with these host ones in tests/test_quantize_gpu.py; the argument
checks are in test_quantize_errors_cpu.py, the kernels in test_quantize_kernels_cpu.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cudattn
from cudattn._ops import quantize as _quantize
from cudattn._spec import quantize as _quantize_rule
from cudattn._numpy.quantize import descale_from_amax, saturate_to_e4m3
from _quantize_cases import BF16, F16, F32, F64, FP8

TINY = np.float32(np.finfo(np.float32).tiny)  # 2^-126


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def _heads_axis(layout):
    return 2 if layout == "bshd" else 1


def _group_blocks(x, layout, G):
    """{(b, g): the elements of x that share descale[b, g]} (a slow, obvious reference)."""
    H = x.shape[_heads_axis(layout)]
    r = H // G
    out = {}
    for b in range(x.shape[0]):
        for g in range(G):
            sl = slice(g * r, (g + 1) * r)
            out[b, g] = x[b, :, sl, :] if layout == "bshd" else x[b, sl, :, :]
    return out


def _roundtrip_bound(xf: np.ndarray, descale_full: np.ndarray) -> np.ndarray:
    """|dequantize(quantize(x)) - x| bound: e4m3 keeps 3 mantissa bits (half an ulp = 2^-4 relative for
    normals), and its subnormal spacing is 2^-9 (half: 2^-10, times the descale); the float32
    division and product add a few 2^-24."""
    return (2.0**-4 + 2.0**-20) * np.abs(xf) + 2.0**-10 * descale_full * (1 + 2.0**-20)


def _descale_full(descale, shape, layout):
    """descale (B, G) broadcast to every element of x's shape."""
    B, G = descale.shape
    H = shape[_heads_axis(layout)]
    per_head = np.repeat(descale.astype(np.float64), H // G, axis=1)  # (B, H)
    if layout == "bshd":
        return np.broadcast_to(per_head[:, None, :, None], shape)
    return np.broadcast_to(per_head[:, :, None, None], shape)


def _rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---------------------------------------------------------------------------- conversion rule


def test_saturation_never_nan():
    v = np.array([464, 465, 479, 480, 1e4, -1e4, 3.4e38, -3.4e38, 448.5, -464], np.float32)
    q = saturate_to_e4m3(v)
    assert q.dtype == FP8
    assert not np.isnan(q.astype(np.float32)).any()
    np.testing.assert_array_equal(q.astype(np.float32), np.sign(v) * 448)
    # Plain astype turns these into NaN: the reason for the clip.
    assert np.isnan(np.float32(1e4).astype(FP8).astype(np.float32))


def test_saturation_through_quantize():
    x = np.zeros((1, 2, 2, 8), np.float32)
    x[0, 0, 0, :4] = [464, 1e4, -1e4, 5000]
    x[0, 1, 1, :2] = [-464, 1.0]
    q, d = cudattn.quantize_fp8(x)
    qf = q.astype(np.float32)
    assert not np.isnan(qf).any() and np.abs(qf).max() == 448
    assert qf[0, 0, 0, 1] == 448 and qf[0, 0, 0, 2] == -448
    assert d[0, 0] == np.float32(1e4) / np.float32(448)


def test_round_to_nearest_even_ties():
    # amax = 448 makes descale exactly 1, so x / descale = x and each tie is seen as is.
    ties = {
        1.0625: 1.0,  # between 1 (mantissa 000) and 1.125 (001): even -> 1
        1.1875: 1.25,  # between 1.125 (001) and 1.25 (010): even -> 1.25
        432.0: 448.0,  # between 416 (101) and 448 (110): even -> 448
        400.0: 384.0,  # between 384 (100) and 416 (101): even -> 384
        2.0**-10: 0.0,  # half the smallest subnormal 2^-9: even -> 0
        3 * 2.0**-10: 2.0**-8,  # between 2^-9 (001) and 2^-8 (010): even -> 2^-8
        5 * 2.0**-10: 2.0**-8,  # between 2^-8 (010) and 3 * 2^-9 (011): even -> 2^-8
        -1.0625: -1.0,
        -1.1875: -1.25,
        1.0626: 1.125,  # just above a tie rounds up
    }
    x = np.array([448.0, *ties], np.float32).reshape(1, 1, 1, -1)
    q, d = cudattn.quantize_fp8(x)
    assert d[0, 0] == 1.0
    np.testing.assert_array_equal(q.astype(np.float32)[0, 0, 0], [448.0, *ties.values()])


def test_division_not_reciprocal_product():
    # x / descale and x * (1 / descale) differ in the last bit for some x; the rule is the division.
    rng = np.random.default_rng(1)
    x = rng.uniform(-3, 3, size=(1, 64, 4, 32)).astype(np.float32)
    x[0, 0, 0, 0] = 3.0
    q, d = cudattn.quantize_fp8(x)
    want = saturate_to_e4m3(x / d[0, 0])
    assert np.array_equal(_bits(q), _bits(want))


def test_descale_from_amax():
    amax = np.array([0.0, 448.0, 1.0, 1e-40, 448 * 2.0**-126, 3.4e38], np.float32)
    d = descale_from_amax(amax)
    assert d.dtype == F32
    assert d[0] == 1 and d[1] == 1 and d[2] == np.float32(1) / np.float32(448)
    assert d[3] == TINY  # raised to the smallest normal float32
    assert d[4] == TINY
    assert d[5] == np.float32(3.4e38) / np.float32(448)


# ---------------------------------------------------------------------------- per tensor / head


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_per_tensor_vs_per_head(layout):
    rng = np.random.default_rng(2)
    shape = (2, 7, 4, 16) if layout == "bshd" else (2, 4, 7, 16)
    x = _rand(rng, shape, np.float32)
    scales = np.array([1, 10, 1e-4, 1000], np.float32)  # very different ranges per head
    x = x * (scales[None, None, :, None] if layout == "bshd" else scales[None, :, None, None])
    qt, dt = cudattn.quantize_fp8(x, per="tensor", layout=layout)
    qh, dh = cudattn.quantize_fp8(x, per="head", layout=layout)
    assert dt.shape == dh.shape == (2, 4) and dt.dtype == dh.dtype == F32
    assert np.all(dt == np.float32(np.abs(x).max()) / np.float32(448))
    for (b, h), block in _group_blocks(x, layout, 4).items():
        assert dh[b, h] == np.float32(np.abs(block).max()) / np.float32(448)
        qb = _group_blocks(qh, layout, 4)[b, h].astype(np.float32)
        assert np.abs(qb).max() == 448  # each head uses e4m3's whole range
    # Per tensor flushes the small head (|x| / descale < 2^-10) to 0; per head keeps it to 2^-4.
    small = (slice(None), slice(None), 2) if layout == "bshd" else (slice(None), 2)
    assert np.all(qt[small].astype(np.float32) == 0)
    err_h = np.abs(cudattn.dequantize(qh, dh, layout=layout)[small] - x[small])
    assert np.all(err_h <= 2.0**-4 * np.abs(x[small]) + 2.0**-10 * dh[:, 2].max())


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("H,G", [(6, 2), (6, 3), (8, 1), (4, 4)])
def test_heads_kv_grouping(layout, H, G):
    rng = np.random.default_rng(3)
    shape = (3, 5, H, 8) if layout == "bshd" else (3, H, 5, 8)
    x = _rand(rng, shape, np.float32) * rng.uniform(0.1, 100, size=(3, 1, 1, 1)).astype(np.float32)
    q, d = cudattn.quantize_fp8(x, per="head", layout=layout, heads_kv=G)
    assert d.shape == (3, G)
    for (b, g), block in _group_blocks(x, layout, G).items():
        assert d[b, g] == np.float32(np.abs(block).max()) / np.float32(448)
        assert np.array_equal(_bits(_group_blocks(q, layout, G)[b, g]),
                              _bits(saturate_to_e4m3(block.astype(np.float32) / d[b, g])))
    qt, dtn = cudattn.quantize_fp8(x, per="tensor", layout=layout, heads_kv=G)
    assert dtn.shape == (3, G) and np.all(dtn == np.float32(np.abs(x).max()) / np.float32(448))


def test_zero_amax_gives_descale_one_and_zeros():
    x = np.zeros((2, 3, 4, 8), np.float16)
    q, d = cudattn.quantize_fp8(x, per="head")
    assert np.all(d == 1) and np.all(q.astype(np.float32) == 0)
    q, d = cudattn.quantize_fp8(x)
    assert np.all(d == 1) and np.all(q.astype(np.float32) == 0)
    # One zero group among others.
    x = np.ones((1, 3, 4, 8), np.float32)
    x[:, :, 1] = 0
    q, d = cudattn.quantize_fp8(x, per="head")
    np.testing.assert_array_equal(d[0], [1 / np.float32(448), 1, 1 / np.float32(448), 1 / np.float32(448)])
    assert np.all(q[:, :, 1].astype(np.float32) == 0) and np.all(q[:, :, 0].astype(np.float32) == 448)


def test_tiny_amax_uses_descale_floor():
    x = np.zeros((1, 2, 1, 8), np.float32)
    x[0, 0, 0, :3] = [1e-40, -5e-41, 2e-39]  # subnormal float32: amax / 448 would be subnormal or 0
    q, d = cudattn.quantize_fp8(x)
    assert d[0, 0] == TINY
    qf = q.astype(np.float32)
    assert not np.isnan(qf).any() and np.abs(qf).max() < 448
    y = cudattn.dequantize(q, d)
    assert np.all(np.abs(y - x) <= _roundtrip_bound(x, _descale_full(d, x.shape, "bshd")))


def test_empty_dims():
    for shape in [(2, 0, 3, 8), (2, 4, 3, 0), (0, 4, 3, 8)]:
        q, d = cudattn.quantize_fp8(np.zeros(shape, np.float16), per="head")
        assert q.shape == shape and q.dtype == FP8 and d.shape == (shape[0], 3) and np.all(d == 1)
        assert cudattn.dequantize(q, d).shape == shape


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("per", ["tensor", "head"])
@pytest.mark.parametrize("heads_kv", [None, 2])
def test_roundtrip_within_e4m3_error(dtype, layout, per, heads_kv):
    rng = np.random.default_rng(4)
    shape = (2, 13, 4, 24) if layout == "bshd" else (2, 4, 13, 24)
    x = _rand(rng, shape, dtype, scale=30.0)
    q, d = cudattn.quantize_fp8(x, per=per, layout=layout, heads_kv=heads_kv)
    assert q.dtype == FP8 and q.shape == shape and q.flags.c_contiguous
    assert d.dtype == F32 and d.shape == (2, heads_kv or 4)
    y = cudattn.dequantize(q, d, layout=layout)
    assert y.dtype == F32 and y.shape == shape and y.flags.c_contiguous
    xf = x.astype(np.float64)
    assert np.all(np.abs(y - xf) <= _roundtrip_bound(xf, _descale_full(d, shape, layout)))


def test_layouts_agree():
    rng = np.random.default_rng(5)
    x = _rand(rng, (2, 9, 6, 16), BF16, scale=5.0)
    for per, G in [("tensor", None), ("head", None), ("head", 3)]:
        qa, da = cudattn.quantize_fp8(x, per=per, heads_kv=G)
        qb, db = cudattn.quantize_fp8(x.transpose(0, 2, 1, 3), per=per, layout="bhsd", heads_kv=G)
        assert np.array_equal(da, db) and qb.flags.c_contiguous
        assert np.array_equal(_bits(qa), _bits(np.ascontiguousarray(qb.transpose(0, 2, 1, 3))))


def test_strided_host_input():
    rng = np.random.default_rng(6)
    big = _rand(rng, (2, 10, 8, 40), F16, scale=3.0)
    x = big[:, ::2, 1::2, 3:35]
    q, d = cudattn.quantize_fp8(x, per="head")
    q2, d2 = cudattn.quantize_fp8(np.ascontiguousarray(x), per="head")
    assert np.array_equal(d, d2) and np.array_equal(_bits(q), _bits(q2)) and q.flags.c_contiguous


@pytest.mark.parametrize("out_dtype", [np.float16, ml_dtypes.bfloat16, "float32", "bf16"])
def test_dequantize_out_dtypes(out_dtype):
    rng = np.random.default_rng(7)
    x = _rand(rng, (1, 5, 4, 8), F32, scale=100.0)
    q, d = cudattn.quantize_fp8(x, per="head", heads_kv=2)
    y32 = cudattn.dequantize(q, d)
    y = cudattn.dequantize(q, d, out_dtype=out_dtype)
    want = _quantize_rule._check_out_dtype(out_dtype)
    assert y.dtype == want and np.array_equal(_bits(y), _bits(y32.astype(want)))


def test_dequantize_uint8_bits_and_all_codes():
    codes = np.arange(256, dtype=np.uint8).reshape(1, 2, 4, 32)
    d = np.array([[2.0, 0.5]], np.float32)
    y = cudattn.dequantize(codes, d)
    y2 = cudattn.dequantize(codes.view(FP8), d)
    nan = np.isnan(y)
    assert np.array_equal(nan, np.isnan(y2)) and np.array_equal(y[~nan], y2[~nan])
    assert nan.sum() == 2  # 0x7f and 0xff
    vals = codes.view(FP8).astype(np.float32)
    want = vals * np.array([2.0, 2.0, 0.5, 0.5], np.float32)[None, None, :, None]
    assert np.array_equal(y[~nan], want[~nan])


# ---------------------------------------------------------------------------- property test

_finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def _cases(draw):
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    per = draw(st.sampled_from(["tensor", "head"]))
    B, S, D = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    G, r = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    shape = (B, S, G * r, D) if layout == "bshd" else (B, G * r, S, D)
    lim = float(np.float32(10.0 ** draw(st.integers(-40, 38))))  # values clustered at one scale, or anywhere
    elems = st.one_of(_finite32, st.floats(-lim, lim, width=32))
    x = draw(hnp.arrays(np.float32, shape, elements=elems))
    heads_kv = draw(st.sampled_from([None, G]))
    return x, layout, per, heads_kv


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_property_roundtrip(case):
    x, layout, per, heads_kv = case
    q, d = cudattn.quantize_fp8(x, per=per, layout=layout, heads_kv=heads_kv)
    qf = q.astype(np.float32)
    assert not np.isnan(qf).any() and np.abs(qf).max() <= 448
    assert np.all(np.isfinite(d)) and np.all(d > 0)
    y = cudattn.dequantize(q, d, layout=layout)
    xf = x.astype(np.float64)
    assert np.all(np.isfinite(y))
    bound = _roundtrip_bound(xf, _descale_full(d, x.shape, layout))
    assert np.all(np.abs(y - xf) <= bound), np.max(np.abs(y - xf) - bound)
    # A group's largest |x| lands on 448 (unless amax is so small that the descale floor applies).
    G = d.shape[1]
    qs, xs = _group_blocks(qf, layout, G), _group_blocks(x, layout, G)
    for key, xb in xs.items():
        amax = np.abs(xb).max() if per == "head" else np.abs(x).max()
        if amax >= 448 * TINY and np.abs(xb).max() == amax:
            assert np.abs(qs[key]).max() == 448


def test_exported():
    assert cudattn.quantize_fp8 is _quantize.quantize_fp8 and cudattn.dequantize is _quantize.dequantize
    assert {"quantize_fp8", "dequantize"} <= set(cudattn.__all__)
