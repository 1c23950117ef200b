"""cudattn.reference, FP8 parts: the quantiser, descales in the float64 reference and the naive
baseline, error_stats and check_close_fp8 (including that corrupted outputs fail it). The NumPy
emulation of the FP8 kernels is in test_reference_fp8_emulation.py. CPU only, a few seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudattn.reference import (
    attention,
    attention_fp8_emulated,
    attention_naive,
    check_close_fp8,
    dequantize,
    error_stats,
    quantize_fp8,
)
from cudattn.reference.fp8 import _round_e4m3
from _reference_fp8_cases import BF16, FP8, make_fp8
from _reference_fp8_cases import _warnings_are_errors as _warnings_are_errors  # fixtures


# ---- e4m3 rounding and the quantiser ---------------------------------------------------------


def test_round_e4m3_matches_ml_dtypes_and_saturates():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(100_000) * 10 ** rng.uniform(-4, 2.6, 100_000),
                        np.arange(256, dtype=np.uint8).view(FP8).astype(np.float32)])  # every code
    x = x[np.isfinite(x) & (np.abs(x) <= 448)].astype(np.float32)
    got = _round_e4m3(x)
    want = x.astype(FP8).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    big = np.array([448, 449, 463.9, 464, 480, 1e4, 3e38, np.inf], np.float32)
    assert np.all(_round_e4m3(big) == 448) and np.all(_round_e4m3(-big) == -448)
    with np.errstate(invalid="ignore"):
        assert np.isnan(big.astype(FP8).astype(np.float32)[4:]).all()  # NumPy's own cast: NaN above 464
    assert np.isnan(_round_e4m3(np.array([np.nan], np.float32))).all()
    # probabilities in (0, 1]: 1 is exact, the smallest subnormal is 2^-9, below 2^-10 is 0
    p = np.array([1.0, 0.999, 2.0**-9, 2.0**-10, 2.0**-10 * 1.01, 1e-6], np.float32)
    np.testing.assert_array_equal(_round_e4m3(p), [1.0, 1.0, 2.0**-9, 0.0, 2.0**-9, 0.0])


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("per", ["tensor", "head"])
def test_quantize_fp8(per, layout):
    rng = np.random.default_rng(1)
    B, S, H, G, D = 2, 37, 6, 3, 16
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    x8, d = quantize_fp8(x, per=per, layout=layout, heads_kv=G)
    assert x8.dtype == FP8 and x8.shape == x.shape and d.dtype == np.float32 and d.shape == (B, G)
    xh = x if layout == "bhsd" else x.transpose(0, 2, 1, 3)  # (B, H, S, D)
    if per == "tensor":
        np.testing.assert_array_equal(d, np.float32(np.abs(x).max() / 448))
    else:
        want = np.abs(xh).reshape(B, G, -1).max(axis=2) / 448  # head h belongs to group h // (H // G)
        np.testing.assert_allclose(d, want, rtol=1e-7)
    x8f = x8.astype(np.float32)
    assert np.isfinite(x8f).all() and np.abs(x8f).max() == 448  # the amax lands on 448 exactly
    back = dequantize(x8, d, layout=layout, out_dtype=np.float64)
    assert back.dtype == np.float64
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 in the normal range; subnormals: 2^-10 absolute
    scale = dequantize(np.ones_like(x8), d, layout=layout, out_dtype=np.float64)
    assert np.all(np.abs(back - x) <= np.maximum(2.0**-4 * np.abs(x), 2.0**-10 * scale) * (1 + 1e-6))


def test_quantize_fp8_never_nan_and_zero_is_descale_one():
    x = np.full((1, 4, 2, 16), 1e6, np.float32)
    x[0, 0, 0, 0] = -3e7
    x8, d = quantize_fp8(x, per="head")
    assert not np.isnan(x8.astype(np.float32)).any() and np.abs(x8.astype(np.float32)).max() == 448
    z8, dz = quantize_fp8(np.zeros((2, 3, 2, 16), np.float32), per="head")
    assert np.all(dz == 1) and np.all(z8.astype(np.float32) == 0)
    with pytest.raises(ValueError, match="finite"):
        quantize_fp8(np.full((1, 1, 1, 16), np.inf, np.float32))
    with pytest.raises(ValueError, match="per"):
        quantize_fp8(x, per="row")
    with pytest.raises(ValueError, match="multiple"):
        quantize_fp8(x, heads_kv=3)


# ---- descales in the reference and the naive baseline -----------------------------------------


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_reference_descales_are_dequantisation(layout):
    rng = np.random.default_rng(2)
    B, Sq, Sk, Hq, Hkv, D = 2, 7, 9, 6, 2, 16
    q, k, v, kw = make_fp8(rng, B, Sq, Sk, Hq, Hkv, D, layout=layout)
    ax = 2 if layout == "bshd" else 1

    def deq(x, d):  # explicit: head h of x uses d[:, h // (H // Hkv)]
        xf = x.astype(np.float64)
        H = x.shape[ax]
        for h in range(H):
            idx = [slice(None)] * 4
            idx[ax] = h
            xf[tuple(idx)] *= d[:, h // (H // Hkv)].astype(np.float64).reshape(B, 1, 1)
        return xf

    for causal in (False, True):
        out, lse = attention(q, k, v, causal=causal, layout=layout, return_lse=True, **kw)
        want, want_lse = attention(deq(q, kw["q_descale"]), deq(k, kw["k_descale"]), deq(v, kw["v_descale"]),
                                   causal=causal, layout=layout, return_lse=True)
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-13, atol=1e-13)
    # scalars broadcast; None is 1.0
    np.testing.assert_array_equal(attention(q, k, v, layout=layout, q_descale=0.5, k_descale=None, v_descale=3.0),
                                  attention(q.astype(np.float64) * 0.5, k, v.astype(np.float64) * 3.0, layout=layout))
    np.testing.assert_array_equal(attention(q, k, v, layout=layout, q_descale=1.0, k_descale=1.0, v_descale=1.0),
                                  attention(q, k, v, layout=layout))


def test_reference_rejects_bad_descales():
    rng = np.random.default_rng(3)
    q, k, v, kw = make_fp8(rng, 2, 3, 4, 4, 2, 16)
    with pytest.raises(ValueError, match=r"q_descale must have shape \(batch, heads_kv\) = \(2, 2\)"):
        attention(q, k, v, q_descale=np.ones((2, 4), np.float32))  # (B, Hq) is not the convention
    with pytest.raises(ValueError, match="v_descale must be finite"):
        attention(q, k, v, v_descale=np.array([[1, np.nan], [1, 1]], np.float32))
    with pytest.raises(ValueError, match="k_descale"):
        attention_fp8_emulated(q, k, v, k_descale=np.ones(2))


def test_naive_descales():
    rng = np.random.default_rng(4)
    q, k, v, kw = make_fp8(rng, 1, 9, 11, 4, 2, 16)
    base = attention_naive(q, k, v, causal=True).astype(np.float32)
    # powers of two commute with every rounding: exact
    np.testing.assert_array_equal(attention_naive(q, k, v, causal=True, q_descale=2.0, k_descale=0.5), base)
    np.testing.assert_array_equal(attention_naive(q, k, v, causal=True, v_descale=4.0).astype(np.float32), 4 * base)
    ref = attention(q, k, v, causal=True, **kw)
    naive = attention_naive(q, k, v, causal=True, **kw)
    assert naive.dtype == BF16
    assert error_stats(naive, ref)["rel_rmse"] < 0.1
    # 16-bit callers: unchanged by descales of None
    q16 = q.astype(np.float16)
    np.testing.assert_array_equal(attention_naive(q16, q16, q16, q_descale=None, k_descale=None, v_descale=None),
                                  attention_naive(q16, q16, q16))


# ---- error_stats and check_close_fp8 -----------------------------------------------------------


def test_error_stats():
    ref = np.array([3.0, -4.0, 0.0, 0.0])  # rms 2.5, max 4
    st = error_stats(np.array([3.0, -4.0, 0.5, 0.0]), ref)
    assert st == dict(rel_rmse=pytest.approx(0.25 / 2.5), max_abs=0.5, max_rel=pytest.approx(0.125), nonfinite=0)
    assert isinstance(st["rel_rmse"], float) and isinstance(st["nonfinite"], int)
    st = error_stats(np.array([3.0, np.nan, np.inf, 0.0]), ref)
    assert st["nonfinite"] == 2 and math.isnan(st["rel_rmse"]) and math.isnan(st["max_abs"])
    assert error_stats(np.zeros(3), np.zeros(3)) == dict(rel_rmse=0.0, max_abs=0.0, max_rel=0.0, nonfinite=0)
    assert error_stats(np.ones(3), np.zeros(3))["rel_rmse"] == math.inf
    with pytest.raises(ValueError, match="shape"):
        error_stats(np.zeros(3), np.zeros(4))


def test_check_close_fp8_rule():
    rng = np.random.default_rng(11)
    ref = rng.standard_normal(10_000)
    emul = ref + rng.standard_normal(10_000) * 1e-2
    se = error_stats(emul, ref)
    ok, st = check_close_fp8(emul, ref, emul)
    assert ok and st["failed"] == [] and st["emulated"] == se
    assert st["max_bound"] == pytest.approx(2 * se["max_abs"] + 1e-5 * np.abs(ref).max())
    assert st["rmse_bound"] == pytest.approx(1.5 * se["rel_rmse"] + 1e-4)
    # another draw of the same error distribution passes
    assert check_close_fp8(ref + rng.standard_normal(10_000) * 1e-2, ref, emul)[0]
    # the max rule: one entry 3x the emulation's worst error
    bad = emul.copy()
    bad[7] = ref[7] + 3 * se["max_abs"]
    ok, st = check_close_fp8(bad, ref, emul)
    assert not ok and st["failed"] == ["max_abs"]
    # the RMSE rule: errors everywhere twice as large, yet under the max bound
    ok, st = check_close_fp8(ref + 2 * (emul - ref), ref, emul)
    assert not ok and st["failed"] == ["rel_rmse"]
    # NaN or inf never pass, however loose the bound
    for poison in (np.nan, np.inf, -np.inf):
        bad = emul.copy()
        bad[3] = poison
        ok, st = check_close_fp8(bad, ref, emul)
        assert not ok and "nonfinite" in st["failed"]
    with pytest.raises(ValueError, match="emulated"):
        check_close_fp8(emul, ref, np.full_like(emul, np.nan))
    with pytest.raises(ValueError, match="shape"):
        check_close_fp8(emul[:5], ref, emul)


@pytest.mark.parametrize("dist", ["normal", "outliers"])
@pytest.mark.parametrize("causal", [False, True])
def test_check_close_fp8_tolerates_what_the_kernels_do_differently(causal, dist):
    """The kernels' own key tiles (64 on the portable FP8 kernel, 128 on Hopper), float32 noise
    in the score scale and a more accurate float32 output all pass against the 128-key emulation."""
    rng = np.random.default_rng(12)
    q, k, v, kw = make_fp8(rng, 2, 150, 300, 4, 2, 64, dist=dist)
    ref = attention(q, k, v, causal=causal, **kw)
    emul = attention_fp8_emulated(q, k, v, causal=causal, **kw)
    for variant in (dict(block_n=64), dict(block_n=32), dict(block_n=256), dict(out_dtype=np.float32),
                    dict(scale=(1 + 2**-22) / 8)):
        out = attention_fp8_emulated(q, k, v, causal=causal, **{**kw, **variant})
        ok, stats = check_close_fp8(out, ref, emul)
        assert ok, (variant, stats)


def _corruptions(q, k, v, kw):
    """Outputs of plausible kernel bugs, computed by the emulation on corrupted operands."""
    Sk = k.shape[1]
    perm = np.arange(Sk)
    for g in range(0, Sk - Sk % 32, 32):  # a wrong key order inside each 32-key group of Vt
        perm[g:g + 32] = g + np.array([2 * (j % 16) + j // 16 for j in range(32)])
    swapped = v.copy()
    swapped[:, [5, 6]] = swapped[:, [6, 5]]  # two V rows exchanged
    rolled = {**kw, "q_descale": np.roll(kw["q_descale"], 1, axis=1)}  # q descale of the wrong head
    yield "key permutation", dict(v=v[:, perm])
    yield "swapped V rows", dict(v=swapped)
    yield "missing v_descale", dict(kw={**kw, "v_descale": None})
    yield "missing q_descale", dict(kw={**kw, "q_descale": None})
    yield "descale of the wrong head", dict(kw=rolled)
    yield "v_descale squared", dict(kw={**kw, "v_descale": kw["v_descale"] ** 2})
    yield "causal mask ignored", dict(causal=False)
    # the diagonal off by one (row i sees keys j < i + Sk - Sq): a q with one more row at the
    # end moves bottom-right alignment by one; its extra row is dropped again
    yield "causal diagonal off by one", dict(q=np.concatenate([q, q[:, -1:]], axis=1), drop_last_row=True)
    yield "last key dropped", dict(k=k[:, :-1], v=v[:, :-1], causal=False, reference="non-causal")


@pytest.mark.parametrize("dist", ["normal", "outliers"])
@pytest.mark.parametrize("per", ["tensor", "head"])
def test_check_close_fp8_catches_corruptions(per, dist):
    rng = np.random.default_rng(13)
    B, Sq, Sk, Hq, Hkv, D = 2, 40, 96, 4, 2, 64
    q, k, v, kw = make_fp8(rng, B, Sq, Sk, Hq, Hkv, D, per=per, dist=dist)
    refs = {c: (attention(q, k, v, causal=c, **kw), attention_fp8_emulated(q, k, v, causal=c, **kw))
            for c in (False, True)}
    for ref, emul in refs.values():
        assert check_close_fp8(emul, ref, emul)[0]
    for name, c in _corruptions(q, k, v, kw):
        if name == "descale of the wrong head" and per == "tensor":
            continue  # per-tensor descales are equal across heads: no bug to see
        if name == "last key dropped" and dist == "outliers":
            continue  # one key of 96 in ordinary rows hides under the outlier rows' error (docstring)
        causal = c.get("causal", True)
        ref, emul = refs[c.get("reference") != "non-causal"]
        out = attention_fp8_emulated(c.get("q", q), c.get("k", k), c.get("v", v), causal=causal, **c.get("kw", kw))
        if c.get("drop_last_row"):
            out = out[:, :-1]
        ok, stats = check_close_fp8(out, ref, emul)
        assert not ok, (name, stats["failed"], stats["out"], stats["emulated"])


def test_accuracy_tool_runs_on_cpu(tmp_path):
    """python -m cudattn.bench.fp8_accuracy --cpu-only: the emulation and NumPy rows, JSON and Markdown."""
    import json

    from cudattn.bench import fp8_accuracy as tool

    js, md = tmp_path / "a.json", tmp_path / "a.md"
    assert tool.main(["--cpu-only", "--quick", "--json", str(js), "--markdown", str(md)]) == 0
    result = json.loads(js.read_text())
    assert len(result["configs"]) == 4 and any(c["causal"] for c in result["configs"])
    for c in result["configs"]:
        rows = {r["method"]: r for r in c["rows"]}
        assert set(rows) == {"emulated fp8 -> bf16", "emulated fp8 -> f32", "naive fp8 -> bf16", "naive fp16 (NumPy)"}
        assert all(r["nonfinite"] == 0 for r in rows.values())
        assert 1e-3 < rows["emulated fp8 -> bf16"]["rel_rmse"] < 5e-2
        assert rows["naive fp16 (NumPy)"]["rel_rmse"] < rows["emulated fp8 -> bf16"]["rel_rmse"]
    text = md.read_text()
    assert "| emulated fp8 -> bf16 |" in text and "rel RMSE" in text
