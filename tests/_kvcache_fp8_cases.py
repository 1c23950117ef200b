"""Shared pieces of the FP8 KV-cache GPU tests (test_kvcache_fp8*_gpu.py): the dtypes, one seed
sequence, and the dequantization of a cache.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

F8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
_seed = itertools.count(9300)


def _dequant(cache, table, lens, descale_b, B):
    """(B, L_max, Hkv, D) float32 contiguous copies of each sequence's dequantized keys."""
    if table is None:
        per = cache.astype(np.float32)
    else:
        per = cache[table].reshape(B, -1, *cache.shape[2:]).astype(np.float32)
    return per * descale_b[:, None, :, None]
