"""The NumPy path of `cudattn.merge_attention_states` (its inputs' rules are `_spec.merge`'s).

Per row, with ``m = max_s lse_s``:

- ``m = -inf`` (no part saw a key): output 0, LSE ``-inf``;
- otherwise ``w_s = exp(lse_s − m)``, with parts whose LSE is ``-inf`` skipped explicitly (their
  output may hold anything, NaN included), ``out = Σ w_s·out_s / Σ w_s``, ``lse = m + log Σ w_s``.

The host path computes in float32, as a GPU combine kernel does, and rounds the output to the
outs' dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._spec.merge import _has_shape, parse_merge_inputs

__all__ = ["merge_host"]


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
