"""Runtime layer tests that need no GPU: errors, no CUDA call at import, stream adaptation,
DeviceArray views, dtype tables, launch argument checks. The foreign-array protocols are in
test_runtime_interop_cpu.py, the copy logic in test_runtime_copies_cpu.py.
"""

from __future__ import annotations

import ctypes
import pickle
import subprocess
import sys

import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._arrays import array as _array
from cudattn._arrays import dlpack as _dlpack
from cudattn._runtime import launch as _launch
from cudattn._runtime import stream as _stream
from cudattn._arrays.array import DeviceArray
from cudattn._runtime.errors import CudaError, check
from _runtime_cases import BF16, FAKE_PTR, FP8


# ---------------------------------------------------------------------------- errors


def test_check_returns_values():
    assert check((driver.CUresult.CUDA_SUCCESS,), "cuX") is None
    assert check((driver.CUresult.CUDA_SUCCESS, 5), "cuX") == 5
    assert check((driver.CUresult.CUDA_SUCCESS, 1, 2), "cuX") == (1, 2)
    assert check(driver.CUresult.CUDA_SUCCESS, "cuX") is None


def test_check_raises_with_driver_name_and_call():
    with pytest.raises(CudaError) as info:
        check((driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAllocAsync(1 GiB)")
    e = info.value
    assert isinstance(e, RuntimeError)
    assert e.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert e.code == 2
    assert "cuMemAllocAsync(1 GiB)" in str(e) and "CUDA_ERROR_OUT_OF_MEMORY" in str(e)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.name, e2.code, str(e2)) == (e.name, e.code, str(e))


def test_cudattn_exports_the_same_error_class():
    import cudattn

    assert cudattn.CudaError is CudaError


# ---------------------------------------------------------------------------- no CUDA at import


def test_import_makes_no_cuda_call():
    """Every driver entry point is replaced by a bomb before the runtime modules are imported."""
    code = """
import cuda.bindings.driver as d
def bomb(*a, **k):
    raise SystemExit("CUDA call at import time")
for n in dir(d):
    if n.startswith("cu") and callable(getattr(d, n)):
        setattr(d, n, bomb)
import cudattn._runtime.errors, cudattn._runtime.device, cudattn._runtime.stream, cudattn._arrays.dlpack, cudattn._arrays.array, cudattn._runtime.launch
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ---------------------------------------------------------------------------- streams


class ProtocolStream:
    def __init__(self, handle, version=0):
        self.h, self.v = handle, version

    def __cuda_stream__(self):
        return (self.v, self.h)


class TorchLikeStream:  # torch.cuda.Stream exposes an int .cuda_stream
    def __init__(self, handle):
        self.cuda_stream = handle


def test_as_stream_int_handles():
    for h in (0, 1, 2, 0xDEADBEEF):
        ref = _stream.as_stream(h, 0)
        assert ref.handle == h and ref.obj is None
    assert _stream.as_stream(np.int64(77), 0).handle == 77


def test_as_stream_protocols_keep_the_object():
    p = ProtocolStream(0x1234)
    ref = _stream.as_stream(p, 0)
    assert ref.handle == 0x1234 and ref.obj is p
    t = TorchLikeStream(0x5678)
    ref = _stream.as_stream(t, 0)
    assert ref.handle == 0x5678 and ref.obj is t
    assert _stream.as_stream(ref, 0) is ref


@pytest.mark.parametrize("bad", ["stream", 1.5, True, [1], object()])
def test_as_stream_rejects_with_type_error_naming_stream(bad):
    with pytest.raises(TypeError, match="stream"):
        _stream.as_stream(bad, 0)


def test_as_stream_rejects_bad_values():
    with pytest.raises(ValueError, match="stream"):
        _stream.as_stream(-5, 0)
    with pytest.raises(TypeError, match="protocol version"):
        _stream.as_stream(ProtocolStream(1, version=3), 0)
    with pytest.raises(TypeError, match="stream"):
        _stream.as_stream(TorchLikeStream("x"), 0)


# ---------------------------------------------------------------------------- DeviceArray views


def test_device_array_basics():
    a = DeviceArray(FAKE_PTR, (4, 6, 8), BF16, device_id=3)
    assert a.shape == (4, 6, 8) and a.strides == (96, 16, 2)
    assert (a.ndim, a.size, a.nbytes, a.itemsize, a.device_id) == (3, 192, 384, 2, 3)
    assert a.is_c_contiguous and len(a) == 4
    assert not DeviceArray(FAKE_PTR, (4, 6), np.float16, (2, 8), device_id=0).is_c_contiguous
    with pytest.raises(ValueError):
        DeviceArray(FAKE_PTR, (4, 6), np.float16, (2,), device_id=0)


def test_indexing_matches_numpy_layout():
    host = np.empty((5, 7, 9), np.float16)
    a = DeviceArray(FAKE_PTR, host.shape, host.dtype, device_id=0)
    for key in [(1,), (slice(1, None), slice(None, None, -2), 3), (Ellipsis, 2), (None, 0, Ellipsis), (2, 3, 4),
                (slice(None), slice(7, 7))]:
        want = host[key if Ellipsis in key else key + (Ellipsis,)]  # a view even for all-int keys
        got = a[key]
        assert got.shape == want.shape, key
        if want.size:
            assert got.strides == want.strides, key
            assert got.ptr - FAKE_PTR == want.__array_interface__["data"][0] - host.ctypes.data, key
    with pytest.raises(TypeError):
        a[[0, 1]]
    t = a.T
    assert t.shape == (9, 7, 5) and t.strides == (2, 18, 126)
    assert a.transpose(1, 0, 2).strides == (18, 126, 2)
    assert a.view(np.uint16).dtype == np.uint16
    with pytest.raises(ValueError):
        a.view(np.float32)


# ---------------------------------------------------------------------------- dtype tables


def test_dlpack_dtype_tables():
    assert _dlpack.dlpack_dtype(np.float16) == (2, 16)
    assert _dlpack.dlpack_dtype(BF16) == (4, 16)
    assert _dlpack.dlpack_dtype(FP8) == (1, 8)  # FP8 crosses DLPack as uint8 (DESIGN §2)
    assert _dlpack.dlpack_dtype(np.float32) == (2, 32)
    assert _dlpack.numpy_dtype(2, 16) == np.float16
    assert _dlpack.numpy_dtype(4, 16) == BF16
    assert _dlpack.numpy_dtype(10, 8) == FP8  # kDLFloat8_e4m3fn, as PyTorch sends it
    assert _dlpack.numpy_dtype(1, 8) == np.uint8
    with pytest.raises(TypeError):
        _dlpack.numpy_dtype(2, 16, lanes=2)
    with pytest.raises(BufferError):
        _dlpack.dlpack_dtype(np.dtype("U3"))


def test_nan_patterns():
    assert _array.nan_pattern(np.float16) == 0x7E00
    assert _array.nan_pattern(BF16) == 0x7FC0
    assert _array.nan_pattern(np.float32) == 0x7FC00000
    for dt in (np.float16, BF16, np.float32, FP8):
        bits = np.array([_array.nan_pattern(dt)], dtype=f"u{np.dtype(dt).itemsize}")
        assert np.isnan(bits.view(dt).astype(np.float32))[0]


# ---------------------------------------------------------------------------- launch argument checks


class Params(ctypes.Structure):
    _fields_ = [("out", ctypes.c_void_p), ("n", ctypes.c_int32), ("val", ctypes.c_float)]


def _stub_kernel():
    k = _launch.LoadedKernel(driver.CUfunction(0), None, "fill", 0, "key", None, None)
    k.smem_limit = 48 * 1024
    return k


@pytest.mark.parametrize("grid", [(0, 1, 1), (1, 65536, 1), (1, 1, 65536), (1 << 31, 1, 1), (-1, 1, 1)])
def test_launch_rejects_grids_out_of_range(grid):
    with pytest.raises(ValueError, match="grid"):
        _launch.launch(_stub_kernel(), grid, (128, 1, 1), 0, 0, Params())


def test_launch_rejects_shared_memory_not_unlocked():
    with pytest.raises(ValueError, match="dynamic_smem"):
        _launch.launch(_stub_kernel(), (1, 1, 1), (128, 1, 1), 100 * 1024, 0, Params())
