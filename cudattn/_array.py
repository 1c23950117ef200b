"""`DeviceArray`: a strided view of device memory, and the ways in and out of it.

- :func:`as_device_array` wraps a foreign device array with zero copies: a
  ``DeviceArray`` (returned as is), anything with ``__dlpack__`` on a CUDA device
  (preferred: it carries bfloat16, which PyTorch's CUDA Array Interface refuses),
  else anything with ``__cuda_array_interface__`` (v2 or v3).
- :func:`empty` allocates (stream-ordered, from the device's memory pool, through
  cuda.core); :func:`to_device` / :func:`to_host` copy to and from NumPy (large
  copies through reusable pinned staging chunks, see below);
  :func:`memset` / :meth:`DeviceArray.fill_nan` write bit patterns (tests poison
  outputs with NaN).

A ``DeviceArray`` exports ``__cuda_array_interface__`` (v3) and
``__dlpack__``/``__dlpack_device__``, so PyTorch, CuPy, JAX and Numba take it
without copies. Dtype rules at the borders:

========================  ==========================  ==========================
dtype                     DLPack out                  CUDA Array Interface out
========================  ==========================  ==========================
float16                   (kDLFloat, 16)              ``<f2``
bfloat16                  (kDLBfloat, 16)             none: the property raises
                                                      ``AttributeError``, so
                                                      consumers fall back to DLPack
float8_e4m3fn             as uint8 (kDLUInt, 8)       as uint8 ``|u1``
========================  ==========================  ==========================

CAI has no bfloat16 type code. ``"<V2"`` would be accepted by nobody usefully
(CuPy and Numba have no bfloat16; PyTorch's CAI import rejects void types), so
a bfloat16 array does not pretend: ``hasattr(a, "__cuda_array_interface__")`` is
False and ``torch.from_dlpack(a)`` is the way in.

Streams. Each array remembers ``stream_handle``: the stream its contents are
being produced on (where it was allocated or copied, or the consumer stream it was
imported on), or ``None`` when unknown. ``__dlpack__(stream=s)`` makes ``s`` wait
for that stream (an event, no host blocking); ``__cuda_array_interface__``
reports it as ``"stream"`` so CAI v3 consumers do the same. Code that writes an
array on another stream should update ``stream_handle``.

Importing this module makes no CUDA call; wrapping a foreign array makes none
either, except ``cuPointerGetAttribute`` to learn the device of a CAI pointer
(CAI does not say) and the stream synchronisation described above.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
from numpy.typing import NDArray
from cuda.bindings import driver

from . import _alloc, _dlpack, _recording
from ._device import _ensure_init, get_device
from ._dlpack import kDLCUDA, kDLCUDAManaged
from ._errors import check
from ._geometry import c_strides as _c_strides
from ._geometry import is_dense as _is_dense
from ._geometry import span as _span
from ._geometry import stand_in
from ._staging import parallel_memmove
from ._stream import CU_STREAM_LEGACY, as_stream, stream_wait
from ._types import DeviceArrayLike, DeviceLike, DTypeLike, HostArrayLike, Index, StreamLike

__all__ = [
    "DeviceArray",
    "as_device_array",
    "empty",
    "empty_cache",
    "empty_on",
    "is_device_array_like",
    "memset",
    "device_id_of",
    "nan_pattern",
    "stream_of",
    "to_device",
    "to_host",
    "zero_fill",
]

from ._dtypes import BFLOAT16 as BF16, FLOAT8_E4M3 as FP8_E4M3  # noqa: E402  (one table of dtypes)

# Quiet-NaN bit patterns, one element wide (float8_e4m3fn has no inf; 0x7F is its NaN).
_NAN_BITS: dict[np.dtype, int] = {
    np.dtype(np.float16): 0x7E00,
    BF16: 0x7FC0,
    np.dtype(np.float32): 0x7FC00000,
    FP8_E4M3: 0x7F,
}

_CUDA_DEVICE_TYPES = (kDLCUDA, kDLCUDAManaged)
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                        10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}  # fmt: skip


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
        Stream the contents are produced on (see the module docstring).
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

    def __init__(
        self,
        ptr: int,
        shape: Iterable[SupportsIndex],
        dtype: DTypeLike,
        strides: Iterable[SupportsIndex] | None = None,
        *,
        device_id: int,
        owner: object = None,
        stream_handle: int | None = None,
        readonly: bool = False,
    ) -> None:
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
        return to_host(self, stream=stream)

    def fill_nan(self, *, stream: StreamLike = None) -> DeviceArray:
        """Overwrite every element with a quiet NaN (asynchronous on ``stream``); returns self."""
        try:
            pattern = _NAN_BITS[self.dtype]
        except KeyError:
            raise TypeError(f"fill_nan: no NaN bit pattern for dtype {self.dtype}") from None
        memset(self, pattern, stream=stream)
        return self

    def memset(self, pattern: int, *, stream: StreamLike = None) -> DeviceArray:
        """Write the ``itemsize``-wide bit ``pattern`` over every element; returns self."""
        memset(self, pattern, stream=stream)
        return self


# ---------------------------------------------------------------------- wrapping foreign arrays


def is_device_array_like(obj) -> bool:
    """Cheap test: is ``obj`` a device array cudattn can wrap (NumPy arrays and scalars: no)?"""
    t = type(obj)
    if t is DeviceArray:
        return True
    if t is np.ndarray or isinstance(obj, (np.ndarray, np.generic, numbers.Number, str, bytes)):
        return False
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and hasattr(obj, "__dlpack__"):
        try:
            if dev()[0] in _CUDA_DEVICE_TYPES:
                return True
        except Exception:
            pass
    try:
        obj.__cuda_array_interface__
    except AttributeError:
        return False
    except Exception:  # e.g. PyTorch raises TypeError for bfloat16: still a CUDA array
        return True
    return True


def device_id_of(obj, *, name: str = "array") -> int:
    """Device ordinal of a device array, without wrapping it (DLPack device, else the CAI pointer's device)."""
    if isinstance(obj, DeviceArray):
        return obj.device_id
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and hasattr(obj, "__dlpack__"):
        dev_type, dev_id = _dlpack_device(obj, dev, name)
        if dev_type in _CUDA_DEVICE_TYPES:
            return dev_id
    if _has_cai(obj):
        try:
            cai = obj.__cuda_array_interface__
        except Exception as e:
            raise TypeError(f"{name}: {type(obj).__name__}.__cuda_array_interface__ failed: {e}") from e
        return _pointer_device(_cai_data(cai, name)[0])
    return as_device_array(obj, name=name).device_id  # raises the right TypeError


def _dlpack_device(obj, dlpack_device, name: str) -> tuple[int, int]:
    """``obj.__dlpack_device__()`` as two ints; TypeError naming ``name`` when it returns anything else."""
    res = dlpack_device()
    try:
        dev_type, dev_id = res
        return operator.index(dev_type), operator.index(dev_id)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: {type(obj).__name__}.__dlpack_device__() must return (device_type, device_id) "
                        f"as two ints; got {res!r}") from None


def stream_of(arr) -> int | None:
    """The stream handle ``arr``'s contents are produced on (``DeviceArray.stream_handle``), or None."""
    return getattr(arr, "stream_handle", None)


def _pointer_device(ptr: int) -> int:
    """Device ordinal owning ``ptr`` (a driver query; tests replace this function)."""
    if not ptr:  # empty arrays may carry NULL: take the current device
        return get_device().device_id
    _ensure_init()
    return int(
        check(
            driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
            "cuPointerGetAttribute(DEVICE_ORDINAL)",
        )
    )


def as_device_array(obj, *, stream_handle: int | None = None, name: str = "array") -> DeviceArray:
    """Wrap ``obj`` as a :class:`DeviceArray` without copying.

    ``stream_handle`` is the stream the caller will use the data on. DLPack
    producers are asked to order their pending writes before it (``__dlpack__(stream=...)``);
    for a CAI v3 producer that names a ``"stream"``, ``stream_handle`` is made to
    wait on it (an event). With ``stream_handle=None`` no ordering is arranged
    (DLPack producers are told the legacy default stream, per the protocol).
    ``name`` is the argument name used in error messages.
    """
    if type(obj) is DeviceArray or isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name}: a NumPy array is host memory, not a device array")
    dlpack = getattr(obj, "__dlpack__", None)
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    # CAI is looked at only when DLPack is absent or fails: building the interface
    # dict costs PyTorch tens of microseconds, and it refuses bfloat16 anyway.
    if dlpack is not None and dlpack_device is not None:
        dev_type, _ = _dlpack_device(obj, dlpack_device, name)
        if dev_type in _CUDA_DEVICE_TYPES:
            try:
                return _from_dlpack(obj, dlpack, stream_handle, name)
            except (BufferError, NotImplementedError) as e:
                if not _has_cai(obj):
                    if isinstance(e, BufferError):  # the producer's (or the capsule's) refusal, as our TypeError
                        raise TypeError(f"{name}: {type(obj).__name__} could not be imported through DLPack: "
                                        f"{e}") from e
                    raise
                # e.g. a dtype the producer cannot export through DLPack: try CAI below
        elif not _has_cai(obj):
            where = _DLPACK_DEVICE_NAMES.get(dev_type, f"device type {dev_type}")
            raise TypeError(
                f"{name}: {type(obj).__name__} lives on a {where} device (DLPack device {dev_type}); "
                "a device array must be in CUDA device memory (pass host data as a NumPy array)"
            )
    if _has_cai(obj):
        try:
            cai = obj.__cuda_array_interface__
        except Exception as e:
            raise TypeError(f"{name}: {type(obj).__name__}.__cuda_array_interface__ failed: {e}") from e
        return _from_cai(obj, cai, stream_handle, name)
    raise TypeError(
        f"{name}: expected a NumPy array or a CUDA device array (a cudattn DeviceArray, or an object with "
        f"__cuda_array_interface__ or __dlpack__), got {type(obj).__name__}"
    )


def _has_cai(obj) -> bool:
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:  # PyTorch bfloat16: the property raises TypeError
        return False


def _from_dlpack(obj, dlpack, stream_handle, name) -> DeviceArray:
    # DLPack consumer stream: None means "legacy default" by the protocol, and 0 is
    # not allowed (ambiguous), so the legacy default stream is sent as 1.
    consumer = None if stream_handle is None else (CU_STREAM_LEGACY if stream_handle == 0 else stream_handle)
    try:
        capsule = dlpack(stream=consumer, max_version=(1, 0))
    except TypeError:  # producers from before DLPack 1.0 take no max_version
        capsule = dlpack(stream=consumer)
    try:
        t = _dlpack.from_capsule(capsule, producer=obj)
    except TypeError as e:  # not a capsule, or a dtype cudattn cannot take: say which argument
        raise TypeError(f"{name}: {e}") from None
    if t.device_type not in _CUDA_DEVICE_TYPES:
        raise TypeError(f"{name}: DLPack tensor is on device type {t.device_type}, not CUDA")
    return DeviceArray(
        t.ptr,
        t.shape,
        t.dtype,
        t.strides,
        device_id=t.device_id,
        owner=t.owner,
        stream_handle=stream_handle,
        readonly=t.readonly,
    )


def _cai_dtype(typestr: str, name: str) -> np.dtype:
    if not isinstance(typestr, str):  # np.dtype(None) would silently mean float64
        raise TypeError(f"{name}: CUDA Array Interface typestr must be a string such as '<f2'; got {typestr!r}")
    try:
        dtype = np.dtype(typestr)
    except Exception:  # TypeError, and SyntaxError from comma strings such as ","
        raise TypeError(f"{name}: unsupported CUDA Array Interface typestr {typestr!r}") from None
    if dtype.kind == "V" or dtype.hasobject:
        raise TypeError(
            f"{name}: CUDA Array Interface typestr {typestr!r} is not a numeric type "
            "(bfloat16 cannot cross CAI: pass such arrays through DLPack)"
        )
    if dtype.byteorder == ">":
        raise TypeError(f"{name}: big-endian typestr {typestr!r} is not supported")
    return dtype


#: Device addresses are 64-bit: a CAI pointer outside [0, 2**64) cannot be one.
_PTR_LIMIT = 1 << 64


def _malformed(name: str, what: str) -> TypeError:
    return TypeError(f"{name}: malformed __cuda_array_interface__ ({what})")


def _cai_data(cai, name: str) -> tuple[int, bool]:
    """``(ptr, readonly)`` of a CAI dict's ``"data"``, checked: a dict, a pair, an int pointer in [0, 2**64)."""
    if not isinstance(cai, dict):
        raise _malformed(name, f"expected a dict, got {type(cai).__name__}")
    if "data" not in cai:
        raise _malformed(name, "no 'data' entry")
    data = cai["data"]
    try:
        ptr, readonly = data
        ptr = 0 if ptr is None else operator.index(ptr)
        readonly = bool(readonly)
    except (TypeError, ValueError):
        raise _malformed(name, f"'data' must be (pointer int, readonly bool); got {data!r}") from None
    if not 0 <= ptr < _PTR_LIMIT:
        raise ValueError(f"{name}: __cuda_array_interface__ data pointer {ptr:#x} is not a 64-bit device address")
    return ptr, readonly


def _int_tuple(seq, name: str, key: str) -> tuple[int, ...]:
    try:
        return tuple(operator.index(n) for n in seq)
    except TypeError:
        raise _malformed(name, f"{key!r} must be a tuple of ints; got {seq!r}") from None


def _from_cai(obj, cai: dict, stream_handle, name) -> DeviceArray:
    ptr, readonly = _cai_data(cai, name)
    if "shape" not in cai or "typestr" not in cai:
        raise _malformed(name, f"missing {'shape' if 'shape' not in cai else 'typestr'!r}")
    shape = _int_tuple(cai["shape"], name, "shape")
    if any(n < 0 for n in shape):
        raise ValueError(f"{name}: __cuda_array_interface__ shape {shape} has a negative dimension")
    if cai.get("mask") is not None:
        raise TypeError(f"{name}: masked CUDA arrays are not supported")
    dtype = _cai_dtype(cai["typestr"], name)
    strides = cai.get("strides")
    if strides is not None:
        strides = _int_tuple(strides, name, "strides")
        if len(strides) != len(shape):
            raise ValueError(f"{name}: __cuda_array_interface__ strides {strides} and shape {shape} differ in length")
    version = cai.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise _malformed(name, f"'version' must be an int; got {version!r}")
    producer = cai.get("stream") if version >= 3 else None
    if producer is not None:
        if isinstance(producer, bool) or not isinstance(producer, numbers.Integral):
            raise _malformed(name, f"'stream' must be None or an int stream handle; got {producer!r}")
        if producer < 0:
            raise ValueError(f"{name}: __cuda_array_interface__ stream handle must be >= 0; got {producer}")
    device_id = _pointer_device(ptr)
    if producer is not None and stream_handle is not None:
        producer = int(producer)
        if producer == 0:
            producer = CU_STREAM_LEGACY
        consumer = CU_STREAM_LEGACY if stream_handle == 0 else stream_handle
        if producer != consumer:
            get_device(device_id)
            stream_wait(consumer, producer)
    return DeviceArray(
        ptr, shape, dtype, strides, device_id=device_id, owner=obj, stream_handle=stream_handle, readonly=readonly
    )


# ---------------------------------------------------------------------- allocation and copies


def _shape_tuple(shape) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"shape must be non-negative, got {shape}")
    return shape


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
              strides: tuple[int, ...] | None = None) -> DeviceArray:
    """A C-contiguous (or ``strides``, dense) array on a fresh stream-ordered block (`_alloc`): the
    light constructor the warm call path uses (no argument conversion)."""
    nbytes = math.prod(shape) * dtype.itemsize
    a = object.__new__(DeviceArray)
    a.shape, a.dtype, a.device_id, a.stream_handle, a.readonly = shape, dtype, device_id, stream, False
    a.strides = _c_strides(shape, dtype.itemsize) if strides is None else strides
    rec = _recording.current() if _recording.active else None
    if rec is not None:  # a recorded call (`_replay`): a placeholder address, no memory
        a.owner, a.ptr = None, rec.allocate(shape, dtype, a.strides) if nbytes else 0
    elif nbytes:
        a.owner = block = _alloc.allocate(device_id, nbytes, stream, keep)
        a.ptr = block.ptr
    else:
        a.owner, a.ptr = None, 0
    return a


def _trim_pool(dev) -> None:
    _alloc.trim(dev.device_id)


def empty_cache(device: DeviceLike = None) -> None:
    """Give the device memory that cudattn's pool holds but no array uses back to the driver.

    Freed arrays return their memory to the device's stream-ordered pool, which keeps it for the
    next allocation (as PyTorch's caching allocator does); other libraries on the GPU cannot use
    it until it is given back. Waits for the device's pending work first.
    """
    dev = get_device(device)
    check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    _trim_pool(dev)


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
        _copy_h2d(out.ptr, a.ctypes.data, a.nbytes, out.stream_handle, out.device_id)
    return out


def _stream_for(arr: DeviceArray, stream) -> int:
    """Stream to act on ``arr``: the given one, else the array's own, else the library stream.

    A given stream other than the array's own first waits for the array's stream
    (an event), so that the copy or memset sees the array's pending writes.
    """
    own = arr.stream_handle
    if stream is None:
        return own if own is not None else as_stream(None, arr.device_id).handle
    h = as_stream(stream, arr.device_id).handle
    if own is not None and own != h:
        stream_wait(h, own)
    return h


def to_host(arr: DeviceArrayLike, *, stream: StreamLike = None) -> NDArray[Any]:
    """Copy a device array into a new NumPy array; returns when the copy is done.

    Works for any strided view: the covering byte span is copied and the view
    rebuilt on the host. ``stream`` defaults to the array's own stream (else the
    library stream of its device).
    """
    arr = as_device_array(arr, name="arr")
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    if arr.size == 0:
        return np.empty(arr.shape, arr.dtype)
    itemsize = arr.dtype.itemsize
    if arr.is_c_contiguous:
        out = np.empty(arr.shape, arr.dtype)
        _copy_d2h(out.ctypes.data, arr.ptr, arr.nbytes, h, arr.device_id)
        return out
    lo, hi = _span(arr.shape, arr.strides, itemsize)
    raw = np.empty(hi - lo, np.uint8)
    _copy_d2h(raw.ctypes.data, arr.ptr + lo, hi - lo, h, arr.device_id)
    view = np.ndarray(arr.shape, arr.dtype, buffer=raw, offset=-lo, strides=arr.strides)
    return view.copy()  # C order


# ---------------------------------------------------------------------- pinned staging
#
# Pageable host memory cannot be DMA'd: the driver bounces it through its own
# staging buffers, one chunk at a time. cudattn does that bouncing itself for
# large copies, through a small pool of reusable pinned chunks per device
# (STAGING_CHUNKS of STAGING_CHUNK bytes, allocated on first use), so that the
# host memcpy of one chunk overlaps the DMAs of the others. The host memcpy is
# the slow half (one core copies slower than PCIe moves), so it is split across
# a few threads (`_staging.parallel_memmove`).
#
# Each chunk has an event recorded after its DMA, and a note of what is pending
# on it: nothing, a DMA to wait for (H2D), or a DMA to wait for and then bytes to
# copy out of the chunk into their host destination (D2H). Chunks are taken in
# round-robin order and a chunk is refilled only after its pending work is
# settled, so a copy may return while its last H2D DMAs are still in flight (H2D
# stays asynchronous) and a D2H copy is drained as late as possible (its DMA
# overlaps later work). One user at a time holds the pool (`_Staging.lock`) for a
# whole copy, or for a whole pipelined NumPy attention call (`_host.py`), and
# ends with `flush()` (every D2H byte delivered) or, on error, `discard()`.
# CUDATTN_PINNED_STAGING=0 turns it off (then plain pageable copies).

STAGING_CHUNK = 16 << 20  # bytes per pinned chunk
STAGING_CHUNKS = 4  # pinned chunks per device (so up to 3 DMAs in flight while the host fills the 4th)
STAGING_MIN = 1 << 20  # copies smaller than this go direct from/to pageable memory
_staging_enabled = os.environ.get("CUDATTN_PINNED_STAGING", "1") != "0"
_staging_lock = threading.Lock()
_staging: dict[int, _Staging | None] = {}  # device id -> pool (None: pinned allocation failed, don't retry)

_WAIT = ("wait",)  # pending note: a DMA (H2D, or a discarded D2H) still reads or writes the chunk


class _Staging:
    """Pinned chunks, their "DMA done" events and pending notes, for one device; used under ``lock``."""

    def __init__(self, chunk: int, count: int = 2):
        self.lock = threading.Lock()
        self.chunk = chunk
        self.ptrs: list[int] = []
        self.events: list = []
        self.pending: list[tuple | None] = []  # None | _WAIT | (host dst, nbytes): see the section comment
        self.next = 0  # the chunk to take next: the one used longest ago
        self.pipeline = None  # streams and events of the pipelined NumPy path (`_host`), made on first use
        try:
            for _ in range(count):
                self.ptrs.append(
                    int(check(driver.cuMemHostAlloc(chunk, driver.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"))
                )
                self.events.append(
                    check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                )
                self.pending.append(None)
        except BaseException:
            self.close()
            raise

    def _settle(self, i: int) -> None:
        """Finish what is pending on chunk ``i``: wait for its DMA, and deliver a D2H chunk's bytes."""
        p = self.pending[i]
        if p is None:
            return
        self.pending[i] = _WAIT  # until the wait below has succeeded
        check(driver.cuEventSynchronize(self.events[i]), "cuEventSynchronize(staging)")
        self.pending[i] = None
        if p is not _WAIT:
            dst, n = p
            parallel_memmove(dst, self.ptrs[i], n)

    def _take(self) -> int:
        """The next chunk (round robin), free: its pending work settled."""
        i = self.next
        self.next = (i + 1) % len(self.ptrs)
        self._settle(i)
        return i

    def h2d(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue host ``src`` -> device ``dst`` on ``stream``; returns once ``src`` has been read."""
        chunk = self.chunk
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            i = self._take()
            parallel_memmove(self.ptrs[i], src + off, n)
            check(driver.cuMemcpyHtoDAsync(dst + off, self.ptrs[i], n, stream), "cuMemcpyHtoDAsync")
            self.pending[i] = _WAIT
            check(driver.cuEventRecord(self.events[i], stream), "cuEventRecord(staging)")

    def d2h(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue device ``src`` -> host ``dst`` on ``stream``; the bytes reach ``dst`` by :meth:`flush`
        at the latest (earlier when a later copy needs the chunk)."""
        chunk = self.chunk
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            i = self._take()
            check(driver.cuMemcpyDtoHAsync(self.ptrs[i], src + off, n, stream), "cuMemcpyDtoHAsync")
            self.pending[i] = _WAIT
            check(driver.cuEventRecord(self.events[i], stream), "cuEventRecord(staging)")
            self.pending[i] = (dst + off, n)

    def flush(self) -> None:
        """Deliver every pending D2H chunk to its host destination, oldest first (H2D DMAs may go on)."""
        k = len(self.ptrs)
        for j in range(k):
            i = (self.next + j) % k
            if self.pending[i] not in (None, _WAIT):
                self._settle(i)

    def discard(self) -> None:
        """Forget pending D2H deliveries (after an error: their destinations may be gone); the DMAs
        are still waited for before a chunk is reused."""
        for i, p in enumerate(self.pending):
            if p is not None:
                self.pending[i] = _WAIT

    def close(self) -> None:  # only used when construction fails; pools otherwise live with the process
        for e in self.events:
            driver.cuEventDestroy(e)
        for p in self.ptrs:
            driver.cuMemFreeHost(p)
        self.events, self.ptrs, self.pending = [], [], []


def _get_staging(device_id: int) -> _Staging | None:
    """The device's pinned pool, made on first use; None when pinned allocation failed (warned once)."""
    st = _staging.get(device_id, False)
    if st is not False:
        return st
    with _staging_lock:
        st = _staging.get(device_id, False)
        if st is False:
            try:
                st = _Staging(STAGING_CHUNK, STAGING_CHUNKS)
            except Exception as e:  # e.g. pinned memory exhausted: fall back to pageable copies
                warnings.warn(f"cudattn: no pinned staging buffers ({e}); using pageable copies", RuntimeWarning, 2)
                st = None
            _staging[device_id] = st
    return st


def staging_pool(device_id: int) -> _Staging | None:
    """The pinned staging pool of ``device_id`` (whose context must be current), or None when
    staging is off (``CUDATTN_PINNED_STAGING=0``) or pinned memory could not be had.
    Hold its ``lock`` while using it."""
    return _get_staging(device_id) if _staging_enabled else None


def _copy_h2d(dst: int, src: int, nbytes: int, stream: int, device_id: int) -> None:
    """Host ``src`` -> device ``dst``, ordered on ``stream``; returns before the DMA ends (``src`` reusable)."""
    _recording.refuse("_copy_h2d")
    st = _get_staging(device_id) if _staging_enabled and nbytes >= STAGING_MIN else None
    if st is None:
        check(driver.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")
        return
    with st.lock:
        st.h2d(dst, src, nbytes, stream)


def _copy_d2h(dst: int, src: int, nbytes: int, stream: int, device_id: int) -> None:
    """Device ``src`` -> host ``dst``, ordered on ``stream``; returns when ``dst`` holds the data."""
    _recording.refuse("_copy_d2h")
    st = _get_staging(device_id) if _staging_enabled and nbytes >= STAGING_MIN else None
    if st is None:
        check(driver.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return
    with st.lock:
        try:
            st.d2h(dst, src, nbytes, stream)
            st.flush()
        except BaseException:
            st.discard()
            raise


def zero_fill(arr: DeviceArray, *, stream=None) -> None:
    """Write zeros over every element of a view whose last axis is contiguous (asynchronous on
    ``stream``): one memset when the view is dense, else one 2-D memset per leading index pair."""
    _recording.refuse("zero_fill")
    if arr.size == 0:
        return
    itemsize = arr.dtype.itemsize
    if _is_dense(arr.shape, arr.strides, itemsize):
        memset(arr, 0, stream=stream)
        return
    if arr.ndim != 4 or arr.strides[3] != itemsize:
        raise ValueError("zero_fill needs a dense array or a 4-D view with a contiguous last axis")
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    arr.stream_handle = h
    n0, n1, n2, n3 = arr.shape
    s0, s1, s2, _ = arr.strides
    for i0 in range(n0):
        for i1 in range(n1):
            dst = arr.ptr + i0 * s0 + i1 * s1
            check(driver.cuMemsetD2D8Async(dst, s2, 0, n3 * itemsize, n2, h), "cuMemsetD2D8Async")


def nan_pattern(dtype) -> int:
    """The quiet-NaN bit pattern :meth:`DeviceArray.fill_nan` writes for ``dtype``."""
    try:
        return _NAN_BITS[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no NaN bit pattern for dtype {np.dtype(dtype)}") from None


def memset(arr: DeviceArray, pattern: int, *, stream=None) -> None:
    """Write the ``itemsize``-wide bit ``pattern`` over every element (asynchronous on ``stream``).

    ``cuMemsetD8/D16/D32Async`` over the array's byte span, so the view must be
    dense (no gaps, no overlap; any axis order). 8-byte elements only take
    ``pattern=0``.
    """
    _recording.refuse("memset")
    itemsize = arr.dtype.itemsize
    if arr.size == 0:
        return
    if not _is_dense(arr.shape, arr.strides, itemsize):
        raise ValueError("memset needs a dense array (its elements must cover their byte span exactly once)")
    pattern = int(pattern)
    if pattern < 0 or pattern >= 1 << (8 * itemsize):
        raise ValueError(f"pattern {pattern:#x} does not fit in {itemsize} byte(s)")
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    arr.stream_handle = h  # the contents are now produced on h
    lo, hi = _span(arr.shape, arr.strides, itemsize)
    dst = arr.ptr + lo
    n = arr.size
    if pattern == 0 or itemsize == 1:  # pattern is one byte wide, or zero
        check(driver.cuMemsetD8Async(dst, pattern, hi - lo, h), "cuMemsetD8Async")
    elif itemsize == 2:
        check(driver.cuMemsetD16Async(dst, pattern, n, h), "cuMemsetD16Async")
    elif itemsize == 4:
        check(driver.cuMemsetD32Async(dst, pattern, n, h), "cuMemsetD32Async")
    else:
        raise TypeError(f"memset: a non-zero pattern needs 1-, 2- or 4-byte elements, not {itemsize}")

