"""Page-locked ("pinned") NumPy arrays, and telling them apart from pageable ones.

The NumPy path moves every byte over PCIe. From pageable memory each byte first crosses the host
once more, into pinned staging chunks (`_arrays.transfer`), and that host copy, not the DMA, is most of
the call. A caller that keeps its q, k, v and ``out`` in pinned memory skips it: the NumPy path
sees that an array is pinned (:func:`is_pinned`) and DMAs straight from and into it.

Allocation is the driver's ``cuMemHostAlloc`` with ``CU_MEMHOSTALLOC_PORTABLE``, pinned for every
context of the process (cuda.core's pinned resources pin for the current context, or come from a
pool), freed when the last NumPy view of it is gone. It is slow (tens of ms for 64 MiB): allocate
once and reuse, as with ``torch.Tensor.pin_memory``.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray
from cuda.bindings import driver

from .._runtime import device as _device
from .._runtime.errors import check
from .._runtime.device import restores_caller_context

__all__ = ["empty_pinned", "is_pinned"]


class _PinnedBlock:
    """Owns one ``cuMemHostAlloc`` block; the NumPy arrays over it keep it alive."""

    __slots__ = ("ptr",)

    def __init__(self, nbytes: int):
        self.ptr = 0
        self.ptr = int(check(driver.cuMemHostAlloc(nbytes, driver.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"))

    def __del__(self):
        if self.ptr:
            driver.cuMemFreeHost(self.ptr)  # unchecked: nothing to report to at collection time
            self.ptr = 0


@restores_caller_context
def empty_pinned(shape: int | tuple[int, ...], dtype: DTypeLike = np.float32) -> NDArray[Any]:
    """A new C-contiguous NumPy array in page-locked host memory (uninitialised, as ``np.empty``).

    Give such arrays as q, k, v and ``out`` of :func:`cudattn.attention`: their bytes go to and
    from the device by DMA, with no copy through the host's staging buffers (the NumPy path's
    largest cost with ordinary arrays). Any array whose memory is pinned is used that way,
    including views of pinned memory made by other libraries. Pinning is slow and takes memory
    from the OS for good until freed: allocate once, reuse.

    Parameters
    ----------
    shape : int or tuple of ints
    dtype : dtype, optional
        Default float32; not of dtype object.

    Returns
    -------
    numpy.ndarray
        C-contiguous, uninitialised, in pinned memory that is freed when the last view of it goes.

    Raises
    ------
    ValueError
        A negative dimension.
    TypeError
        An object dtype.
    cudattn.NoDeviceError, cudattn.CudaError
        No usable GPU (pinning needs the driver), or the allocation failed.

    Examples
    --------
    >>> import numpy as np, ml_dtypes, cudattn
    >>> q = cudattn.empty_pinned((2, 4096, 16, 128), ml_dtypes.bfloat16)
    >>> q[...] = np.random.randn(*q.shape)
    >>> out = cudattn.attention(q, q, q)   # q is DMA'd straight from its pinned memory
    """
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"empty_pinned: negative dimension in shape {shape}")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError("empty_pinned: object arrays cannot be pinned")
    nbytes = math.prod(shape) * dt.itemsize
    _device.get_device(None)  # a current context for the allocation (any device: the block is portable)
    block = _PinnedBlock(max(nbytes, 1))
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(block.ptr)
    raw._cudattn_block = block  # type: ignore[attr-defined]  # the block lives as long as any view
    return np.frombuffer(raw, dtype=dt, count=math.prod(shape)).reshape(shape)


_byte_bounds = getattr(np, "byte_bounds", None) or np.lib.array_utils.byte_bounds  # moved in NumPy 2.0
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_HOST = driver.CUmemorytype.CU_MEMORYTYPE_HOST
_MEMORY_TYPE = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE


def _pinned_address(ptr: int) -> bool:
    err, kind = driver.cuPointerGetAttribute(_MEMORY_TYPE, ptr)
    return err == _SUCCESS and int(kind) == int(_HOST)  # pageable memory: an error


def is_pinned(a: np.ndarray) -> bool:
    """Whether ``a``'s bytes lie in page-locked host memory the device can DMA (its first and last
    byte: one NumPy array never spans two allocations). Empty arrays are not."""
    if a.nbytes == 0:
        return False
    lo, hi = _byte_bounds(a)
    return _pinned_address(lo) and _pinned_address(hi - 1)
