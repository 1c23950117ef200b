"""Shared pieces of the reference operations: input checks and layouts (shapes, bshd ↔ bhsd),
rounding to float16/bfloat16, FP8 descales, GQA head grouping, query-row blocking, the causal mask,
the softmax pieces (row max, unnormalised probabilities, row sums, LSE) and the parsing of the score
modifiers. No operation lives here; every other module of `cudattn.reference` builds on these."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .._spec.modifiers import parse_modifiers
from .._spec.varlen import check_cu_seqlens

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


def _packed_offsets(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens_q, cu_seqlens_k):
    """A packed batch's shapes checked and its offsets ``(cq, ck)`` (FlashAttention's varlen layout)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"varlen q, k, v must be (total_q, Hq, D), (total_k, Hkv, D) twice; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    cq = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    return cq, check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch=cq.size - 1)
