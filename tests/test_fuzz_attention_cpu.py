"""Fuzzing the argument checks of `cudattn.attention` (NumPy and device arrays, large logical
shapes, no false refusals) and the wrapping of foreign arrays (CUDA Array Interface, DLPack); CPU
only, the property and the GPU stand-ins are `_fuzz_harness`'s.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import cudattn
from cudattn._arrays import dlpack as _dlpack
from cudattn._arrays import importer as _importer
from cudattn._spec import validate as _validate
from cudattn._arrays.array import DeviceArray
from _fuzz_harness import (
    ANY_FLOAT, BF16, F16, F32, FP8, GOOD_DTYPES, JUNK, LAYOUT_JUNK, OUT_DTYPE_JUNK, RATES, _shapes, arg, bad,
    fuzz, numpy_tensor, outcome,
)
from _fuzz_harness import _no_gpu as _no_gpu  # fixtures
from _fuzz_devices import STREAM_ARG, STREAM_JUNK, FakeCAI, FakeDLPack, _c_strides, _ptrs, cai_dict, device_tensor


# ---------------------------------------------------------------------------------------------
# cudattn.attention
# ---------------------------------------------------------------------------------------------


@st.composite
def problem_sizes(draw, rate, sizes=(0, 1, 1, 2, 3, 5)):
    """(layout, B, Sq, Sk, Hq, Hkv, D, dtype): valid, but for faults drawn with probability ``rate``."""
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    B, Sq, Sk = (draw(st.sampled_from(sizes)) for _ in range(3))
    Hkv = draw(st.sampled_from([1, 1, 2, 3]))
    Hq = Hkv * draw(st.sampled_from([1, 1, 2, 4]))
    if bad(draw, rate):
        Hq = draw(st.sampled_from([0, Hkv + 1, 2 * Hkv + 1]))
    dtype = draw(st.sampled_from(GOOD_DTYPES))
    D = draw(st.sampled_from([16, 32, 64, 128, 256] if dtype == FP8 else [8, 16, 40, 64, 72, 128, 256]))
    if bad(draw, rate):
        D = draw(st.sampled_from([0, 4, 12, 24, 264, 512]))
    return layout, B, Sq, Sk, Hq, Hkv, D, dtype


@st.composite
def descale_arg(draw, host: bool, B: int, Hkv: int, rate):
    """q/k/v_descale: None, a float, or a float32 (B, Hkv) array (NumPy for NumPy calls, else a device
    array); with probability ``rate`` anything else (non-finite, huge, wrong shape or dtype, junk)."""
    kind = "junk" if bad(draw, rate) else draw(st.sampled_from(["none", "scalar", "array"]))
    if kind == "none":
        return None
    if kind == "scalar":
        return draw(st.floats(1e-3, 1e3) | st.integers(1, 9))
    if kind == "array":
        if host:
            value = np.float32(draw(st.floats(1e-3, 1e3)))
            if B * Hkv > 1 << 20:  # huge logical shapes: a (B, Hkv) array would be gigabytes, and checking
                return float(value)  # its values (finite, > 0) reads them all, so a scalar stands in
            return np.full((B, Hkv), value, F32)
        return DeviceArray(draw(_ptrs), (B, Hkv), F32, device_id=0)
    kind = draw(st.sampled_from(["scalar", "array", "junk"]))
    if kind == "scalar":
        return draw(ANY_FLOAT)
    if kind == "junk":
        return draw(JUNK)
    shape = draw(st.sampled_from([(B, Hkv), (B, Hkv), (B + 1, Hkv), (B, Hkv + 1), (Hkv,), (), (1, B, Hkv)]))
    dtype = np.dtype(draw(st.sampled_from([F32, F32, np.float64, np.float16, np.int32, object, BF16])))
    if host == (draw(st.integers(0, 9)) > 0) and math.prod(shape) < 10**6:  # (mostly) NumPy for NumPy calls
        value = draw(st.sampled_from([1.0, 0.5, 0.0, -1.0, 1e-30, 1e300, math.nan, math.inf, 3e38, 1e-45]))
        if dtype == object:
            return np.full(shape, value, object)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.full(shape, value).astype(dtype)
    return DeviceArray(draw(_ptrs), shape, dtype, draw(st.sampled_from([None, (0,) * len(shape)])), device_id=0)


@st.composite
def attention_kwargs(draw, host: bool, sizes, rate):
    """Keyword arguments of one attention call: valid for these sizes unless a fault is drawn."""
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    fp8 = dtype == FP8
    kw = {"layout": arg(draw, rate, st.just(layout), LAYOUT_JUNK)}
    for name in ("causal", "return_lse"):
        if draw(st.booleans()):
            kw[name] = arg(draw, rate, st.sampled_from([True, False, np.bool_(True)]))
    if draw(st.booleans()):
        kw["scale"] = arg(draw, rate, st.one_of(st.none(), st.floats(-100, 100), st.integers(-3, 3)))
    if draw(st.booleans()):
        kw["num_splits"] = arg(draw, rate, st.just(None) if fp8 else st.one_of(st.none(), st.integers(1, 128)),
                               st.one_of(st.integers(-2, 200), JUNK))
    if draw(st.booleans()):
        valid = st.sampled_from([None, BF16, F16, F32, "bfloat16", "fp16", np.float32]) if fp8 else st.sampled_from(
            [None, dtype, dtype.name])
        kw["out_dtype"] = arg(draw, rate, valid, st.one_of(OUT_DTYPE_JUNK, st.sampled_from([F16, BF16, F32])))
    for name in ("q_descale", "k_descale", "v_descale"):
        if fp8 and draw(st.booleans()) or bad(draw, rate / 3):
            kw[name] = draw(descale_arg(host, B, Hkv, rate if fp8 else 1.0))
    return kw


@fuzz(400)
@given(st.data())
def test_attention_numpy_arguments(data):
    """cudattn.attention with NumPy arrays (small: the NumPy path copies strided input to be
    contiguous before its checks)."""
    rate = data.draw(RATES, label="rate")
    sizes = data.draw(problem_sizes(rate))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(numpy_tensor(s, dtype, rate), label=n) for n, s in (("q", qs), ("k", ks), ("v", ks)))
    kw = data.draw(attention_kwargs(True, sizes, rate), label="kwargs")
    if data.draw(st.booleans()):
        odt = np.dtype(_validate.resolve_out_dtype(None, dtype))
        out_dt = data.draw(st.sampled_from([F16, BF16, F32, FP8])) if bad(data.draw, rate) else odt
        kw["out"] = (data.draw(numpy_tensor(qs, out_dt, rate)) if kw.get("out_dtype") is None
                     else None)
        if bad(data.draw, rate / 2):
            kw["out"] = data.draw(st.one_of(JUNK, st.just(DeviceArray(16 << 20, qs, F16, device_id=0))))
    if bad(data.draw, rate / 3):  # one of q, k, v not a NumPy array at all
        args = [q, k, v]
        args[data.draw(st.integers(0, 2))] = data.draw(st.one_of(JUNK, st.just(DeviceArray(16 << 20, qs, F16,
                                                                                            device_id=0))))
        q, k, v = args
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome(cudattn.attention, q, k, v, **kw)


@fuzz(200)
@given(st.data())
def test_validate_large_shapes(data):
    """The validation layer (what the NumPy path calls) on broadcast NumPy views of large logical
    shapes (no memory behind them): 32-bit sizes, 2**62-element spans."""
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    big = st.sampled_from([1, 2, 2**16, 2**31 - 1, 2**31, 2**32 + 1, 2**40])
    B, Sq, Sk, Hkv = (data.draw(big) for _ in range(4))
    Hq = Hkv * data.draw(st.sampled_from([1, 2]))
    dtype = data.draw(st.sampled_from(GOOD_DTYPES))
    D = data.draw(st.sampled_from([16, 64, 256]))
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    try:
        q, k = (np.broadcast_to(np.ones((1, 1, 1, D), dtype), s) for s in (qs, ks))
    except ValueError:  # beyond NumPy's own limits (its sizes are signed 64-bit)
        return
    kw = data.draw(attention_kwargs(True, (layout, B, Sq, Sk, Hq, Hkv, D, dtype), 0.05))
    res = outcome(_validate.validate, q, k, k, host=True, **kw)
    if res[0] == "ok":
        p = res[1]
        assert max(p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv) < 2**31


@fuzz(400)
@given(st.data())
def test_attention_device_arguments(data):
    """cudattn.attention with device arrays: DeviceArrays, CAI objects and DLPack producers, some
    malformed; every scalar argument and `out` and `stream` fuzzed too."""
    rate = data.draw(RATES, label="rate")
    sizes = data.draw(problem_sizes(rate))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    if bad(data.draw, max(rate, 0.1)):  # large but cheap: nothing is allocated
        B, Sq, Sk = (data.draw(st.sampled_from([1, 2**20, 2**31 - 1, 2**31, 2**33])) for _ in range(3))
        sizes = (layout, B, Sq, Sk, Hq, Hkv, D, dtype)
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(device_tensor(s, dtype, rate), label=n) for n, s in (("q", qs), ("k", ks), ("v", ks)))
    kw = data.draw(attention_kwargs(False, sizes, rate), label="kwargs")
    if data.draw(st.booleans()):
        odt = np.dtype(_validate.resolve_out_dtype(None, dtype))
        if kw.get("out_dtype") is None:
            kw["out"] = data.draw(device_tensor(qs, odt, rate, may_broadcast=False))
        if bad(data.draw, rate / 2):
            kw["out"] = data.draw(st.one_of(JUNK, st.just(np.zeros((1, 2, 2, 8), F16)),
                                            st.just(DeviceArray(16 << 20, qs, odt, device_id=0, readonly=True))))
    if data.draw(st.booleans()):
        kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
    if bad(data.draw, rate / 3):
        args = [q, k, v]
        args[data.draw(st.integers(0, 2))] = data.draw(st.one_of(JUNK, st.just(np.zeros((1, 2, 2, 8), F16))))
        q, k, v = args
    outcome(cudattn.attention, q, k, v, **kw)


@fuzz(150)
@given(st.data())
def test_valid_device_calls_reach_the_gpu(data):
    """No false refusals: every valid combination (sizes including 0 and 1, both layouts, GQA,
    every dtype, strided, transposed and broadcast inputs, descales, out) reaches the GPU."""
    sizes = data.draw(problem_sizes(0.0, sizes=(0, 1, 2, 7, 300)))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(device_tensor(s, dtype, 0.0)) for s in (qs, ks, ks))
    kw = data.draw(attention_kwargs(False, sizes, 0.0))
    if data.draw(st.booleans()):
        odt = cudattn._spec.dtypes.resolve_out_dtype(kw.get("out_dtype"), dtype)
        kw["out"] = data.draw(device_tensor(qs, odt, 0.0, may_broadcast=False))
    kw["stream"] = data.draw(STREAM_ARG)
    res = outcome(cudattn.attention, q, k, v, **kw)
    # The stand-ins share one fake address, so a drawn out overlaps the inputs: refused, by rule.
    assert res[0] == "gpu" or ("out" in kw and res[0] is ValueError and "out overlaps" in str(res[1])), res


@fuzz(100)
@given(st.data())
def test_valid_numpy_calls_reach_the_gpu(data):
    """No false refusals on the NumPy path: any strides (the NumPy path copies them to the device)."""
    sizes = data.draw(problem_sizes(0.0, sizes=(0, 1, 2, 7)))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(numpy_tensor(s, dtype, 0.0)) for s in (qs, ks, ks))
    kw = data.draw(attention_kwargs(True, sizes, 0.0))
    if data.draw(st.booleans()):
        kw["out"] = np.empty(qs, cudattn._spec.dtypes.resolve_out_dtype(kw.get("out_dtype"), dtype))
    res = outcome(cudattn.attention, q, k, v, **kw)
    assert res[0] == "gpu", res


# ---------------------------------------------------------------------------------------------
# Foreign arrays: CUDA Array Interface and DLPack
# ---------------------------------------------------------------------------------------------


@fuzz(400)
@given(st.data())
def test_as_device_array_cai(data):
    """Wrapping a CAI object (device_id_of, then as_device_array, as the API does): a documented
    error naming the argument, or a DeviceArray that describes a real view (non-negative int sizes,
    strides of the right length, a 64-bit pointer, a numeric dtype)."""
    shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**40]), max_size=4).map(tuple))
    obj = FakeCAI(data.draw(cai_dict(shape, "<f2", 2, 0.8)))
    handle = data.draw(st.sampled_from([None, 0, 1, 0x5EED]))
    res = outcome(_importer.device_id_of, obj, name="x")
    if res[0] != "ok":
        assert res[1].startswith("x: "), res
        return
    res = outcome(_importer.as_device_array, obj, name="x", stream_handle=handle)
    if res[0] == "ok":
        a = res[1]
        assert all(type(n) is int and n >= 0 for n in a.shape)
        assert len(a.strides) == len(a.shape) and all(type(s) is int for s in a.strides)
        assert 0 <= a.ptr < 2**64 and a.dtype.kind in "biufc"
    else:
        assert res[1].startswith("x: "), res


@fuzz(150)
@given(st.data())
def test_as_device_array_dlpack(data):
    """DLPack producers: capsules of any exportable dtype, shape and strides; junk devices and capsules."""
    dtype = data.draw(st.sampled_from(list(_dlpack._EXPORT)))
    shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 5]), max_size=4).map(tuple))
    strides = tuple(s * data.draw(st.sampled_from([1, -1, 0, 2])) for s in _c_strides(shape, dtype.itemsize))
    arr = DeviceArray(data.draw(_ptrs), shape, dtype, strides, device_id=0)
    obj = data.draw(st.one_of(
        st.just(FakeDLPack((2, 0), arr)),
        st.builds(FakeDLPack, st.sampled_from([(2, 0), (13, 0), (1, 0), (2, 3), (2,), None, (2, "0"), "x"]),
                  st.just(arr)),
        st.builds(FakeDLPack, st.just((2, 0)), st.none(), st.sampled_from([None, 3, "capsule"])),
        st.just(FakeDLPack((2, 0), refuse=True)),
    ))
    res = outcome(_importer.device_id_of, obj, name="x")
    if res[0] == "ok":
        res = outcome(_importer.as_device_array, obj, name="x")
    if res[0] == "ok":
        a = res[1]
        expect = np.dtype(np.uint8) if dtype == FP8 else dtype  # FP8 crosses DLPack as uint8
        assert (a.ptr, a.shape, a.strides, a.dtype) == (arr.ptr, arr.shape, arr.strides, expect)
    else:
        assert res[1].startswith("x: "), res
