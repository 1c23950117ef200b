"""Tensor maps for Hopper's TMA (``cuTensorMapEncodeTiled``), encoded on the host.

A tensor map is 128 opaque bytes that a kernel receives by value (inside its ``__grid_constant__``
params struct, at a 64-byte aligned offset) and hands to ``cp.async.bulk.tensor``. Encoding needs
the driver but no context or launch; the map holds the global address, so it is made per call.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from cuda.bindings import driver

from .._runtime import recording as _recording
from .._spec.dtypes import BFLOAT16, FLOAT8_E4M3, FLOAT16
from .._runtime.errors import check

TENSOR_MAP_BYTES = 128

_DATA_TYPE = {
    FLOAT16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    BFLOAT16: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    FLOAT8_E4M3: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,  # TMA only moves the bytes
    np.dtype(np.float32): driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,  # the backward's dQ sums
}


def _u64(x: int):
    return driver.cuuint64_t(int(x))  # older cuda-bindings take only the wrapper types here


def _u32(x: int):
    return driver.cuuint32_t(int(x))


_SWIZZLE = {128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B}


def encode(ptr: int, dtype, dims, strides_bytes, box, swizzle: int = 128) -> bytes:
    """A tiled map of a tensor at ``ptr`` (16-bit, e4m3 or float32 elements). ``dims`` and ``box`` list the axes
    innermost first (the innermost has unit stride); ``strides_bytes`` the byte strides of the
    others. Boxes land in shared memory in the ``swizzle``-byte swizzle layout (128 or 64), so a box
    row is at most that many bytes. Out-of-bounds elements of a box read as zero and are not stored."""
    dt = np.dtype(dtype)
    if dt not in _DATA_TYPE:
        raise TypeError(f"TMA maps are made for float16, bfloat16, float8_e4m3fn and float32 here; got {dt}")
    if len(strides_bytes) != len(dims) - 1 or len(box) != len(dims):
        raise ValueError(f"{len(dims)} dims need {len(dims) - 1} strides and {len(dims)} box sizes")
    if swizzle not in _SWIZZLE:
        raise ValueError(f"swizzle must be 128 or 64 bytes; got {swizzle}")
    if box[0] * dt.itemsize > swizzle:
        raise ValueError(f"a {swizzle}-byte-swizzled box row holds at most {swizzle} bytes; got {box[0]} x {dt.itemsize}")
    if ptr % 16 or any(st % 16 or st <= 0 for st in strides_bytes):
        raise ValueError(f"TMA needs a 16-byte aligned base address and positive strides that are multiples of "
                         f"16 bytes; got address {ptr:#x}, strides {tuple(strides_bytes)}")
    rank = len(dims)
    tmap = check(driver.cuTensorMapEncodeTiled(
        _DATA_TYPE[dt], rank, ptr, [_u64(d) for d in dims], [_u64(st) for st in strides_bytes],
        [_u32(b) for b in box], [_u32(1)] * rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        _SWIZZLE[swizzle],
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


def encode_2d(ptr: int, dtype, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int) -> bytes:
    """A tiled map of a row-major ``rows x cols`` matrix, boxes of ``box_rows x box_cols``."""
    return encode(ptr, dtype, (cols, rows), (row_stride_bytes,), (box_cols, box_rows))


def encode_attention_operand(ptr: int, dtype, head_dim: int, seqlen: int, heads: int, batch: int, geom,
                             box_rows: int, row_bytes: int = 128) -> bytes:
    """See `_encode_attention_operand`; a recorded call (`_runtime.recording`) notes the map's address."""
    raw = _encode_attention_operand(ptr, dtype, head_dim, seqlen, heads, batch, geom, box_rows, row_bytes)
    if _recording.active:
        _note(ptr, raw)
    return raw


def encode_vt(ptr: int, dtype, head_dim: int, seq_pad: int, heads: int, batch: int, box_rows: int) -> bytes:
    """See `_encode_vt`; a recorded call (`_runtime.recording`) notes the map's address."""
    raw = _encode_vt(ptr, dtype, head_dim, seq_pad, heads, batch, box_rows)
    if _recording.active:
        _note(ptr, raw)
    return raw


def encode_dq_accum(ptr: int, tile_dim: int, heads: int, rows_s: int, rows_b: int, box_rows: int) -> bytes:
    """The 4-D map (column, head, row, batch) of the backward's float32 dQ accumulator, contiguous
    (rows_b * rows_s, heads, tile_dim), boxes of 32 columns (one 128-byte swizzle row) x ``box_rows``
    rows of one head: the Hopper kernel adds its blocks into it. Rows past rows_s are outside the
    map, so a padded batch's block tail is dropped; in a packed batch the tail's rows are the next
    sequence's, and get zeros added (those queries' dS is 0). A recorded call notes the map's address."""
    raw = _encode_dq_accum(ptr, tile_dim, heads, rows_s, rows_b, box_rows)
    if _recording.active:
        _note(ptr, raw)
    return raw


@functools.lru_cache(maxsize=256)
def _encode_dq_accum(ptr: int, tile_dim: int, heads: int, rows_s: int, rows_b: int, box_rows: int) -> bytes:
    """Memoised as `_encode_attention_operand` is: the workspace is often at the address it had last call."""
    row = tile_dim * 4
    return encode(ptr, np.float32, (tile_dim, heads, rows_s, rows_b), (row, row * heads, row * heads * rows_s),
                  (32, 1, box_rows, 1))


def _note(ptr: int, raw: bytes) -> None:
    rec = _recording.current()
    if rec is not None:
        rec.tensor_map(ptr, raw)


def replace_address(raw: bytes, ptr: int) -> bytes:
    """``raw`` (a map's 128 bytes) pointing at ``ptr`` instead (``cuTensorMapReplaceAddress``)."""
    tmap = driver.CUtensorMap()
    ctypes.memmove(tmap.getPtr(), raw, TENSOR_MAP_BYTES)
    check(driver.cuTensorMapReplaceAddress(tmap, ptr), "cuTensorMapReplaceAddress")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


@functools.lru_cache(maxsize=1024)
def _encode_attention_operand(ptr: int, dtype, head_dim: int, seqlen: int, heads: int, batch: int, geom,
                              box_rows: int, row_bytes: int = 128) -> bytes:
    """The 4-D map (head dim, seq, head, batch) of a q/k/v/out tensor with element strides ``geom``
    (a TensorGeom), boxes of one ``row_bytes`` swizzle row (128: 64 16-bit or 128 e4m3 columns; 64:
    the 64 e4m3 columns of FP8's head-dim-64 tile) x ``box_rows`` sequence rows. A size-1 axis may carry any
    stride (even 0); TMA never steps along it, so it gets a dense one that TMA accepts.

    Memoised: the map is a pure function of these arguments (a new buffer at a freed one's
    address gets the same, still right, map), and encoding costs ~20 us through cuda-bindings:
    three per call tripled the Hopper path's host overhead (42 -> 110 us, H100)."""
    item = np.dtype(dtype).itemsize
    sizes = (head_dim, seqlen, heads, batch)
    strides = []
    prev_stride, prev_size = item, head_dim
    for size, st in zip(sizes[1:], (geom.seq, geom.head, geom.batch)):
        st_bytes = st * item if size > 1 else prev_stride * prev_size
        strides.append(st_bytes)
        prev_stride, prev_size = st_bytes, size
    return encode(ptr, dtype, sizes, strides, (row_bytes // item, box_rows, 1, 1), swizzle=row_bytes)


@functools.lru_cache(maxsize=256)
def _encode_vt(ptr: int, dtype, head_dim: int, seq_pad: int, heads: int, batch: int, box_rows: int) -> bytes:
    """The 4-D map (key, head-dim row, head, batch) of an FP8 Vt workspace (`_kernels.fp8.transpose_v`),
    contiguous, boxes of 128 keys x ``box_rows`` head-dim rows (rows past head_dim read as zero)."""
    row = seq_pad  # bytes: e4m3
    return encode(ptr, dtype, (seq_pad, head_dim, heads, batch), (row, row * head_dim, row * head_dim * heads),
                  (128, box_rows, 1, 1))
