"""Torch tensors and CuPy arrays read through their own accessors: the importer's first choice for
the two runtimes whose arrays come to cudattn most often.

A plain CUDA tensor or ``cupy.ndarray`` is described by a few attribute reads (address, shape,
strides, dtype, device); the layout they give maps to cudattn's (tuple shape, byte strides, NumPy
dtype) through a table filled as layouts are first seen, so a warm call reads those few facts and
builds nothing else. On an H200 host this took a torch tensor's import from 3.4 us (cuda.core's
``StridedMemoryView`` and the fields read from it) to 1.35 us. Everything these readers do not
take (subclasses, CPU or sparse tensors, dtypes cudattn does not read) returns None, and the
importer's general path takes it or names the problem.

Nothing here imports torch or CuPy: their modules are found in ``sys.modules`` once an array of
theirs has arrived.
"""

from __future__ import annotations

import sys

import numpy as np

from .._spec.dtypes import BFLOAT16, FLOAT8_E4M3, FLOAT16
from .array import DeviceArray

__all__ = ["from_cupy", "from_torch"]

_LAYOUTS_MAX = 4096
# per package: (its dtype, its shape, its strides) -> (shape tuple, byte strides, NumPy dtype)
_torch_layouts: dict = {}
_cupy_layouts: dict = {}

_torch_dtypes: dict | None = None  # torch dtype -> NumPy dtype, for the dtypes cudattn reads
_new = object.__new__  # one global lookup a DeviceArray instead of two
_torch_plain: set = set()  # torch.Tensor and Parameter, once torch is seen (subclasses may not own what data_ptr says)


def _torch_table() -> dict:
    global _torch_dtypes
    torch = sys.modules["torch"]
    table = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: np.dtype(np.float32),
             torch.int32: np.dtype(np.int32)}
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        table[fp8] = FLOAT8_E4M3
    _torch_plain.update((torch.Tensor, torch.nn.Parameter))
    _torch_dtypes = table
    return table


def _remember(layouts: dict, key, shape, byte_strides, dtype) -> tuple:
    if len(layouts) >= _LAYOUTS_MAX:  # many distinct layouts: start over, bounded
        layouts.clear()
    f = layouts[key] = (tuple(shape), tuple(byte_strides), dtype)
    return f


def from_torch(t) -> DeviceArray | None:
    """A plain CUDA tensor of a dtype cudattn reads as a DeviceArray (owner ``t``; its
    ``stream_handle`` is the caller's to set), else None: a negated view (its bytes hold -x) too,
    for the importer to name. One function with no calls of its own on the warm path (a frame is
    a tenth of a tensor's import): seven accessor reads, each a fact a tensor may change in place
    (``resize_``, ``set_``, ``.data =``), so none is remembered per tensor."""
    if type(t) not in _torch_plain:
        if _torch_dtypes is not None:
            return None
        _torch_table()  # the first torch operand: fill the tables, then judge it
        if type(t) not in _torch_plain:
            return None
    try:
        key = (t.dtype, t.shape, t.stride())
    except RuntimeError:  # sparse, nested and other layouts without strides
        return None
    f = _torch_layouts.get(key)
    if f is None:
        dtype = _torch_dtypes.get(key[0])
        if dtype is None:
            return None
        f = _remember(_torch_layouts, key, key[1], [s * dtype.itemsize for s in key[2]], dtype)
    if not t.is_cuda or t.is_neg():  # CPU, meta, other backends' devices (whose get_device() may be >= 0)
        return None
    a = _new(DeviceArray)
    a.ptr, (a.shape, a.strides, a.dtype), a.device_id, a.owner, a.readonly = t.data_ptr(), f, t.get_device(), t, False
    return a


_cupy_types: tuple = ()
_CUPY_KINDS = "fi"  # what else a CuPy array may hold takes the general path (which names it)


def from_cupy(x) -> DeviceArray | None:
    """A ``cupy.ndarray`` (exactly that type) of a float or int dtype as a DeviceArray (owner ``x``;
    its ``stream_handle`` is the caller's to set), else None."""
    global _cupy_types
    if not _cupy_types:
        _cupy_types = (getattr(sys.modules["cupy"], "ndarray", None),)
    if type(x) is not _cupy_types[0]:
        return None
    dtype = x.dtype
    shape = x.shape
    st = x.strides  # bytes already
    f = _cupy_layouts.get((dtype, shape, st))
    if f is None:
        if dtype.kind not in _CUPY_KINDS:
            return None
        f = _remember(_cupy_layouts, (dtype, shape, st), shape, st, dtype)
    mem = x.data
    a = _new(DeviceArray)
    dev = mem.device_id
    a.ptr, (a.shape, a.strides, a.dtype), a.device_id, a.owner, a.readonly = mem.ptr, f, dev, x, False
    return a
