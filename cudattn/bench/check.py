"""Is a benchmarked output right? The §6 rule on a subsample of a large problem.

Checked: batches {0, B-1}, query heads {0, Hq-1} (with their KV heads), and up to 64 query rows
(the first and last 16, the rest random), against all keys; float64 reference vs the naive
low-precision baseline, ``max|out − ref| ≤ 2·max|naive − ref| + 1e-5``.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from .grids import Case

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
