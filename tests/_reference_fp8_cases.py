"""Shared pieces of the FP8 reference tests (test_reference_fp8*.py): quantised random inputs
with their descales, and the fixture that turns every warning into an error.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from cudattn.reference import quantize_fp8

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    # No RuntimeWarning (overflow, 0/0, -inf - -inf) may leak out of the reference or the emulation.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _shapes(B, Sq, Sk, Hq, Hkv, D, layout="bshd"):
    if layout == "bshd":
        return (B, Sq, Hq, D), (B, Sk, Hkv, D)
    return (B, Hq, Sq, D), (B, Hkv, Sk, D)


def outliers(rng, x, frac=1e-3, lo=20.0, hi=100.0):
    """x with a fraction ``frac`` of its entries set to ±(lo..hi) (in place; returned)."""
    hit = rng.random(x.shape) < frac
    x[hit] = rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(lo, hi, hit.sum())
    return x


def make_fp8(rng, B, Sq, Sk, Hq, Hkv, D, *, layout="bshd", per="head", dist="normal", head_gain=True):
    """Quantised q, k, v and their descales (as `attention`'s keyword arguments). With
    ``head_gain`` the heads get different magnitudes, so that per-head descales differ."""
    qs, ks = _shapes(B, Sq, Sk, Hq, Hkv, D, layout)
    ax = 2 if layout == "bshd" else 1
    xs = []
    for shape in (qs, ks, ks):
        x = rng.standard_normal(shape).astype(np.float32)
        if head_gain:
            gain = np.sqrt(1.0 + np.arange(shape[ax], dtype=np.float32))
            x *= gain.reshape([-1 if a == ax else 1 for a in range(4)])
        if dist == "outliers":
            outliers(rng, x)
        xs.append(x)
    (q, qd), (k, kd), (v, vd) = (quantize_fp8(x, per=per, layout=layout, heads_kv=Hkv) for x in xs)
    return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)
