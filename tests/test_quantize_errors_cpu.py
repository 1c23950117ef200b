"""The argument checks of cudattn.quantize_fp8 / cudattn.dequantize, on the host (NumPy) and on
the device (the CUDA calls stubbed out: no allocation or launch happens before the checks).
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn._arrays import array as _array
from cudattn._calls import call as _callpath
from cudattn._runtime import device as _device
from cudattn._runtime import stream as _stream
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from _quantize_cases import BF16, F16, F32, F64, FP8


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
