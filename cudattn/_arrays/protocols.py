"""The array protocols read field by field: DLPack and the CUDA Array Interface into DeviceArrays, zero copies.

:func:`as_device_array` wraps a ``DeviceArray`` (returned as is), anything with ``__dlpack__`` on
a CUDA device (preferred: it carries bfloat16, which PyTorch's CUDA Array Interface refuses), else
anything with ``__cuda_array_interface__`` (v2 or v3), with a precise message for each malformed
producer. The importer (`importer`, the one entry for every operand) takes the fast route through
cuda.core's ``StridedMemoryView`` where it can; this module serves what the view cannot take (FP8
that crosses DLPack as uint8, producers other than torch and CuPy) and ``cudattn.as_device_array``.

Wrapping makes no CUDA call, except ``cuPointerGetAttribute`` to learn the device of a CAI pointer
(CAI does not say) and the stream ordering a producer asks for (DLPack's ``stream=``, CAI v3's
``"stream"``).
"""

from __future__ import annotations

import numbers
import operator

import numpy as np
from cuda.bindings import driver

from . import dlpack as _dlpack
from .array import DeviceArray
from .._runtime.device import _ensure_init, get_device
from .dlpack import kDLCUDA, kDLCUDAManaged
from .._runtime.errors import check
from .._runtime.stream import CU_STREAM_LEGACY, stream_wait

__all__ = ["as_device_array", "is_device_array_like", "device_id_of", "stream_of"]

_CUDA_DEVICE_TYPES = (kDLCUDA, kDLCUDAManaged)
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                        10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}  # fmt: skip

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

