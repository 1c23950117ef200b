"""cudattn.reference: the float64 reference, the low-precision "naive" baseline, and check_close."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cudattn import reference
from cudattn.reference import _common, attention, attention_naive, check_close

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


# --------------------------------------------------------------------------------------------
# An independent, deliberately plain formula: loops over (batch, head), a mask built entry by
# entry from the index rule, np.exp / np.sum over the visible keys only.
# --------------------------------------------------------------------------------------------


def formula(q, k, v, *, causal=False, scale=None, layout="bshd"):
    q = np.asarray(q).astype(np.float64)
    k = np.asarray(k).astype(np.float64)
    v = np.asarray(v).astype(np.float64)
    if layout == "bshd":  # to (B, H, S, D)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = np.zeros((B, Hq, Sq, D))
    lse = np.full((B, Hq, Sq), -np.inf)
    visible = np.zeros((Sq, Sk), dtype=bool)
    for i in range(Sq):
        for j in range(Sk):
            visible[i, j] = (not causal) or (j <= i + Sk - Sq)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                js = np.flatnonzero(visible[i])
                if js.size == 0:
                    continue
                s = np.array([scale * np.dot(q[b, h, i], k[b, hk, j]) for j in js])
                e = np.exp(s - s.max())
                out[b, h, i] = np.sum(e[:, None] * v[b, hk, js], axis=0) / np.sum(e)
                lse[b, h, i] = s.max() + np.log(np.sum(e))
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return out, lse


def make(rng, B, Sq, Sk, Hq, Hkv, D, layout="bshd", dtype=np.float16):
    if layout == "bshd":
        shapes = (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
    else:
        shapes = (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)
    return tuple(rng.standard_normal(s).astype(dtype) for s in shapes)


SHAPES = [
    # B, Sq, Sk, Hq, Hkv, D
    (1, 1, 1, 1, 1, 8),  # Sq = Sk = 1
    (2, 5, 5, 3, 3, 16),  # MHA, square
    (2, 3, 7, 4, 2, 8),  # GQA, Sq < Sk
    (1, 9, 4, 6, 1, 24),  # MQA, Sq > Sk (causal: empty rows)
    (3, 1, 11, 4, 4, 32),  # decode-like: one query
    (1, 13, 13, 8, 2, 8),
    (2, 7, 1, 2, 1, 16),  # one key
]


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    # No RuntimeWarning (0/0, log 0, -inf - -inf) may leak out of the reference.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_formula(shape, causal, layout):
    rng = np.random.default_rng(hash((shape, causal, layout)) % 2**32)
    q, k, v = make(rng, *shape, layout=layout)
    out, lse = attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    want_out, want_lse = formula(q, k, v, causal=causal, layout=layout)
    assert out.dtype == np.float64 and out.shape == q.shape
    assert lse.dtype == np.float64 and lse.shape == (shape[0], shape[3], shape[1])
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
    assert not np.isnan(out).any() and not np.isnan(lse).any()


@pytest.mark.parametrize("scale", [0.3, -0.7, 0.0, 2])
def test_explicit_scale(scale):
    rng = np.random.default_rng(1)
    q, k, v = make(rng, 2, 4, 6, 4, 2, 16)
    out, lse = attention(q, k, v, scale=scale, causal=True, return_lse=True)
    want_out, want_lse = formula(q, k, v, scale=scale, causal=True)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_default_scale_is_inverse_sqrt_head_dim():
    rng = np.random.default_rng(2)
    q, k, v = make(rng, 1, 3, 5, 2, 2, 64)
    np.testing.assert_array_equal(attention(q, k, v), attention(q, k, v, scale=1 / 8))


def test_layouts_agree():
    rng = np.random.default_rng(3)
    q, k, v = make(rng, 2, 6, 9, 4, 2, 16, layout="bshd")
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    for causal in (False, True):
        a, la = attention(q, k, v, causal=causal, return_lse=True)
        b, lb = attention(t(q), t(k), t(v), causal=causal, layout="bhsd", return_lse=True)
        np.testing.assert_array_equal(a, t(b))
        np.testing.assert_array_equal(la, lb)


def test_gqa_is_mha_with_repeated_kv_heads():
    rng = np.random.default_rng(4)
    q, k, v = make(rng, 2, 5, 7, 6, 2, 8)
    rep = lambda x: np.repeat(x, 3, axis=2)  # noqa: E731  head h reads kv head h // 3
    np.testing.assert_array_equal(attention(q, k, v, causal=True), attention(q, rep(k), rep(v), causal=True))


def test_hand_computed_tiny():
    # Sq=1, Sk=2, D=1, scale=1: scores (1·1, 1·2) = (1, 2); weights (e, e²)/(e + e²).
    q = np.array([1.0]).reshape(1, 1, 1, 1)
    k = np.array([1.0, 2.0]).reshape(1, 2, 1, 1)
    v = np.array([3.0, 5.0]).reshape(1, 2, 1, 1)
    out, lse = attention(q, k, v, scale=1.0, return_lse=True)
    e = math.e
    assert out[0, 0, 0, 0] == pytest.approx((3 * e + 5 * e**2) / (e + e**2), rel=1e-15)
    assert lse[0, 0, 0] == pytest.approx(math.log(e + e**2), rel=1e-15)
    # causal with Sq=1 < Sk=2 is bottom-right aligned: the single query sees both keys
    np.testing.assert_array_equal(attention(q, k, v, scale=1.0, causal=True), out)


def test_hand_computed_causal_bottom_right():
    # Sq=2, Sk=3: query 0 sees keys 0, 1; query 1 sees keys 0, 1, 2 (top-left would give 1 and 2).
    q = np.zeros((1, 2, 1, 1))  # all scores 0: uniform weights over the visible keys
    k = np.zeros((1, 3, 1, 1))
    v = np.array([1.0, 2.0, 6.0]).reshape(1, 3, 1, 1)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    np.testing.assert_allclose(out[0, :, 0, 0], [1.5, 3.0], rtol=1e-15)
    np.testing.assert_allclose(lse[0, 0], [math.log(2), math.log(3)], rtol=1e-15)


def test_empty_rows_are_zero_and_minus_inf():
    # causal with Sq=5 > Sk=2: query i sees j <= i - 3, so queries 0, 1, 2 see nothing.
    rng = np.random.default_rng(5)
    q, k, v = make(rng, 2, 5, 2, 2, 1, 8)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :3] == 0)
    assert np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[:, :, 3:]))
    assert np.any(out[:, 3:] != 0)


def test_every_row_empty():
    rng = np.random.default_rng(6)
    q, k, v = make(rng, 1, 4, 1, 2, 2, 8)  # Sk=1, Sq=4: only the last query sees the key
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[..., :3]))
    np.testing.assert_array_equal(out[:, 3], v.astype(np.float64)[:, 0])


def test_row_blocks_agree_with_one_block(monkeypatch):
    # Long rows are processed in blocks of query rows; force many (uneven) blocks.
    rng = np.random.default_rng(7)
    q, k, v = make(rng, 1, 37, 29, 2, 1, 8)
    whole = [attention(q, k, v, causal=c, return_lse=True) for c in (False, True)]
    whole_naive = attention_naive(q, k, v, causal=True)
    monkeypatch.setattr(_common, "_BLOCK_ELEMENTS", 29 * 5)  # 5 rows per block
    for c, (o, lse) in zip((False, True), whole):
        o2, lse2 = attention(q, k, v, causal=c, return_lse=True)
        np.testing.assert_allclose(o2, o, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(lse2, lse, rtol=1e-14)
    np.testing.assert_array_equal(attention_naive(q, k, v, causal=True), whole_naive)


@pytest.mark.parametrize("dtype", [np.float16, BF16, FP8, np.float32, np.float64])
def test_any_float_dtype_is_upcast(dtype):
    rng = np.random.default_rng(8)
    q, k, v = make(rng, 1, 3, 4, 2, 1, 8, dtype=dtype)
    up = [x.astype(np.float64) for x in (q, k, v)]
    np.testing.assert_array_equal(attention(q, k, v, causal=True), attention(*up, causal=True))


def test_reference_rejects_bad_shapes():
    rng = np.random.default_rng(9)
    q, k, v = make(rng, 1, 3, 4, 3, 2, 8)
    with pytest.raises(ValueError, match="heads_q"):
        attention(q, k, v)
    with pytest.raises(ValueError, match="layout"):
        attention(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match="k and v"):
        attention(q, k, v[:, :2])


# ---- properties -----------------------------------------------------------------------------


@st.composite
def problems(draw):
    B = draw(st.integers(1, 2))
    Sq = draw(st.integers(1, 6))
    Sk = draw(st.integers(1, 6))
    Hkv = draw(st.integers(1, 2))
    Hq = Hkv * draw(st.integers(1, 3))
    causal = draw(st.booleans())
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    scale = draw(st.one_of(st.none(), st.floats(-3, 3, allow_nan=False)))
    seed = draw(st.integers(0, 2**32 - 1))
    return B, Sq, Sk, Hq, Hkv, causal, layout, scale, seed


@settings(max_examples=60, deadline=None)
@given(problems())
def test_weights_are_a_distribution(p):
    """With v = one-hot rows (v[j] = e_j), the output rows *are* the attention weights."""
    B, Sq, Sk, Hq, Hkv, causal, layout, scale, seed = p
    rng = np.random.default_rng(seed)
    D = 8  # >= Sk
    q, k, _ = make(rng, B, Sq, Sk, Hq, Hkv, D, layout=layout, dtype=np.float64)
    onehot = np.zeros((B, Sk, Hkv, D))
    onehot[:, np.arange(Sk), :, np.arange(Sk)] = 1.0
    v = onehot if layout == "bshd" else onehot.transpose(0, 2, 1, 3)
    w, lse = attention(q, k, v, causal=causal, scale=scale, layout=layout, return_lse=True)
    w = w if layout == "bshd" else w.transpose(0, 2, 1, 3)  # (B, Sq, Hq, D)
    i = np.arange(Sq)[:, None]
    j = np.arange(D)[None, :]
    visible = (j < Sk) & ((not causal) | (j <= i + Sk - Sq))  # (Sq, D)
    assert np.all(w >= 0)
    hidden = np.broadcast_to(~visible[:, None, :], (Sq, Hq, D))
    assert np.all(w[:, hidden] == 0)  # masked keys (and the padding columns j >= Sk) get no weight
    rows = w.sum(axis=-1)  # (B, Sq, Hq)
    nonempty = visible.any(axis=1)  # (Sq,)
    np.testing.assert_allclose(rows[:, nonempty], 1.0, rtol=0, atol=1e-12)
    assert np.all(rows[:, ~nonempty] == 0)
    assert np.all(np.isneginf(lse[:, :, ~nonempty])) and np.all(np.isfinite(lse[:, :, nonempty]))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_output_is_a_convex_combination_of_visible_values(p):
    B, Sq, Sk, Hq, Hkv, causal, layout, scale, seed = p
    rng = np.random.default_rng(seed)
    D = 8
    q, k, v = make(rng, B, Sq, Sk, Hq, Hkv, D, layout="bshd", dtype=np.float64)
    out, lse = attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    s = 1 / math.sqrt(D) if scale is None else scale
    G = Hq // Hkv
    for b in range(B):
        for h in range(Hq):
            for i in range(Sq):
                js = [j for j in range(Sk) if not causal or j <= i + Sk - Sq]
                if not js:
                    assert np.all(out[b, i, h] == 0) and lse[b, h, i] == -np.inf
                    continue
                vis = v[b, js, h // G]  # (n, D)
                tol = 1e-12 * (1 + np.abs(vis).max())
                assert np.all(out[b, i, h] >= vis.min(axis=0) - tol)
                assert np.all(out[b, i, h] <= vis.max(axis=0) + tol)
                logits = s * (k[b, js, h // G] @ q[b, i, h])
                want = logits.max() + math.log(np.exp(logits - logits.max()).sum())
                assert lse[b, h, i] == pytest.approx(want, rel=1e-12, abs=1e-12)


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
