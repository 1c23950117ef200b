"""Operands from other runtimes, and the streams their packages call current.

:func:`adapt` turns a torch tensor or CuPy array into a :class:`~cudattn._array.DeviceArray`
through cuda.core's ``StridedMemoryView`` (its torch fast path, DLPack, CUDA Array Interface):
about 1.8 us an array with its attribute reads, measured on an H100 host. What the view cannot
take (FP8 tensors that cross DLPack as uint8) goes through `_foreign.as_device_array`, as do
arrays of every other producer (JAX, Numba, any DLPack or CAI object): that importer validates
each field of a foreign producer and names what is wrong, where cuda.core 1.2, handed a malformed
DLPack capsule by a fuzzed producer, returned without raising and left the interpreter's error
state inconsistent (a SystemError at the next call, not an error the caller could catch).

Streams follow nvmath-python's rule (docs/DESIGN.md, "Streams"): each operand's
``stream_handle`` is the stream its package knows it by: torch's or CuPy's current stream for
their arrays, the producing stream for a cudattn DeviceArray. The caller orders the call after
those streams (`_stream.stream_wait`). Other DLPack producers (JAX, ...) are asked to order
their own work before the consumer stream, and their arrays are kept alive until the call's
work is done, since their owners do not know that stream.

Nothing here imports torch or CuPy: their modules are found in ``sys.modules`` once an array of
theirs arrives.
"""

from __future__ import annotations

import functools
import sys

from ._array import DeviceArray
from ._foreign import as_device_array
from ._geometry import c_strides as _c_strides

__all__ = ["OTHER", "TORCH", "CUPY", "CUDATTN", "adapt", "kind_of", "current_stream", "current_stream_owner"]

CUDATTN, TORCH, CUPY, OTHER = 0, 1, 2, 3
_kinds: dict[type, int] = {DeviceArray: CUDATTN}
_SMV = None
_torch_stream = None  # torch's current-stream getter, bound when a torch tensor first arrives


def kind_of(obj) -> int:
    t = type(obj)
    k = _kinds.get(t)
    if k is None:
        top = t.__module__.partition(".")[0]
        k = _kinds[t] = TORCH if top == "torch" else CUPY if top == "cupy" else OTHER
    return k


def current_stream(kind: int, device_id: int) -> int | None:
    """The stream handle the package of ``kind`` calls current on ``device_id`` (None: it has none)."""
    if kind == TORCH:
        return (_torch_stream or _torch_stream_getter())(device_id)
    if kind == CUPY:
        return current_stream_owner(kind, device_id).ptr
    return None


def _torch_stream_getter():
    """torch's current stream handle by device, without a Stream object where torch allows."""
    global _torch_stream
    torch = sys.modules["torch"]
    _torch_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _torch_stream


def current_stream_owner(kind: int, device_id: int):
    """What keeps the package's current stream alive: CuPy's Stream object (CuPy destroys a stream
    with its object); torch's streams come from pools that are never destroyed."""
    if kind == CUPY:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device_id):
            return cupy.cuda.get_current_stream()
    return None


def _smv_type():
    global _SMV
    from cuda.core.utils import StridedMemoryView

    _SMV = StridedMemoryView
    return _SMV


def adapt(obj, name: str, consumer: int) -> DeviceArray:
    """``obj`` as a DeviceArray whose ``stream_handle`` is its producer's stream (see the module
    docstring); ``consumer`` is the stream the call will read it on."""
    kind = _kinds.get(type(obj))
    if kind is None:
        kind = kind_of(obj)
    if kind == CUDATTN:
        return obj
    if kind == OTHER:  # any other producer: cudattn's validating importer (see the module docstring)
        return as_device_array(obj, name=name, stream_handle=consumer)
    try:  # torch / CuPy: ordered after their current stream by the caller, as their users expect
        view = (_SMV or _smv_type()).from_any_interface(obj, -1)
        dtype = view.dtype
        dev = view.device_id
        if dev < 0 or dtype is None or dtype.kind == "u":  # host memory, or FP8 that crossed as uint8
            raise TypeError
    except Exception:
        a = as_device_array(obj, name=name, stream_handle=None)  # no ordering: the caller orders the call
        a.stream_handle = current_stream(kind, a.device_id)  # after the package's current stream, as above
        return a
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = view.ptr, view.shape, dtype, dev, view, view.readonly
    st = view.strides
    a.strides = _contiguous(a.shape, dtype.itemsize) if st is None else tuple([s * dtype.itemsize for s in st])
    a.stream_handle = current_stream(kind, dev)
    return a


# C-contiguous byte strides, memoised: operands of a signature repeat their shapes.
_contiguous = functools.lru_cache(maxsize=1024)(_c_strides)
