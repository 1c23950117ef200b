"""`cudattn.to_device` and `cudattn.to_host`: the public copies between NumPy and device arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import transfer as _transfer
from .array import DeviceArray, empty
from .importer import as_device_array
from .types import DeviceArrayLike, DeviceLike, HostArrayLike, StreamLike

__all__ = ["to_device", "to_host"]


def to_device(array: HostArrayLike, *, device: DeviceLike = None, stream: StreamLike = None) -> DeviceArray:
    """Copy host data into a new C-contiguous :class:`DeviceArray` (asynchronous on ``stream``).

    The host array may be reused as soon as this returns: from pageable memory the
    driver stages the bytes before returning.
    """
    a = np.asarray(array)
    if a.dtype.hasobject:
        raise TypeError("to_device: object arrays cannot be copied to the device")
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    out = empty(a.shape, a.dtype, device=device, stream=stream)
    if a.nbytes:
        _transfer._copy_h2d(out.ptr, a.ctypes.data, a.nbytes, out.stream_handle, out.device_id)
    return out


def to_host(arr: DeviceArrayLike, *, stream: StreamLike = None) -> NDArray[Any]:
    """Copy a device array into a new NumPy array; returns when the copy is done.

    Works for any strided view: the covering byte span is copied and the view
    rebuilt on the host. ``stream`` defaults to the array's own stream (else the
    library stream of its device).
    """
    return _transfer.device_to_host(as_device_array(arr, name="arr"), stream)
