"""`attention` (the float64 ground truth) and `attention_naive` (the same math in the input's low
precision, the baseline of the correctness rule), dense inputs in either layout, with GQA/MQA,
bottom-right causal masking and FP8 descales; and the path both take when a score modifier
(sliding window, softcap, sinks, ALiBi) is given, `_attention_modified`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import DTypeLike, HostArrayLike, Layout
from .._spec.modifiers import NONE
from . import _common
from ._common import (
    _BF16,
    _FP8,
    _apply_descale,
    _as_bhsd,
    _descales,
    _from_bhsd,
    _heads,
    _lse,
    _mask_scores,
    _parse_mods,
    _query_rows,
    _round_to,
    _row_blocks,
    _shapes,
    _softmax_parts,
)


def attention(q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *, causal: bool = False,
              scale: float | None = None, layout: Layout = "bshd", return_lse: bool = False,
              rows: HostArrayLike | None = None, q_descale: HostArrayLike | None = None,
              k_descale: HostArrayLike | None = None, v_descale: HostArrayLike | None = None,
              window_size: tuple[int, int] | None = None, softcap: float | None = None,
              sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
              ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Scaled-dot-product attention in float64.

    Args:
        q: ``(B, Sq, Hq, D)`` for ``layout="bshd"``, ``(B, Hq, Sq, D)`` for ``"bhsd"``; any real
            floating dtype (float16, ``ml_dtypes.bfloat16``, FP8, float32, ...), upcast to float64.
        k, v: ``(B, Sk, Hkv, D)`` / ``(B, Hkv, Sk, D)``, with ``Hq % Hkv == 0``; query head ``h``
            reads kv head ``h // (Hq // Hkv)`` (GQA/MQA).
        causal: bottom-right aligned: query ``i`` sees key ``j`` iff ``j <= i + Sk - Sq``
            (differs from torch SDPA's ``is_causal`` when ``Sq != Sk``).
        scale: multiplies ``q·kᵀ``; default ``1/sqrt(D)``.
        rows: compute only these query rows (1-D integer indices into ``Sq``), e.g. to check a
            subsample of a large problem; the outputs then have ``len(rows)`` rows, in that order.
        q_descale, k_descale, v_descale: FP8 descales (FlashAttention-3's names): None (1.0), a
            real number, or an array ``(B, Hkv)``. The attention is then that of the dequantised
            inputs ``x.astype(float64) * descale`` (query head ``h`` uses
            ``q_descale[b, h // (Hq // Hkv)]``); the LSE is of the dequantised scores too.
        window_size, softcap, sinks, alibi_slopes: score modifiers, FlashAttention's conventions
            (as `cudattn.attention` takes them): a sliding window ``(left, right)`` around the
            bottom-right diagonal (-1: unbounded; causal sets ``right = 0``); ``softcap ·
            tanh(s / softcap)`` of the scaled scores; float32 ``(Hq,)`` sink logits in every
            row's softmax denominator; float32 ``(Hq,)`` or ``(B, Hq)`` ALiBi slopes adding
            ``-slope · |i + Sk - Sq - j|``. NumPy arrays, checked as the API checks them.

    Returns:
        ``out`` (float64, q's shape), and with ``return_lse`` also ``lse`` (float64,
        ``(B, Hq, Sq)``): natural log of the row sum of ``exp(scale·q·kᵀ)`` over visible keys
        (plus ``exp(sink)`` with sinks). A row with no visible key (causal with ``Sq > Sk``, or
        outside its window) gets output 0 and LSE ``-inf`` (its sink's logit with sinks).
    """
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    f64 = np.dtype(np.float64)
    qb, kb, vb = (_as_bhsd(x, f64, layout) for x in (q, k, v))
    dq, dk, dv = _descales(q_descale, k_descale, v_descale, B, Hq, Hkv)
    qb, kb, vb = _apply_descale(qb, dq), _apply_descale(kb, dk), _apply_descale(vb, dv)

    rows = _query_rows(rows, Sq)
    if window_size is not None or softcap is not None or sinks is not None or alibi_slopes is not None:
        mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)
        out, lse = _attention_modified(qb, kb, vb, rows, Sq, Sk, causal, mods, lambda b, h: scale, None, None)
        out = _from_bhsd(out, layout)
        return (out, lse) if return_lse else out
    out = np.zeros((B, Hq, rows.size, D), dtype=np.float64)
    lse = np.full((B, Hq, rows.size), -np.inf, dtype=np.float64)
    for b, h, qh, kh, vh in _heads(qb, kb, vb):
        for at, idx, kend in _row_blocks(rows, Sq, Sk, causal):
            s = (qh[idx] @ kh[:kend].T) * scale
            if causal:
                _mask_scores(s, idx, Sq, Sk)
            m, p, l = _softmax_parts(s)
            out[b, h, at] = _weighted_values(p, vh[:kend], idx, Sq, Sk, causal) / np.where(l != 0, l, 1.0)
            lse[b, h, at] = _lse(m, l)
    out = _from_bhsd(out, layout)
    return (out, lse) if return_lse else out


def _weighted_values(p: np.ndarray, v: np.ndarray, idx: np.ndarray, Sq: int, Sk: int, causal: bool) -> np.ndarray:
    """``p @ v`` over the keys each row sees. A NaN or inf in a V row reaches exactly the rows that
    see that key (``p * v`` by IEEE rules, so even a weight that underflowed to 0 gives NaN), never
    a row for which the key is masked: a plain ``p @ v`` would spread it through the masked zeros."""
    return _weighted_visible(p, v, idx, 0, Sq, Sk, causal, NONE)


def _softmax_sink(s: np.ndarray, sink):
    """`_softmax_parts` with an optional sink logit in the denominator: ``(m, p, l)`` where ``l``
    includes ``exp(sink - m)`` and ``m`` is at least the sink (a row with no key: p = 0, l = 1)."""
    if sink is None:
        return _softmax_parts(s)
    m = np.maximum(s.max(axis=1, keepdims=True), s.dtype.type(sink))
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True) + np.exp(s.dtype.type(sink) - m)
    return m, p, l


def _attention_modified(qb, kb, vb, rows, Sq, Sk, causal, mods, scale_of, round_probs, v_scale_of):
    """The attention loop with score modifiers, in the dtype of ``qb`` (float64 for `attention`,
    float32 for `attention_naive`); returns (B, Hq, rows, D) outputs and (B, Hq, rows) LSEs.
    ``scale_of(b, h)``: the score scale; ``round_probs``: rounds normalised P (naive) or None;
    ``v_scale_of(b, h)``: a factor on P·V (FP8's v descale) or None."""
    dt = qb.dtype
    B, Hq, _, D = qb.shape
    out = np.zeros((B, Hq, rows.size, D), dtype=dt)
    lse = np.full((B, Hq, rows.size), -np.inf, dtype=dt)
    n = max(1, _common._BLOCK_ELEMENTS // max(Sk, 1))
    for b, h, qh, kh, vh in _heads(qb, kb, vb):
        sink = mods.sink(h)
        if sink is not None:
            lse[b, h] = sink  # rows that see no key
        for r0 in range(0, rows.size, n):
            idx = rows[r0:r0 + n]
            at = slice(r0, r0 + idx.size)
            lo, hi = mods.key_range(idx, Sq, Sk, causal)
            if hi <= lo:
                continue
            s = (qh[idx] @ kh[lo:hi].T) * dt.type(scale_of(b, h))
            mods.scores(s, b, h, idx, lo, Sq, Sk, causal)
            m, p, l = _softmax_sink(s, sink)
            keys = vh[lo:hi]
            if round_probs is not None:
                probs = round_probs(p / np.where(l > 0, l, dt.type(1)))
                o = probs @ keys
            else:
                o = _weighted_visible(p, keys, idx, lo, Sq, Sk, causal, mods) / np.where(l != 0, l, 1.0)
            vs = None if v_scale_of is None else v_scale_of(b, h)
            out[b, h, at] = o if vs is None else o * dt.type(vs)
            lse[b, h, at] = _lse(m, l)
    return out, lse


def _weighted_visible(p, v, idx, lo, Sq, Sk, causal, mods) -> np.ndarray:
    """`_weighted_values` for keys ``lo ..`` under any mask (``mods``' window as well as causal)."""
    bad = ~np.isfinite(v).all(axis=1)
    if not bad.any():
        return p @ v
    out = p @ np.where(bad[:, None], 0.0, v)
    for j in np.flatnonzero(bad):
        sees = mods.visible(idx, np.array([lo + j]), Sq, Sk, causal)[:, 0]
        out[sees] += p[sees, j, None] * v[j]
    return out


def attention_naive(q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *, causal: bool = False,
                    scale: float | None = None, layout: Layout = "bshd", dtype: DTypeLike | None = None,
                    return_lse: bool = False, round_scores: bool = False, rows: HostArrayLike | None = None,
                    q_descale: HostArrayLike | None = None, k_descale: HostArrayLike | None = None,
                    v_descale: HostArrayLike | None = None, window_size: tuple[int, int] | None = None,
                    softcap: float | None = None, sinks: HostArrayLike | None = None,
                    alibi_slopes: HostArrayLike | None = None,
                    ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[np.float32]]:
    """The same attention done in low precision, as a plain (unfused) GPU implementation would.

    Inputs are rounded to ``dtype`` (default: q's dtype, which must then be 16-bit or FP8), then:
    scores ``q·kᵀ`` with float32 accumulation, times ``scale`` in float32; softmax in float32;
    probabilities rounded to ``dtype``; ``P·V`` with float32 accumulation; output rounded to the
    output dtype (``dtype``, or bfloat16 for FP8). Empty rows give 0 (and LSE ``-inf``).

    ``round_scores=True`` also rounds the scores to ``dtype`` (with ``scale`` folded into k in
    ``dtype`` first), as FlashAttention's torch baseline does (``attention_ref(upcast=False,
    reorder_ops=True)``): a noisier baseline, so a looser bound. The default keeps scores in
    float32, as a fused kernel does.

    FP8 descales (as in `attention`) fold into the float32 score scale (``scale · q_descale ·
    k_descale`` per head) and multiply the float32 ``P·V`` (``v_descale``), as the FP8 kernels do.

    Returns ``out`` in the output dtype (layout as given) and, with ``return_lse``, a float32
    LSE ``(B, Hq, Sq)``. ``rows`` selects query rows as in `attention`; the score modifiers
    (``window_size``, ``softcap``, ``sinks``, ``alibi_slopes``) as in `attention`, in float32 (not
    with ``round_scores``).
    """
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    low = np.dtype(q.dtype if dtype is None else dtype)
    if low.kind == "f" and low.itemsize >= 4:
        raise TypeError(
            f"attention_naive needs a low-precision dtype (float16, bfloat16, float8_e4m3fn); got {low}: "
            f"pass dtype=np.float16 or dtype=ml_dtypes.bfloat16"
        )
    out_dtype = _BF16 if low == _FP8 else low
    f32 = np.dtype(np.float32)
    # round the inputs to the low dtype, then compute from those values in float32
    qb, kb, vb = (_as_bhsd(np.asarray(x).astype(low), f32, layout) for x in (q, k, v))
    dq, dk, dv = _descales(q_descale, k_descale, v_descale, B, Hq, Hkv)
    group = Hq // Hkv

    rows = _query_rows(rows, Sq)
    if window_size is not None or softcap is not None or sinks is not None or alibi_slopes is not None:
        if round_scores:
            raise ValueError("round_scores does not combine with the score modifiers")
        mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)

        def scale_of(b, h):
            return scale * (1.0 if dq is None else dq[b, h]) * (1.0 if dk is None else dk[b, h // group])

        out, lse = _attention_modified(qb, kb, vb, rows, Sq, Sk, causal, mods, scale_of,
                                       lambda x: _round_to(x, low),
                                       None if dv is None else (lambda b, h: dv[b, h // group]))
        out = _from_bhsd(out.astype(out_dtype), layout)
        return (out, lse.astype(np.float32)) if return_lse else out
    out = np.zeros((B, Hq, rows.size, D), dtype=np.float32)
    lse = np.full((B, Hq, rows.size), -np.inf, dtype=np.float32)
    for b, h, qh, kh, vh in _heads(qb, kb, vb):
        sc = scale
        if dq is not None:
            sc *= dq[b, h]
        if dk is not None:
            sc *= dk[b, h // group]
        s32 = np.float32(sc)
        v32 = None if dv is None else np.float32(dv[b, h // group])
        if round_scores:
            kh = _round_to(kh * s32, low)
        for at, idx, kend in _row_blocks(rows, Sq, Sk, causal):
            s = qh[idx] @ kh[:kend].T
            if round_scores:
                s = _round_to(s, low)
            else:
                s *= s32
            if causal:
                _mask_scores(s, idx, Sq, Sk)
            m, p, l = _softmax_parts(s)
            probs = _round_to(p / np.where(l > 0, l, np.float32(1)), low)
            out[b, h, at] = probs @ vh[:kend] if v32 is None else (probs @ vh[:kend]) * v32
            lse[b, h, at] = _lse(m, l)
    out = _from_bhsd(out.astype(out_dtype), layout)
    return (out, lse) if return_lse else out
