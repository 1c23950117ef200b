"""GPU: cudattn.quantize_fp8 / cudattn.dequantize on device arrays give the host's bits exactly.

Quantization (the e4m3 bytes and the float32 descales) and dequantization are compared bit for bit
with the NumPy path (tests/test_quantize_cpu.py checks that one against the rule): random inputs
including large and tiny magnitudes, odd sizes, both layouts, per tensor and per head, head
groups, strided and misaligned views (the kernels' scalar path), every e4m3 code, and the
stream contract (asynchronous on the given stream, no host sync). Outputs are poisoned first.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import threading

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._runtime.errors import check

pytestmark = pytest.mark.gpu

F16, BF16, F32 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
_seed = itertools.count(7100)


def _needs_sm89():
    cc = _device.device_properties(0).compute_capability
    if cc < (8, 9):
        pytest.skip(f"device quantization needs sm_89+, this GPU is sm_{cc[0]}{cc[1]}")


def _rand(shape, dtype, scale=1.0):
    rng = np.random.default_rng(next(_seed))
    x = rng.standard_normal(shape) * scale
    # Spread magnitudes over many binades so that rounding ties, subnormals and the largest values show.
    x *= np.exp2(rng.integers(-8, 9, size=shape))
    if dtype == F16:
        x = np.clip(x, -65504, 65504)
    return x.astype(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _check_quantize(x_host, x_dev, **kw):
    q_h, d_h = cudattn.quantize_fp8(x_host, **kw)
    q_d, d_d = cudattn.quantize_fp8(x_dev, **kw)
    assert isinstance(q_d, cudattn.DeviceArray) and isinstance(d_d, cudattn.DeviceArray)
    assert q_d.dtype == FP8 and q_d.is_c_contiguous and d_d.dtype == F32
    q_d, d_d = cudattn.to_host(q_d), cudattn.to_host(d_d)
    assert _same_bits(d_d, d_h), f"descales differ: device {d_d.ravel()[:8]} host {d_h.ravel()[:8]}"
    if not _same_bits(q_d, q_h):
        bad = np.flatnonzero(q_d.view(np.uint8) != q_h.view(np.uint8))
        raise AssertionError(f"{bad.size} e4m3 bytes differ, first at flat index {bad[0]}: device "
                             f"{q_d.ravel()[bad[0]]} host {q_h.ravel()[bad[0]]}")
    return q_h, d_h


SHAPES = [(2, 113, 3, 72), (1, 1, 1, 8), (3, 17, 8, 128), (1, 64, 4, 5), (2, 33, 6, 1), (1, 1000, 2, 64)]


@pytest.mark.parametrize("dtype", [F16, BF16, F32])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("per", ["tensor", "head"])
def test_quantize_matches_host(dtype, shape, layout, per):
    _needs_sm89()
    x = _rand(shape, dtype, scale=3.0)
    if layout == "bhsd":
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    _check_quantize(x, cudattn.to_device(x), per=per, layout=layout)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("per", ["tensor", "head"])
@pytest.mark.parametrize("H,G", [(6, 2), (6, 3), (8, 1), (3, 3)])
def test_quantize_heads_kv(layout, per, H, G):
    _needs_sm89()
    shape = (2, 113, H, 72) if layout == "bshd" else (2, H, 113, 72)
    x = _rand(shape, BF16)
    q, d = _check_quantize(x, cudattn.to_device(x), per=per, layout=layout, heads_kv=G)
    assert d.shape == (2, G)


@pytest.mark.parametrize("dtype,scale", [(F32, 1e30), (F32, 1e-30), (F32, 1e-41), (F16, 3e4), (BF16, 1e35)])
def test_quantize_large_and_tiny(dtype, scale):
    _needs_sm89()
    x = _rand((2, 37, 4, 64), dtype, scale=scale)
    if dtype == F32:
        x = np.clip(x, -3e38, 3e38).astype(F32)
    _check_quantize(x, cudattn.to_device(x), per="head")
    _check_quantize(x, cudattn.to_device(x), per="tensor")


def test_quantize_zero_groups():
    _needs_sm89()
    x = _rand((2, 9, 4, 16), F16)
    x[:, :, 1] = 0
    x[1] = 0
    q, d = _check_quantize(x, cudattn.to_device(x), per="head")
    assert d[0, 1] == 1 and np.all(d[1] == 1)


def test_quantize_strided_views():
    """Non-contiguous device views (sliced heads and sequence) and a head-dim window that starts off
    the 4-element alignment: the scalar path of the kernels."""
    _needs_sm89()
    big = _rand((2, 40, 8, 80), F16)
    d_big = cudattn.to_device(big)
    for sl in [np.s_[:, ::3, 1::2, :], np.s_[:, 5:30, :, 8:72], np.s_[:, :, 2:7, 1:73], np.s_[:, ::-1, :, 4:68]]:
        x_host = np.ascontiguousarray(big[sl])
        view = d_big[sl]
        for per in ("tensor", "head"):
            _check_quantize(x_host, view, per=per)
    # bhsd as a transposed view of a bshd buffer: inner rows then run along the sequence.
    x_t = d_big.transpose(0, 2, 1, 3)
    _check_quantize(np.ascontiguousarray(big.transpose(0, 2, 1, 3)), x_t, per="head", layout="bhsd", heads_kv=2)


def test_quantize_outputs_overwrite_poison():
    """Every output byte is written: run over memory the pool just handed back full of NaN."""
    _needs_sm89()
    shape = (2, 113, 3, 72)
    junk = _array.empty(shape, FP8)
    junk.fill_nan()
    junk_d = _array.empty((2, 3), F32)
    junk_d.fill_nan()
    del junk, junk_d
    x = _rand(shape, F32)
    q, d = cudattn.quantize_fp8(cudattn.to_device(x), per="head")
    q_h, d_h = cudattn.quantize_fp8(x, per="head")
    assert _same_bits(cudattn.to_host(q), q_h) and _same_bits(cudattn.to_host(d), d_h)


# ---------------------------------------------------------------------------- dequantize


def _check_dequantize(q_host, d_host, q_dev, d_dev, **kw):
    y_h = cudattn.dequantize(q_host, d_host, **kw)
    y_d = cudattn.dequantize(q_dev, d_dev, **kw)
    assert isinstance(y_d, cudattn.DeviceArray) and y_d.is_c_contiguous
    y_d = cudattn.to_host(y_d)
    assert y_d.dtype == y_h.dtype and y_d.shape == y_h.shape
    f_h, f_d = y_h.astype(np.float32), y_d.astype(np.float32)
    nan = np.isnan(f_h)
    assert np.array_equal(nan, np.isnan(f_d)), "NaN in different places"
    u = f"u{y_h.itemsize}"  # NaN payloads may differ; every other value must match bit for bit
    assert np.array_equal(y_h.view(u)[~nan], y_d.view(u)[~nan])
    return y_h


@pytest.mark.parametrize("out_dtype", [F32, F16, BF16])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("G", [None, 1, 3])
def test_dequantize_matches_host(out_dtype, layout, G):
    shape = (2, 113, 6, 72) if layout == "bshd" else (2, 6, 113, 72)
    x = _rand(shape, F32, scale=10.0)
    q, d = cudattn.quantize_fp8(x, per="head", layout=layout, heads_kv=G)  # host
    _check_dequantize(q, d, cudattn.to_device(q), cudattn.to_device(d), layout=layout, out_dtype=out_dtype)


@pytest.mark.parametrize("out_dtype", [F32, F16, BF16])
def test_dequantize_every_code(out_dtype):
    codes = np.arange(256, dtype=np.uint8).reshape(1, 4, 2, 32).view(FP8)
    d = np.array([[1.0, 3.5e4]], np.float32)  # the second overflows float16 for the largest codes
    _check_dequantize(codes, d, cudattn.to_device(codes), cudattn.to_device(d), out_dtype=out_dtype)
    # uint8 bits (as FP8 crosses DLPack / CAI) read the same
    raw = codes.view(np.uint8)
    _check_dequantize(raw, d, cudattn.to_device(raw), cudattn.to_device(d), out_dtype=out_dtype)


def test_dequantize_strided():
    x = _rand((2, 50, 4, 80), F32)
    q, d = cudattn.quantize_fp8(x, per="head")  # d: (2, 4)
    q_dev = cudattn.to_device(q)
    d_dev = cudattn.to_device(np.ascontiguousarray(d.T)).transpose(1, 0)  # a non-contiguous (2, 4) view
    for sl in [np.s_[:, ::2, :, :], np.s_[:, :, :, 3:70], np.s_[:, 7:9, :, :], np.s_[:, ::-3, :, 8:40]]:
        _check_dequantize(np.ascontiguousarray(q[sl]), d, q_dev[sl], d_dev)
    # Three heads sharing one descale column.
    d1 = np.ascontiguousarray(d[:, :1])
    sl = np.s_[:, :, 1:4, :]
    _check_dequantize(np.ascontiguousarray(q[sl]), d1, q_dev[sl], cudattn.to_device(d1))


def test_roundtrip_on_device():
    _needs_sm89()
    x = _rand((2, 113, 3, 72), BF16)
    q, d = cudattn.quantize_fp8(cudattn.to_device(x), per="head")
    y = cudattn.to_host(cudattn.dequantize(q, d, out_dtype=BF16))
    q_h, d_h = cudattn.quantize_fp8(x, per="head")
    assert _same_bits(y, cudattn.dequantize(q_h, d_h, out_dtype=BF16))


# ---------------------------------------------------------------------------- streams


def test_runs_on_the_given_stream_without_host_sync():
    """The stream is held closed by a wait on host memory: quantize/dequantize must return while
    their work cannot run (a host sync would hang; checked from a thread with a timeout)."""
    _needs_sm89()
    dev = _device.get_device(0)
    s = dev.create_stream()
    h = int(s.handle)
    x = _rand((2, 113, 3, 72), F16)
    xd = cudattn.to_device(x, stream=s)
    cudattn.quantize_fp8(xd, per="head", stream=s)  # warm-up: compile and load outside the gate
    cudattn.dequantize(*cudattn.quantize_fp8(xd, stream=s), stream=s)
    check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")

    flag = check(driver.cuMemHostAlloc(4, driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE),
                 "cuMemHostAlloc")
    try:
        ctypes.c_uint32.from_address(int(flag)).value = 0
        dptr = check(driver.cuMemHostGetDevicePointer(flag, 0), "cuMemHostGetDevicePointer")
        err, = driver.cuStreamWaitValue32(h, dptr, 1, int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))
        if err != driver.CUresult.CUDA_SUCCESS:
            pytest.skip(f"cuStreamWaitValue32 unsupported here ({err})")
        result = {}

        def call():
            q, d = cudattn.quantize_fp8(xd, per="head", stream=s)
            result["q"], result["d"] = q, d
            result["y"] = cudattn.dequantize(q, d, out_dtype=F32, stream=s)

        t = threading.Thread(target=call)
        t.start()
        t.join(timeout=60)
        blocked = t.is_alive()
        pending = driver.cuStreamQuery(h)[0]
        ctypes.c_uint32.from_address(int(flag)).value = 1  # open the gate
        t.join()
        assert not blocked, "quantize_fp8/dequantize waited for the stream (host sync)"
        assert pending == driver.CUresult.CUDA_ERROR_NOT_READY
        for k in ("q", "d", "y"):
            assert result[k].stream_handle == h
        check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")
        q_h, d_h = cudattn.quantize_fp8(x, per="head")
        assert _same_bits(cudattn.to_host(result["q"], stream=s), q_h)
        assert _same_bits(cudattn.to_host(result["d"], stream=s), d_h)
        assert _same_bits(cudattn.to_host(result["y"], stream=s), cudattn.dequantize(q_h, d_h))
    finally:
        ctypes.c_uint32.from_address(int(flag)).value = 1
        check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")
        result = None
        gc.collect()
        check(driver.cuMemFreeHost(flag), "cuMemFreeHost")


def test_int_stream_handle_and_default_stream():
    _needs_sm89()
    x = _rand((1, 64, 2, 64), F32)
    q_h, d_h = cudattn.quantize_fp8(x)
    q, d = cudattn.quantize_fp8(cudattn.to_device(x))  # cudattn's stream
    assert _same_bits(cudattn.to_host(q), q_h) and _same_bits(cudattn.to_host(d), d_h)
    s = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    try:
        hs = int(s)
        q, d = cudattn.quantize_fp8(cudattn.to_device(x, stream=hs), stream=hs)
        assert q.stream_handle == hs
        assert _same_bits(cudattn.to_host(q), q_h) and _same_bits(cudattn.to_host(d), d_h)
        del q, d
        gc.collect()
    finally:
        check(driver.cuStreamSynchronize(s), "cuStreamSynchronize")
        check(driver.cuStreamDestroy(s), "cuStreamDestroy")
