"""Shared pieces of the runtime layer's GPU tests (test_runtime_*gpu.py): dtypes, random arrays,
bitwise comparison, and copies checked on a given stream.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from cudattn._arrays.host_io import to_device, to_host

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
DTYPES = [np.dtype(np.float16), BF16, FP8]


def _random(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _check_copies_on(stream):
    x = _random((3, 203, 7), BF16, seed=3)
    d = to_device(x, stream=stream)
    assert _same_bits(to_host(d, stream=stream), x)
    d.fill_nan(stream=stream)
    assert np.all(np.isnan(to_host(d, stream=stream).astype(np.float32)))
