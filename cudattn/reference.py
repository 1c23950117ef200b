"""NumPy reference for `cudattn.attention`, and the correctness rule GPU results are held to.

- `attention`: float64, exactly the API's semantics (layouts, GQA/MQA, bottom-right causal,
  empty rows → output 0 / LSE -inf). The ground truth ("ref").
- `attention_naive`: the same math in the input's low precision, as a straightforward GPU
  implementation would do it (fp32 accumulation, probabilities and output rounded to the
  dtype). FlashAttention's "naive" baseline: it measures how much error the dtype alone costs.
- `check_close`: FlashAttention's rule, ``max|out − ref| ≤ 2·max|naive − ref| + atol``,
  with NaN never passing.

Causal masking is aligned to the bottom right (FlashAttention ≥ 2.1): query ``i`` sees key
``j`` iff ``j <= i + Sk - Sq``. torch SDPA's ``is_causal`` aligns to the top left instead;
the two agree only when ``Sq == Sk``.

Memory: work is done one (batch, query head) at a time, in blocks of query rows, so at most
one block of one head's score matrix (about ``_BLOCK_ELEMENTS`` scores) is held at once.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = ["attention", "attention_naive", "check_close"]

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
    """Row max (0 where the row is empty), unnormalized probabilities, row sums; never NaN."""
    m = s.max(axis=1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m).astype(s.dtype, copy=False)  # empty row: exp(-inf - 0) = 0
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    return m, p, l


def _lse(m: np.ndarray, l: np.ndarray) -> np.ndarray:
    nonempty = l > 0
    log_l = np.log(np.where(nonempty, l, 1)).astype(l.dtype, copy=False)
    return np.where(nonempty, m + log_l, -np.inf).astype(l.dtype, copy=False)[:, 0]


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
              return_lse: bool = False, rows=None):
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

    Returns:
        ``out`` (float64, q's shape), and with ``return_lse`` also ``lse`` (float64,
        ``(B, Hq, Sq)``): natural log of the row sum of ``exp(scale·q·kᵀ)`` over visible keys.
        A row with no visible key (causal with ``Sq > Sk``) gets output 0 and LSE ``-inf``.
    """
    q = np.asarray(q)
    k = np.asarray(k)
    v = np.asarray(v)
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    f64 = np.dtype(np.float64)
    qb, kb, vb = (_as_bhsd(x, f64, layout) for x in (q, k, v))

    rows = _query_rows(rows, Sq)
    out = np.zeros((B, Hq, rows.size, D), dtype=np.float64)
    lse = np.full((B, Hq, rows.size), -np.inf, dtype=np.float64)
    for b, h, qh, kh, vh in _heads(qb, kb, vb):
        for at, idx, kend in _row_blocks(rows, Sq, Sk, causal):
            s = (qh[idx] @ kh[:kend].T) * scale
            if causal:
                _mask_scores(s, idx, Sq, Sk)
            m, p, l = _softmax_parts(s)
            out[b, h, at] = (p @ vh[:kend]) / np.where(l > 0, l, 1.0)
            lse[b, h, at] = _lse(m, l)
    out = _from_bhsd(out, layout)
    return (out, lse) if return_lse else out


def attention_naive(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "bshd",
                    dtype=None, return_lse: bool = False, round_scores: bool = False, rows=None):
    """The same attention done in low precision, as a plain (unfused) GPU implementation would.

    Inputs are rounded to ``dtype`` (default: q's dtype, which must then be 16-bit or FP8), then:
    scores ``q·kᵀ`` with float32 accumulation, times ``scale`` in float32; softmax in float32;
    probabilities rounded to ``dtype``; ``P·V`` with float32 accumulation; output rounded to the
    output dtype (``dtype``, or bfloat16 for FP8). Empty rows give 0 (and LSE ``-inf``).

    ``round_scores=True`` also rounds the scores to ``dtype`` (with ``scale`` folded into k in
    ``dtype`` first), as FlashAttention's torch baseline does (``attention_ref(upcast=False,
    reorder_ops=True)``): a noisier baseline, so a looser bound. The default keeps scores in
    float32, as a fused kernel does.

    Returns ``out`` in the output dtype (layout as given) and, with ``return_lse``, a float32
    LSE ``(B, Hq, Sq)``. ``rows`` selects query rows as in `attention`.
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
    s32 = np.float32(scale)

    rows = _query_rows(rows, Sq)
    out = np.zeros((B, Hq, rows.size, D), dtype=np.float32)
    lse = np.full((B, Hq, rows.size), -np.inf, dtype=np.float32)
    for b, h, qh, kh, vh in _heads(qb, kb, vb):
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
            out[b, h, at] = probs @ vh[:kend]
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


def check_close(out, ref, naive, *, atol: float = 1e-5) -> tuple[bool, float, float]:
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
