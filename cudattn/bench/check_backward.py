"""Are a benchmarked backward's gradients right? FlashAttention's rule on a subsample of a large problem.

- dq: the first and the last ROWS query rows of batches {0, B-1} and query heads {0, Hq-1} (with
  their KV heads), each end cut out as its own problem with the keys its rows see (bottom-right
  causal keeps its masks so, as in `check`), against `reference.attention_backward` (float64,
  recomputed from q, k, v) and its naive baseline `reference.attention_backward_naive`: a query
  row's gradient depends on that row alone.
- dk, dv: up to `check.MAX_ROWS` key positions (the first and last 16, the rest random) of batches
  {0, B-1} and KV heads {0, Hkv-1}, summed over every query row of each query head that shares the
  KV head. A key's gradient depends on every row that sees it, and each row's probabilities on
  all of its keys; rather than the whole problem, the probabilities are taken from the forward's
  LSE and ``D = rowsum(dO ∘ O)`` from its output, the backward's own inputs: in float64 for the
  reference, in float32 with P and dS rounded to the input dtype for the naive baseline (as
  `attention_backward_naive` rounds them).

The rule, per gradient: ``max|grad - ref| <= 2·max|naive - ref| + eps``, with FlashAttention-3's
eps for gradients (`reference.gradient_eps`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import reference
from ..reference.rule import check_close, gradient_eps
from .check import sample_rows
from .grids import Case

ROWS = 32  # query rows at each end for dq


def _picked(case: Case):
    """Batches, query heads and their KV heads, each query head on its own KV head (as `check`)."""
    group = case.Hq // case.Hkv
    hs = sorted({0, case.Hq - 1})
    return sorted({0, case.B - 1}), hs, sorted({h // group for h in hs})


def _dq_ends(case: Case, q, k, v, dout, dq):
    """(got, ref, naive) dq of the first and the last ROWS query rows, picked batches and heads."""
    bs, hs, kvs = _picked(case)
    n, off = min(ROWS, case.Sq), case.Sk - case.Sq
    ends = [(np.arange(n), np.arange(min(case.Sk, n + off)) if case.causal else np.arange(case.Sk)),
            (np.arange(case.Sq - n, case.Sq), np.arange(case.Sk))]
    got, ref, naive = [], [], []
    for rows, keys in ends:
        if keys.size == 0:
            continue  # causal rows that see no key: nothing to compare but zeros
        qs, gs = q[np.ix_(bs, rows, hs)], dout[np.ix_(bs, rows, hs)]
        ks, vs = k[np.ix_(bs, keys, kvs)], v[np.ix_(bs, keys, kvs)]
        ref.append(reference.attention_backward(gs, qs, ks, vs, causal=case.causal)[0])
        naive.append(reference.attention_backward_naive(gs, qs, ks, vs, causal=case.causal)[0])
        got.append(dq[np.ix_(bs, rows, hs)])
    return tuple(np.concatenate(x, axis=1) for x in (got, ref, naive))


def _dkv_columns(case: Case, q, k, v, dout, out, lse, cols):
    """(ref, naive) dk and dv ``(batches, len(cols), KV heads, D)`` at key positions ``cols``, taken
    from the forward's ``out`` and ``lse`` (see the module's docstring)."""
    bs, _, kvs = _picked(case)
    low = np.dtype(q.dtype)
    group, scale, off = case.Hq // case.Hkv, 1.0 / math.sqrt(case.D), case.Sk - case.Sq
    rows = np.arange(case.Sq)
    visible = (cols[None, :] <= rows[:, None] + off) if case.causal else np.ones((case.Sq, cols.size), bool)
    shape = (len(bs), cols.size, len(kvs), case.D)
    res = {np.float64: [np.zeros(shape), np.zeros(shape)], np.float32: [np.zeros(shape, np.float32),
                                                                      np.zeros(shape, np.float32)]}
    for bi, b in enumerate(bs):
        for gi, g in enumerate(kvs):
            for h in range(g * group, (g + 1) * group):
                for dt, acc in res.items():
                    rnd = (lambda x: x) if dt is np.float64 else (lambda x: x.astype(low).astype(np.float32))
                    qh, gh, oh = (x[b, :, h].astype(dt) for x in (q, dout, out))
                    kc, vc = k[b, cols, g].astype(dt), v[b, cols, g].astype(dt)
                    x = (qh @ kc.T) * dt(scale)
                    with np.errstate(over="ignore", invalid="ignore"):  # rows that see no key: lse -inf
                        p = np.where(visible, np.exp(x - lse[b, h].astype(dt)[:, None]), dt(0))
                    d_row = (gh * oh).sum(axis=1)
                    ds = p * (gh @ vc.T - d_row[:, None])
                    acc[0][bi, :, gi] += dt(scale) * (rnd(ds).T @ qh)
                    acc[1][bi, :, gi] += rnd(p).T @ gh
    return res[np.float64], res[np.float32]


def check_grads(case: Case, q, k, v, dout, out, lse, grads, rng: np.random.Generator) -> dict:
    """Check ``grads`` (host dq, dk, dv, bshd) of ``attention_backward(dout, q, k, v, out, lse,
    causal=case.causal)`` on a subsample; ``out`` and ``lse`` are the forward's, on the host."""
    dq, dk, dv = grads
    bs, hs, kvs = _picked(case)
    cols = sample_rows(case.Sk, rng)
    (rk, rv), (nk, nv) = _dkv_columns(case, q, k, v, dout, out, lse, cols)
    parts = {"dq": _dq_ends(case, q, k, v, dout, dq),
             "dk": (dk[np.ix_(bs, cols, kvs)], rk, nk), "dv": (dv[np.ix_(bs, cols, kvs)], rv, nv)}
    low = np.dtype(q.dtype)
    each = {}
    for name, (got, ref, naive) in parts.items():
        ok, err, bound = check_close(got, ref, naive, atol=gradient_eps(ref, low))
        each[name] = {"ok": ok, "max_err": err, "bound": bound}
    res = combine(*each.values())
    res.update(grads=each, batches=bs, heads=hs, rows=2 * min(ROWS, case.Sq), of_rows=case.Sq,
               keys=int(cols.size), of_keys=case.Sk)
    return res


def combine(*checks: dict) -> dict:
    """One verdict of several checks: ok when all are, with the error and bound of the one closest
    to (or furthest past) its bound."""
    def margin(c):
        return math.inf if not math.isfinite(c["max_err"]) else c["max_err"] / max(c["bound"], 1e-30)

    worst = max(checks, key=margin)
    return {"ok": all(c["ok"] for c in checks), "max_err": worst["max_err"], "bound": worst["bound"]}

