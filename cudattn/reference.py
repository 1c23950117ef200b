"""NumPy reference for `cudattn.attention`, and the correctness rule GPU results are held to.

- `attention`: float64, exactly the API's semantics (layouts, GQA/MQA, bottom-right causal,
  empty rows → output 0 / LSE -inf). The ground truth ("ref").
- `attention_naive`: the same math in the input's low precision, as a straightforward GPU
  implementation would do it (fp32 accumulation, probabilities and output rounded to the
  dtype). FlashAttention's "naive" baseline: it measures how much error the dtype alone costs.
- `check_close`: FlashAttention's rule, ``max|out − ref| ≤ 2·max|naive − ref| + atol``,
  with NaN never passing.
- KV cache (decode): `kvcache_append` (write new tokens into copies of a contiguous or paged
  cache), `gather_kv` (each sequence's valid keys as contiguous arrays), and
  `attention_with_kvcache` / `attention_with_kvcache_naive`, which run `attention` /
  `attention_naive` per sequence over its gathered keys.
- `merge_attention_states`: combine partial results ``(out_s, lse_s)`` over disjoint key sets
  (split-KV) into the result over their union, in float64.
- FP8 (e4m3): `attention` and `attention_naive` take FlashAttention-3's ``q/k/v_descale``
  (None, a float, or a ``(B, Hkv)`` array) and then work on the dequantised inputs
  ``x.astype(float64) * descale``; `quantize_fp8` / `dequantize` are the NumPy quantiser;
  `attention_fp8_emulated` does the FP8 kernels' arithmetic in NumPy (tile by tile, P rounded to
  e4m3); `error_stats` and `check_close_fp8` are the FP8 accuracy metrics and correctness rule.

Causal masking is aligned to the bottom right (FlashAttention ≥ 2.1): query ``i`` sees key
``j`` iff ``j <= i + Sk - Sq``. torch SDPA's ``is_causal`` aligns to the top left instead;
the two agree only when ``Sq == Sk``.

Memory: work is done one (batch, query head) at a time, in blocks of query rows, so at most
one block of one head's score matrix (about ``_BLOCK_ELEMENTS`` scores) is held at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import ml_dtypes
import numpy as np
from numpy.typing import NDArray

from ._arrays.types import DTypeLike, HostArrayLike, Layout, QuantizePer
from ._spec.modifiers import NONE, parse_modifiers
from ._spec.varlen import check_cu_seqlens, check_max_seqlen

__all__ = [
    "attention",
    "attention_naive",
    "attention_varlen",
    "check_close",
    "kvcache_append",
    "gather_kv",
    "attention_with_kvcache",
    "attention_with_kvcache_naive",
    "merge_attention_states",
    "quantize_fp8",
    "dequantize",
    "attention_fp8_emulated",
    "error_stats",
    "check_close_fp8",
]

# Scores held at once (per block of query rows of one head): 4M float64 = 32 MiB.
_BLOCK_ELEMENTS = 1 << 22

_BF16 = np.dtype(ml_dtypes.bfloat16)
_FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def _shapes(qs: tuple, ks: tuple, vs: tuple, layout: str) -> tuple[int, int, int, int, int, int]:
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
    for name, s in (("q", qs), ("k", ks), ("v", vs)):
        if len(s) != 4:
            raise ValueError(f"{name} must be 4-D; got shape {s}")
    if ks != vs:
        raise ValueError(f"k and v must have the same shape; got k {ks} and v {vs}")
    if layout == "bshd":
        B, Sq, Hq, D = qs
        Bk, Sk, Hkv, Dk = ks
    else:
        B, Hq, Sq, D = qs
        Bk, Hkv, Sk, Dk = ks
    if Bk != B:
        raise ValueError(f"q, k, v must have the same batch size; got q {B}, k and v {Bk}")
    if Dk != D:
        raise ValueError(f"q, k, v must have the same head_dim; got q {D}, k and v {Dk}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"heads_q ({Hq}) must be a multiple of heads_kv ({Hkv})")
    return B, Sq, Sk, Hq, Hkv, D


def _as_bhsd(x, dtype: np.dtype, layout: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind in "cbOSUMm":
        raise TypeError(f"reference attention takes real floating-point inputs; got dtype {x.dtype}")
    x = x.astype(dtype, copy=False)
    return x.transpose(0, 2, 1, 3) if layout == "bshd" else x


def _round_f16(x: np.ndarray) -> np.ndarray:
    """float32 → nearest float16 value (ties to even), kept in float32; bit-exact with
    ``x.astype(np.float16).astype(np.float32)`` but ~10x faster on the tiny (subnormal in
    float16) probabilities that long softmax rows are full of, where NumPy's cast is slow."""
    u = x.view(np.uint32)
    r = ((u + (np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))) & np.uint32(0xFFFFE000)).view(np.float32)
    subnormal = np.abs(x) < np.float32(2.0**-14)  # float16 subnormals: a uniform grid of 2**-24
    r = np.where(subnormal, np.rint(x * np.float32(2.0**24)) * np.float32(2.0**-24), r)
    over = np.abs(r) > np.float32(65504)
    if over.any():
        r = np.where(over, np.copysign(np.float32(np.inf), x), r)
    nan = np.isnan(x)
    if nan.any():
        r = np.where(nan, x, r)
    return r


def _round_to(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round float32 values to ``dtype`` and return them as float32."""
    if dtype == np.float16:
        return _round_f16(x)
    return x.astype(dtype).astype(np.float32)


def _descale(x, name: str, B: int, Hkv: int) -> np.ndarray | None:
    """One FP8 descale as float64 ``(B, Hkv)``: None stays None (1.0); a real number is broadcast;
    an array must have shape ``(B, Hkv)``. Values must be finite."""
    if x is None:
        return None
    a = np.asarray(x)
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be None, a real number or a (B, Hkv) float array; got dtype {a.dtype}")
    if a.ndim == 0:
        a = np.full((B, Hkv), float(a))
    elif a.shape != (B, Hkv):
        raise ValueError(f"{name} must have shape (batch, heads_kv) = ({B}, {Hkv}); got {a.shape}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a


def _descales(q_descale, k_descale, v_descale, B: int, Hq: int, Hkv: int):
    """(dq (B, Hq), dk (B, Hkv), dv (B, Hkv)), float64 or None; query head h uses the q descale of
    its KV head, ``q_descale[b, h // (Hq // Hkv)]`` (FlashAttention-3's convention)."""
    dq = _descale(q_descale, "q_descale", B, Hkv)
    if dq is not None:
        dq = np.repeat(dq, Hq // Hkv, axis=1)
    return dq, _descale(k_descale, "k_descale", B, Hkv), _descale(v_descale, "v_descale", B, Hkv)


def _apply_descale(xb: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    """x (B, H, S, D) times its per-(batch, head) descale (None: unchanged)."""
    return xb if d is None else xb * d[:, :, None, None].astype(xb.dtype)


def _from_bhsd(x: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3) if layout == "bshd" else x)


def _query_rows(rows, Sq: int) -> np.ndarray:
    """The query rows to compute: all of them, or the given indices (checked, in the given order)."""
    if rows is None:
        return np.arange(Sq)
    idx = np.asarray(rows)
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise ValueError(f"rows must be a 1-D array of integer query indices; got {idx.dtype} of shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= Sq):
        raise ValueError(f"rows must lie in [0, Sq={Sq}); got {idx.min()}..{idx.max()}")
    return idx.astype(np.int64, copy=False)


def _heads(qb: np.ndarray, kb: np.ndarray, vb: np.ndarray):
    """(b, h, q, k, v) per (batch, query head), contiguous; query head h reads KV head h // group."""
    group = qb.shape[1] // kb.shape[1]
    for b in range(qb.shape[0]):
        for h in range(qb.shape[1]):
            yield (b, h, np.ascontiguousarray(qb[b, h]), np.ascontiguousarray(kb[b, h // group]),
                   np.ascontiguousarray(vb[b, h // group]))


def _row_blocks(rows: np.ndarray, Sq: int, Sk: int, causal: bool):
    """(output slice, query row indices, kend) per block of rows small enough that its scores fit
    ``_BLOCK_ELEMENTS``; keys [0, kend) hold every key the block sees. Blocks whose rows all see no
    key are skipped (their output 0 and LSE -inf are the initial values)."""
    n = max(1, _BLOCK_ELEMENTS // max(Sk, 1))
    for r0 in range(0, rows.size, n):
        idx = rows[r0:r0 + n]
        kend = _visible_keys(idx, Sq, Sk, causal)
        if kend:
            yield slice(r0, r0 + idx.size), idx, kend


def _visible_keys(idx: np.ndarray, Sq: int, Sk: int, causal: bool) -> int:
    """Keys [0, kend) hold every key visible to the query rows ``idx``."""
    if not causal:
        return Sk
    return max(0, min(Sk, int(idx.max()) + 1 + Sk - Sq))  # row i sees j <= i + Sk-Sq


def _mask_scores(s: np.ndarray, idx: np.ndarray, Sq: int, Sk: int) -> None:
    """Causal, bottom-right: row i sees key j iff j <= i + Sk - Sq; the rest becomes -inf."""
    cols = np.arange(s.shape[1])[None, :]
    s[cols > idx[:, None] + (Sk - Sq)] = -np.inf


def _softmax_parts(s: np.ndarray):
    """Row max (0 where the row is empty or all -inf), unnormalized probabilities, row sums.

    NaN only from non-finite inputs: a NaN score, or a +inf one (exp(inf - inf)), makes its row NaN."""
    m = s.max(axis=1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m).astype(s.dtype, copy=False)  # empty row: exp(-inf - 0) = 0
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    return m, p, l


def _lse(m: np.ndarray, l: np.ndarray) -> np.ndarray:
    nonempty = l != 0  # a NaN sum gives a NaN LSE
    log_l = np.log(np.where(nonempty, l, 1)).astype(l.dtype, copy=False)
    return np.where(nonempty, m + log_l, -np.inf).astype(l.dtype, copy=False)[:, 0]


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
            (`cudattn._spec.modifiers` states them): a sliding window ``(left, right)`` around the
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


def _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq):
    as_arr = lambda x: None if x is None else np.asarray(x)  # noqa: E731 (lists welcome in the reference)
    return parse_modifiers(window_size, softcap, as_arr(sinks), as_arr(alibi_slopes), causal=bool(causal),
                           batch=B, heads_q=Hq)


def _mods_kwargs(window_size, softcap, sinks, mods, b: int) -> dict:
    """The modifiers of sequence ``b`` as `attention` keywords (its row of the ALiBi slopes)."""
    kw = dict(window_size=window_size, softcap=softcap, sinks=sinks)
    if mods.alibi is not None:
        kw["alibi_slopes"] = mods.alibi[b].astype(np.float32)
    return kw


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
    n = max(1, _BLOCK_ELEMENTS // max(Sk, 1))
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


def attention_varlen(q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, cu_seqlens_q: HostArrayLike,
                     cu_seqlens_k: HostArrayLike, *, max_seqlen_q: int | None = None,
                     max_seqlen_k: int | None = None, causal: bool = False, scale: float | None = None,
                     return_lse: bool = False, q_descale: HostArrayLike | None = None,
                     k_descale: HostArrayLike | None = None, v_descale: HostArrayLike | None = None,
                     window_size: tuple[int, int] | None = None, softcap: float | None = None,
                     sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
                     ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
    """`attention` of a packed variable-length batch, in float64 (FlashAttention's varlen layout).

    Args:
        q: ``(total_q, Hq, D)``: sequence ``b`` is rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1``.
        k, v: ``(total_k, Hkv, D)``, sequence ``b`` at ``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1``.
        cu_seqlens_q, cu_seqlens_k: int32 ``(B + 1,)`` offsets: 0 first, never decreasing, the
            totals last. Zero-length sequences are allowed (no rows; no keys: output 0, LSE -inf).
        max_seqlen_q, max_seqlen_k: optional upper bounds of the lengths (FlashAttention passes
            them); checked against the offsets when given.
        causal: bottom right per sequence: its query ``i`` sees its key ``j`` iff
            ``j <= i + Sk_b - Sq_b``.
        q_descale, k_descale, v_descale: as in `attention`; an array is ``(B, Hkv)``, row ``b``
            for sequence ``b``.
        window_size, softcap, sinks, alibi_slopes: as in `attention`, per sequence (``(B, Hq)``
            slopes: row ``b`` for sequence ``b``).

    Returns:
        ``out`` (float64, ``(total_q, Hq, D)``), and with ``return_lse`` the natural-log LSE
        ``(Hq, total_q)`` (float64), as FlashAttention's varlen functions return it.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"varlen q, k, v must be (total_q, Hq, D), (total_k, Hkv, D) twice; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    cq = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    ck = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch=cq.size - 1)
    lq, lk = np.diff(cq), np.diff(ck)
    for name, n, lens in (("max_seqlen_q", max_seqlen_q, lq), ("max_seqlen_k", max_seqlen_k, lk)):
        if n is not None:
            check_max_seqlen(n, name, lens)
    B, Hq = cq.size - 1, q.shape[1]
    out = np.zeros(q.shape, dtype=np.float64)
    lse = np.full((Hq, q.shape[0]), -np.inf, dtype=np.float64)

    def row(d, b):  # sequence b's descale: a scalar, or its row of a (B, Hkv) array
        return d if d is None or np.ndim(d) == 0 else np.asarray(d)[b:b + 1]

    mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)  # checks them once
    for b in range(B):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lq[b] == 0 or lk[b] == 0:
            if lq[b] and mods.sinks is not None:
                lse[:, qs] = mods.sinks[:, None]  # rows that see no key: 0 and their sink's logit
            continue  # no rows, or rows that see no key: 0 and -inf already
        o_b, l_b = attention(q[None, qs], k[None, ks], v[None, ks], causal=causal, scale=scale, return_lse=True,
                             q_descale=row(q_descale, b), k_descale=row(k_descale, b), v_descale=row(v_descale, b),
                             **_mods_kwargs(window_size, softcap, sinks, mods, b))
        out[qs] = o_b[0]
        lse[:, qs] = l_b[0]
    return (out, lse) if return_lse else out


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


def _abs_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b| in float64 where equal infinities (LSE -inf of empty rows) count as 0 and other
    infinities as inf; NaN stays NaN."""
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    same_inf = np.isinf(a) & (a == b)
    if same_inf.any():
        d[same_inf] = 0.0
    return d


def check_close(out: HostArrayLike, ref: HostArrayLike, naive: HostArrayLike, *,
                atol: float = 1e-5) -> tuple[bool, float, float]:
    """FlashAttention's rule: ``max|out − ref| ≤ 2·max|naive − ref| + atol``.

    ``ref`` is the float64 reference, ``naive`` the same math in the input dtype
    (`attention_naive`). NaN in ``out`` never passes; neither does an infinity in ``out`` that
    ``ref`` does not have (equal infinities, such as LSE ``-inf`` of empty rows, agree).

    Returns ``(ok, err, bound)`` with ``err = max|out − ref|`` (NaN if ``out`` has NaN) and
    ``bound = 2·max|naive − ref| + atol``.
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    n = np.asarray(naive).astype(np.float64)
    if o.shape != r.shape or n.shape != r.shape:
        raise ValueError(f"out, ref and naive must have one shape; got {o.shape}, {r.shape}, {n.shape}")
    if np.isnan(r).any():
        raise ValueError("ref contains NaN; the reference must be NaN-free")
    naive_diff = _abs_diff(n, r)
    if not np.isfinite(naive_diff).all():
        raise ValueError("naive is NaN or infinite where ref is not; the bound would be meaningless")
    bound = 2.0 * (float(naive_diff.max()) if naive_diff.size else 0.0) + atol
    if np.isnan(o).any():
        return False, math.nan, bound
    diff = _abs_diff(o, r)
    err = float(diff.max()) if diff.size else 0.0
    ok = bool(math.isfinite(err) and err <= bound)
    return ok, err, bound


# --------------------------------------------------------------------------------------------
# FP8 (e4m3): the quantiser, the FP8 kernels' arithmetic emulated, accuracy metrics and the rule.
# --------------------------------------------------------------------------------------------

#: Largest finite e4m3 (NVIDIA's float8_e4m3fn: no infinity, 480 and up is NaN).
E4M3_MAX = 448.0
_LOG2E = 1.4426950408889634
_FP8_OUT_DTYPES = (np.dtype(np.float16), _BF16, np.dtype(np.float32))


def _round_e4m3(x) -> np.ndarray:
    """float32 values rounded to e4m3 (nearest, ties to even) and saturated to ±448, returned as
    float32: what the kernels' ``cvt.rn.satfinite.e4m3x2.f32`` does (infinities saturate, NaN
    stays NaN). NumPy's own cast turns ``|x| > 464`` into NaN, hence the clip first; values in
    (448, 464] round to 448 either way."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(_FP8).astype(np.float32)


def _head_axis(layout: str) -> int:
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout must be 'bshd' or 'bhsd'; got {layout!r}")
    return 2 if layout == "bshd" else 1


def _expand_descale(descale: np.ndarray, shape: tuple, layout: str) -> np.ndarray:
    """A (B, G) descale broadcast against x of ``shape`` (head h uses entry h // (H // G))."""
    axis = _head_axis(layout)
    B, H = shape[0], shape[axis]
    d = np.asarray(descale)
    if d.ndim != 2 or d.shape[0] != B or d.shape[1] < 1 or H % d.shape[1]:
        raise ValueError(f"descale must have shape (batch, G) with heads ({H}) a multiple of G; got {d.shape}")
    d = np.repeat(d, H // d.shape[1], axis=1)  # (B, H)
    return d[:, None, :, None] if layout == "bshd" else d[:, :, None, None]


def quantize_fp8(x: HostArrayLike, *, per: QuantizePer = "tensor", layout: Layout = "bshd",
                 heads_kv: int | None = None) -> tuple[NDArray[Any], NDArray[np.float32]]:
    """NumPy counterpart of ``cudattn.quantize_fp8``: ``(x_fp8, descale)``.

    ``descale`` is float32 ``(B, G)``, ``G = heads_kv`` (default: x's head count); head ``h`` of
    x belongs to group ``h // (H // G)``. ``per="tensor"``: one amax over all of x, repeated in
    every entry; ``per="head"``: the amax of each (batch, group). ``descale = amax / 448`` (1 where
    amax is 0) and ``x_fp8 = e4m3(x / descale)``, rounded to nearest even and saturated (never
    NaN). Dequantised values are ``x_fp8.astype(float64) * descale`` (`dequantize`).
    """
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D; got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"x must be a floating-point array; got dtype {x.dtype}")
    axis = _head_axis(layout)
    B, H = x.shape[0], x.shape[axis]
    G = H if heads_kv is None else int(heads_kv)
    if G < 1 or H % G:
        raise ValueError(f"heads ({H}) must be a multiple of heads_kv ({heads_kv})")
    xf = x.astype(np.float64)
    if not np.isfinite(xf).all():
        raise ValueError("x must be finite to be quantised")
    a = np.abs(xf)
    if per == "tensor":
        amax = np.full((B, G), a.max() if a.size else 0.0)
    elif per == "head":
        ab = a if layout == "bhsd" else a.transpose(0, 2, 1, 3)  # (B, H, S, D)
        amax = ab.reshape(B, G, -1).max(axis=2) if a.size else np.zeros((B, G))
    else:
        raise ValueError(f"per must be 'tensor' or 'head'; got {per!r}")
    descale = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    scaled = xf / _expand_descale(descale.astype(np.float64), x.shape, layout)
    return np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(_FP8), descale


def dequantize(x_fp8: HostArrayLike, descale: HostArrayLike, *, layout: Layout = "bshd",
               out_dtype: DTypeLike = np.float32) -> NDArray[Any]:
    """``x_fp8.astype(float64) * descale`` (descale: a number or ``(B, G)``), cast to ``out_dtype``."""
    x = np.asarray(x_fp8).astype(np.float64)
    d = np.asarray(descale, dtype=np.float64)
    if d.ndim == 0:
        return (x * d).astype(out_dtype)
    return (x * _expand_descale(d, x.shape, layout)).astype(out_dtype)


def attention_fp8_emulated(q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *, causal: bool = False,
                           scale: float | None = None, layout: Layout = "bshd", q_descale: HostArrayLike | None = None,
                           k_descale: HostArrayLike | None = None, v_descale: HostArrayLike | None = None,
                           out_dtype: DTypeLike | None = None, return_lse: bool = False, block_n: int = 128,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
                           ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[np.float32]]:
    """The FP8 kernels' arithmetic in NumPy (cu_src/include/cudattn/fp8.cuh, softmax.cuh).

    q, k, v are ``ml_dtypes.float8_e4m3fn`` (shapes, layouts, GQA and bottom-right causal as in
    `attention`); descales as in `attention`. Per (batch, query head), over key tiles
    ``[t·block_n, (t+1)·block_n)`` taken from the **last tile to the first** (as the kernels do):

    - ``S = q·kᵀ`` in float32 from the e4m3 values (products exact, float32 sums);
      ``x = S · scale·log2(e)·q_descale·k_descale`` (the exp2 domain; masked keys ``-inf``);
    - running row max ``m`` (float32); ``alpha = exp2(m_old − m)``;
      ``P = exp2(x − m)`` in float32 (one rounding, as the kernels' ``fma``);
    - ``l = l·alpha + Σ P`` from the float32 P;
    - ``O = O·alpha + e4m3(P) · V`` with P rounded to e4m3 (nearest even, saturating) relative
      to the **running** max, float32 accumulation;

    then ``out = O · (1/l) · v_descale`` rounded to ``out_dtype`` (default bfloat16; float16,
    bfloat16 or float32) and ``lse = (m + log2 l)·ln 2`` (float32). Rows that see no key give 0
    and ``-inf``.

    Score modifiers as in `attention`, where the kernels apply them: a softcap takes the raw
    scores through ``tanh(S · p)`` with ``p = scale·q_descale·k_descale / softcap`` (float32), and
    the exp2 domain is ``x = tanh(...) · softcap·log2(e)``; ALiBi adds ``-slope·|i + Sk - Sq - j|·
    log2(e)`` to ``x``; the window and causal masks make ``x = -inf``; a sink joins at the end,
    ``M = max(m, sink·log2 e)``, ``l' = l·2^(m−M) + 2^(sink·log2 e − M)``, ``out = O·2^(m−M)/l'``,
    ``lse = (M + log2 l')·ln 2`` (a row that sees no key: 0 and the sink). The kernels' tanh is
    ``tanh.approx`` (relative error about 2^-11), not NumPy's.

    Differences left from the kernels: float32 summation order (NumPy's matmul and
    pairwise sums vs the tensor cores' and the quads'), the descales folded into the score scale
    in float64 then rounded once, and exact ``exp2`` instead of ``ex2.approx``: an e4m3 rounding
    of P that lands on a tie can go the other way, nothing more. ``block_n`` is the kernel's key
    tile (128 for the Hopper FP8 kernel, 64 for the portable one): it decides the running max P
    is rounded against, so it changes *which* rounding errors are made, not their size.

    Limit (the kernels' too): the row max ``m`` is the float32 rounding of the largest scaled
    score while ``P`` takes the exact one (``fma``), so the largest ``P`` is ``exp2(±½ ulp(m))``
    rather than 1: a common factor of every P, cancelled by ``l``, while ``|m| < 2²⁸`` (P ≤ 256).
    Beyond, the largest P saturates at 448 in e4m3 (the output shrinks towards 0), and beyond
    ``2³¹`` P overflows to inf (output 0 or NaN). With descales of 1 and the default scale the
    largest possible ``|m|`` is ``448²·sqrt(D)·log2(e) ≈ 4.6e6`` (D = 256): it takes
    ``scale·q_descale·k_descale`` about 60x larger than ``1/sqrt(D)`` to reach the limit.

    Vectorised over batch and heads: memory is a few float64 copies of one key tile's scores,
    ``B·Hq·Sq·block_n``.
    """
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != _FP8:
            raise TypeError(f"attention_fp8_emulated takes float8_e4m3fn inputs; {name} is {x.dtype} "
                            f"(quantise with quantize_fp8)")
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    block_n = int(block_n)
    if block_n < 1:
        raise ValueError(f"block_n must be positive; got {block_n}")
    out_dt = _BF16 if out_dtype is None else np.dtype(out_dtype)
    if out_dt not in _FP8_OUT_DTYPES:
        raise ValueError(f"FP8 output dtype must be float16, bfloat16 or float32; got {out_dt}")
    f32 = np.dtype(np.float32)
    G = Hq // Hkv
    qb = np.ascontiguousarray(_as_bhsd(q, f32, layout)).reshape(B, Hkv, G, Sq, D)
    kb = np.ascontiguousarray(_as_bhsd(k, f32, layout))[:, :, None]  # (B, Hkv, 1, Sk, D)
    vb = np.ascontiguousarray(_as_bhsd(v, f32, layout))[:, :, None]

    ones = np.ones((B, Hkv))
    dq = _descale(q_descale, "q_descale", B, Hkv)
    dk = _descale(k_descale, "k_descale", B, Hkv)
    dv = _descale(v_descale, "v_descale", B, Hkv)
    mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)
    folded = scale * (ones if dq is None else dq) * (ones if dk is None else dk)
    cap = mods.softcap
    if cap:  # the scores' scale goes inside the tanh; the softmax takes the cap's
        pre = (folded / cap).astype(np.float32).astype(np.float64)[:, :, None, None, None]
        sl2 = np.full((B, Hkv), np.float32(cap * _LOG2E), np.float32)
    else:
        sl2 = (folded * _LOG2E).astype(np.float32)
        sl2[sl2 == 0] = np.float32(1e-30)  # as the kernels: a zero scale would make NaN of masked scores
    sl2 = sl2.astype(np.float64)[:, :, None, None, None]  # float32 values; float64 for exact products
    out_scale = (ones if dv is None else dv).astype(np.float32)[:, :, None, None]
    slopes = None if mods.alibi is None else (mods.alibi.reshape(B, Hkv, G)[:, :, :, None, None] * _LOG2E)

    m = np.full((B, Hkv, G, Sq), -np.inf, dtype=np.float32)
    l = np.zeros((B, Hkv, G, Sq), dtype=np.float32)
    o = np.zeros((B, Hkv, G, Sq, D), dtype=np.float32)
    off = Sk - Sq  # causal: row i sees key j iff j <= i + off
    # Past the limit in the docstring P overflows to inf (and l·alpha may make NaN), as in the
    # kernels: the emulation shows it rather than warn.
    with np.errstate(over="ignore", invalid="ignore"):
        for t in reversed(range(-(-Sk // block_n))):
            j0, j1 = t * block_n, min(Sk, (t + 1) * block_n)
            i0 = max(0, j0 - off) if causal else 0  # rows before i0 see no key of this tile: unchanged
            if i0 >= Sq:
                continue
            s = np.matmul(qb[:, :, :, i0:], kb[:, :, :, j0:j1].swapaxes(-1, -2))  # float32
            if cap:
                x = np.tanh(s.astype(np.float64) * pre) * sl2
            else:
                x = s.astype(np.float64) * sl2  # exact: a product of two float32
            rows_i, cols = np.arange(i0, Sq), np.arange(j0, j1)
            if slopes is not None:
                x = x - slopes * np.abs(rows_i[:, None] + off - cols[None, :])
            if causal or mods.window != (-1, -1):
                x = np.where(mods.visible(rows_i, cols, Sq, Sk, causal), x, -np.inf)
            m_old = m[..., i0:]
            m_new = np.maximum(m_old, x.max(axis=-1).astype(np.float32))  # rounding is monotonic
            m_use = np.where(m_new == -np.inf, np.float32(0), m_new)  # no key yet: exp2(-inf - 0) = 0
            alpha = np.exp2(m_old - m_use)
            p = np.exp2((x - m_use[..., None]).astype(np.float32))
            l[..., i0:] = l[..., i0:] * alpha + p.sum(axis=-1, dtype=np.float32)
            o[..., i0:, :] = o[..., i0:, :] * alpha[..., None] + np.matmul(_round_e4m3(p), vb[:, :, :, j0:j1])
            m[..., i0:] = m_new

        if mods.sinks is not None:  # one more term of the denominator, carrying no value
            sink = (mods.sinks.reshape(Hkv, G) * _LOG2E).astype(np.float32)[None, :, :, None]
            M = np.maximum(m, sink)
            a = np.where(m == -np.inf, np.float32(0), np.exp2(m - M))
            l = l * a + np.exp2(sink - M)
            inv = a / l
            m = M
            nonempty = np.ones(l.shape, bool)
        else:
            nonempty = l != 0  # as the kernels: a row is empty iff its sum is exactly 0 (NaN stays NaN)
            inv = np.where(nonempty, np.float32(1) / np.where(nonempty, l, np.float32(1)), np.float32(0))
        out = o * (inv * out_scale)[..., None]
        out = _from_bhsd(out.reshape(B, Hq, Sq, D), layout).astype(out_dt)
        log_l = np.log2(np.where(nonempty, l, np.float32(1)))
        lse = np.where(nonempty, (m + log_l) * np.float32(math.log(2)), np.float32(-np.inf)).astype(np.float32)
    return (out, lse.reshape(B, Hq, Sq)) if return_lse else out


def error_stats(out: HostArrayLike, ref: HostArrayLike) -> dict[str, float]:
    """Accuracy of ``out`` against ``ref`` (float64), over all elements:

    - ``rel_rmse`` = ``sqrt(mean((out − ref)²)) / sqrt(mean(ref²))``;
    - ``max_abs`` = ``max|out − ref|``;
    - ``max_rel`` = ``max|out − ref| / max|ref|`` (normwise: elementwise ratios blow up where
      ref is near 0, as attention outputs often are);
    - ``nonfinite``: how many entries of ``out`` are NaN or infinite (then the errors are NaN/inf).

    Returns plain Python floats (and an int), e.g. for JSON.
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    if o.shape != r.shape:
        raise ValueError(f"out and ref must have one shape; got {o.shape} and {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ref must be finite")
    nonfinite = int(np.count_nonzero(~np.isfinite(o)))
    if o.size == 0:
        return dict(rel_rmse=0.0, max_abs=0.0, max_rel=0.0, nonfinite=0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(o - r)  # NaN and inf propagate into the statistics
        rmse = float(np.sqrt(np.mean(d * d)))
        max_abs = float(d.max())
    ref_rms = float(np.sqrt(np.mean(r * r)))
    ref_max = float(np.abs(r).max())
    return dict(rel_rmse=_relative(rmse, ref_rms), max_abs=max_abs, max_rel=_relative(max_abs, ref_max),
                nonfinite=nonfinite)


def _relative(err: float, size: float) -> float:
    """err / size; for size 0 (ref all zeros): 0 if err is 0, else inf (NaN stays NaN)."""
    if size > 0 or math.isnan(err):
        return err / size if size > 0 else err
    return 0.0 if err == 0 else math.inf


#: check_close_fp8's factors and floors (see its docstring for why these values).
FP8_MAX_FACTOR = 2.0
FP8_RMSE_FACTOR = 1.5
FP8_MAX_FLOOR = 1e-5  # times max|ref|
FP8_RMSE_FLOOR = 1e-4  # relative RMSE


def check_close_fp8(out: HostArrayLike, ref: HostArrayLike, emulated: HostArrayLike, *,
                    max_factor: float | None = None) -> tuple[bool, dict[str, Any]]:
    """The FP8 correctness rule: the kernel's output ``out`` against the float64 reference ``ref``
    on the dequantised inputs (`attention` with the descales), measured against ``emulated``,
    the same FP8 arithmetic done in NumPy (`attention_fp8_emulated`). All three must hold:

    1. ``out`` has no NaN and no infinity (``ref`` is finite);
    2. ``max|out − ref| ≤ 2·max|emulated − ref| + 1e-5·max|ref|``;
    3. ``rel_rmse(out) ≤ 1.5·rel_rmse(emulated) + 1e-4``.

    Why not DESIGN §6's rule with the "naive" baseline: ``attention_naive`` for FP8 rounds the
    *normalised* probabilities to e4m3, whose smallest subnormal is 2⁻⁹ ≈ 0.002, so at 1k keys
    most probabilities become 0 or one coarse step: a 33% relative RMSE at N(0,1) inputs, where
    the kernels' arithmetic gives 2.4%.
    A bound of twice that would pass a broken kernel. The kernels round the *unnormalised*
    ``P = exp2(x − m) ∈ (0, 1]`` instead, and that rounding (3 mantissa bits, up to 6.25%
    relative per probability) is by far their largest error; only an emulation of it is a
    baseline of the right size.

    Why factors are still needed: the emulation is not bit-exact. (a) P is rounded against the
    *running* row max, which depends on the kernel's key tile (192 keys at head dim 128 and 128 at
    256 on the Hopper FP8 kernel, 64 on the portable one); a different max shifts every P by a non-power-of-two factor, so the
    e4m3 rounding errors are a different draw of the same distribution, not the same errors.
    (b) float32 sums run in another order (tensor cores vs BLAS) and ``ex2.approx`` is not exact,
    so a P near an e4m3 tie can round the other way (one step, 6%). Both change which errors are
    made, not their size: the maximum over many outputs of two such draws differs by tens of
    percent (factor 2 on the max), and the RMSE, an average, much less (factor 1.5).

    Why these floors: they only matter where the emulation is (nearly) exact, e.g. one visible
    key (P = 1) with a float32 output; 1e-5·max|ref| is float32 noise, and a relative RMSE of
    1e-4 is 100x below the e4m3 error of P (about 1e-2 at N(0,1) inputs). Neither lets a real
    bug through: a wrong key permutation, a missing or misapplied descale, a swapped V row, a
    causal diagonal off by one or a dropped key makes errors of the size of the outputs on
    some entries, 1.7x to 1000x the bound over 20 random problems each (tests/
    test_reference_fp8.py shows each one failing). The other way, another key tile (64 or 32
    instead of 128) stays within 0.66 of either bound (0.8 of the RMSE bound with only 16
    outputs): a 1.5x margin. Limit: the bound follows the largest errors, so with outliers (a
    few rows carry errors 100x the rest) a bug that moves one key's weight in ordinary rows,
    such as a dropped key, can hide under it; the N(0,1) cases catch it.

    Returns ``(ok, stats)``: ``stats`` holds ``out`` and ``emulated`` (their `error_stats`),
    ``max_bound``, ``rmse_bound`` and ``failed`` (the rules broken, by name).
    """
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    e = np.asarray(emulated).astype(np.float64)
    if o.shape != r.shape or e.shape != r.shape:
        raise ValueError(f"out, ref and emulated must have one shape; got {o.shape}, {r.shape}, {e.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ref must be finite (the reference of finite inputs is)")
    if not np.isfinite(e).all():
        raise ValueError("emulated has NaN or infinity; the bound would be meaningless")
    so, se = error_stats(o, r), error_stats(e, r)
    ref_max = float(np.abs(r).max()) if r.size else 0.0
    max_bound = (FP8_MAX_FACTOR if max_factor is None else max_factor) * se["max_abs"] + FP8_MAX_FLOOR * ref_max
    rmse_bound = FP8_RMSE_FACTOR * se["rel_rmse"] + FP8_RMSE_FLOOR
    failed = []
    if so["nonfinite"]:
        failed.append("nonfinite")
    if not so["max_abs"] <= max_bound:  # NaN fails
        failed.append("max_abs")
    if not so["rel_rmse"] <= rmse_bound:
        failed.append("rel_rmse")
    stats = dict(out=so, emulated=se, max_bound=max_bound, rmse_bound=rmse_bound, failed=failed)
    return not failed, stats


# --------------------------------------------------------------------------------------------
# KV cache (decode): contiguous or paged caches, layout bshd only.
# --------------------------------------------------------------------------------------------


def _cache_geometry(k_cache: np.ndarray, v_cache: np.ndarray, block_table):
    """(B or None, capacity per sequence, Hkv, D, block_table or None) of a contiguous cache
    ``(B, Sk_cache, Hkv, D)`` or a paged one ``(num_pages, page_size, Hkv, D)`` + ``block_table``
    ``(B, max_pages)``; key ``j`` of sequence ``b`` lives at
    ``cache[block_table[b, j // page_size], j % page_size]``."""
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache must be 4-D; got shape {k_cache.shape}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {k_cache.shape} and {v_cache.shape}")
    _, S, Hkv, D = k_cache.shape
    if block_table is None:
        return k_cache.shape[0], S, Hkv, D, None
    bt = np.asarray(block_table)
    if bt.ndim != 2 or bt.dtype.kind not in "iu":
        raise ValueError(f"block_table must be a 2-D integer array (B, max_pages); got {bt.dtype} of shape {bt.shape}")
    return bt.shape[0], bt.shape[1] * S, Hkv, D, bt.astype(np.int64)


def _seqlens(cache_seqlens, B: int, capacity: int) -> np.ndarray:
    sl = np.asarray(cache_seqlens)
    if sl.shape != (B,) or sl.dtype.kind not in "iu":
        raise ValueError(f"cache_seqlens must be a 1-D integer array of length B={B}; got {sl.dtype} of shape {sl.shape}")
    if B and (sl.min() < 0 or sl.max() > capacity):
        raise ValueError(f"cache_seqlens must lie in [0, {capacity}] (the cache's capacity); got {sl.min()}..{sl.max()}")
    return sl.astype(np.int64)


def _slots(bt, b: int, positions: np.ndarray, cache_shape: tuple):
    """Index tuple into the cache's first two axes for key positions of sequence ``b``. Only the
    block_table entries of pages actually used are checked (the rest may hold anything)."""
    if bt is None:
        return b, positions
    num_pages, page_size = cache_shape[:2]
    pages = bt[b, positions // page_size]
    if pages.size and (pages.min() < 0 or pages.max() >= num_pages):
        raise ValueError(f"block_table[{b}] uses page {pages.min() if pages.min() < 0 else pages.max()}, "
                         f"outside [0, num_pages={num_pages})")
    return pages, positions % page_size


def kvcache_append(k_cache: HostArrayLike, v_cache: HostArrayLike, k_new: HostArrayLike, v_new: HostArrayLike,
                   cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                   ) -> tuple[NDArray[Any], NDArray[Any]]:
    """Write ``k_new``/``v_new`` ``(B, S_new, Hkv, D)`` into copies of the cache.

    Token ``t`` of sequence ``b`` goes to key position ``cache_seqlens[b] + t`` (contiguous cache
    ``(B, Sk_cache, Hkv, D)``: ``cache[b, pos]``; paged cache ``(num_pages, page_size, Hkv, D)``:
    ``cache[block_table[b, pos // page_size], pos % page_size]``). ``cache_seqlens=None`` means a
    full cache, which has no room to append: ValueError. New values are cast to the cache's
    dtype. Returns ``(k_cache2, v_cache2)``; the inputs are left untouched.
    """
    k_cache = np.asarray(k_cache)
    v_cache = np.asarray(v_cache)
    k_new = np.asarray(k_new)
    v_new = np.asarray(v_new)
    B, capacity, Hkv, D, bt = _cache_geometry(k_cache, v_cache, block_table)
    if cache_seqlens is None:
        raise ValueError("kvcache_append needs cache_seqlens: without it the cache is taken as full, with no room to append")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must have the same shape; got {k_new.shape} and {v_new.shape}")
    if k_new.ndim != 4 or k_new.shape[0] != B or k_new.shape[2:] != (Hkv, D):
        raise ValueError(f"k_new must be (B={B}, S_new, Hkv={Hkv}, D={D}); got {k_new.shape}")
    sl = _seqlens(cache_seqlens, B, capacity)
    S_new = k_new.shape[1]
    if B and int(sl.max()) + S_new > capacity:
        raise ValueError(f"appending {S_new} tokens overflows the cache: max(cache_seqlens) + S_new = "
                         f"{int(sl.max()) + S_new} > capacity {capacity}")
    k2 = k_cache.copy()
    v2 = v_cache.copy()
    for b in range(B):
        at = _slots(bt, b, sl[b] + np.arange(S_new), k_cache.shape)
        k2[at] = k_new[b]
        v2[at] = v_new[b]
    return k2, v2


def gather_kv(k_cache: HostArrayLike, v_cache: HostArrayLike, cache_seqlens: HostArrayLike | None = None,
              block_table: HostArrayLike | None = None) -> list[tuple[NDArray[Any], NDArray[Any]]]:
    """Each sequence's valid keys and values as contiguous arrays.

    Returns a list of ``B`` pairs ``(k_b, v_b)``, each ``(L_b, Hkv, D)`` in the cache's dtype,
    with ``L_b = cache_seqlens[b]`` (None: the whole cache, ``Sk_cache`` contiguous,
    ``max_pages * page_size`` paged).
    """
    k_cache = np.asarray(k_cache)
    v_cache = np.asarray(v_cache)
    B, capacity, Hkv, D, bt = _cache_geometry(k_cache, v_cache, block_table)
    sl = np.full(B, capacity, dtype=np.int64) if cache_seqlens is None else _seqlens(cache_seqlens, B, capacity)
    pairs = []
    for b in range(B):
        at = _slots(bt, b, np.arange(sl[b]), k_cache.shape)
        pairs.append((np.ascontiguousarray(k_cache[at]), np.ascontiguousarray(v_cache[at])))
    return pairs


def _with_kvcache(fn, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale, kwargs,
                  mods_kw=None):
    """Per-sequence ``fn`` (`attention` or `attention_naive`) over each sequence's gathered keys;
    returns the per-sequence ``(out_b, lse_b)`` pairs (None for L_b == 0) and B."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D (B, Sq, Hq, D); got shape {q.shape}")
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None:
        if cache_seqlens is None:
            raise ValueError("k_new needs cache_seqlens: without it the cache is taken as full, with no room to append")
        k_cache, v_cache = kvcache_append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)
        cache_seqlens = np.asarray(cache_seqlens) + np.asarray(k_new).shape[1]
    pairs = gather_kv(k_cache, v_cache, cache_seqlens, block_table)
    B = len(pairs)
    if q.shape[0] != B:
        raise ValueError(f"q's batch ({q.shape[0]}) must match the cache's ({B})")
    Hkv, D = np.asarray(k_cache).shape[2:]
    if q.shape[3] != D:
        raise ValueError(f"q, k_cache, v_cache must have the same head_dim; got q {q.shape[3]}, cache {D}")
    if Hkv < 1 or q.shape[2] % Hkv:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({Hkv})")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    mods = None
    if mods_kw and any(x is not None for x in mods_kw.values()):
        mods = _parse_mods(*(mods_kw.get(n) for n in ("window_size", "softcap", "sinks", "alibi_slopes")), causal,
                           B, q.shape[2])
    results = []
    for b, (kb, vb) in enumerate(pairs):
        if kb.shape[0] == 0:
            results.append(None)  # no key: output 0, LSE -inf (the sink's logit with sinks)
        else:
            extra = {} if mods is None else _mods_kwargs(mods_kw.get("window_size"), mods_kw.get("softcap"),
                                                         mods_kw.get("sinks"), mods, b)
            results.append(fn(q[b:b + 1], kb[None], vb[None], causal=causal, scale=scale,
                              return_lse=True, **kwargs, **extra))
    return results, q, (None if mods is None else mods.sinks)


def _assemble(results, q: np.ndarray, out_dtype, lse_dtype, sinks=None):
    B, Sq, Hq, D = q.shape
    out = np.zeros(q.shape, dtype=out_dtype)
    lse = np.full((B, Hq, Sq), -np.inf, dtype=lse_dtype)
    if sinks is not None:  # sequences with no key: their sinks' logits
        lse[:] = sinks[None, :, None]
    for b, r in enumerate(results):
        if r is not None:
            out[b], lse[b] = r[0][0], r[1][0]
    return out, lse


def attention_with_kvcache(q: HostArrayLike, k_cache: HostArrayLike, v_cache: HostArrayLike, *,
                           cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                           k_new: HostArrayLike | None = None, v_new: HostArrayLike | None = None,
                           causal: bool = False, scale: float | None = None, return_lse: bool = False,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
                           ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
    """`attention` (float64) of ``q`` ``(B, Sq, Hq, D)`` over a KV cache, layout bshd only.

    The cache is contiguous ``(B, Sk_cache, Hkv, D)`` or paged ``(num_pages, page_size, Hkv, D)``
    with ``block_table`` ``(B, max_pages)`` (see `kvcache_append`). With ``k_new``/``v_new``
    ``(B, S_new, Hkv, D)``, those are first appended (to copies) at ``cache_seqlens[b]``, and
    sequence ``b`` then holds ``L_b = cache_seqlens[b] + S_new`` keys; otherwise
    ``L_b = cache_seqlens[b]`` (None: the whole cache). Sequence ``b`` is then plain attention of
    ``q[b]`` over its ``L_b`` keys: causal is bottom-right w.r.t. ``L_b`` (query ``i`` sees key
    ``j`` iff ``j <= i + L_b - Sq``); ``L_b = 0`` gives output 0 and LSE ``-inf``.

    Returns ``out`` (float64, q's shape) and, with ``return_lse``, ``lse`` (float64,
    ``(B, Hq, Sq)``), as `attention` does; the score modifiers as in `attention`, per sequence
    over its ``L_b`` keys.
    """
    mods_kw = dict(window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    results, q, sk = _with_kvcache(attention, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new,
                                   causal, scale, {}, mods_kw)
    out, lse = _assemble(results, q, np.float64, np.float64, sk)
    return (out, lse) if return_lse else out


def attention_with_kvcache_naive(q: HostArrayLike, k_cache: HostArrayLike, v_cache: HostArrayLike, *,
                                 cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                                 k_new: HostArrayLike | None = None, v_new: HostArrayLike | None = None,
                                 causal: bool = False, scale: float | None = None, return_lse: bool = False,
                                 dtype: DTypeLike | None = None, window_size: tuple[int, int] | None = None,
                                 softcap: float | None = None, sinks: HostArrayLike | None = None,
                                 alibi_slopes: HostArrayLike | None = None,
                                 ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[np.float32]]:
    """`attention_with_kvcache` in low precision: `attention_naive` per sequence.

    ``dtype`` as in `attention_naive` (default: q's dtype, 16-bit or FP8). Returns ``out`` in the
    output dtype (``dtype``, bfloat16 for FP8) and, with ``return_lse``, a float32 LSE
    ``(B, Hq, Sq)``, as `attention_naive` does; ``L_b = 0`` gives 0 and ``-inf``.
    """
    low = np.dtype(np.asarray(q).dtype if dtype is None else dtype)
    if low.kind == "f" and low.itemsize >= 4:
        raise TypeError(
            f"attention_with_kvcache_naive needs a low-precision dtype (float16, bfloat16, float8_e4m3fn); "
            f"got {low}: pass dtype=np.float16 or dtype=ml_dtypes.bfloat16"
        )
    out_dtype = _BF16 if low == _FP8 else low
    mods_kw = dict(window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    results, q, sk = _with_kvcache(attention_naive, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new,
                                   causal, scale, {"dtype": low}, mods_kw)
    out, lse = _assemble(results, q, out_dtype, np.float32, sk)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------
# Merging partial attention states (split-KV).
# --------------------------------------------------------------------------------------------


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
