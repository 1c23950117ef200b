"""The rules of `cudattn.merge_attention_states`'s inputs, shared by the NumPy and device paths.

Merging combines partial attentions over disjoint key sets (split-KV, or a cache plus new keys)
into the attention over their union. `parse_merge_inputs` uses only ``.shape``, ``.dtype``,
``len()`` and indexing of its arguments, so the device path runs the same checks on device arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

__all__ = ["MERGE_OUT_DTYPES", "parse_merge_inputs"]

#: dtypes the partial outputs may have (all parts the same).
MERGE_OUT_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))

_OUT_DTYPES_TEXT = "float16, bfloat16 (ml_dtypes.bfloat16) or float32"

_LAYOUTS = ("bshd", "bhsd")


def _check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ValueError(f"merge_attention_states: layout must be 'bshd' or 'bhsd'; got {layout!r}")
    return layout


def _has_shape(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _split_parts(parts, name: str, stacked_ndim: int) -> list:
    """A sequence of N arrays, or one array with a leading N axis (``stacked_ndim``-D), as a list."""
    if _has_shape(parts):
        shape = tuple(parts.shape)
        if len(shape) != stacked_ndim:
            raise ValueError(
                f"merge_attention_states: {name} must be a sequence of N arrays or one {stacked_ndim}-D array "
                f"with a leading N axis; got one array of shape {shape}"
            )
        return [parts[i] for i in range(shape[0])]
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
        raise TypeError(
            f"merge_attention_states: {name} must be a sequence (list/tuple) of arrays or one array with a "
            f"leading N axis; got {type(parts).__name__}"
        )
    parts = list(parts)
    for i, p in enumerate(parts):
        if not _has_shape(p):
            raise TypeError(f"merge_attention_states: {name}[{i}] must be an array (with .shape and .dtype); "
                            f"got {type(p).__name__}")
    return parts


def _check_count(outs: list, lses: list) -> int:
    n = len(outs)
    if n < 1:
        raise ValueError("merge_attention_states: outs must hold at least one part (N >= 1); got 0")
    if len(lses) != n:
        raise ValueError(f"merge_attention_states: outs and lses must hold the same number of parts; "
                         f"got {n} outs and {len(lses)} lses")
    return n


def _common_shape(parts: list, name: str, ndim: int, what: str) -> tuple[int, ...]:
    shape = tuple(parts[0].shape)
    if len(shape) != ndim:
        raise ValueError(f"merge_attention_states: each of {name} must be {ndim}-D {what}; "
                         f"got {name}[0] of shape {shape}")
    for i, p in enumerate(parts[1:], 1):
        if tuple(p.shape) != shape:
            raise ValueError(f"merge_attention_states: all {name} must have the same shape; "
                             f"got {name}[0] {shape} and {name}[{i}] {tuple(p.shape)}")
    return shape


def _common_out_dtype(outs: list) -> np.dtype:
    dtype = np.dtype(outs[0].dtype)
    for i, o in enumerate(outs):
        d = np.dtype(o.dtype)
        if d not in MERGE_OUT_DTYPES:
            raise TypeError(f"merge_attention_states: outs must be {_OUT_DTYPES_TEXT}; got outs[{i}] of dtype {d}")
        if d != dtype:
            raise TypeError(f"merge_attention_states: all outs must have the same dtype; "
                            f"got outs[0] {dtype} and outs[{i}] {d}")
    return dtype


def _check_lse_dtype(lses: list) -> None:
    for i, x in enumerate(lses):
        d = np.dtype(x.dtype)
        if d != np.float32:
            raise TypeError(f"merge_attention_states: lses must be float32 (as attention returns them); "
                            f"got lses[{i}] of dtype {d}; cast with .astype(np.float32) if that is intended")


def parse_merge_inputs(outs, lses, layout: str = "bshd"):
    """Check merge inputs; return ``(outs_list, lses_list, B, Sq, H, D, dtype)``.

    ``outs``: a sequence of N arrays, or one array with a leading N axis, each ``(B, Sq, H, D)``
    (``"bshd"``) or ``(B, H, Sq, D)`` (``"bhsd"``), all float16, all bfloat16 or all float32.
    ``lses``: a sequence of N float32 arrays ``(B, H, Sq)``, or one ``(N, B, H, Sq)`` array.
    Uses only ``.shape``, ``.dtype``, ``len()`` and indexing, so any array-like object works
    (NumPy arrays, `cudattn.DeviceArray`). Raises ValueError (layout, counts, shapes) or
    TypeError (types, dtypes) naming the argument.
    """
    layout = _check_layout(layout)
    outs = _split_parts(outs, "outs", 5)
    lses = _split_parts(lses, "lses", 4)
    _check_count(outs, lses)
    dims = "(B, Sq, H, D)" if layout == "bshd" else "(B, H, Sq, D)"
    oshape = _common_shape(outs, "outs", 4, f"{dims} for layout {layout!r}")
    lshape = _common_shape(lses, "lses", 3, "(B, H, Sq)")
    if layout == "bshd":
        B, Sq, H, D = oshape
    else:
        B, H, Sq, D = oshape
    if lshape != (B, H, Sq):
        raise ValueError(f"merge_attention_states: lses must be (B, H, Sq) = {(B, H, Sq)} to match outs of shape "
                         f"{oshape} {dims}; got {lshape}")
    dtype = _common_out_dtype(outs)
    _check_lse_dtype(lses)
    return outs, lses, B, Sq, H, D, dtype
