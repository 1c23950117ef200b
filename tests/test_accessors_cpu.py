"""The importer's fast readers without a GPU: torch tensors and CuPy arrays read through their own
accessors (stand-in packages in ``sys.modules``), and JAX arrays recognised after a first import.
Each reader must take what it can describe exactly and hand everything else to the general path."""

from __future__ import annotations

import gc
import sys
import types

import numpy as np
import pytest

from cudattn._arrays import accessors as _acc
from cudattn._arrays import importer as _importer
from cudattn._arrays import known_jax as _known
from cudattn._arrays.array import DeviceArray
from _runtime_cases import BF16, FP8

F16 = np.dtype(np.float16)
STREAM = 0x7000


class _Dtype:
    def __init__(self, name):
        self.name = name


def _fake_torch(monkeypatch):
    torch = types.ModuleType("torch")
    for name in ("float16", "bfloat16", "float32", "int32", "float8_e4m3fn", "float64"):
        setattr(torch, name, _Dtype(name))

    class Tensor:
        def __init__(self, ptr, shape, strides, dtype, device=0, neg=False, is_cuda=True):
            self.ptr, self.shape, self.strides, self.dtype, self.device, self.neg = ptr, shape, strides, dtype, device, neg
            self.is_cuda = is_cuda and device >= 0

        def stride(self):
            if self.strides is None:
                raise RuntimeError("sparse tensors do not have strides")
            return self.strides

        def get_device(self):
            return self.device

        def data_ptr(self):
            return self.ptr

        def is_neg(self):
            return self.neg

    Tensor.__module__ = "torch"

    class Parameter(Tensor):
        pass

    class Subclass(Tensor):
        pass

    Parameter.__module__ = Subclass.__module__ = "torch.nn.parameter"

    torch.Tensor, torch.nn, torch.Subclass = Tensor, types.SimpleNamespace(Parameter=Parameter), Subclass
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: STREAM + d)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_acc, "_torch_dtypes", None)
    monkeypatch.setattr(_acc, "_torch_plain", set())
    monkeypatch.setattr(_acc, "_torch_layouts", {})
    monkeypatch.setattr(_importer, "_torch_stream", None)
    return torch


def test_a_torch_tensor_is_read_through_its_accessors(monkeypatch):
    torch = _fake_torch(monkeypatch)
    t = torch.Tensor(0x10000, (2, 3, 4), (12, 4, 1), torch.bfloat16, device=1)
    a = _importer.adapt(t, "q", -1)
    assert type(a) is DeviceArray and a.owner is t and not a.readonly
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device_id) == (0x10000, (2, 3, 4), (24, 8, 2), BF16, 1)
    assert a.stream_handle == STREAM + 1  # torch's current stream on the tensor's device
    p = _importer.adapt(torch.nn.Parameter(0x20000, (4,), (1,), torch.float8_e4m3fn), "k", -1)
    assert p.dtype == FP8 and p.strides == (1,), "FP8 keeps its dtype (DLPack would hand over uint8)"
    # a call's later operand of the same type and device takes the stream found for the first
    b = _importer.adapt(torch.Tensor(0x30000, (2, 3, 4), (12, 4, 1), torch.bfloat16, device=1), "k", -1,
                        (torch.Tensor, 1, 0x99))
    assert b.stream_handle == 0x99


def test_a_changed_tensor_is_read_again_not_taken_from_the_layout_table(monkeypatch):
    """The table maps a layout, never an object: a tensor whose metadata changed in place (resize_,
    set_, .data =) is described by what it reads now."""
    torch = _fake_torch(monkeypatch)
    t = torch.Tensor(0x10000, (2, 3), (3, 1), torch.float16)
    assert _importer.adapt(t, "q", -1).strides == (6, 2)
    t.ptr, t.shape, t.strides = 0x40000, (3, 2), (1, 3)
    a = _importer.adapt(t, "q", -1)
    assert (a.ptr, a.shape, a.strides) == (0x40000, (3, 2), (2, 6))
    t.dtype = torch.float32
    assert _importer.adapt(t, "q", -1).strides == (4, 12)


def test_what_the_torch_reader_leaves_goes_to_the_general_path(monkeypatch):
    torch = _fake_torch(monkeypatch)
    assert _acc.from_torch(torch.Tensor(0x10000, (2,), (1,), torch.float16, device=-1)) is None  # CPU
    # another backend's device (xpu:0, mps:0: get_device() is its index) is no CUDA address
    assert _acc.from_torch(torch.Tensor(0x10000, (2,), (1,), torch.float16, device=0, is_cuda=False)) is None
    assert _acc.from_torch(torch.Tensor(0x10000, (2,), None, torch.float16)) is None  # no strides
    assert _acc.from_torch(torch.Tensor(0x10000, (2,), (1,), torch.float64)) is None  # a dtype cudattn does not read
    assert _acc.from_torch(torch.Subclass(0x10000, (2,), (1,), torch.float16)) is None  # may not own data_ptr
    with pytest.raises(TypeError, match="q is a negated torch view"):
        _importer.adapt(torch.Tensor(0x10000, (2,), (1,), torch.float16, neg=True), "q", -1)


def test_negated_views_are_named_whatever_path_would_take_them(monkeypatch):
    """The reader hands a negated view back (None) and the importer names it: plain tensors,
    subclasses and CPU tensors alike; a torch object that is no tensor goes on to the general
    importer, which names what it is."""
    torch = _fake_torch(monkeypatch)
    neg = torch.Tensor(0x10000, (2,), (1,), torch.float16, neg=True)
    assert _acc.from_torch(neg) is None
    for x in (neg, torch.Subclass(0x10000, (2,), (1,), torch.float16, neg=True),
              torch.Tensor(0x10000, (2,), (1,), torch.float16, device=-1, neg=True)):
        with pytest.raises(TypeError, match="k is a negated torch view.*k.resolve_neg"):
            _importer.adapt(x, "k", -1)

    class Size(tuple):
        pass

    Size.__module__ = "torch"
    with pytest.raises(TypeError, match="k: expected .* got Size"):
        _importer.adapt(Size((2, 3)), "k", -1)


def _fake_cupy(monkeypatch):
    cupy = types.ModuleType("cupy")

    class ndarray:
        def __init__(self, ptr, shape, strides, dtype, device=0):
            self.data = types.SimpleNamespace(ptr=ptr, device_id=device)
            self.shape, self.strides, self.dtype = shape, strides, np.dtype(dtype)

    ndarray.__module__ = "cupy._core.core"
    cupy.ndarray = ndarray
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda d: types.SimpleNamespace(ptr=STREAM + 10 + d))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_acc, "_cupy_types", ())
    monkeypatch.setattr(_acc, "_cupy_layouts", {})
    return cupy


def test_a_cupy_array_is_read_through_its_accessors(monkeypatch):
    cupy = _fake_cupy(monkeypatch)
    x = cupy.ndarray(0x50000, (4, 2), (2, 8), np.float16, device=1)  # byte strides, transposed
    a = _importer.adapt(x, "q", -1)
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device_id) == (0x50000, (4, 2), (2, 8), F16, 1)
    assert a.owner is x and a.stream_handle == STREAM + 11
    x.shape, x.strides = (8,), (2,)  # an in-place reshape: read again
    assert _importer.adapt(x, "q", -1).shape == (8,)
    assert _acc.from_cupy(cupy.ndarray(0x50000, (2,), (1,), np.bool_)) is None  # the general path names it


class _JaxArray:
    """A stand-in jax.Array: one buffer, handed over as a capsule (refused once deleted)."""

    def __init__(self, ptr):
        self.ptr, self.exports = ptr, []

    def __dlpack__(self, stream=None):
        if self.ptr is None:
            raise RuntimeError("Array has been deleted")
        if stream == 0xBAD:
            raise RuntimeError("CUDA_ERROR_INVALID_HANDLE")
        self.exports.append(stream)
        return ("capsule", self.ptr, stream)

    def is_deleted(self):
        return self.ptr is None


def _imported(ptr, device=0):
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly = ptr, (2, 4), (8, 2), F16, device, True
    a.owner, a.stream_handle = None, None
    return a


def test_a_jax_array_imported_before_is_recalled_with_a_fresh_capsule_for_the_call():
    """The facts come from the first import; every call still asks for a capsule with its stream
    (JAX orders its pending writes before that stream, and the capsule held with the operands
    keeps JAX from freeing or donating the buffer while the call's kernels read it)."""
    x = _JaxArray(0x60000)
    _known.remember(x, _imported(0x60000, device=1))
    for stream in (STREAM, STREAM + 1):
        a = _known.recall(x, stream, stream + 5, "q")
        assert (a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly) == (0x60000, (2, 4), (8, 2), F16, 1, True)
        assert a.stream_handle == stream and a.owner == (x, ("capsule", 0x60000, stream + 5))
    assert x.exports == [STREAM + 5, STREAM + 6]
    assert _known.device_of(x) == 1
    y = _JaxArray(0x60000)
    _known._seen[id(y)] = _known._seen[id(x)]  # an entry whose reference is another object's
    assert _known.recall(y, STREAM, STREAM, "q") is None and _known.device_of(y) is None
    del _known._seen[id(y)]


def test_a_deleted_jax_array_is_refused_by_name_and_a_collected_one_forgotten():
    x = _JaxArray(0x70000)
    _known.remember(x, _imported(0x70000))
    with pytest.raises(ValueError, match=r"^v: the JAX array refused its DLPack export for stream 0xbad: CUDA_ERROR"):
        _known.recall(x, STREAM, 0xBAD, "v")  # a refusal for another reason says JAX's
    x.ptr = None  # deleted (or donated): the capsule is refused, and the call says which operand
    with pytest.raises(ValueError, match=r"^k: the JAX array has been deleted or donated \(Array has been deleted\)"):
        _known.recall(x, STREAM, STREAM, "k")
    y = _JaxArray(0x80000)
    _known.remember(y, _imported(0x80000))
    key = id(y)
    del y
    gc.collect()
    assert key not in _known._seen, "an entry must not outlive its array"
