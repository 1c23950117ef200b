"""Runtime layer tests that need no GPU: errors, stream adaptation, views, CAI, DLPack, copy logic.

Where a code path would call the driver, the test replaces the one module-level
function or module that does it (`_protocols._pointer_device`, `_transfer.driver`, ...):
"device memory" is then host memory, which exercises the same bookkeeping.
"""

from __future__ import annotations

import ctypes
import gc
import pickle
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._arrays import array as _array
from cudattn._arrays import dlpack as _dlpack
from cudattn._arrays import importer as _importer
from cudattn._arrays import protocols as _protocols
from cudattn._runtime import launch as _launch
from cudattn._runtime import stream as _stream
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from cudattn._arrays.importer import as_device_array, is_device_array_like
from cudattn._runtime.errors import CudaError, check

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FAKE_PTR = 0x7F00_0000_1000


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


# ---------------------------------------------------------------------------- CUDA Array Interface


class FakeCAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


@pytest.fixture
def no_driver_device_lookup(monkeypatch):
    """Wrap CAI arrays without a driver: their pointer's device is taken to be 0."""
    monkeypatch.setattr(_protocols, "_pointer_device", lambda ptr: 0)


def test_cai_import_fields(no_driver_device_lookup):
    obj = FakeCAI(version=3, shape=(3, 5), typestr="<f2", data=(FAKE_PTR, False), strides=None, stream=None)
    a = as_device_array(obj)
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device_id) == (FAKE_PTR, (3, 5), (10, 2), np.float16, 0)
    assert a.owner is obj and not a.readonly
    obj = FakeCAI(version=2, shape=(4, 2), typestr="<f4", data=(FAKE_PTR, True), strides=(4, 16))
    a = as_device_array(obj)
    assert a.strides == (4, 16) and a.dtype == np.float32 and a.readonly and not a.is_c_contiguous


def test_cai_import_errors_name_the_argument(no_driver_device_lookup):
    bf = FakeCAI(version=3, shape=(2,), typestr="<V2", data=(FAKE_PTR, False), strides=None)
    with pytest.raises(TypeError, match=r"^q: .*DLPack"):
        as_device_array(bf, name="q")
    masked = FakeCAI(version=3, shape=(2,), typestr="<f2", data=(FAKE_PTR, False), mask=object())
    with pytest.raises(TypeError, match="^k: "):
        as_device_array(masked, name="k")
    with pytest.raises(TypeError, match="^v: "):
        as_device_array(FakeCAI(version=3, shape=(2,)), name="v")


def test_cai_stream_is_waited_on(no_driver_device_lookup, monkeypatch):
    waits = []
    monkeypatch.setattr(_protocols, "stream_wait", lambda consumer, producer: waits.append((consumer, producer)))
    monkeypatch.setattr(_protocols, "get_device", lambda device_id=None: None)
    obj = FakeCAI(version=3, shape=(2,), typestr="<f2", data=(FAKE_PTR, False), stream=0x99)
    as_device_array(obj)  # no consumer stream: nothing to order
    a = as_device_array(obj, stream_handle=0x42)
    assert waits == [(0x42, 0x99)] and a.stream_handle == 0x42
    as_device_array(obj, stream_handle=0x99)  # same stream: no event
    assert waits == [(0x42, 0x99)]


def test_cai_export():
    a = DeviceArray(FAKE_PTR, (3, 4), np.float16, device_id=0, stream_handle=0x77)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["typestr"] == "<f2"
    assert cai["data"] == (FAKE_PTR, False) and cai["strides"] is None and cai["stream"] == 0x77
    v = a[:, ::2]
    assert v.__cuda_array_interface__["strides"] == (8, 4)
    assert DeviceArray(FAKE_PTR, (3,), FP8, device_id=0).__cuda_array_interface__["typestr"] == "|u1"
    assert DeviceArray(FAKE_PTR, (3,), np.float16, device_id=0, stream_handle=0).__cuda_array_interface__["stream"] == 1
    b = DeviceArray(FAKE_PTR, (3,), BF16, device_id=0)
    assert not hasattr(b, "__cuda_array_interface__")  # consumers fall back to DLPack
    with pytest.raises(AttributeError, match="DLPack"):
        b.__cuda_array_interface__


def test_is_device_array_like():
    assert is_device_array_like(DeviceArray(FAKE_PTR, (1,), np.float16, device_id=0))
    assert is_device_array_like(FakeCAI(version=3, shape=(1,), typestr="<f2", data=(FAKE_PTR, False)))
    assert not is_device_array_like(np.zeros(3, np.float16))
    assert not is_device_array_like(np.float16(1))
    assert not is_device_array_like([1, 2])
    assert not is_device_array_like(CPUDLPack())
    assert not is_device_array_like(None)


def test_numpy_and_host_dlpack_rejected_with_argument_name():
    with pytest.raises(TypeError, match="^q: .*host"):
        as_device_array(np.zeros(3), name="q")
    with pytest.raises(TypeError, match="^k: .*CPU"):
        as_device_array(CPUDLPack(), name="k")
    with pytest.raises(TypeError, match="^v: "):
        as_device_array("nope", name="v")


def test_device_id_of_and_stream_of(no_driver_device_lookup):
    a = DeviceArray(FAKE_PTR, (1,), np.float16, device_id=5, stream_handle=9)
    assert _importer.device_id_of(a) == 5 and _importer.stream_of(a) == 9
    assert _importer.device_id_of(Producer(DeviceArray(FAKE_PTR, (1,), np.float16, device_id=2))) == 2
    assert _importer.device_id_of(FakeCAI(version=3, shape=(1,), typestr="<f2", data=(FAKE_PTR, False))) == 0


# ---------------------------------------------------------------------------- DLPack


class CPUDLPack:
    def __dlpack__(self, stream=None, max_version=None):
        raise AssertionError("must not be called")

    def __dlpack_device__(self):
        return (1, 0)


class Producer:
    """A foreign DLPack producer that hands out a DeviceArray's capsule."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = []

    def __dlpack__(self, stream=None, max_version=None):
        self.calls.append((stream, max_version))
        return self.arr.__dlpack__(stream=-1)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def _read_capsule(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return _dlpack.DLManagedTensor.from_address(get(capsule, b"dltensor"))


@pytest.mark.parametrize(
    "dtype, code_bits", [(np.float16, (2, 16)), (BF16, (4, 16)), (FP8, (1, 8)), (np.float32, (2, 32))]
)
def test_dlpack_export_fields_and_refcount(dtype, code_bits):
    owner = object()
    a = DeviceArray(FAKE_PTR, (4, 6, 8), dtype, device_id=1, owner=owner)
    v = a[1:, ::-2, 3]  # strided, negative stride, offset pointer
    before = sys.getrefcount(v)
    live = _dlpack.live_exports()
    assert v.__dlpack_device__() == (2, 1)
    cap = v.__dlpack__(stream=-1)
    assert sys.getrefcount(v) == before + 1  # the capsule keeps the array alive
    t = _read_capsule(cap).dl_tensor
    assert t.data == v.ptr and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (2, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (*code_bits, 1)
    item = np.dtype(dtype).itemsize
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [3, 3]
    assert [t.strides[i] for i in range(2)] == [s // item for s in v.strides]  # elements, not bytes
    del t, cap  # an unconsumed capsule's destructor runs the deleter
    gc.collect()
    assert sys.getrefcount(v) == before
    assert _dlpack.live_exports() == live


def test_dlpack_export_arguments():
    a = DeviceArray(FAKE_PTR, (2,), np.float16, device_id=0)
    with pytest.raises(BufferError):
        a.__dlpack__(stream=-1, dl_device=(1, 0))
    with pytest.raises(BufferError):
        a.__dlpack__(stream=-1, copy=True)
    with pytest.raises(TypeError):
        a.__dlpack__(stream="s")
    cap = a.__dlpack__(stream=-1, max_version=(1, 0), dl_device=(2, 0), copy=False)
    assert "dltensor" in repr(cap)


def test_dlpack_round_trip_consumes_and_releases():
    owner = object()
    src = DeviceArray(FAKE_PTR, (3, 5, 7), BF16, device_id=2, owner=owner)[:, 1:4]
    prod = Producer(src)
    before = sys.getrefcount(src)
    live = _dlpack.live_exports()
    b = as_device_array(prod, stream_handle=None, name="q")
    assert prod.calls == [(None, (1, 0))]
    assert (b.ptr, b.shape, b.strides, b.dtype, b.device_id) == (src.ptr, src.shape, src.strides, BF16, 2)
    assert sys.getrefcount(src) == before + 1 and _dlpack.live_exports() == live + 1
    del b  # the importer calls the producer's deleter exactly once
    gc.collect()
    assert sys.getrefcount(src) == before and _dlpack.live_exports() == live


def test_dlpack_consumer_stream_argument():
    src = DeviceArray(FAKE_PTR, (3,), np.float16, device_id=0)
    prod = Producer(src)
    as_device_array(prod, stream_handle=0)  # legacy default stream goes out as 1 (0 is ambiguous in DLPack)
    as_device_array(prod, stream_handle=0x1234)
    assert [c[0] for c in prod.calls] == [1, 0x1234]


def test_dlpack_import_versioned_capsule_from_c():
    """A producer written in C: DLManagedTensorVersioned with byte_offset, read-only flag and a C deleter."""
    deleted = []
    keep = {}

    @_dlpack.DELETER
    def deleter(addr):
        deleted.append(addr)

    mt = _dlpack.DLManagedTensorVersioned()
    shape = (ctypes.c_int64 * 2)(4, 3)
    mt.version.major, mt.version.minor = 1, 1
    mt.flags = _dlpack.DLPACK_FLAG_BITMASK_READ_ONLY
    mt.deleter = deleter
    t = mt.dl_tensor
    t.data = FAKE_PTR
    t.byte_offset = 64
    t.device.device_type, t.device.device_id = 2, 0
    t.ndim = 2
    t.dtype.code, t.dtype.bits, t.dtype.lanes = 10, 8, 1  # kDLFloat8_e4m3fn
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # compact row-major
    keep["mt"], keep["shape"] = mt, shape
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"dltensor_versioned")
    cap = new(ctypes.addressof(mt), name, None)

    class VersionedProducer:
        def __dlpack__(self, stream=None, max_version=None):
            return cap

        def __dlpack_device__(self):
            return (2, 0)

    a = as_device_array(VersionedProducer())
    assert (a.ptr, a.shape, a.strides, a.dtype, a.readonly) == (FAKE_PTR + 64, (4, 3), (3, 1), FP8, True)
    assert "used_dltensor_versioned" in repr(cap)
    assert deleted == []
    del a
    gc.collect()
    assert deleted == [ctypes.addressof(mt)]
    del cap
    gc.collect()
    assert len(deleted) == 1  # the consumed capsule's destructor does not delete again


def test_dlpack_import_rejects_used_capsule():
    a = DeviceArray(FAKE_PTR, (2,), np.float16, device_id=0)
    cap = a.__dlpack__(stream=-1)
    _dlpack.from_capsule(cap)
    with pytest.raises(TypeError):
        _dlpack.from_capsule(cap)


# ---------------------------------------------------------------------------- copies and memset, on a fake driver


class HostDriver:
    """Just enough of cuda.bindings.driver, with "device memory" that is host memory."""

    CUevent_flags = driver.CUevent_flags
    CUpointer_attribute = driver.CUpointer_attribute
    CU_MEMHOSTALLOC_PORTABLE = driver.CU_MEMHOSTALLOC_PORTABLE

    def __init__(self):
        self.pinned = []
        self.calls = []

    def _ok(self, name, *values):
        self.calls.append(name)
        return (0, *values)

    def cuMemHostAlloc(self, size, flags):
        buf = ctypes.create_string_buffer(size)
        self.pinned.append(buf)
        return self._ok("cuMemHostAlloc", ctypes.addressof(buf))

    def cuEventCreate(self, flags):
        return self._ok("cuEventCreate", object())

    def cuEventRecord(self, ev, stream):
        return self._ok("cuEventRecord")

    def cuEventSynchronize(self, ev):
        return self._ok("cuEventSynchronize")

    def cuStreamSynchronize(self, stream):
        return self._ok("cuStreamSynchronize")

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return self._ok("cuMemcpyHtoDAsync")

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return self._ok("cuMemcpyDtoHAsync")

    def _memset(self, width, dst, value, n):
        np.ctypeslib.as_array((ctypes.c_uint8 * (n * width)).from_address(dst)).view(f"u{width}")[:] = value

    def cuMemsetD8Async(self, dst, value, n, stream):
        self._memset(1, dst, value, n)
        return self._ok("cuMemsetD8Async")

    def cuMemsetD16Async(self, dst, value, n, stream):
        self._memset(2, dst, value, n)
        return self._ok("cuMemsetD16Async")

    def cuMemsetD32Async(self, dst, value, n, stream):
        self._memset(4, dst, value, n)
        return self._ok("cuMemsetD32Async")


@pytest.fixture
def host_driver(monkeypatch):
    fake = HostDriver()
    monkeypatch.setattr(_transfer, "driver", fake)
    monkeypatch.setattr(_transfer, "get_device", lambda device=None: types.SimpleNamespace(device_id=0))
    monkeypatch.setattr(_transfer, "_staging", {})
    monkeypatch.setattr(_transfer, "_staging_enabled", True)
    keep = []

    def fake_empty(shape, dtype, *, device=None, stream=None):
        host = np.empty(shape, dtype)
        keep.append(host)
        return DeviceArray(host.ctypes.data, host.shape, host.dtype, device_id=0, owner=host, stream_handle=7)

    monkeypatch.setattr(_host_io, "empty", fake_empty)
    return fake


def _on_fake_device(x: np.ndarray) -> DeviceArray:
    return DeviceArray(x.ctypes.data, x.shape, x.dtype, x.strides, device_id=0, owner=x, stream_handle=7)


@pytest.mark.parametrize("staged", [False, True])
def test_to_device_to_host_round_trip_logic(host_driver, monkeypatch, staged):
    if staged:  # tiny chunks so that every copy takes several, through both staging buffers
        monkeypatch.setattr(_transfer, "STAGING_CHUNK", 64)
        monkeypatch.setattr(_transfer, "STAGING_MIN", 0)
    else:
        monkeypatch.setattr(_transfer, "STAGING_MIN", 1 << 40)
    rng = np.random.default_rng(0)
    for dtype in (np.float16, BF16, FP8):
        for shape in [(1,), (113,), (3, 41, 5), (2, 1, 203)]:
            x = rng.standard_normal(shape).astype(dtype)
            d = _host_io.to_device(x)
            assert d.ptr != x.ctypes.data
            y = _host_io.to_host(d)
            assert y.dtype == x.dtype and y.shape == x.shape
            assert np.array_equal(y.view(np.uint8), x.view(np.uint8))
    assert ("cuMemHostAlloc" in host_driver.calls) == staged


@pytest.mark.parametrize("staged", [False, True])
def test_to_host_strided_views(host_driver, monkeypatch, staged):
    if staged:
        monkeypatch.setattr(_transfer, "STAGING_CHUNK", 48)
        monkeypatch.setattr(_transfer, "STAGING_MIN", 0)
    x = np.arange(4 * 7 * 9, dtype=np.float32).reshape(4, 7, 9).astype(BF16)
    d = _on_fake_device(x)
    for key in [(slice(None), slice(None, None, 2)), (Ellipsis, slice(None, None, -1)), (1, slice(2, 5), 3),
                (slice(None, None, -2), 0)]:
        got = _host_io.to_host(d[key])
        assert got.flags.c_contiguous
        assert np.array_equal(got.view(np.uint16), x[key].view(np.uint16)), key
    assert np.array_equal(_host_io.to_host(d.T).view(np.uint16), x.T.view(np.uint16))
    assert _host_io.to_host(d[:, 3:3]).shape == (4, 0, 9)


def test_memset_and_fill_nan(host_driver):
    for dtype, width in [(np.float16, 2), (BF16, 2), (np.float32, 4), (FP8, 1)]:
        x = np.ones((3, 5), dtype)
        d = _on_fake_device(x)
        d.fill_nan()
        assert np.all(np.isnan(x.astype(np.float32)))
        assert np.all(x.view(f"u{width}") == _array.nan_pattern(dtype))
    x = np.ones((4, 6), np.float16)
    _on_fake_device(x).T.memset(0x3C00 + 0x400)  # dense in another axis order: 2.0 everywhere
    assert np.all(x == 2.0)
    _on_fake_device(x).memset(0)
    assert np.all(x == 0)
    with pytest.raises(ValueError, match="dense"):
        _on_fake_device(x)[:, ::2].memset(0)
    with pytest.raises(ValueError):
        _on_fake_device(x).memset(1 << 16)
    with pytest.raises(TypeError):
        _on_fake_device(np.ones(3, np.float64)).fill_nan()


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
