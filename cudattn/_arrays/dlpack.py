"""DLPack in both directions, in ctypes: export a strided device view, import a producer's capsule.

Why our own and not cuda.core's: cuda.core 1.2 can export (``StridedMemoryView``
/ ``Buffer.__dlpack__``), but building its view of a pointer queries the driver
(``cuPointerGetAttributes``), so export/import could not be tested without a GPU;
its DLPack import has changed between releases (``byte_offset`` handling fixed in
1.2.0); and cudattn must send FP8 as ``uint8`` (DESIGN §2), which is a
reinterpretation of our own. The protocol is small, so it lives here, tested on
CPU.

Export (:func:`to_capsule`) produces the *legacy* ``"dltensor"`` capsule
(``DLManagedTensor``). Every consumer accepts it, including those that asked for
``max_version=(1, x)`` (the spec lets a producer answer a versioned request with
a legacy capsule).

Ownership and reference counting of an exported capsule:

- :func:`to_capsule` allocates the ``DLManagedTensor`` and its shape/strides
  arrays with ctypes and files them, together with a strong reference to the
  ``owner`` (the array, which keeps the memory alive), in ``_live`` under the
  struct's address. That entry is the one and only reference the export holds.
- The struct's ``deleter`` is :data:`_c_deleter`; it pops the entry, which frees
  the ctypes memory and drops the owner reference. Popping is idempotent.
- A consumer that takes the tensor renames the capsule ``"used_dltensor"`` and
  calls ``deleter`` when it is done (from any thread: ctypes callbacks take the
  GIL themselves).
- The capsule's destructor (:data:`_c_capsule_destructor`) calls the deleter only
  if the capsule is still named ``"dltensor"``, i.e. nobody consumed it.
  It works on the raw ``PyObject*`` (never turning it back into a Python
  object, which would resurrect a capsule that is being destroyed).

Import (:func:`from_capsule`) accepts both ``"dltensor"`` and
``"dltensor_versioned"``, renames the capsule ``"used_…"`` (so its destructor
will not free it), and returns a :class:`ForeignTensor` whose ``__del__`` calls
the producer's deleter exactly once. Keep that object alive as long as the memory
is used (``DeviceArray`` keeps it as its owner).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import ml_dtypes
import numpy as np

__all__ = [
    "ForeignTensor",
    "ImportedTensor",
    "dlpack_dtype",
    "from_capsule",
    "numpy_dtype",
    "to_capsule",
]

# DLDeviceType
kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLCUDAManaged = 13

# DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6
kDLFloat8_e4m3fn = 10
kDLFloat8_e5m2 = 12

DLPACK_FLAG_BITMASK_READ_ONLY = 1

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

# numpy dtype -> (code, bits) sent over DLPack. FP8 goes out as uint8: consumers
# (PyTorch, NumPy, CuPy) reject the fp8 codes today (DESIGN §2).
_EXPORT: dict[np.dtype, tuple[int, int]] = {
    np.dtype(np.float16): (kDLFloat, 16),
    np.dtype(np.float32): (kDLFloat, 32),
    np.dtype(np.float64): (kDLFloat, 64),
    BF16: (kDLBfloat, 16),
    FP8_E4M3: (kDLUInt, 8),
    np.dtype(np.bool_): (kDLBool, 8),
    np.dtype(np.complex64): (kDLComplex, 64),
    np.dtype(np.complex128): (kDLComplex, 128),
}
for _t in (np.int8, np.int16, np.int32, np.int64):
    _EXPORT[np.dtype(_t)] = (kDLInt, np.dtype(_t).itemsize * 8)
for _t in (np.uint8, np.uint16, np.uint32, np.uint64):
    _EXPORT[np.dtype(_t)] = (kDLUInt, np.dtype(_t).itemsize * 8)

# (code, bits) -> numpy dtype, received over DLPack.
_IMPORT: dict[tuple[int, int], np.dtype] = {v: k for k, v in _EXPORT.items() if k != FP8_E4M3}
_IMPORT[(kDLFloat8_e4m3fn, 8)] = FP8_E4M3  # what PyTorch sends for torch.float8_e4m3fn
_IMPORT[(kDLFloat8_e5m2, 8)] = np.dtype(ml_dtypes.float8_e5m2)


def dlpack_dtype(dtype) -> tuple[int, int]:
    """``(code, bits)`` under which ``dtype`` is exported; ``BufferError`` if it has none."""
    try:
        return _EXPORT[np.dtype(dtype)]
    except KeyError:
        raise BufferError(f"dtype {np.dtype(dtype)} cannot be exported through DLPack") from None


def numpy_dtype(code: int, bits: int, lanes: int = 1) -> np.dtype:
    """NumPy dtype of a DLPack ``DLDataType``; ``TypeError`` for unsupported ones."""
    if lanes != 1:
        raise TypeError(f"vector DLPack dtypes (lanes={lanes}) are not supported")
    try:
        return _IMPORT[(code, bits)]
    except KeyError:
        raise TypeError(f"unsupported DLPack dtype (code={code}, bits={bits})") from None


# --------------------------------------------------------------------------- structs


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# void (*deleter)(DLManagedTensor*), taken as void* so one prototype serves both structs.
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# --------------------------------------------------------------------------- capsule C API

_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"
_NAME_V = b"dltensor_versioned"
_USED_NAME_V = b"used_dltensor_versioned"
# The capsule keeps a pointer to its name, so the names must live as long as the
# process: module-level ctypes buffers never move and are never freed.
_c_name = ctypes.create_string_buffer(_NAME)
_c_used_name = ctypes.create_string_buffer(_USED_NAME)
_c_used_name_v = ctypes.create_string_buffer(_USED_NAME_V)

_api = ctypes.pythonapi
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api)
)
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_PyCapsule_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(("PyCapsule_SetName", _api))
# Raw-pointer variants for the capsule destructor, which must not touch the dying object's refcount.
_PyCapsule_IsValid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_PyCapsule_GetPointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

# --------------------------------------------------------------------------- export

# address of an exported DLManagedTensor -> (struct, shape array, strides array, owner)
_live: dict[int, tuple] = {}


def _release(addr) -> None:
    """The deleter: drop the export's memory and its reference to the owner (idempotent)."""
    if addr:
        _live.pop(addr, None)


_c_deleter = DELETER(_release)


def _capsule_destructor(capsule_ptr) -> None:
    try:
        if _PyCapsule_IsValid_raw(capsule_ptr, _NAME):  # still "dltensor": never consumed
            _release(_PyCapsule_GetPointer_raw(capsule_ptr, _NAME))
    except Exception:  # at interpreter shutdown module globals may already be gone
        pass


_c_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor)
_c_capsule_destructor_ptr = ctypes.cast(_c_capsule_destructor, ctypes.c_void_p).value


def to_capsule(
    ptr: int,
    shape: tuple[int, ...],
    strides_bytes: tuple[int, ...],
    dtype: np.dtype,
    device: tuple[int, int],
    owner: object,
):
    """A ``"dltensor"`` capsule describing a strided view; holds ``owner`` until the deleter runs.

    ``strides_bytes`` are NumPy-style byte strides; DLPack wants element strides,
    so each must be a multiple of the itemsize (``BufferError`` otherwise).
    ``device`` is ``(device_type, device_id)``.
    """
    code, bits = dlpack_dtype(dtype)
    itemsize = np.dtype(dtype).itemsize
    ndim = len(shape)
    elem_strides = []
    for s in strides_bytes:
        if s % itemsize:
            raise BufferError(
                f"stride of {s} bytes is not a multiple of the itemsize {itemsize}; DLPack cannot describe it"
            )
        elem_strides.append(s // itemsize)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*elem_strides)

    mt = DLManagedTensor()
    t = mt.dl_tensor
    t.data = ptr or None
    t.device.device_type = device[0]
    t.device.device_id = device[1]
    t.ndim = ndim
    t.dtype.code = code
    t.dtype.bits = bits
    t.dtype.lanes = 1
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    mt.deleter = _c_deleter
    addr = ctypes.addressof(mt)
    mt.manager_ctx = addr

    _live[addr] = (mt, shape_arr, strides_arr, owner)
    try:
        return _PyCapsule_New(addr, ctypes.addressof(_c_name), _c_capsule_destructor_ptr)
    except BaseException:
        _release(addr)
        raise


def live_exports() -> int:
    """Number of exported tensors whose deleter has not run yet (for tests and leak hunting)."""
    return len(_live)


# --------------------------------------------------------------------------- import


class ForeignTensor:
    """Owns a consumed DLPack tensor: calls the producer's deleter once, when collected."""

    __slots__ = ("_managed", "_deleter", "producer", "__weakref__")

    def __init__(self, managed: int, deleter: int, producer: object = None):
        self._managed = managed
        self._deleter = deleter
        self.producer = producer  # the exporting object, kept alive too (belt and braces)

    def release(self) -> None:
        managed, deleter = self._managed, self._deleter
        self._managed = self._deleter = 0
        if managed and deleter:
            # A ctypes foreign call releases the GIL; producers' deleters take it if they need it.
            DELETER(deleter)(managed)

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


class ImportedTensor(NamedTuple):
    ptr: int  # data + byte_offset
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # bytes; None = C-contiguous
    dtype: np.dtype
    device_type: int
    device_id: int
    readonly: bool
    owner: ForeignTensor


def from_capsule(capsule, producer: object = None) -> ImportedTensor:
    """Consume a DLPack capsule (legacy or versioned): rename it ``used_…`` and describe the tensor.

    The returned ``owner`` must be kept alive while the memory is in use; when it
    is collected the producer's deleter runs. Raises ``TypeError`` for an object
    that is not an unconsumed DLPack capsule or for an unsupported dtype (the
    deleter still runs, via ``owner``, in the latter case).
    """
    if _PyCapsule_IsValid(capsule, _NAME_V):
        addr = _PyCapsule_GetPointer(capsule, _NAME_V)
        mtv = DLManagedTensorVersioned.from_address(addr)
        deleter = ctypes.cast(mtv.deleter, ctypes.c_void_p).value or 0
        if _PyCapsule_SetName(capsule, ctypes.addressof(_c_used_name_v)) != 0:
            raise BufferError("could not mark the DLPack capsule as consumed")
        owner = ForeignTensor(addr, deleter, producer)
        if mtv.version.major != 1:
            raise BufferError(f"unsupported DLPack version {mtv.version.major}.{mtv.version.minor} (expected 1.x)")
        t = mtv.dl_tensor
        readonly = bool(mtv.flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    elif _PyCapsule_IsValid(capsule, _NAME):
        addr = _PyCapsule_GetPointer(capsule, _NAME)
        mt = DLManagedTensor.from_address(addr)
        deleter = ctypes.cast(mt.deleter, ctypes.c_void_p).value or 0
        if _PyCapsule_SetName(capsule, ctypes.addressof(_c_used_name)) != 0:
            raise BufferError("could not mark the DLPack capsule as consumed")
        owner = ForeignTensor(addr, deleter, producer)
        t = mt.dl_tensor
        readonly = False
    else:
        raise TypeError("expected an unconsumed DLPack capsule ('dltensor' or 'dltensor_versioned')")

    ndim = t.ndim
    dtype = numpy_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides and ndim:
        itemsize = dtype.itemsize
        strides = tuple(int(t.strides[i]) * itemsize for i in range(ndim))
    else:
        strides = None
    ptr = (t.data or 0) + int(t.byte_offset)
    return ImportedTensor(
        ptr=ptr,
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type=int(t.device.device_type),
        device_id=int(t.device.device_id),
        readonly=readonly,
        owner=owner,
    )
