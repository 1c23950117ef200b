"""Operands from other runtimes, and the streams their packages call current.

:func:`adapt` turns a device array of any runtime into a :class:`~cudattn._array.DeviceArray`
through cuda.core's ``StridedMemoryView`` (DLPack, CUDA Array Interface, and a fast path for torch
tensors that reads their metadata without Python calls: about 1 us an array). What it cannot take
(FP8 tensors that cross DLPack as uint8, malformed producers that deserve a precise message) goes
through `_array.as_device_array`.

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

import sys

from ._array import DeviceArray, _c_strides, as_device_array

__all__ = ["OTHER", "TORCH", "CUPY", "CUDATTN", "adapt", "kind_of", "current_stream", "current_stream_owner"]

CUDATTN, TORCH, CUPY, OTHER = 0, 1, 2, 3
_kinds: dict[type, int] = {DeviceArray: CUDATTN}
_SMV = None
_CU_STREAM_LEGACY = 1


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
        torch = sys.modules["torch"]
        try:
            return torch._C._cuda_getCurrentRawStream(device_id)  # the handle, without a Stream object
        except AttributeError:
            return torch.cuda.current_stream(device_id).cuda_stream
    if kind == CUPY:
        return current_stream_owner(kind, device_id).ptr
    return None


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
    SMV = _SMV or _smv_type()
    try:
        if kind == OTHER:  # the producer orders its work before `consumer` (DLPack) or cuda.core does (CAI)
            view = SMV.from_any_interface(obj, consumer if consumer else _CU_STREAM_LEGACY)
            producer = consumer
        else:  # torch / CuPy: ordered after their current stream by the caller, as their users expect
            view = SMV.from_any_interface(obj, -1)
            producer = None
        dtype = view.dtype
        dev = view.device_id
        if dev < 0 or dtype is None or dtype.kind == "u":  # host memory, or FP8 that crossed as uint8
            raise TypeError
    except Exception:
        return as_device_array(obj, name=name, stream_handle=consumer)
    if producer is None:
        producer = current_stream(kind, dev)
    item = dtype.itemsize
    shape = view.shape
    st = view.strides
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id = view.ptr, shape, dtype, dev
    a.strides = _c_strides(shape, item) if st is None else tuple([s * item for s in st])
    a.owner, a.stream_handle, a.readonly = view, producer, view.readonly
    return a
