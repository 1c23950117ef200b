"""A tensor argument read and checked: its shape, byte strides, dtype and address (NumPy or device), and
its strides as the kernels take them (`TensorGeom`), with the rules that make them safe: unit
stride on the head dim, 16-byte alignment, 64-bit offsets that fit, no self-overlapping output."""

from __future__ import annotations

import numpy as np

from .geometry import TensorGeom
from .geometry import c_strides as _c_strides

#: The kernels load 16-byte vectors: data pointers and every stride but the last must be multiples of this.
ALIGN_BYTES = 16

#: Kernels index with 64-bit offsets; refuse anything that could come near overflowing them.
_MAX_ELEMENT_OFFSET = 2**62

#: Batch, sequence lengths and head counts go to the kernels as 32-bit ints.
_MAX_SIZE = 2**31 - 1

_LAYOUT_AXES = {
    # name -> axes of a 4-D tensor in that layout, for q and for k/v (used in messages)
    "bshd": ("(batch, seqlen_q, heads_q, head_dim)", "(batch, seqlen_k, heads_kv, head_dim)"),
    "bhsd": ("(batch, heads_q, seqlen_q, head_dim)", "(batch, heads_kv, seqlen_k, head_dim)"),
}

# Index of the (batch, seq, head) axes in a 4-D shape, per layout.
_BSH = {"bshd": (0, 1, 2), "bhsd": (0, 2, 1)}

_AXIS_NAMES = ("batch", "seqlen", "heads")


def kind_name(x: object) -> str:
    return "numpy.ndarray" if isinstance(x, np.ndarray) else f"{type(x).__module__}.{type(x).__qualname__}"


def describe_array(name: str, x: object, host: bool):
    """(shape, byte strides, dtype, data pointer) of a NumPy or device array."""
    if host:
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(
                f"{name} is a masked array; cudattn would ignore its mask, so pass "
                f"{name}.filled(0) or np.asarray({name}) to say what you mean"
            )
        return x.shape, x.strides, x.dtype, x.ctypes.data  # type: ignore[attr-defined]
    try:
        shape, strides, dtype, ptr = x.shape, x.strides, x.dtype, x.ptr  # type: ignore[attr-defined]
    except AttributeError:
        raise TypeError(
            f"{name} must be a NumPy array or a device array exposing shape, strides (bytes), dtype "
            f"and ptr; got {kind_name(x)}"
        ) from None
    if type(shape) is not tuple:
        shape = tuple(shape)
    if not isinstance(dtype, np.dtype):
        try:
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise TypeError(f"{name}.dtype must be a NumPy dtype; got {dtype!r}") from None
    if strides is None:  # __cuda_array_interface__ convention: None means C-contiguous
        strides = _c_strides(shape, dtype.itemsize)
    elif type(strides) is not tuple:
        strides = tuple(strides)
    return shape, strides, dtype, int(ptr)


def tensor_geom(name: str, shape: tuple, strides: tuple, itemsize: int, ptr: int, layout: str) -> TensorGeom:
    """Check the strides and pointer of a 4-D tensor and return its element strides in (batch, seq, head) order.

    An axis of extent 1 is never stepped along, so its stride is not checked; an unusable one
    (negative, unaligned) is recorded as 0.
    """
    if len(strides) != 4:
        raise ValueError(f"{name} has {len(strides)} strides for its 4-D shape {shape}")
    if 0 in shape:  # never read, so its strides and pointer do not matter (NumPy gives it 0 strides)
        return TensorGeom(0, 0, 0)
    last = strides[3]
    if last != itemsize:
        got = f"{last // itemsize} elements" if last % itemsize == 0 else f"{last} bytes"
        raise ValueError(
            f"{name} must have unit stride in its last (head_dim) axis; got stride {got}; "
            f"pass np.ascontiguousarray({name}) or a view whose last axis is contiguous"
        )
    elem = []
    span = 0
    for axis, i in enumerate(_BSH[layout]):
        s = strides[i]
        n = shape[i]
        if n == 1:
            elem.append(s // itemsize if 0 <= s <= _MAX_ELEMENT_OFFSET and s % ALIGN_BYTES == 0 else 0)
            continue
        if s < 0:
            raise ValueError(
                f"{name} has a negative stride ({s} bytes) in its {_AXIS_NAMES[axis]} axis; cudattn does not "
                f"take reversed views (e.g. x[:, ::-1]); pass np.ascontiguousarray({name})"
            )
        if s % itemsize:
            raise ValueError(
                f"{name}'s {_AXIS_NAMES[axis]} stride ({s} bytes) is not a multiple of its element size "
                f"({itemsize} bytes)"
            )
        if s % ALIGN_BYTES:
            raise ValueError(
                f"{name}'s {_AXIS_NAMES[axis]} stride ({s} bytes) is not a multiple of {ALIGN_BYTES} bytes: "
                f"the kernel loads {ALIGN_BYTES}-byte vectors, so the data pointer and every stride but the "
                f"last must be {ALIGN_BYTES}-byte aligned; pass np.ascontiguousarray({name})"
            )
        e = s // itemsize
        elem.append(e)
        span += (n - 1) * e
    if ptr % ALIGN_BYTES:
        raise ValueError(
            f"{name}'s data pointer {ptr:#x} is not a multiple of {ALIGN_BYTES} bytes: the kernel loads "
            f"{ALIGN_BYTES}-byte vectors, so the data pointer and every stride but the last must be "
            f"{ALIGN_BYTES}-byte aligned; pass a fresh copy ({name}.copy()) or a view that starts on a "
            f"{ALIGN_BYTES}-byte boundary"
        )
    if span + shape[3] > _MAX_ELEMENT_OFFSET:
        raise ValueError(f"{name} spans more than 2**62 elements (shape {shape}, strides {strides} bytes)")
    return TensorGeom(elem[0], elem[1], elem[2])


def check_no_overlap(shape: tuple, geom: TensorGeom, layout: str) -> None:
    """Refuse an `out` whose elements alias (stride 0, or strides that interleave): kernels would race."""
    b, s, h = _BSH[layout]
    axes = [(geom.batch, shape[b]), (geom.seq, shape[s]), (geom.head, shape[h])]
    axes = sorted((st, n) for st, n in axes if n > 1)
    reach = shape[3]  # elements covered by one index of the axes so far (a contiguous head_dim row)
    for st, n in axes:
        if st < reach:
            raise ValueError(
                f"out has overlapping elements (element strides (batch, seq, head) = "
                f"({geom.batch}, {geom.seq}, {geom.head}) for shape {shape}); it must not alias itself"
            )
        reach = st * (n - 1) + reach
