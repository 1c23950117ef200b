"""Shared pieces of the reference tests (test_reference.py, test_reference_naive.py): random
inputs, dtypes, and the fixture that turns every warning into an error.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def make(rng, B, Sq, Sk, Hq, Hkv, D, layout="bshd", dtype=np.float16):
    if layout == "bshd":
        shapes = (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
    else:
        shapes = (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    # No RuntimeWarning (0/0, log 0, -inf - -inf) may leak out of the reference.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
