"""Tensor maps for Hopper's TMA (``cuTensorMapEncodeTiled``), encoded on the host.

A tensor map is 128 opaque bytes that a kernel receives by value (inside its ``__grid_constant__``
params struct, at a 64-byte aligned offset) and hands to ``cp.async.bulk.tensor``. Encoding needs
the driver but no context or launch; the map holds the global address, so it is made per call.
"""

from __future__ import annotations

import ctypes

import numpy as np
from cuda.bindings import driver

from ._dtypes import BFLOAT16, FLOAT16
from ._errors import check

TENSOR_MAP_BYTES = 128

_DATA_TYPE = {
    FLOAT16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    BFLOAT16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
}


def _u64(x: int):
    return driver.cuuint64_t(int(x))  # older cuda-bindings take only the wrapper types here


def _u32(x: int):
    return driver.cuuint32_t(int(x))


def encode_2d(ptr: int, dtype, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int) -> bytes:
    """A tiled map of a row-major ``rows x cols`` matrix at ``ptr`` (16-bit elements), boxes of
    ``box_rows x box_cols`` written to shared memory in the 128-byte swizzle layout (so a box
    row is at most 128 bytes: 64 halves). Out-of-bounds elements of a box read as zero."""
    dt = np.dtype(dtype)
    if dt not in _DATA_TYPE:
        raise TypeError(f"TMA maps are made for float16 and bfloat16 here; got {dt}")
    if box_cols * dt.itemsize > 128:
        raise ValueError(f"a 128-byte-swizzled box row holds at most 128 bytes; got {box_cols} x {dt.itemsize}")
    if ptr % 16 or row_stride_bytes % 16:
        raise ValueError("TMA needs a 16-byte aligned base address and row stride")
    tmap = check(driver.cuTensorMapEncodeTiled(
        _DATA_TYPE[dt], 2, ptr, [_u64(cols), _u64(rows)], [_u64(row_stride_bytes)],
        [_u32(box_cols), _u32(box_rows)], [_u32(1), _u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)
