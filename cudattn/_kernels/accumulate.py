"""The ring backward's float32 accumulators (cu_src/ring_accumulate.cu): ``ring_add`` adds a 16-bit
array into a float32 one, ``ring_store`` rounds a float32 array into a 16-bit one, both over arrays
of one shape laid out as rows of equal pitch (C-contiguous arrays and slices of one axis of them)."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.dtypes import BFLOAT16, FLOAT16
from . import registry as _kernels
from .decode_traits import HelperKernel

SOURCE = "ring_accumulate.cu"
THREADS = 256  # ring_accumulate.cu: ringacc::THREADS
_CODES = {FLOAT16: 1, BFLOAT16: 2}
_ADD_CODES = {np.dtype(np.float32): 0, **_CODES}  # ring_add also adds float32 (the sinks' gradients)


class RingAddParams(ctypes.Structure):
    """``RingAddParams`` of cu_src/ring_accumulate.cu, field for field."""

    _fields_ = [("src", ctypes.c_void_p), ("dst", ctypes.c_void_p), ("rows", ctypes.c_longlong),
                ("cols", ctypes.c_longlong), ("src_pitch", ctypes.c_longlong), ("dst_pitch", ctypes.c_longlong)]


def add_kernel(dtype) -> HelperKernel:
    return HelperKernel(SOURCE, "ring_add", (("CUDATTN_ADD_IN", _ADD_CODES[np.dtype(dtype)]),), threads=THREADS)


def store_kernel(dtype) -> HelperKernel:
    return HelperKernel(SOURCE, "ring_store", (("CUDATTN_STORE_OUT", _CODES[np.dtype(dtype)]),), threads=THREADS)


def all_accumulate_kernels() -> list[HelperKernel]:
    return [add_kernel(dt) for dt in _ADD_CODES] + [store_kernel(dt) for dt in _CODES]


def rows_of(shape: tuple, strides: tuple, itemsize: int) -> tuple[int, int, int]:
    """``(rows, cols, pitch)`` in elements of an array whose axes past some axis r are dense and whose
    axes up to r step evenly (a C-contiguous array, or a slice of one axis of one): rows of ``cols``
    elements ``pitch`` apart. ValueError for other layouts."""
    st = [s // itemsize for s in strides]
    n = len(shape)
    dense = 1
    r = n
    while r > 0 and (shape[r - 1] == 1 or st[r - 1] == dense):
        dense *= shape[r - 1]
        r -= 1
    if r == 0:
        return 1, dense, dense
    pitch = st[r - 1]
    for i in range(r - 1):
        if shape[i] != 1 and st[i] != st[i + 1] * shape[i + 1]:
            raise ValueError(f"strides {tuple(strides)} of shape {tuple(shape)} are not rows of one pitch")
    return math.prod(shape[:r]), dense, pitch


def _launch_rows(spec: HelperKernel, src, dst, stream: int) -> None:
    if src.shape != dst.shape:
        raise ValueError(f"shapes {src.shape} and {dst.shape} differ")
    rows, cols, sp = rows_of(src.shape, src.strides, src.dtype.itemsize)
    rows_d, cols_d, dp = rows_of(dst.shape, dst.strides, dst.dtype.itemsize)
    if rows == 1 and (rows_d, cols_d) != (1, cols):  # a dense side splits into the other side's rows
        rows, cols, sp = rows_d, cols_d, cols_d
    elif rows_d == 1 and (rows, cols) != (1, cols_d):
        rows_d, cols_d, dp = rows, cols, cols
    if (rows, cols) != (rows_d, cols_d):
        raise ValueError(f"layouts of shape {src.shape} do not split into the same rows: {src.strides}, {dst.strides}")
    if rows * cols == 0:
        return
    device_id = dst.device_id
    device = _device.get_device(device_id)
    props = _device.device_properties(device_id)
    p = RingAddParams(src.ptr, dst.ptr, rows, cols, sp, dp)
    grid = (max(1, min(props.sm_count * 8, -(-rows * cols // THREADS))), 1, 1)
    kernel = _kernels.get_kernel(spec, device, device_id, props.arch)
    _launch.launch(kernel, grid, (THREADS, 1, 1), 0, stream, p)


def add_into(dst, src, stream: int) -> None:
    """``dst += src`` on ``stream``: ``dst`` float32, ``src`` float16 or bfloat16, one shape."""
    _launch_rows(add_kernel(src.dtype), src, dst, stream)


def store(dst, src, stream: int) -> None:
    """``dst = src`` rounded on ``stream``: ``src`` float32, ``dst`` float16 or bfloat16, one shape."""
    _launch_rows(store_kernel(dst.dtype), src, dst, stream)
