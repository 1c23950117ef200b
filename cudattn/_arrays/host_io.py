"""`cudattn.to_device` and `cudattn.to_host`: the public copies between NumPy and device arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import transfer as _transfer
from .array import DeviceArray, empty
from .importer import as_device_array
from .types import DeviceArrayLike, DeviceLike, HostArrayLike, StreamLike
from .._runtime.device import restores_caller_context

__all__ = ["to_device", "to_host"]


@restores_caller_context
def to_device(array: HostArrayLike, *, device: DeviceLike = None, stream: StreamLike = None) -> DeviceArray:
    """Copy host data into a new C-contiguous :class:`DeviceArray` (asynchronous on ``stream``).

    The host array may be reused as soon as this returns: from pageable memory the
    driver stages the bytes before returning.

    Parameters
    ----------
    array : array_like
        Anything ``numpy.asarray`` takes (not of dtype object); copied in C order.
    device : int or cuda.core Device, optional
        None: the current device (else device 0).
    stream : optional
        The stream to copy on (an int handle, a cuda.core Stream, or any object with
        ``__cuda_stream__``); None: cudattn's stream for the device. It becomes the
        array's ``stream_handle``.

    Returns
    -------
    DeviceArray
        ``array``'s shape and dtype, C-contiguous, on ``device``.

    Raises
    ------
    TypeError
        An object array, or a ``device`` or ``stream`` of a type cudattn does not take.
    ValueError
        ``device`` names no device of this process.
    cudattn.NoDeviceError, cudattn.OutOfMemoryError, cudattn.CudaError
        No usable GPU, no device memory left, or another failed driver call.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> d = cudattn.to_device(np.arange(6, dtype=np.float16).reshape(2, 3))
    >>> d.shape, d.dtype
    ((2, 3), dtype('float16'))
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


@restores_caller_context
def to_host(arr: DeviceArrayLike, *, stream: StreamLike = None) -> NDArray[Any]:
    """Copy a device array into a new NumPy array; returns when the copy is done.

    Works for any strided view: the covering byte span is copied and the view
    rebuilt on the host.

    Parameters
    ----------
    arr : device array
        A :class:`DeviceArray`, or any object with ``__cuda_array_interface__`` or
        ``__dlpack__`` on a CUDA device (CuPy, PyTorch, JAX, Numba).
    stream : optional
        The stream to copy on; None: the array's own stream (else cudattn's stream
        for its device), so the copy follows the work that produced it.

    Returns
    -------
    numpy.ndarray
        ``arr``'s shape and dtype, C-contiguous.

    Raises
    ------
    TypeError
        ``arr`` is a NumPy array or no device array.
    cudattn.NoDeviceError, cudattn.CudaError
        No usable GPU, or a failed driver call (an error of earlier asynchronous work included).

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> x = np.ones((2, 3), np.float16)
    >>> y = cudattn.to_host(cudattn.to_device(x))
    >>> bool((y == x).all())
    True
    """
    return _transfer.device_to_host(as_device_array(arr, name="arr"), stream)
