"""Host (NumPy) path of `cudattn.merge_attention_states`, and the input checks the device path shares.

Merging combines partial attentions over disjoint key sets (split-KV, or a cache plus new keys)
into the attention over their union. Per row, with ``m = max_s lse_s``:

- ``m = -inf`` (no part saw a key): output 0, LSE ``-inf``;
- otherwise ``w_s = exp(lse_s − m)``, with parts whose LSE is ``-inf`` skipped explicitly (their
  output may hold anything, NaN included), ``out = Σ w_s·out_s / Σ w_s``, ``lse = m + log Σ w_s``.

The host path computes in float32, as a GPU combine kernel does, and rounds the output to the
outs' dtype. `parse_merge_inputs` uses only ``.shape``, ``.dtype``, ``len()`` and indexing of its
arguments, so the device path can run the same checks on device arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

__all__ = ["MERGE_OUT_DTYPES", "parse_merge_inputs", "merge_host"]

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


def _host_parts(parts):
    """np.asarray each part (or the stacked array) without stacking a list of parts."""
    if _has_shape(parts):
        return np.asarray(parts)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence):
        return parts  # parse_merge_inputs reports it
    return [np.asarray(p) for p in parts]


def merge_host(outs, lses, layout: str = "bshd"):
    """Merge partial attention states on the host, in float32.

    Arguments as in `parse_merge_inputs`. Returns ``(out, lse)``: ``out`` in the outs' dtype and
    layout, ``lse`` float32 ``(B, H, Sq)``. A single part comes back unchanged (bit for bit).
    """
    outs, lses, B, Sq, H, D, dtype = parse_merge_inputs(_host_parts(outs), _host_parts(lses), layout)
    f32 = np.float32
    ninf = f32(-np.inf)
    # LSEs laid out like the outs' leading dims, so that w[..., None] broadcasts over D.
    rows = (lambda x: x.transpose(0, 2, 1)) if layout == "bshd" else (lambda x: x)  # noqa: E731
    lse_r = [rows(np.asarray(x, dtype=f32)) for x in lses]
    m = lse_r[0]
    for x in lse_r[1:]:
        m = np.maximum(m, x)
    empty = m == ninf
    m_safe = np.where(empty, f32(0), m)
    num = np.zeros(outs[0].shape, dtype=f32)
    den = np.zeros(m.shape, dtype=f32)
    for o, x in zip(outs, lse_r):
        live = x != ninf
        w = np.where(live, np.exp(np.where(live, x, f32(0)) - m_safe), f32(0))
        # a part with LSE -inf is skipped explicitly (its output may be NaN): never 0·NaN
        num += w[..., None] * np.where(live[..., None], np.asarray(o, dtype=f32), f32(0))
        den += w
    # den >= 1 on every non-empty row (the part holding the max has weight 1)
    out = np.where(empty[..., None], f32(0), num / np.where(empty, f32(1), den)[..., None])
    lse = np.where(empty, ninf, m_safe + np.log(np.where(empty, f32(1), den)))
    return out.astype(dtype), np.ascontiguousarray(rows(lse.astype(f32)))
