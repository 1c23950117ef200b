"""JAX arrays imported before, recognised again without a DLPack export.

A JAX array never changes its shape, dtype, device or buffer, and its DLPack import (about 8 us on
an H200 host: the export, the capsule, the view) orders the consumer stream after JAX's pending
writes to it. So once an array has been imported for a call on a stream, a later call on the
same stream needs none of that again: it is ordered after the first call, which was ordered after
the write. What is remembered here is the import's facts (address, shape, strides, dtype, device),
keyed by the array's identity and held through a weak reference (nothing here keeps an array
alive); each later use checks that the array is the same live object and that its buffer still
has the address remembered (``unsafe_buffer_pointer`` raises once the array is deleted or
donated, and the general import then says why).
"""

from __future__ import annotations

import weakref

from .array import DeviceArray

__all__ = ["device_of", "recall", "remember"]

_MAX = 4096
_seen: dict = {}  # id(array) -> (weak reference, consumer stream, (ptr, shape, strides, dtype, device, readonly))


def remember(obj, consumer: int, a: DeviceArray) -> None:
    """Keep what importing ``obj`` for ``consumer`` found (``a``); arrays without weak references are
    not kept."""
    key = id(obj)

    def forget(ref, key=key):
        e = _seen.get(key)
        if e is not None and e[0] is ref:
            del _seen[key]

    try:
        ref = weakref.ref(obj, forget)
    except TypeError:
        return
    if len(_seen) >= _MAX:
        _seen.clear()
    _seen[key] = (ref, consumer, (a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly))


def recall(obj, consumer: int) -> DeviceArray | None:
    """``obj`` as a DeviceArray (owner ``obj``, read on ``consumer``) from an earlier import for the
    same stream; None when there is none, or when the array is no longer what it was."""
    e = _seen.get(id(obj))
    if e is None or e[1] != consumer or e[0]() is not obj:
        return None
    f = e[2]
    try:
        if obj.unsafe_buffer_pointer() != f[0]:
            return None
    except Exception:  # deleted, donated, or no single buffer: the general import says what
        return None
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.strides, a.dtype, a.device_id, a.readonly = f
    a.owner, a.stream_handle = obj, consumer
    return a


def device_of(obj) -> int | None:
    """The device of a live array imported before (None: not known)."""
    e = _seen.get(id(obj))
    if e is None or e[0]() is not obj:
        return None
    return e[2][4]
