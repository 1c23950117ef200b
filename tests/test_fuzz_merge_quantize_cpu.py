"""Fuzzing `merge_attention_states`, `quantize_fp8` and `dequantize`: documented errors, and on
the NumPy path results of the right shape, dtype and value; CPU only, the property and the GPU
stand-ins are `_fuzz_harness`'s.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import cudattn
from cudattn._arrays.array import DeviceArray
from _fuzz_harness import (
    BF16, F16, F32, FP8, JUNK, LAYOUT_JUNK, OUT_DTYPE_JUNK, RATES, arg, bad, fuzz, host_tensor, outcome,
    perturbed_shape,
)
from _fuzz_harness import _no_gpu as _no_gpu  # fixtures
from _fuzz_devices import STREAM_ARG, STREAM_JUNK, _ptrs, device_strides, device_tensor


# ---------------------------------------------------------------------------------------------
# merge_attention_states
# ---------------------------------------------------------------------------------------------

LSE_VALUES = st.one_of(st.floats(-80, 80, width=32), st.just(-math.inf))


@fuzz(300)
@given(st.data())
def test_merge_numpy(data):
    """NumPy parts: a documented error, or a result of the right shape and dtype, finite where the
    inputs are (LSEs finite or -inf), equal to the single part when there is one, with no
    RuntimeWarning."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    n = 0 if bad(data.draw, rate / 2) else data.draw(st.sampled_from([1, 1, 2, 3, 5]))
    B, Sq, H, D = (data.draw(st.sampled_from([0, 1, 2, 3])) for _ in range(4))
    oshape = (B, Sq, H, D) if layout == "bshd" else (B, H, Sq, D)
    dtype = data.draw(st.sampled_from([F16, BF16, F32]))
    outs, lses = [], []
    for _ in range(n):
        vals = data.draw(st.lists(st.floats(-4, 4, width=16), min_size=1, max_size=4))
        dt = data.draw(st.sampled_from([F16, F32, np.int32, np.float64, object])) if bad(data.draw, rate) else dtype
        outs.append(np.resize(np.array(vals, np.float32), data.draw(perturbed_shape(oshape, rate))).astype(dt))
        lv = data.draw(st.lists(LSE_VALUES, min_size=1, max_size=4))
        ldt = data.draw(st.sampled_from([np.float64, F16])) if bad(data.draw, rate) else F32
        lses.append(np.resize(np.array(lv, np.float32), data.draw(perturbed_shape((B, H, Sq), rate))).astype(ldt))
    if (data.draw(st.integers(0, 4)) == 0 and n and len({(o.shape, o.dtype) for o in outs}) == 1
            and len({(x.shape, x.dtype) for x in lses}) == 1):
        outs, lses = np.stack(outs), np.stack(lses)  # one array with a leading N axis
    elif data.draw(st.booleans()):
        outs, lses = tuple(outs), tuple(lses)
    if bad(data.draw, rate / 2):
        outs = data.draw(st.one_of(JUNK, st.just(iter(outs))))
    if bad(data.draw, rate / 2):
        lses = data.draw(st.one_of(JUNK, st.just(lses[:-1])))
    kw = {"layout": arg(data.draw, rate / 2, st.just(layout), LAYOUT_JUNK)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.merge_attention_states, outs, lses, **kw)
    if res[0] != "ok":
        return
    out, lse = res[1]
    first = outs[0]
    b, s, h, _ = first.shape if kw["layout"] == "bshd" else np.array(first.shape)[[0, 2, 1, 3]]
    assert out.shape == first.shape and out.dtype == first.dtype
    assert lse.dtype == F32 and lse.shape == (b, h, s)
    assert np.all(np.isfinite(out.astype(np.float32))) and not np.isnan(lse).any() and not np.any(lse == np.inf)
    if len(outs) == 1:  # a single part comes back unchanged (but for rows that saw no key: 0)
        assert np.array_equal(lse, np.asarray(lses[0]))
        empty = np.isneginf(lse).transpose(0, 2, 1) if kw["layout"] == "bshd" else np.isneginf(lse)
        want = np.where(empty[..., None], 0, np.asarray(first, np.float64))
        assert np.array_equal(out.astype(np.float64), want)


@fuzz(150)
@given(st.data())
def test_merge_device(data):
    """Device parts (as lists, stacked, mixed with NumPy, empty, junk): documented error or GPU."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    n = data.draw(st.sampled_from([1, 2, 3, 16, 17] + ([0, 20] if bad(data.draw, rate) else [])))
    B, Sq, H = (data.draw(st.sampled_from([1, 2, 3])) for _ in range(3))
    D = data.draw(st.sampled_from([8, 64]))
    oshape = (B, Sq, H, D) if layout == "bshd" else (B, H, Sq, D)
    dtype = data.draw(st.sampled_from([F16, BF16, F32]))
    if data.draw(st.integers(0, 3)) == 0:  # stacked, evenly spaced
        outs = DeviceArray(data.draw(_ptrs), data.draw(perturbed_shape((n,) + oshape, rate)), dtype, device_id=0)
        lses = DeviceArray(data.draw(_ptrs), data.draw(perturbed_shape((n, B, H, Sq), rate)), F32, device_id=0)
    else:  # a list of parts with one set of strides (the device path wants them alike)
        o_strides = data.draw(device_strides(oshape, dtype.itemsize, False))
        base_o, base_l = data.draw(_ptrs), data.draw(_ptrs)
        outs = [DeviceArray(base_o + 4096 * (i * i + 1), oshape, dtype, o_strides, device_id=0) for i in range(n)]
        lses = [DeviceArray(base_l + 4096 * (i * i + 1), (B, H, Sq), F32, device_id=0) for i in range(n)]
        for parts, shape, dt in ((outs, oshape, dtype), (lses, (B, H, Sq), F32)):
            if n and bad(data.draw, rate):
                parts[data.draw(st.integers(0, n - 1))] = data.draw(device_tensor(shape, dt, 0.5))
    if bad(data.draw, rate / 2):
        outs = data.draw(st.one_of(JUNK, st.just([np.zeros(oshape, dtype)] * max(n, 1)), st.just([])))
    if bad(data.draw, rate / 2):
        lses = data.draw(st.one_of(JUNK, st.just([np.zeros((B, H, Sq), F32)] * max(n, 1)), st.just([])))
    kw = {"layout": arg(data.draw, rate / 2, st.just(layout), LAYOUT_JUNK)}
    if data.draw(st.booleans()):
        kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
    outcome(cudattn.merge_attention_states, outs, lses, **kw)


# ---------------------------------------------------------------------------------------------
# quantize_fp8 / dequantize
# ---------------------------------------------------------------------------------------------

E4M3_MAX = 448.0


@fuzz(250)
@given(st.data())
def test_quantize_numpy(data):
    """Host quantize_fp8: a documented error (bad arguments, non-finite input), or e4m3 values that
    are never NaN and saturate at +-448, positive finite float32 descales of shape (B, G) (1 for an
    all-zero group, equal everywhere per tensor), the largest value mapped to +-448, and
    dequantize(x8, descale) within half an e4m3 step of x."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 3, 4])) for _ in range(4))
    shape = data.draw(perturbed_shape((B, S, H, D) if layout == "bshd" else (B, H, S, D), rate))
    dtype = data.draw(st.sampled_from([F32, F32, np.float64, F16, BF16]))
    if bad(data.draw, rate):
        dtype = data.draw(st.sampled_from([FP8, np.int32, object, np.complex64, np.bool_]))
    exponent = data.draw(st.sampled_from([0, 0, -140, -40, -10, 10, 30, 37, 100]))
    vals = data.draw(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6))
    x = np.resize(np.array(vals, np.float64) * 2.0**exponent, shape)
    if bad(data.draw, rate) and x.size:
        x.flat[data.draw(st.integers(0, x.size - 1))] = data.draw(st.sampled_from([math.nan, math.inf, 0.0, 1e300]))
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        x = x.astype(dtype)
    if data.draw(st.integers(0, 5)) == 0 and x.ndim == 4:
        x = host_tensor(x.shape, x.dtype, data.draw(st.sampled_from(["reversed", "step", "padded", "transposed",
                                                                     "broadcast", "fortran", "subclass"])))
    if bad(data.draw, rate / 2):  # its mask would be ignored (a masked NaN used to come out as a NaN e4m3 value)
        x = np.ma.masked_array(x, mask=np.ones(x.shape, bool))
    kw = {"layout": arg(data.draw, rate, st.just(layout), LAYOUT_JUNK)}
    if data.draw(st.booleans()):
        kw["per"] = arg(data.draw, rate, st.sampled_from(["tensor", "head"]))
    if data.draw(st.booleans()):
        kw["heads_kv"] = arg(data.draw, rate, st.sampled_from([None, 1, 2, 4, np.int64(2)]),
                             st.one_of(st.sampled_from([3, 0, -1, 2**70]), JUNK))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.quantize_fp8, x, **kw)
    if res[0] != "ok":
        return
    x8, d = res[1]
    Bx, Sx, Hx, Dx = x.shape if kw["layout"] == "bshd" else (x.shape[0], x.shape[2], x.shape[1], x.shape[3])
    G = Hx if kw.get("heads_kv") is None else int(kw["heads_kv"])
    assert x8.dtype == FP8 and x8.shape == x.shape and x8.flags.c_contiguous
    assert d.dtype == F32 and d.shape == (Bx, G)
    v8 = x8.astype(np.float32)
    assert not np.isnan(v8).any() and np.all(np.abs(v8) <= E4M3_MAX)
    assert np.all(np.isfinite(d)) and np.all(d > 0)
    if kw.get("per", "tensor") == "tensor" and d.size:
        assert np.all(d == d.flat[0])
    if not x.size:
        return
    xf = x.astype(np.float64)
    back = cudattn.dequantize(x8, d, layout=kw["layout"]).astype(np.float64)
    # per element: |back - x| <= 2^-4 |x| (3 mantissa bits, rounded to nearest) + half the subnormal
    # step, 2^-10 * descale
    dh = np.repeat(d.astype(np.float64), Hx // G, axis=1)  # (B, H)
    dfull = dh[:, None, :, None] if kw["layout"] == "bshd" else dh[:, :, None, None]
    tol = 2.0**-4 * np.abs(xf) + 2.0**-10 * dfull + 1e-30
    assert np.all(np.abs(back - xf) <= tol * (1 + 1e-5)), float(np.max(np.abs(back - xf) / tol))
    if kw.get("per", "tensor") == "tensor" and np.abs(xf).max() > 2.0**-100:
        assert np.abs(v8).max() == E4M3_MAX  # the largest |x| lands on 448 (descale above its 2^-126 floor)


@fuzz(150)
@given(st.data())
def test_dequantize_numpy(data):
    """Host dequantize: documented error, or exactly float32(e4m3) * descale rounded to out_dtype."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 4])) for _ in range(4))
    shape = data.draw(perturbed_shape((B, S, H, D) if layout == "bshd" else (B, H, S, D), rate))
    codes = np.resize(np.array(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=8)), np.uint8), shape)
    x8 = codes if data.draw(st.integers(0, 3)) == 0 else codes.view(FP8)
    if bad(data.draw, rate):
        x8 = x8.astype(data.draw(st.sampled_from([F16, F32, object])))
    G = data.draw(st.sampled_from([1, 2, 4]))
    dshape = (B, G)
    if bad(data.draw, rate):
        dshape = data.draw(st.sampled_from([(B, 3), (B, 0), (G,), (B + 1, G), ()]))
    dval = data.draw(st.sampled_from([1.0, 0.5, 2.0**-126, 1e30, -3.0, 0.0]))
    ddt = data.draw(st.sampled_from([np.float64, np.int32, F16])) if bad(data.draw, rate) else F32
    with np.errstate(over="ignore", invalid="ignore"):
        descale = np.full(dshape, dval).astype(ddt)
    if bad(data.draw, rate / 2):
        descale = data.draw(JUNK)
    out_dtype = arg(data.draw, rate, st.sampled_from([np.float32, F16, BF16, "float16", "bf16"]), OUT_DTYPE_JUNK)
    kw = dict(layout=arg(data.draw, rate, st.just(layout), LAYOUT_JUNK), out_dtype=out_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.dequantize, x8, descale, **kw)
    if res[0] != "ok":
        return
    y = res[1]
    odt = cudattn._spec.dtypes.as_dtype(out_dtype)
    assert y.shape == x8.shape and y.dtype == odt and y.flags.c_contiguous
    xs = x8.view(FP8).astype(np.float32)
    Hx = x8.shape[2] if kw["layout"] == "bshd" else x8.shape[1]
    dh = np.repeat(descale, Hx // descale.shape[1], axis=1)
    dfull = dh[:, None, :, None] if kw["layout"] == "bshd" else dh[:, :, None, None]
    with np.errstate(over="ignore", invalid="ignore"):
        want = (xs * dfull.astype(np.float32)).astype(odt)
    assert np.array_equal(y.astype(np.float64), want.astype(np.float64), equal_nan=True)


@fuzz(150)
@given(st.data())
def test_quantize_and_dequantize_device_arguments(data):
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 4] + ([2**31] if bad(data.draw, rate) else [])))
                  for _ in range(4))
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    kw = dict(layout=arg(data.draw, rate, st.just(layout), LAYOUT_JUNK))
    if data.draw(st.booleans()):
        dtype = data.draw(st.sampled_from([F32, F16, BF16]))
        x = data.draw(device_tensor(shape, dtype, rate))
        if data.draw(st.booleans()):
            kw["per"] = arg(data.draw, rate, st.sampled_from(["tensor", "head"]))
        if data.draw(st.booleans()):
            kw["heads_kv"] = arg(data.draw, rate, st.sampled_from([None, 1, 2]))
        if data.draw(st.booleans()):
            kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
        outcome(cudattn.quantize_fp8, x, **kw)
    else:
        x = data.draw(device_tensor(shape, data.draw(st.sampled_from([FP8, np.uint8])), rate))
        G = data.draw(st.sampled_from([1, 2]))
        descale = data.draw(device_tensor((B, G), F32, rate, may_broadcast=False))
        if bad(data.draw, rate / 2):
            descale = data.draw(st.one_of(JUNK, st.just(np.ones((B, G), F32))))
        kw["out_dtype"] = arg(data.draw, rate, st.sampled_from([np.float32, F16, BF16]), OUT_DTYPE_JUNK)
        outcome(cudattn.dequantize, x, descale, **kw)
