"""Merging partial attention states (split-KV): `merge_attention_states` combines partial results
``(out_s, lse_s)`` over disjoint key sets into the result over their union, in float64."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import HostArrayLike, Layout


def merge_attention_states(outs: Iterable[HostArrayLike], lses: Iterable[HostArrayLike], *,
                           layout: Layout = "bshd") -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Combine partial attentions over disjoint key sets into the attention over their union.

    ``outs``: N arrays of one shape, ``(B, Sq, H, D)`` for ``layout="bshd"`` (``(B, H, Sq, D)``
    for ``"bhsd"``); ``lses``: N arrays ``(B, H, Sq)``, each part's natural-log row sum of
    ``exp(scores)``. In float64: ``m = max_s lse_s``; a row with ``m = -inf`` gets output 0 and
    LSE ``-inf``; otherwise ``w_s = exp(lse_s − m)`` (a part with LSE ``-inf`` contributes nothing,
    even if its output is NaN), ``out = Σ w_s·out_s / Σ w_s``, ``lse = m + log Σ w_s``.

    Returns ``(out, lse)``, both float64, shapes as one part's.
    """
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
    outs = [np.asarray(o).astype(np.float64) for o in outs]
    lses = [np.asarray(x).astype(np.float64) for x in lses]
    if not outs or len(outs) != len(lses):
        raise ValueError(f"need N >= 1 outs and as many lses; got {len(outs)} outs and {len(lses)} lses")
    shape, lshape = outs[0].shape, lses[0].shape
    if any(o.shape != shape for o in outs) or any(x.shape != lshape for x in lses):
        raise ValueError("all outs must share one shape, and all lses one shape")
    if len(shape) != 4:
        raise ValueError(f"outs must be 4-D; got shape {shape}")
    want = (shape[0], shape[2], shape[1]) if layout == "bshd" else shape[:3]
    if lshape != want:
        raise ValueError(f"lses must be (B, H, Sq) = {want} for outs of shape {shape} ({layout}); got {lshape}")
    to_rows = (lambda x: x.transpose(0, 2, 1)) if layout == "bshd" else (lambda x: x)  # noqa: E731
    lse_r = [to_rows(x) for x in lses]  # lse laid out like out's leading dims
    m = np.max(np.stack(lse_r), axis=0)
    empty = m == -np.inf
    m_safe = np.where(empty, 0.0, m)
    num = np.zeros(shape)
    den = np.zeros(m.shape)
    for o, x in zip(outs, lse_r):
        live = x != -np.inf
        w = np.where(live, np.exp(np.where(live, x, 0.0) - m_safe), 0.0)
        num += w[..., None] * np.where(live[..., None], o, 0.0)  # LSE -inf: skipped, never 0·NaN
        den += w
    out = np.where(empty[..., None], 0.0, num / np.where(empty, 1.0, den)[..., None])
    lse = np.where(empty, -np.inf, m_safe + np.log(np.where(empty, 1.0, den)))
    return out, np.ascontiguousarray(to_rows(lse))
