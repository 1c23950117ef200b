"""cudattn.quantize_fp8 / cudattn.dequantize on the host (NumPy), their argument checks (host and
device, the latter with the CUDA calls stubbed out), and the device kernels compiled by NVRTC
(no GPU needed). The device results are compared bit for bit with these host ones in
tests/test_quantize_gpu.py."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cudattn
import nvrtc_cache
from cudattn._arrays import array as _array
from cudattn._calls import call as _callpath
from cudattn._runtime import device as _device
from cudattn._kernels import registry as _kernels
from cudattn._ops import quantize as _quantize
from cudattn._kernels import quantize as _quantize_kernels
from cudattn._spec import quantize as _quantize_rule
from cudattn._runtime import stream as _stream
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from cudattn._kernels.quantize import Fp8QuantParams, all_quantize_kernels
from cudattn._numpy.quantize import descale_from_amax, saturate_to_e4m3

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
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


# ---------------------------------------------------------------------------- errors (host)


def test_errors_quantize_host():
    x = np.ones((1, 2, 4, 8), np.float16)
    with pytest.raises(ValueError, match=r"x must be 4-D \(B, S, H, D\)"):
        cudattn.quantize_fp8(np.ones((2, 4, 8), np.float16))
    with pytest.raises(ValueError, match=r"x must be 4-D \(B, H, S, D\) for layout 'bhsd'"):
        cudattn.quantize_fp8(np.ones((1, 2, 3, 4, 8), np.float16), layout="bhsd")
    with pytest.raises(ValueError, match="layout must be 'bshd'"):
        cudattn.quantize_fp8(x, layout="bsh")
    with pytest.raises(ValueError, match="per must be 'tensor'"):
        cudattn.quantize_fp8(x, per="channel")
    with pytest.raises(ValueError, match="not a multiple of heads_kv=3"):
        cudattn.quantize_fp8(x, heads_kv=3)
    with pytest.raises(ValueError, match="heads_kv must be a positive int"):
        cudattn.quantize_fp8(x, heads_kv=0)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="heads_kv must be None or a positive int"):
            cudattn.quantize_fp8(x, heads_kv=bad)
    with pytest.raises(TypeError, match="x is already float8_e4m3fn"):
        cudattn.quantize_fp8(x.astype(FP8))
    for dt in (np.int32, np.complex64, np.dtype(">f4"), np.uint8):
        with pytest.raises(TypeError, match=r"x has dtype .*quantize_fp8 takes float16, bfloat16"):
            cudattn.quantize_fp8(x.astype(dt))
    with pytest.raises(TypeError, match="x must be a NumPy array or a device array"):
        cudattn.quantize_fp8([[[[1.0]]]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
def test_nonfinite_host_input_raises(bad, dtype):
    x = np.ones((1, 2, 2, 8), dtype)
    x[0, 1, 0, 3] = bad
    with pytest.raises(ValueError, match=r"x has 1 non-finite value"):
        cudattn.quantize_fp8(x)


def test_float64_beyond_float32_range_raises():
    x = np.ones((1, 1, 1, 4), np.float64)
    x[0, 0, 0, 0] = 1e39
    with pytest.raises(ValueError, match="beyond float32's range"):
        cudattn.quantize_fp8(x)


def test_errors_dequantize_host():
    q = np.zeros((2, 3, 4, 8), FP8)
    d = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"x_fp8 must be 4-D"):
        cudattn.dequantize(q[0], d)
    with pytest.raises(TypeError, match="x_fp8 has dtype float16; dequantize takes ml_dtypes.float8_e4m3fn"):
        cudattn.dequantize(q.astype(np.float16), d)
    with pytest.raises(TypeError, match="descale has dtype float64; it must be float32"):
        cudattn.dequantize(q, d.astype(np.float64))
    for bad in (np.ones((3, 4), np.float32), np.ones((2, 3), np.float32), np.ones((4,), np.float32),
                np.ones((2, 8), np.float32), np.ones((2, 0), np.float32)):
        with pytest.raises(ValueError, match=r"descale has shape .* it must be \(B, G\) = \(2, G\)"):
            cudattn.dequantize(q, bad)
    with pytest.raises(ValueError, match="dividing x_fp8's 3 heads"):
        cudattn.dequantize(q, d, layout="bhsd")  # H is then 3
    with pytest.raises(ValueError, match="layout must be"):
        cudattn.dequantize(q, d, layout="sbhd")
    with pytest.raises(TypeError, match="out_dtype=float64 is not supported"):
        cudattn.dequantize(q, d, out_dtype=np.float64)
    with pytest.raises(TypeError, match="out_dtype must be a dtype"):
        cudattn.dequantize(q, d, out_dtype=None)


def test_host_device_mixing_raises_before_gpu_work(monkeypatch):
    def no_cuda(*a, **k):
        raise AssertionError("no CUDA call may happen before the arguments are checked")

    monkeypatch.setattr(_device, "get_device", no_cuda)
    q = np.zeros((2, 3, 4, 8), FP8)
    d = np.ones((2, 4), np.float32)
    qd = DeviceArray(0x10000, q.shape, FP8, device_id=0)
    dd = DeviceArray(0x20000, d.shape, F32, device_id=0)
    with pytest.raises(TypeError, match="x_fp8 is a NumPy .host. array but descale is not"):
        cudattn.dequantize(q, dd)
    with pytest.raises(TypeError, match="descale is a NumPy .host. array but x_fp8 is not"):
        cudattn.dequantize(qd, d)
    with pytest.raises(TypeError, match="descale must be a NumPy array or a device array"):
        cudattn.dequantize(qd, [[1.0]])


# ---------------------------------------------------------------------------- errors (device, CUDA stubbed)


class _FakeDevice:
    device_id = 0


@pytest.fixture
def fake_device(monkeypatch):
    """Device calls answered without a GPU; any allocation or launch fails the test."""
    props = _device.DeviceProperties(0, "fake sm_90", (9, 0), 132, 232448, 49152, 233472, 50 << 20, 1024,
                                     (2**31 - 1, 65535, 65535))

    def forbidden(*a, **k):
        raise AssertionError("no allocation or launch may happen before the arguments are checked")

    monkeypatch.setattr(_device, "get_device", lambda *a, **k: _FakeDevice())
    monkeypatch.setattr(_device, "device_properties", lambda *a, **k: props)
    monkeypatch.setattr(_stream, "as_stream", lambda s, d: _stream.StreamRef(0, None))
    monkeypatch.setattr(_callpath, "is_capturing", lambda h: False)
    monkeypatch.setattr(_array, "empty_on", forbidden)
    monkeypatch.setattr(_transfer, "memset", forbidden)
    return props


def _dev(shape, dtype, strides=None, ptr=0x100000):
    return DeviceArray(ptr, shape, dtype, strides, device_id=0)


def test_errors_quantize_device(fake_device, monkeypatch):
    with pytest.raises(ValueError, match=r"x must be 4-D"):
        cudattn.quantize_fp8(_dev((2, 4, 8), F16))
    with pytest.raises(TypeError, match="float64 device array"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F64))
    with pytest.raises(TypeError, match="x is already float8_e4m3fn"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), FP8))
    with pytest.raises(ValueError, match="not a multiple of heads_kv=3"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F16), heads_kv=3)
    with pytest.raises(ValueError, match="unit stride along its last axis"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F16, strides=(256, 128, 32, 4)))
    with pytest.raises(ValueError, match="not a multiple of its itemsize"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F32, ptr=0x100002))
    with pytest.raises(ValueError, match="multiples of its itemsize"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F32, strides=(512, 130, 32, 4)))
    sm80 = _device.DeviceProperties(0, "fake A100", (8, 0), 108, 166912, 49152, 167936, 40 << 20, 1024,
                                    (2**31 - 1, 65535, 65535))
    monkeypatch.setattr(_device, "device_properties", lambda *a, **k: sm80)
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer .* quantize a NumPy array"):
        cudattn.quantize_fp8(_dev((1, 2, 4, 8), F16))


def test_errors_dequantize_device(fake_device):
    q = _dev((2, 3, 4, 8), FP8)
    with pytest.raises(TypeError, match="descale has dtype float16"):
        cudattn.dequantize(q, _dev((2, 4), F16))
    with pytest.raises(ValueError, match=r"descale has shape \(2, 3\)"):
        cudattn.dequantize(q, _dev((2, 3), F32))
    with pytest.raises(TypeError, match="x_fp8 has dtype bfloat16"):
        cudattn.dequantize(_dev((2, 3, 4, 8), BF16), _dev((2, 4), F32))
    with pytest.raises(ValueError, match="descale is on device 1 but x_fp8 is on device 0"):
        cudattn.dequantize(q, DeviceArray(0x1000, (2, 4), F32, device_id=1))
    with pytest.raises(ValueError, match="descale's address and strides"):
        cudattn.dequantize(q, _dev((2, 4), F32, strides=(16, 2)))
    with pytest.raises(ValueError, match="unit stride along its last axis"):
        cudattn.dequantize(_dev((2, 3, 4, 8), FP8, strides=(192, 64, 16, 2)), _dev((2, 4), F32))


# ---------------------------------------------------------------------------- launch geometry


def test_rows_follow_the_smaller_stride():
    g = _quantize_rule._Geom(2, 5, 6, 64, 2, "bshd")  # r = 3
    st_bsh = _quantize_kernels._contiguous_strides(g)  # (S*H*D, H*D, D)
    assert not _quantize_kernels._inner_is_seq(st_bsh, g)  # bshd: heads of a group are adjacent
    rows = _quantize_kernels._rows(st_bsh, g, False)
    assert (rows.stride_g, rows.stride_outer, rows.stride_inner, rows.n_outer, rows.n_inner) == (3 * 64, 6 * 64, 64,
                                                                                                5, 3)
    g2 = _quantize_rule._Geom(2, 5, 6, 64, 2, "bhsd")
    st2 = _quantize_kernels._contiguous_strides(g2)  # (b, s, h) strides of (B, H, S, D): (H*S*D, D, S*D)
    assert st2 == (6 * 5 * 64, 64, 5 * 64) and _quantize_kernels._inner_is_seq(st2, g2)
    rows2 = _quantize_kernels._rows(st2, g2, True)
    assert (rows2.stride_g, rows2.stride_outer, rows2.stride_inner, rows2.n_outer, rows2.n_inner) == (
        3 * 5 * 64, 5 * 64, 64, 3, 5)
    empty = _quantize_kernels._rows(st2, _quantize_rule._Geom(2, 0, 6, 64, 2, "bhsd"), True)
    assert empty.n_outer == 0 and empty.n_inner == 1


@pytest.mark.parametrize("D,vec,lpr", [(128, True, 32), (64, True, 16), (72, True, 32), (8, True, 2),
                                       (4, True, 1), (5, False, 8), (1, False, 1), (200, False, 32)])
def test_lanes_per_row(D, vec, lpr):
    g = _quantize_rule._Geom(1, 100, 4, D, 4, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    got, grid = _quantize_kernels._launch_shape(g, rows, vec, 132)
    assert got == lpr and grid[0] == 4 and 1 <= grid[1] <= 65535 and grid[2] == 1


def test_grid_stays_within_limits():
    g = _quantize_rule._Geom(1, 10**7, 1, 128, 1, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    _, grid = _quantize_kernels._launch_shape(g, rows, True, 132)
    assert grid == (1, 132 * 8, 1)  # enough blocks for the GPU; each walks many rows
    g = _quantize_rule._Geom(4096, 3, 32, 128, 32, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    _, grid = _quantize_kernels._launch_shape(g, rows, True, 132)
    assert grid == (4096 * 32, 1, 1)


def test_vec_needs_aligned_rows():
    g = _quantize_rule._Geom(1, 4, 2, 8, 2, "bshd")
    rows = _quantize_kernels._rows(_quantize_kernels._contiguous_strides(g), g, False)
    assert _quantize_kernels._vec_ok(0x1000, 2, rows, 8)
    assert not _quantize_kernels._vec_ok(0x1002, 2, rows, 8)  # base 2 elements off
    assert not _quantize_kernels._vec_ok(0x1000, 2, rows, 6)
    odd = _quantize_kernels._Rows(18, 18, 6, 3, 4, 2)
    assert not _quantize_kernels._vec_ok(0x1000, 2, odd, 8)


# ---------------------------------------------------------------------------- kernels compile (NVRTC, no GPU)


@pytest.fixture(scope="module")
def cache(kernel_cache):
    return kernel_cache  # conftest: every kernel for sm_80, sm_89 and sm_90a, built in parallel


def _specs():
    return [pytest.param(arch, k, id=f"{arch}-{k.kernel_name}-{'-'.join(f'{a}{b}' for a, b in k.define_items)}")
            for arch in ("sm_80", "sm_89", "sm_90a") for k in all_quantize_kernels(arch)]


def test_all_quantize_kernels_lists_every_spec():
    names = {(k.kernel_name, k.define_items) for k in all_quantize_kernels()}
    assert len(names) == 9
    assert {n for n, _ in names} == {"fp8_amax", "fp8_quantize", "fp8_dequantize"}
    assert all(k.source == "fp8_quantize.cu" and k.smem_bytes == 0 for k in all_quantize_kernels())
    assert {k.kernel_name for k in all_quantize_kernels("sm_80")} == {"fp8_dequantize"}
    assert len(all_quantize_kernels("sm_89")) == len(all_quantize_kernels("sm_90a")) == 9
    hash(all_quantize_kernels()[0])  # get_kernel keys its in-process cache by the spec


@pytest.mark.parametrize("arch,spec", _specs())
def test_quantize_kernels_compile(cache, arch, spec, tmp_path):
    res = _kernels.compile_variant(spec, arch, cache=cache)
    assert res.cubin[:4] == b"\x7fELF"
    assert "warning" not in res.log, res.log
    rep = res.ptxas.get(spec.kernel_name)
    if rep is not None:
        assert rep.spill_stores == 0 and rep.spill_loads == 0 and rep.stack_bytes == 0, rep
        assert rep.registers * spec.threads <= 65536
    sass = _sass(res.cubin, tmp_path)
    if sass is not None:
        assert "LDL" not in sass and "STL" not in sass
        if spec.kernel_name == "fp8_quantize":
            assert re.search(r"F2FP\.SATFINITE\.E4M3", sass), "the saturating e4m3 conversion is missing"


def test_quantize_kernels_need_sm89(cache):
    with pytest.raises(nvrtc_cache.CompileError):
        _kernels.compile_variant(_quantize_kernels.quantize_kernel(F16), "sm_80", cache=cache)


def _sass(cubin: bytes, tmp_path) -> str | None:
    try:
        import cuda.pathfinder as pf

        tool = pf.find_nvidia_binary_utility("cuobjdump") or shutil.which("cuobjdump")
    except Exception:
        tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    path = tmp_path / "q.cubin"
    path.write_bytes(cubin)
    return subprocess.run([tool, "-sass", str(path)], check=True, capture_output=True, text=True).stdout


def test_params_struct_matches_source():
    source, _ = _kernels.sources("fp8_quantize.cu")
    body = source.split("struct Fp8QuantParams {", 1)[1].split("};", 1)[0]
    body = re.sub(r"//[^\n]*", "", body)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        first, *more = decl.split(",")
        names += [first.split()[-1].lstrip("*")] + [m.strip() for m in more]
    assert names == [f[0] for f in Fp8QuantParams._fields_]
    assert ctypes.sizeof(Fp8QuantParams) == 4 * 8 + 12 * 8 + 5 * 4 + 4  # padded to 8 bytes, as in C


def test_threads_match_source():
    source, _ = _kernels.sources("fp8_quantize.cu")
    assert re.search(r"constexpr int THREADS = (\d+);", source).group(1) == str(_quantize_kernels.THREADS)


def test_exported():
    assert cudattn.quantize_fp8 is _quantize.quantize_fp8 and cudattn.dequantize is _quantize.dequantize
    assert {"quantize_fp8", "dequantize"} <= set(cudattn.__all__)
