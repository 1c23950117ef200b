"""cudattn.reference: the float64 reference, against an independent plain formula, hand-computed
cases and its properties. The naive baseline and check_close are in test_reference_naive.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cudattn.reference import _common, attention, attention_naive
from _reference_cases import BF16, FP8, make
from _reference_cases import _warnings_are_errors as _warnings_are_errors  # fixtures


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
