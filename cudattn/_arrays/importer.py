"""The importer of foreign arrays: every operand from another runtime becomes a DeviceArray here, with the
stream its package calls current. (`protocols` reads DLPack and CAI field by field for it.)

:func:`adapt` turns a torch tensor or CuPy array into a :class:`~cudattn._arrays.array.DeviceArray`
through cuda.core's ``StridedMemoryView`` (its torch fast path, DLPack, CUDA Array Interface):
0.9 us for the view and its reads on an H100 host, where torch's own accessors take 1.7 us for
the same facts. A torch FP8 tensor (the view sees uint8) is read through torch's accessors,
keeping its dtype; a negated torch view (its bytes hold -x, which the view would hand over as x)
is refused. JAX arrays take the view's DLPack import too, with the call's stream as the consumer
(JAX orders its pending writes before it). What none of these takes goes through
`protocols.as_device_array`, as do arrays of every other producer (Numba, any DLPack or CAI
object): that importer validates each field of a foreign producer and names what is wrong, where
cuda.core 1.2, handed a malformed DLPack capsule by a fuzzed producer, returned without raising
and left the interpreter's error state inconsistent (a SystemError at the next call, not an
error the caller could catch).

Streams follow nvmath-python's rule (docs/DESIGN.md, "Streams"): each operand's
``stream_handle`` is the stream its package knows it by: torch's or CuPy's current stream for
their arrays, the producing stream for a cudattn DeviceArray. The caller orders the call after
those streams (`_runtime.stream.stream_wait`). Other DLPack producers (JAX, ...) are asked to order
their own work before the consumer stream, and their arrays are kept alive until the call's
work is done, since their owners do not know that stream.

Nothing here imports torch or CuPy: their modules are found in ``sys.modules`` once an array of
theirs arrives.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from .array import DeviceArray
from .._spec.dtypes import BFLOAT16, FLOAT8_E4M3, FLOAT16
from .protocols import as_device_array, device_id_of, is_device_array_like, stream_of
from .._spec.geometry import c_strides as _c_strides
from .._runtime.stream import CU_STREAM_LEGACY

__all__ = ["OTHER", "TORCH", "CUPY", "CUDATTN", "JAX", "adapt", "as_device_array", "current_stream",
           "current_stream_owner", "device_id_of", "is_device_array_like", "kind_of", "stream_of"]

# JAX and other producers (kinds >= JAX) know no consumer stream: they order their work before it
# through DLPack's handshake, and the call holds their arrays until its work is done.
CUDATTN, TORCH, CUPY, JAX, OTHER = 0, 1, 2, 3, 4
_kinds: dict[type, int] = {DeviceArray: CUDATTN}
_SMV = None
_torch_stream = None  # torch's current-stream getter, bound when a torch tensor first arrives


def kind_of(obj) -> int:
    t = type(obj)
    k = _kinds.get(t)
    if k is None:
        top = t.__module__.partition(".")[0]
        k = _kinds[t] = TORCH if top == "torch" else CUPY if top == "cupy" else \
            JAX if top in ("jax", "jaxlib") else OTHER
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
        try:  # by device id: no switch of the current device (two runtime calls) per operand
            return cupy.cuda.get_current_stream(device_id)
        except TypeError:  # a CuPy whose get_current_stream takes no device id
            with cupy.cuda.Device(device_id):
                return cupy.cuda.get_current_stream()
    return None


def _smv_type():
    global _SMV
    from cuda.core.utils import StridedMemoryView

    _SMV = StridedMemoryView
    return _SMV


def adapt(obj, name: str, consumer: int, current: tuple | None = None) -> DeviceArray:
    """``obj`` as a DeviceArray whose ``stream_handle`` is its producer's stream (see the module
    docstring); ``consumer`` is the stream the call will read it on. ``current``: ``(type, device
    id, stream handle)`` of an operand of the same call already adapted, whose package's current
    stream serves the later operands of its type and device (not asked again for each)."""
    kind = _kinds.get(type(obj))
    if kind is None:
        kind = kind_of(obj)
    if kind == CUDATTN:
        return obj
    if kind == OTHER:  # any other producer: cudattn's validating importer (see the module docstring)
        return as_device_array(obj, name=name, stream_handle=consumer)
    if kind == TORCH and obj.is_neg():  # the view would hand over the bytes, which hold -x
        raise TypeError(f"{name} is a negated torch view (torch._neg_view): its memory holds the negated "
                        f"values; pass {name}.resolve_neg()")
    if kind == TORCH and (_torch_dtypes is not None or _torch_dtype_table()) and obj.dtype is _torch_fp8:
        a = _from_torch(obj, current)  # FP8 crosses DLPack as uint8: straight to the accessors (no failed export)
        if a is not None:
            return a
    # torch / CuPy: ordered after their current stream by the caller, as their users expect; JAX
    # orders its pending writes before the consumer stream itself (DLPack's handshake)
    sync = (CU_STREAM_LEGACY if consumer == 0 else consumer) if kind == JAX else -1
    try:
        view = (_SMV or _smv_type()).from_any_interface(obj, sync)
        dtype = view.dtype
        dev = view.device_id
        if dev < 0 or dtype is None or dtype.kind == "u":  # host memory, or FP8 that crossed as uint8
            raise TypeError
    except Exception:
        if kind == JAX:  # what the view cannot take (host arrays, FP8): the importer takes it or says why
            return as_device_array(obj, name=name, stream_handle=consumer)
        if kind == TORCH:
            a = _from_torch(obj, current)  # FP8 keeps its dtype
            if a is not None:
                return a
        a = as_device_array(obj, name=name, stream_handle=None)  # no ordering: the caller orders the call
        a.stream_handle = _current(kind, obj, a.device_id, current)  # after the package's current stream
        return a
    a = object.__new__(DeviceArray)
    shape = view.shape
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = view.ptr, shape, dtype, dev, view, view.readonly
    st = view.strides
    a.strides = _contiguous(shape, dtype.itemsize) if st is None else _byte_strides(st, dtype.itemsize)
    if current is not None and current[0] is type(obj) and current[1] == dev:  # `_current`, inline
        a.stream_handle = current[2]
    else:
        a.stream_handle = (_torch_stream or _torch_stream_getter())(dev) if kind == TORCH else \
            consumer if kind == JAX else current_stream(kind, dev)
    return a


def _current(kind: int, obj, dev: int, current: tuple | None) -> int | None:
    """The current stream of ``obj``'s package on ``dev``: ``current``'s when it is of the same type
    and device (see `adapt`), else asked of the package."""
    if current is not None and current[0] is type(obj) and current[1] == dev:
        return current[2]
    return (_torch_stream or _torch_stream_getter())(dev) if kind == TORCH else current_stream(kind, dev)


# C-contiguous byte strides, memoised: operands of a signature repeat their shapes.
_contiguous = functools.lru_cache(maxsize=1024)(_c_strides)


@functools.lru_cache(maxsize=1024)
def _byte_strides(strides: tuple, itemsize: int) -> tuple:
    return tuple([s * itemsize for s in strides])


_torch_dtypes: dict | None = None  # torch dtype -> NumPy dtype, for the dtypes cudattn reads
_torch_plain: set = set()  # torch.Tensor and Parameter, once torch is seen
_torch_fp8 = object()  # torch.float8_e4m3fn once torch is seen (`adapt`'s one identity test for it)


def _torch_dtype_table() -> dict:
    global _torch_dtypes, _torch_fp8
    torch = sys.modules["torch"]
    table = {torch.float16: FLOAT16, torch.bfloat16: BFLOAT16, torch.float32: np.dtype(np.float32),
             torch.int32: np.dtype(np.int32)}
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        table[fp8] = FLOAT8_E4M3
        _torch_fp8 = fp8
    _torch_plain.update((torch.Tensor, torch.nn.Parameter))
    _torch_dtypes = table
    return table


def _from_torch(t, current: tuple | None = None) -> DeviceArray | None:
    """A CUDA torch tensor the view could not take as it is (FP8, which crosses DLPack as uint8),
    strided, of a dtype in the table, read through its accessors; None for anything else (CPU,
    sparse, subclasses, other dtypes): `_importer`'s importer then takes it or names the problem.
    ``current``: as in `adapt` (torch's current stream, asked once a call)."""
    table = _torch_dtypes or _torch_dtype_table()
    if type(t) not in _torch_plain:  # subclasses (DTensor, fake tensors) may not own what data_ptr says
        return None
    dtype = table.get(t.dtype)
    if dtype is None or not t.is_cuda or t.is_neg():
        return None
    dev = t.get_device()
    try:
        strides = t.stride()
    except RuntimeError:  # sparse and other layouts without strides
        return None
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = t.data_ptr(), tuple(t.shape), dtype, dev, t, False
    a.strides = _byte_strides(strides, dtype.itemsize)
    a.stream_handle = _current(TORCH, t, dev, current)
    return a
