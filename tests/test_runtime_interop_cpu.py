"""The runtime layer's foreign-array protocols without a GPU: the CUDA Array Interface and DLPack
(import, export, capsules, streams). Where a code path would call the driver, the test replaces the
one module-level function that does it (`_protocols._pointer_device`).
"""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

from cudattn._arrays import dlpack as _dlpack
from cudattn._arrays import importer as _importer
from cudattn._arrays import protocols as _protocols
from cudattn._arrays.array import DeviceArray
from cudattn._arrays.importer import as_device_array, is_device_array_like
from _runtime_cases import BF16, FAKE_PTR, FP8


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


def test_cai_export(monkeypatch):
    from cudattn._arrays import array as _array

    monkeypatch.setattr(_array._devices, "is_current", lambda device_id: True)
    a = DeviceArray(FAKE_PTR, (3, 4), np.float16, device_id=0, stream_handle=0x77)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["typestr"] == "<f2"
    assert cai["data"] == (FAKE_PTR, False) and cai["strides"] is None and cai["stream"] == 0x77
    v = a[:, ::2]
    assert v.__cuda_array_interface__["strides"] == (8, 4)
    assert DeviceArray(FAKE_PTR, (3,), FP8, device_id=0).__cuda_array_interface__["typestr"] == "|u1"
    assert DeviceArray(FAKE_PTR, (3,), np.float16, device_id=0, stream_handle=0).__cuda_array_interface__["stream"] == 1
    # a default stream of a device that is not current: the consumer would read it as its own
    # device's, so the host waits for the producer and the export names no stream
    settled = []
    monkeypatch.setattr(_array._devices, "is_current", lambda device_id: False)
    monkeypatch.setattr(_array._transfer, "settle_default_stream", lambda arr: settled.append(arr.device_id))
    other = DeviceArray(FAKE_PTR, (3,), np.float16, device_id=1, stream_handle=0)
    assert other.__cuda_array_interface__["stream"] is None and settled == [1]
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
