"""The importer of foreign arrays: every operand from another runtime becomes a DeviceArray here, with the
stream its package calls current. (`protocols` reads DLPack and CAI field by field for it.)

:func:`adapt` turns a plain CUDA torch tensor or ``cupy.ndarray`` into a
:class:`~cudattn._arrays.array.DeviceArray` through its package's own accessors (`accessors`:
a few attribute reads, the layout mapped through a table); a negated torch view (its bytes hold
-x) is refused by name. Other torch and CuPy arrays (subclasses, dtypes the accessors leave) and
JAX arrays go through cuda.core's ``StridedMemoryView`` (DLPack, CUDA Array Interface); JAX's
import names the call's stream as the consumer, and JAX orders its pending writes before it. An
array JAX has handed over before is recognised again (`known_jax`: its capsule is still asked
for, for the ordering and to keep the buffer, but not parsed). What none of these takes goes
through `protocols.as_device_array`, as do arrays of every other producer (Numba, any DLPack or
CAI object): that importer validates each field of a foreign producer and names what is wrong,
where cuda.core 1.2, handed a malformed DLPack capsule by a fuzzed producer, returned without
raising and left the interpreter's error state inconsistent (a SystemError at the next call, not
an error the caller could catch).

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

from . import known_jax
from .accessors import from_cupy, from_torch
from .array import DeviceArray
from .protocols import as_device_array, device_id_of, is_device_array_like, stream_of
from .._spec.geometry import c_strides as _c_strides
from .._runtime.stream import CU_STREAM_LEGACY

__all__ = ["OTHER", "TORCH", "CUPY", "CUDATTN", "JAX", "KINDS", "adapt", "as_device_array", "current_stream",
           "current_stream_owner", "device_id_of", "is_device_array_like", "kind_of", "stream_of"]

# JAX and other producers (kinds >= JAX) know no consumer stream: they order their work before it
# through DLPack's handshake, and the call holds their arrays until its work is done.
CUDATTN, TORCH, CUPY, JAX, OTHER = 0, 1, 2, 3, 4
# type -> kind (`kind_of` fills it): an operand's kind is here once an object of its type was adapted
KINDS: dict[type, int] = {DeviceArray: CUDATTN}
_SMV = None
_torch_stream = None  # torch's current-stream getter, bound when a torch tensor first arrives


def kind_of(obj) -> int:
    t = type(obj)
    k = KINDS.get(t)
    if k is None:
        top = t.__module__.partition(".")[0]
        k = KINDS[t] = TORCH if top == "torch" else CUPY if top == "cupy" else \
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
    kind = KINDS.get(type(obj))
    if kind is None:
        kind = kind_of(obj)
    if kind == CUDATTN:
        return obj
    if kind == TORCH or kind == CUPY:
        a = from_torch(obj) if kind == TORCH else from_cupy(obj)  # torch FP8 keeps its dtype (DLPack: uint8)
        if a is not None:
            dev = a.device_id  # `_current` inline: the later operands of a call skip a function call
            a.stream_handle = current[2] if current is not None and current[1] == dev and current[0] is type(obj) \
                else (_torch_stream or _torch_stream_getter())(dev) if kind == TORCH else current_stream(CUPY, dev)
            return a
        is_neg = getattr(obj, "is_neg", None) if kind == TORCH else None
        if is_neg is not None and is_neg():  # any importer would hand over the bytes, which hold -x
            raise TypeError(f"{name} is a negated torch view (torch._neg_view): its memory holds the negated "
                            f"values; pass {name}.resolve_neg()")
    elif kind == JAX:  # the consumer as DLPack names it: JAX orders its pending writes before that stream
        sync = CU_STREAM_LEGACY if consumer == 0 else consumer
        a = known_jax.recall(obj, consumer, sync, name)
        if a is not None:
            return a
    else:  # any other producer: cudattn's validating importer (see the module docstring)
        return as_device_array(obj, name=name, stream_handle=consumer)
    if kind != JAX:  # torch / CuPy arrays the accessors do not take: ordered after their package's current
        sync = -1    # stream by the caller, as their users expect
    try:
        view = (_SMV or _smv_type()).from_any_interface(obj, sync)
        dtype = view.dtype
        dev = view.device_id
        if dev < 0 or dtype is None or dtype.kind == "u":  # host memory, or FP8 that crossed as uint8
            raise TypeError
    except Exception:
        if kind == JAX:  # what the view cannot take (host arrays, FP8): the importer takes it or says why
            return as_device_array(obj, name=name, stream_handle=consumer)
        a = as_device_array(obj, name=name, stream_handle=None)  # no ordering: the caller orders the call
        a.stream_handle = _current(kind, obj, a.device_id, current)  # after the package's current stream
        return a
    a = object.__new__(DeviceArray)
    shape = view.shape
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = view.ptr, shape, dtype, dev, view, view.readonly
    st = view.strides
    a.strides = _contiguous(shape, dtype.itemsize) if st is None else _byte_strides(st, dtype.itemsize)
    if kind == JAX:
        a.stream_handle = consumer
        known_jax.remember(obj, a)
    else:
        a.stream_handle = _current(kind, obj, dev, current)
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
