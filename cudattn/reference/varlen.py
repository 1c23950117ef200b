"""`attention_varlen`: the float64 reference of a packed variable-length batch (FlashAttention's
varlen layout, ``cu_seqlens`` offsets), computed as `attention` per sequence."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import HostArrayLike
from .._spec.varlen import check_max_seqlen
from ._common import _mods_kwargs, _packed_offsets, _parse_mods
from .dense import attention


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
    cq, ck = _packed_offsets(q, k, v, cu_seqlens_q, cu_seqlens_k)
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
