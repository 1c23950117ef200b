"""Packed variable-length batches, FlashAttention's ``cu_seqlens`` convention: the offsets' checks.

Sequence ``b`` of a packed ``(total, H, D)`` array is rows ``cu[b] .. cu[b+1] - 1``; ``cu`` is
int32 ``(B + 1,)``, starts at 0, never decreases and ends at ``total``. Offsets held in NumPy
arrays are checked here before any GPU work; offsets in device memory cannot be read without a
sync, so their values are the caller's duty (the kernels clamp them, as for KV caches).
"""

from __future__ import annotations

import numpy as np

from . import validate as _validate

_I32 = np.dtype(np.int32)

__all__ = ["check_cu_seqlens", "check_device_offsets", "check_max_seqlen"]


def check_cu_seqlens(cu, name: str, total: int, batch: int | None = None) -> np.ndarray:
    """The offsets as int64 values, or a ValueError/TypeError naming ``name`` and the rule broken.

    ``total``: the packed array's row count, which the last offset must equal; ``batch``: the
    number of sequences when another argument has fixed it (``len(cu) == batch + 1``)."""
    if not isinstance(cu, np.ndarray):
        raise TypeError(f"{name} must be an int32 NumPy array of shape (batch + 1,); got {type(cu).__name__}")
    if cu.dtype != np.int32:
        raise TypeError(f"{name} must be int32 (FlashAttention's cu_seqlens); got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 1 entries; got shape {cu.shape}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} must have batch + 1 = {batch + 1} entries; got {cu.shape[0]}")
    vals = cu.astype(np.int64)
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0; got {vals[0]}")
    steps = np.diff(vals)
    if steps.size and steps.min() < 0:
        b = int(np.argmin(steps))
        raise ValueError(f"{name} must not decrease; {name}[{b + 1}] = {vals[b + 1]} < {name}[{b}] = {vals[b]}")
    if vals[-1] != total:
        raise ValueError(f"{name} must end at the packed length {total}; got {vals[-1]}")
    return vals


def check_max_seqlen(max_seqlen, name: str, lengths: np.ndarray | None) -> int:
    """``max_seqlen`` (an int >= 0, at least every sequence's length where the lengths are known)."""
    if isinstance(max_seqlen, (bool, np.bool_)) or not isinstance(max_seqlen, (int, np.integer)):
        raise TypeError(f"{name} must be an int (the longest sequence, as in FlashAttention); got "
                        f"{type(max_seqlen).__name__}")
    n = int(max_seqlen)
    if n < 0:
        raise ValueError(f"{name} must be >= 0; got {n}")
    if lengths is not None and lengths.size and n < int(lengths.max()):
        raise ValueError(f"{name} = {n} is shorter than sequence {int(np.argmax(lengths))} ({int(lengths.max())} rows)")
    return n


def check_device_offsets(cu, name: str, batch: int | None) -> int:
    """The sequence count ``len(cu) - 1`` of a device offsets array, checked for dtype, rank and
    contiguity (its values are the caller's duty)."""
    shape, strides, dtype, _ = _validate._describe(name, cu, False)
    if dtype != _I32:
        raise TypeError(f"{name} must be int32 (FlashAttention's cu_seqlens); got {dtype}")
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 1 entries; got shape {tuple(shape)}")
    if batch is not None and shape[0] != batch + 1:
        raise ValueError(f"{name} must have batch + 1 = {batch + 1} entries (as cu_seqlens_q); got {shape[0]}")
    if shape[0] > 1 and tuple(strides) != (4,):
        raise ValueError(f"{name} must be contiguous (stride 4 bytes); got strides {tuple(strides)}")
    return shape[0] - 1
