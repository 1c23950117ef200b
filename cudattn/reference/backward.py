"""`attention_backward`: exact float64 gradients of `attention` (dense or packed), under every score
modifier: the ground truth the backward kernels are held to.

With ``S = modifiers(scale · q kᵀ)`` (softcap, then ALiBi, then the masks), ``P = softmax(S)`` over
the keys a row sees (a sink's ``e^{sink}`` joining the denominator, with no value) and
``O = P v``, for a loss whose gradient at ``O`` is ``dO``:

- ``dV = Pᵀ dO``, ``dP = dO vᵀ``, ``D = rowsum(dO ∘ O) = rowsum(P ∘ dP)``;
- ``dS = P ∘ (dP − D)``; through the softcap ``c · tanh(x / c)`` of the scaled scores
  ``x``, times ``1 − tanh²(x / c)``; ALiBi adds a constant and the masks drop keys (``P = 0``
  there), so neither adds a term;
- ``dQ = scale · dS k``, ``dK = scale · dSᵀ q``, summed over the query heads that share a KV head
  (GQA/MQA), as ``dV`` is;
- a sink's own gradient: ``∂O/∂sink = −P_sink · O``, so ``dsink = −Σ_rows P_sink · D`` with
  ``P_sink = e^{sink − lse}``, summed over the batch and the rows of its head.

Rows that see no key contribute nothing. The gradients are recomputed from q, k and v (the
forward's output and LSE are not inputs: this is the ground truth, not a replay of them).

`attention_backward_naive` is the same math done as a plain GPU implementation would in the
inputs' 16-bit dtype (float32 accumulation; P, dS and the forward's output rounded to the dtype):
the baseline of the correctness rule the backward kernels are held to, ``max|grad − ref| ≤
2·max|naive − ref| + atol`` (`check_close`), as the forward's is `attention_naive`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import DTypeLike, HostArrayLike, Layout
from . import _common
from ._common import _BF16, _as_bhsd, _from_bhsd, _mods_kwargs, _packed_offsets, _parse_mods, _round_to, _shapes
from .dense import _softmax_sink

Grads = tuple[NDArray[np.float64], ...]


def attention_backward(dout: HostArrayLike, q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *,
                       causal: bool = False, scale: float | None = None, layout: Layout = "bshd",
                       window_size: tuple[int, int] | None = None, softcap: float | None = None,
                       alibi_slopes: HostArrayLike | None = None, sinks: HostArrayLike | None = None,
                       cu_seqlens_q: HostArrayLike | None = None, cu_seqlens_k: HostArrayLike | None = None,
                       ) -> Grads:
    """The gradients of `attention` (or `attention_varlen`) at ``dout``, in float64.

    Parameters
    ----------
    dout : array
        The gradient at the output: q's shape.
    q, k, v, causal, scale, layout, window_size, softcap, alibi_slopes, sinks
        As in `attention` (16-bit or float inputs, upcast to float64; no FP8 descales).
    cu_seqlens_q, cu_seqlens_k : int32 arrays (B + 1,), optional
        A packed batch, as in `attention_varlen`: q ``(total_q, Hq, D)``, k and v
        ``(total_k, Hkv, D)``; each sequence is differentiated on its own (``(B, Hq)`` slopes: row
        ``b`` for sequence ``b``; the sinks' gradient summed over the sequences).

    Returns
    -------
    (dq, dk, dv), or (dq, dk, dv, dsinks) when ``sinks`` is given
        float64, the shapes of q, k, v (and ``(Hq,)`` for the sinks).

    Raises
    ------
    ValueError, TypeError
        Shapes or arguments that `attention` refuses, or a ``dout`` of another shape than q's.
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together (a packed batch needs both)")
    if cu_seqlens_q is not None:
        return _packed(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window_size, softcap,
                       alibi_slopes, sinks)
    return _dense(dout, q, k, v, causal, scale, layout, window_size, softcap, alibi_slopes, sinks, None)


def attention_backward_naive(dout: HostArrayLike, q: HostArrayLike, k: HostArrayLike, v: HostArrayLike, *,
                             causal: bool = False, scale: float | None = None, layout: Layout = "bshd",
                             window_size: tuple[int, int] | None = None, softcap: float | None = None,
                             alibi_slopes: HostArrayLike | None = None, sinks: HostArrayLike | None = None,
                             dtype: DTypeLike | None = None) -> tuple[np.ndarray, ...]:
    """`attention_backward` as a plain GPU implementation would do it in the inputs' dtype.

    The inputs and ``dout`` are rounded to ``dtype`` (default: q's, which must then be float16 or
    bfloat16); products accumulate in float32; the probabilities, the forward's output (from which
    ``D = rowsum(dO ∘ O)`` is taken) and ``dS`` are rounded to ``dtype`` before they enter a
    product, as the forward's naive baseline and FlashAttention's backward kernels round them.
    Dense batches only (arguments as `attention_backward`).

    Returns
    -------
    (dq, dk, dv) in ``dtype``, or (dq, dk, dv, dsinks) with dsinks float32 ``(Hq,)``.
    """
    low = np.dtype(np.asarray(q).dtype if dtype is None else dtype)
    if low not in (np.dtype(np.float16), _BF16):
        raise TypeError(f"attention_backward_naive needs dtype float16 or bfloat16; got {low}: pass "
                        f"dtype=np.float16 or dtype=ml_dtypes.bfloat16")
    rounded = [np.asarray(x).astype(low) for x in (dout, q, k, v)]
    grads = _dense(*rounded, causal, scale, layout, window_size, softcap, alibi_slopes, sinks, low)
    return (*(g.astype(low) for g in grads[:3]), *(g.astype(np.float32) for g in grads[3:]))


def _dense(dout, q, k, v, causal, scale, layout, window_size, softcap, alibi_slopes, sinks, low) -> Grads:
    """The gradients of a dense batch: exact in float64 (``low`` None), or in float32 with the
    products' operands rounded to ``low`` (`attention_backward_naive`)."""
    q, k, v, dout = (np.asarray(x) for x in (q, k, v, dout))
    B, Sq, Sk, Hq, Hkv, D = _shapes(q.shape, k.shape, v.shape, layout)
    if dout.shape != q.shape:
        raise ValueError(f"dout must have q's shape {q.shape}; got {dout.shape}")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)
    dt = np.dtype(np.float64 if low is None else np.float32)
    rnd = (lambda x: x) if low is None else (lambda x: _round_to(x, low))  # noqa: E731
    qb, kb, vb, gb = (_as_bhsd(x, dt, layout) for x in (q, k, v, dout))
    dq, dk, dv = np.zeros(qb.shape, dt), np.zeros(kb.shape, dt), np.zeros(vb.shape, dt)
    dsinks = np.zeros(Hq, dt)
    group = Hq // Hkv
    n = max(1, _common._BLOCK_ELEMENTS // max(Sk, 1))  # query rows a block (bounded score memory)
    rows = np.arange(Sq)
    for b in range(B):
        for h in range(Hq):
            kh, vh = kb[b, h // group], vb[b, h // group]
            sink = mods.sink(h)
            for r0 in range(0, Sq, n):
                idx = rows[r0:r0 + n]
                lo, hi = mods.key_range(idx, Sq, Sk, causal)
                if hi <= lo:
                    continue  # no key for these rows: no gradient
                x = (qb[b, h, idx] @ kh[lo:hi].T) * dt.type(scale)  # the scaled scores
                s = x.copy()
                mods.scores(s, b, h, idx, lo, Sq, Sk, causal)
                m, p, l = _softmax_sink(s, sink)
                p = p / np.where(l > 0, l, dt.type(1))
                g = gb[b, h, idx]
                dp = g @ vh[lo:hi].T
                # D = rowsum(dO ∘ O): exactly rowsum(P ∘ dP); the naive takes its own rounded output
                d_row = (p * dp).sum(axis=1) if low is None else (g * rnd(rnd(p) @ vh[lo:hi])).sum(axis=1)
                ds = p * (dp - d_row[:, None])
                if mods.softcap:
                    ds *= 1.0 - np.tanh(x / dt.type(mods.softcap)) ** 2
                ds_r = rnd(ds)
                dq[b, h, idx] += dt.type(scale) * (ds_r @ kh[lo:hi])
                dk[b, h // group, lo:hi] += dt.type(scale) * (ds_r.T @ qb[b, h, idx])
                dv[b, h // group, lo:hi] += rnd(p).T @ g
                if sink is not None:
                    p_sink = np.exp(dt.type(sink) - m[:, 0]) / l[:, 0]
                    dsinks[h] -= (p_sink * d_row).sum()
    grads = (_from_bhsd(dq, layout), _from_bhsd(dk, layout), _from_bhsd(dv, layout))
    return (*grads, dsinks) if sinks is not None else grads


def _packed(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window_size, softcap, alibi_slopes,
            sinks) -> Grads:
    """`attention_backward` of a packed batch: each sequence as a batch of one."""
    q, k, v, dout = (np.asarray(x) for x in (q, k, v, dout))
    cq, ck = _packed_offsets(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if dout.shape != q.shape:
        raise ValueError(f"dout must have q's shape {q.shape}; got {dout.shape}")
    B, Hq = cq.size - 1, q.shape[1]
    mods = _parse_mods(window_size, softcap, sinks, alibi_slopes, causal, B, Hq)  # checks them once
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dsinks = np.zeros(Hq)
    for b in range(B):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if qs.start == qs.stop or ks.start == ks.stop:
            continue  # no rows, or rows that see no key: no gradient
        got = attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal=causal, scale=scale,
                                 **_mods_kwargs(window_size, softcap, sinks, mods, b))
        dq[qs], dk[ks], dv[ks] = got[0][0], got[1][0], got[2][0]
        if sinks is not None:
            dsinks += got[3]
    return (dq, dk, dv, dsinks) if sinks is not None else (dq, dk, dv)
