"""Is a benchmarked output right? The §6 rule on a subsample of a large problem.

Checked: batches {0, B-1}, query heads {0, Hq-1} (with their KV heads), and up to 64 query rows
(the first and last 16, the rest random), against all keys; float64 reference vs the naive
low-precision baseline, ``max|out − ref| ≤ 2·max|naive − ref| + 1e-5``.

FP8 rows: the first and the last FP8_ROWS query rows of the same batches and heads, against the
float64 reference and the NumPy emulation of the FP8 arithmetic (`reference.check_close_fp8`).
The emulation takes whole problems, so each end is cut out as its own problem: the last rows
with all keys, the first rows with the keys they can see (bottom-right causal keeps the same
masks either way; without causal every row sees every key).
"""

from __future__ import annotations

import numpy as np

from .. import reference
from .grids import FP8, Case

MAX_ROWS = 64


def sample_rows(Sq: int, rng: np.random.Generator) -> np.ndarray:
    if Sq <= MAX_ROWS:
        return np.arange(Sq)
    ends = np.r_[np.arange(16), np.arange(Sq - 16, Sq)]
    middle = rng.choice(np.arange(16, Sq - 16), size=MAX_ROWS - 32, replace=False)
    return np.sort(np.r_[ends, middle])


def check_output(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                 rng: np.random.Generator) -> dict:
    """Check ``out`` (host, bshd) of ``attention(q, k, v, causal=case.causal)`` on a subsample."""
    if case.dtype == FP8:
        return _check_fp8(case, q, k, v, out)
    group = case.Hq // case.Hkv
    bs = sorted({0, case.B - 1})
    hs = sorted({0, case.Hq - 1})
    kvs = sorted({h // group for h in hs})  # keeps each selected query head on its own KV head
    rows = sample_rows(case.Sq, rng)
    qs, ks, vs = q[bs][:, :, hs], k[bs][:, :, kvs], v[bs][:, :, kvs]
    ref = reference.attention(qs, ks, vs, causal=case.causal, rows=rows)
    naive = reference.attention_naive(qs, ks, vs, causal=case.causal, rows=rows)
    got = out[bs][:, rows][:, :, hs]
    ok, err, bound = reference.check_close(got, ref, naive)
    return {"ok": ok, "max_err": err, "bound": bound, "batches": bs, "heads": hs, "rows": int(rows.size),
            "of_rows": case.Sq}


FP8_ROWS = 32


def _check_fp8(case: Case, q, k, v, out) -> dict:
    group = case.Hq // case.Hkv
    bs, hs = sorted({0, case.B - 1}), sorted({0, case.Hq - 1})
    kvs = sorted({h // group for h in hs})
    n = min(FP8_ROWS, case.Sq)
    off = case.Sk - case.Sq
    # (query rows, keys seen): the first rows see keys < n + off under causal; the last rows all.
    ends = [(slice(0, n), slice(0, min(case.Sk, n + off)) if case.causal else slice(None)),
            (slice(case.Sq - n, case.Sq), slice(None))]
    worst, ok = None, True
    for rows, keys in ends:
        if keys.stop is not None and keys.stop <= 0:
            continue  # causal rows that see no key: nothing to compare but zeros
        qs, ks, vs = q[bs][:, rows][:, :, hs], k[bs][:, keys][:, :, kvs], v[bs][:, keys][:, :, kvs]
        ref = reference.attention(qs, ks, vs, causal=case.causal)
        emu = reference.attention_fp8_emulated(qs, ks, vs, causal=case.causal)
        good, stats = reference.check_close_fp8(out[bs][:, rows][:, :, hs], ref, emu)
        ok &= good
        if worst is None or stats["out"]["max_abs"] > worst["out"]["max_abs"]:
            worst = stats
    return {"ok": bool(ok), "max_err": worst["out"]["max_abs"], "bound": worst["max_bound"],
            "rel_rmse": worst["out"]["rel_rmse"], "batches": bs, "heads": hs, "rows": 2 * n, "of_rows": case.Sq}
