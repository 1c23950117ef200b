"""cudattn.reference: the low-precision "naive" baseline and check_close (DESIGN §6's rule), with
row subsets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudattn import reference
from cudattn.reference import _common, attention, attention_naive, check_close
from _reference_cases import BF16, FP8, make
from _reference_cases import _warnings_are_errors as _warnings_are_errors  # fixtures


# ---- the low-precision baseline ---------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (BF16, 2e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_is_close_to_reference(dtype, tol, causal):
    rng = np.random.default_rng(10)
    q, k, v = make(rng, 2, 9, 7, 4, 2, 32, dtype=dtype)
    ref, ref_lse = attention(q, k, v, causal=causal, return_lse=True)
    out, lse = attention_naive(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == np.dtype(dtype) and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == ref_lse.shape
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=tol, rtol=0)
    err = np.abs(out.astype(np.float64) - ref).max()
    assert err > 0  # it really is rounded
    assert check_close(lse, ref_lse, lse)[0]
    if causal:  # Sq > Sk: empty rows
        assert np.all(out[:, :2] == 0) and np.all(np.isneginf(lse[:, :, :2]))


def test_naive_layout_and_dtype_argument():
    rng = np.random.default_rng(11)
    q, k, v = make(rng, 1, 5, 6, 2, 1, 16, layout="bhsd", dtype=np.float64)
    out = attention_naive(q, k, v, layout="bhsd", dtype=BF16)
    assert out.dtype == BF16 and out.shape == q.shape
    again = attention_naive(*(x.astype(BF16) for x in (q, k, v)), layout="bhsd")
    np.testing.assert_array_equal(out.astype(np.float32), again.astype(np.float32))
    assert attention_naive(q, k, v, layout="bhsd", dtype=FP8).dtype == BF16  # FP8 writes bfloat16
    with pytest.raises(TypeError, match="low-precision dtype"):
        attention_naive(q, k, v, layout="bhsd")  # float64 inputs need dtype=


def test_naive_round_scores_is_noisier():
    rng = np.random.default_rng(12)
    q, k, v = make(rng, 2, 64, 64, 4, 4, 64, dtype=BF16)
    ref = attention(q, k, v)
    e_fused = np.abs(attention_naive(q, k, v).astype(np.float64) - ref).max()
    e_torch = np.abs(attention_naive(q, k, v, round_scores=True).astype(np.float64) - ref).max()
    assert e_torch > e_fused > 0


def test_fast_float16_rounding_is_bit_exact():
    rng = np.random.default_rng(13)
    x = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float32)
    ties = (h.view(np.uint32) + np.uint32(0x1000)).view(np.float32)  # halfway between float16 neighbours
    specials = np.array([0.0, -0.0, 2**-25, 3 * 2**-25, 2**-14, 65504, 65519.9, 65520, -1e9, np.inf, np.nan], np.float32)
    for xs in (x, h, ties, specials, rng.random(4096, dtype=np.float32) * 1e-5):
        with np.errstate(all="ignore"):
            want = xs.astype(np.float16).astype(np.float32)
            got = _common._round_f16(xs)
        same = (want.view(np.uint32) == got.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
        assert same.all(), xs[~same][:5]


# ---- check_close ------------------------------------------------------------------------------


def test_check_close_rule():
    ref = np.array([1.0, 2.0, 3.0])
    naive = np.array([1.0, 2.1, 3.0])  # max error 0.1 → bound 0.2 + atol
    ok, err, bound = check_close(np.array([1.0, 2.0, 3.15]), ref, naive)
    assert ok and err == pytest.approx(0.15) and bound == pytest.approx(0.2 + 1e-5)
    assert isinstance(ok, bool) and isinstance(err, float) and isinstance(bound, float)
    ok, err, _ = check_close(np.array([1.0, 2.0, 3.3]), ref, naive)
    assert not ok and err == pytest.approx(0.3)
    # naive == ref: only atol is left
    assert check_close(ref + 5e-6, ref, ref)[0]
    assert not check_close(ref + 2e-5, ref, ref)[0]
    assert check_close(ref + 2e-5, ref, ref, atol=1e-4)[0]


def test_check_close_nan_and_inf_never_pass():
    ref = np.zeros(4)
    naive = np.full(4, 10.0)  # a huge bound
    ok, err, bound = check_close(np.array([0, 0, np.nan, 0]), ref, naive)
    assert not ok and math.isnan(err) and bound == pytest.approx(20 + 1e-5)
    assert not check_close(np.array([0, 0, np.inf, 0]), ref, naive)[0]
    assert not check_close(np.array([0, 0, -np.inf, 0]), ref, naive)[0]


def test_check_close_lse_with_empty_rows():
    ref = np.array([-np.inf, 1.0, 2.0])
    naive = np.array([-np.inf, 1.0, 2.001])
    assert check_close(np.array([-np.inf, 1.0, 2.0015], np.float32), ref, naive)[0]
    assert not check_close(np.array([0.0, 1.0, 2.0]), ref, naive)[0]  # an empty row must stay -inf
    assert not check_close(np.array([-np.inf, -np.inf, 2.0]), ref, naive)[0]  # and a full one finite


def test_check_close_accepts_low_precision_and_checks_shapes():
    ref = np.linspace(-1, 1, 12).reshape(3, 4)
    naive = ref.astype(np.float16)
    assert check_close(ref.astype(BF16), ref, naive, atol=1e-2)[0]
    with pytest.raises(ValueError, match="shape"):
        check_close(ref[:2], ref, naive)
    with pytest.raises(ValueError, match="ref contains NaN"):
        check_close(ref, np.full_like(ref, np.nan), naive)
    with pytest.raises(ValueError, match="naive"):
        check_close(ref, ref, np.full_like(ref, np.nan))


def test_check_close_end_to_end_with_naive():
    rng = np.random.default_rng(14)
    q, k, v = make(rng, 1, 17, 33, 4, 1, 64)
    ref = attention(q, k, v, causal=True)
    naive = attention_naive(q, k, v, causal=True)
    assert check_close(naive, ref, naive)[0]
    ok, err, bound = check_close(naive.astype(np.float64) + 0.01, ref, naive)
    assert not ok and err > bound


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(7, 7), (9, 5), (5, 11)])
def test_rows_subset_matches_full(causal, sq, sk):
    """`rows=` computes exactly those rows of the full result (bottom-right causal included)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, sq, 4, 16)).astype(np.float16)
    k = rng.standard_normal((2, sk, 2, 16)).astype(np.float16)
    v = rng.standard_normal((2, sk, 2, 16)).astype(np.float16)
    rows = np.array([sq - 1, 0, sq // 2])
    # BLAS may block a different row count differently: equal up to rounding (one fp16 ulp for naive)
    for fn, tol in ((reference.attention, 1e-12), (reference.attention_naive, 1e-3)):
        full, lse = fn(q, k, v, causal=causal, return_lse=True)
        part, plse = fn(q, k, v, causal=causal, return_lse=True, rows=rows)
        np.testing.assert_allclose(part.astype(np.float64), full[:, rows].astype(np.float64), rtol=tol, atol=tol)
        np.testing.assert_allclose(plse, lse[:, :, rows], rtol=tol, atol=tol)
    bh = reference.attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                             causal=causal, layout="bhsd", rows=rows)
    np.testing.assert_allclose(bh, reference.attention(q, k, v, causal=causal)[:, rows].transpose(0, 2, 1, 3),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [np.array([3]), np.array([[0]]), np.array([0.5])])
def test_rows_rejects_bad_indices(rows):
    q = np.ones((1, 3, 1, 8), np.float16)
    with pytest.raises(ValueError, match="rows"):
        reference.attention(q, q, q, rows=rows)
