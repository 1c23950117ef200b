"""Shared pieces of the reliability GPU tests (test_reliability*_gpu.py): dtypes, one seed
sequence, random q, k, v.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
_seed = itertools.count(7000)


def _inputs(rng, B, Sq, Sk, H, D, dtype):
    q = rng.standard_normal((B, Sq, H, D), dtype=np.float32)
    k = rng.standard_normal((B, Sk, H, D), dtype=np.float32)
    v = rng.standard_normal((B, Sk, H, D), dtype=np.float32)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)
