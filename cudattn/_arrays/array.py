"""`DeviceArray`: a strided view of device memory, and the memory behind new ones.

- :func:`empty` / :func:`empty_on` / :func:`new_array` allocate, stream-ordered, from the device's
  memory pool (`_arrays.alloc`); views share their parent's block; :func:`empty_cache` trims it.
- Foreign arrays come in through `_importer`; copies to and from NumPy and fills are in
  `transfer` (the raw copies) and `host_io` (the public ones).

A ``DeviceArray`` exports ``__cuda_array_interface__`` (v3) and ``__dlpack__``/``__dlpack_device__``,
so PyTorch, CuPy, JAX and Numba take it without copies. Dtype rules at the borders:

=============  =====================  ==========================================================
dtype          DLPack out             CUDA Array Interface out
=============  =====================  ==========================================================
float16        (kDLFloat, 16)         ``<f2``
bfloat16       (kDLBfloat, 16)        none: the property raises ``AttributeError`` (use DLPack)
float8_e4m3fn  as uint8 (kDLUInt, 8)  as uint8 ``|u1``
=============  =====================  ==========================================================

CAI has no bfloat16 type code (and ``"<V2"`` would help nobody): a bfloat16 array has no
``__cuda_array_interface__`` attribute, and ``torch.from_dlpack(a)`` is the way in.

Streams. ``stream_handle`` is the stream an array's contents are produced on (where it was
allocated or copied, or the consumer stream it was imported on), None when unknown.
``__dlpack__(stream=s)`` makes ``s`` wait for it (an event, no host blocking); CAI reports it as
``"stream"``, so v3 consumers do the same. Code that writes an array on another stream updates it.
Importing this module makes no CUDA call.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex, TypeAlias, Union

import numpy as np
from numpy.typing import NDArray
from cuda.bindings import driver

from . import alloc as _alloc
from . import dlpack as _dlpack
from . import stream_memory as _stream_memory
from . import transfer as _transfer
from .._runtime import device as _devices, recording as _recording
from .._runtime.device import _as_ordinal, get_device, restores_caller_context
from .dlpack import kDLCUDA
from .._runtime.errors import check
from .._spec.geometry import c_strides as _c_strides, stand_in
from .._runtime.stream import CU_STREAM_LEGACY, as_stream, stream_wait
from .types import DeviceLike, DTypeLike, Index, StreamLike

__all__ = ["ArrayResult", "DeviceArray", "empty", "empty_cache", "empty_on", "new_array", "nan_pattern"]

from .._spec.dtypes import BFLOAT16 as BF16, FLOAT8_E4M3 as FP8_E4M3  # noqa: E402  (one table of dtypes)

# Quiet-NaN bit patterns, one element wide (float8_e4m3fn has no inf; 0x7F is its NaN).
_NAN_BITS: dict[np.dtype, int] = {
    np.dtype(np.float16): 0x7E00,
    BF16: 0x7FC0,
    np.dtype(np.float32): 0x7FC00000,
    FP8_E4M3: 0x7F,
}


class DeviceArray:
    """A strided n-d view of device memory.

    Attributes
    ----------
    ptr : int
        Device address of element ``[0, 0, ...]``.
    shape : tuple[int, ...]
    strides : tuple[int, ...]
        In **bytes**, like NumPy; may be negative or zero.
    dtype : numpy.dtype
        Includes ``ml_dtypes.bfloat16`` and ``ml_dtypes.float8_e4m3fn``.
    device_id : int
    owner : object
        What keeps the memory alive: the cuda.core ``Buffer`` cudattn allocated,
        or the foreign array (or DLPack tensor) it wraps; ``None`` for a bare pointer.
    stream_handle : int | None
        Stream its contents are produced on (None: unknown); DLPack and CAI consumers wait for it.
    readonly : bool
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "device_id", "owner", "stream_handle", "readonly", "__weakref__")

    # Annotations only (no values, so no clash with __slots__).
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]
    device_id: int
    owner: object
    stream_handle: int | None
    readonly: bool

    def __init__(self, ptr: int, shape: Iterable[SupportsIndex], dtype: DTypeLike,
                 strides: Iterable[SupportsIndex] | None = None, *, device_id: int, owner: object = None,
                 stream_handle: int | None = None, readonly: bool = False) -> None:
        self.ptr = int(ptr)
        if not 0 <= self.ptr < 1 << 64:
            raise ValueError(f"ptr {self.ptr:#x} is not a 64-bit device address")
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        if strides is None:
            self.strides = _c_strides(self.shape, self.dtype.itemsize)
        else:
            self.strides = tuple(int(s) for s in strides)
            if len(self.strides) != len(self.shape):
                raise ValueError(f"strides {self.strides} and shape {self.shape} differ in length")
        if any(n < 0 for n in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        self.device_id = int(device_id)
        self.owner = owner
        self.stream_handle = stream_handle
        self.readonly = bool(readonly)

    # ------------------------------------------------------------------ basic facts

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (``size * itemsize``), not of the span a strided view covers."""
        return self.size * self.dtype.itemsize

    @property
    def is_c_contiguous(self) -> bool:
        expect = self.dtype.itemsize
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"DeviceArray(shape={self.shape}, dtype={self.dtype}, strides={self.strides}, "
            f"ptr={self.ptr:#x}, device_id={self.device_id})"
        )

    # ------------------------------------------------------------------ views

    def _derive(self, ptr: int, shape: Iterable[SupportsIndex], strides: Iterable[SupportsIndex],
                dtype: DTypeLike | None = None) -> DeviceArray:
        return DeviceArray(
            ptr,
            shape,
            self.dtype if dtype is None else dtype,
            strides,
            device_id=self.device_id,
            owner=self.owner,
            stream_handle=self.stream_handle,
            readonly=self.readonly,
        )

    def __getitem__(self, key: Index | tuple[Index, ...]) -> DeviceArray:
        """Basic indexing (ints, slices with any step, ``...``, ``None``) → a view; no data moves.

        The view's layout is computed by NumPy on a stand-in array that points at
        the same (device) address and is never read.
        """
        if not isinstance(key, tuple):
            key = (key,)
        for k in key:
            if not (k is None or k is Ellipsis or isinstance(k, (slice, numbers.Integral))) or isinstance(k, bool):
                raise TypeError(
                    f"DeviceArray supports basic indexing only (ints, slices, ..., None), not {type(k).__name__}"
                )
        if Ellipsis not in key:
            key = key + (Ellipsis,)  # integer indexing then still yields a (0-d) view, never a read
        base = self.ptr if self.ptr else 1 << 40  # NumPy treats a NULL data pointer as "allocate"
        v = stand_in(base, self.shape, self.strides, self.dtype.itemsize)[key]
        new_ptr = v.__array_interface__["data"][0] - base + self.ptr if v.size else self.ptr
        return self._derive(new_ptr, v.shape, v.strides)

    def transpose(self, *axes: SupportsIndex | Sequence[SupportsIndex]) -> DeviceArray:
        """Permute axes (reverse them when none are given), as ``numpy.transpose``; a view."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        axes = tuple(int(a) % self.ndim if self.ndim else int(a) for a in axes)
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} are not a permutation of {self.ndim} axes")
        return self._derive(self.ptr, tuple(self.shape[a] for a in axes), tuple(self.strides[a] for a in axes))

    @property
    def T(self) -> DeviceArray:
        return self.transpose()

    def view(self, dtype: DTypeLike) -> DeviceArray:
        """The same bytes as another dtype of the same itemsize (e.g. float8_e4m3fn as uint8)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"view({dtype}) needs itemsize {self.dtype.itemsize}, not {dtype.itemsize}")
        return self._derive(self.ptr, self.shape, self.strides, dtype)

    # ------------------------------------------------------------------ interchange

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.dtype == BF16:
            raise AttributeError(
                "bfloat16 has no CUDA Array Interface type code; exchange this array through DLPack "
                "(torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack)"
            )
        typestr = "|u1" if self.dtype == FP8_E4M3 else self.dtype.str
        s = self.stream_handle
        if s in (0, 1, 2) and not _devices.is_current(self.device_id):
            _transfer.settle_default_stream(self)  # done on the host: the export names no stream
            s = None
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.ptr, self.readonly),
            "strides": None if self.is_c_contiguous else self.strides,
            "descr": [("", typestr)],
            "mask": None,
            # v3: the consumer must order its work after this stream; 0 is not allowed there.
            "stream": (CU_STREAM_LEGACY if s == 0 else s) if s is not None else None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCUDA, self.device_id)

    @restores_caller_context
    def __dlpack__(self, stream: int | None = None, *, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        """Export as a DLPack ``"dltensor"`` capsule (zero copy; FP8 goes out as uint8).

        ``stream`` is the consumer's stream: ``None`` (legacy default stream), 1
        (legacy), 2 (per-thread), a ``CUstream`` handle, or -1 (no ordering). Unless it
        is -1, the consumer stream is made to wait for :attr:`stream_handle` (an
        event; the host does not block). ``max_version`` is accepted and answered with
        a legacy capsule, as the protocol allows.
        """
        if dl_device is not None and tuple(dl_device) != (kDLCUDA, self.device_id):
            raise BufferError(
                f"cannot export to DLPack device {tuple(dl_device)}: the data lives on (kDLCUDA, {self.device_id})"
            )
        if copy:
            raise BufferError("DeviceArray.__dlpack__ exports views only (copy=True is not supported)")
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
            raise TypeError(f"stream must be an int or None, not {type(stream).__name__}")
        producer = self.stream_handle
        if stream != -1 and producer is not None:
            consumer = CU_STREAM_LEGACY if stream is None or stream == 0 else stream
            if consumer != producer:
                get_device(self.device_id)
                stream_wait(consumer, producer)
        return _dlpack.to_capsule(
            self.ptr, self.shape, self.strides, self.dtype, (kDLCUDA, self.device_id), self
        )

    # ------------------------------------------------------------------ conveniences

    def copy_to_host(self, *, stream: StreamLike = None) -> NDArray[Any]:
        """Synchronous copy to a new NumPy array (see :func:`to_host`)."""
        return _transfer.device_to_host(self, stream)

    def fill_nan(self, *, stream: StreamLike = None) -> DeviceArray:
        """Overwrite every element with a quiet NaN (asynchronous on ``stream``); returns self."""
        try:
            pattern = _NAN_BITS[self.dtype]
        except KeyError:
            raise TypeError(f"fill_nan: no NaN bit pattern for dtype {self.dtype}") from None
        _transfer.memset(self, pattern, stream=stream)
        return self

    def memset(self, pattern: int, *, stream: StreamLike = None) -> DeviceArray:
        """Write the ``itemsize``-wide bit ``pattern`` over every element; returns self."""
        _transfer.memset(self, pattern, stream=stream)
        return self


# ---------------------------------------------------------------------- allocation and copies


def _shape_tuple(shape) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"shape must be non-negative, got {shape}")
    return shape


#: What a NumPy-or-device function returns: a NumPy array for NumPy inputs, a DeviceArray for device ones.
ArrayResult: TypeAlias = Union[NDArray[Any], DeviceArray]


def empty(shape, dtype, *, device=None, stream=None) -> DeviceArray:
    """A new C-contiguous :class:`DeviceArray`, uninitialised.

    Allocated stream-ordered on ``stream`` from the device's default memory
    resource (cuda.core's pool-backed ``DeviceMemoryResource``), and freed,
    stream-ordered on the same stream, when the last reference goes.
    ``device``: ordinal, cuda.core Device, or None (current/0).
    """
    dev = get_device(device)
    return empty_on(_shape_tuple(shape), np.dtype(dtype), dev, as_stream(stream, dev.device_id))


def empty_on(shape: tuple[int, ...], dtype: np.dtype, dev, ref) -> DeviceArray:
    """`empty` for callers that already hold the current cuda.core Device and a StreamRef
    (the attention launch path), so neither is resolved a second time per call."""
    return new_array(shape, dtype, dev.device_id, ref.handle, ref.obj)


def new_array(shape: tuple[int, ...], dtype: np.dtype, device_id: int, stream: int, keep: object = None,
              strides: tuple[int, ...] | None = None, reuse: bool = False) -> DeviceArray:
    """A C-contiguous (or ``strides``, dense) array on a stream-ordered block (`_arrays.alloc`, which
    says what ``reuse`` allows): the light constructor of the warm call path (no argument conversion)."""
    nbytes = math.prod(shape) * dtype.itemsize
    a = object.__new__(DeviceArray)
    a.shape, a.dtype, a.device_id, a.stream_handle, a.readonly = shape, dtype, device_id, stream, False
    a.strides = _c_strides(shape, dtype.itemsize) if strides is None else strides
    rec = _recording.current() if _recording.active else None
    if rec is not None:  # a recorded call (`_calls.replay`): a placeholder address, no memory
        a.owner, a.ptr = None, rec.allocate(shape, dtype, a.strides) if nbytes else 0
    elif nbytes:
        a.owner = block = _alloc.allocate(device_id, nbytes, stream, keep, reuse)
        a.ptr = block.ptr
    else:
        a.owner, a.ptr = None, 0
    return a


@restores_caller_context
def empty_cache(device: DeviceLike = None) -> None:
    """Give the device memory that cudattn keeps for reuse, but no array uses, back to the driver.

    Freed arrays leave their memory in the device's pool, as PyTorch's caching allocator does (a
    warm call's dropped outputs, up to 256 MiB a device, wait for the next call on their stream);
    streams that ran split-KV decode keep counters and workspaces (64 MiB a device at most). This
    call waits for the device's pending work, then frees them all. Where cudattn has used no GPU
    in this process (none present included), it returns at once, CUDA untouched.

    Parameters
    ----------
    device : int, cuda.core Device or None
        The device; None: the current one (else device 0).

    Returns
    -------
    None

    Raises
    ------
    TypeError, ValueError
        ``device`` is no ordinal or Device, or names no device of this process.
    cudattn.CudaError
        A driver call failed (an error left by earlier asynchronous work included).

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> x = cudattn.to_device(np.zeros((1024, 1024), np.float32))
    >>> del x                   # the last reference: its memory returns to cudattn's pool
    >>> cudattn.empty_cache()   # and from the pool to the driver
    """
    if device is not None and type(device) is not int:
        _as_ordinal(device)  # TypeError for what is no device, before anything else
    if not _devices._initialized or not _devices._device_count:
        return  # cudattn never initialised CUDA (or sees no GPU): it holds no device memory
    dev = get_device(device)
    _alloc.release_kept(dev.device_id)  # kept for later calls (`_arrays.alloc`): back to the pool
    check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    _stream_memory.release(dev.device_id)  # their kernels are done; the frees are waited for
    _alloc.trim(dev.device_id)


def nan_pattern(dtype) -> int:
    """The quiet-NaN bit pattern :meth:`DeviceArray.fill_nan` writes for ``dtype``."""
    try:
        return _NAN_BITS[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no NaN bit pattern for dtype {np.dtype(dtype)}") from None
