"""Score modifiers (sliding window, softcap, sinks, ALiBi) in the float64 reference, on the CPU.

The reference is checked against a brute-force formula written here from the stated semantics
(`cudattn._spec.modifiers`): every (query, key) score built one by one, masked, softmaxed with the
sink in the denominator. Also: identities that tie the modifiers to plain attention, the
low-precision baseline, the varlen and KV-cache references, and every argument rule.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from cudattn import reference
from cudattn._spec.modifiers import parse_modifiers


def _brute(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, sinks=None, alibi=None):
    """(out, lse) from the definitions, one row at a time; q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D)."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    out = np.zeros(q.shape)
    lse = np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            for i in range(Sq):
                diag = i + Sk - Sq
                js = [j for j in range(Sk) if (right < 0 or j <= diag + right) and (left < 0 or j >= diag - left)]
                s = np.array([scale * float(q[b, i, h] @ k[b, j, kv]) for j in js])
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if alibi is not None:
                    slope = alibi[b, h] if alibi.ndim == 2 else alibi[h]
                    s = s - slope * np.abs(diag - np.array(js))
                terms = list(s) + ([float(sinks[h])] if sinks is not None else [])
                if not terms:
                    continue
                m = max(terms)
                w = np.exp(s - m)
                denom = w.sum() + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
                out[b, i, h] = (w[:, None] * v[b, js, kv]).sum(axis=0) / denom if js else 0.0
                lse[b, h, i] = m + math.log(denom)
    return out, lse


def _qkv(rng, B=2, Sq=7, Sk=11, Hq=4, Hkv=2, D=16, spread=1.0):
    q = rng.standard_normal((B, Sq, Hq, D)) * spread
    k = rng.standard_normal((B, Sk, Hkv, D)) * spread
    v = rng.standard_normal((B, Sk, Hkv, D))
    return q, k, v


CASES = [
    dict(window=(0, 0)), dict(window=(1, 0)), dict(window=(3, 5)), dict(window=(-1, 2)), dict(window=(7, -1)),
    dict(window=(2, 2), causal=True), dict(window=(-1, 4), causal=True), dict(softcap=3.0),
    dict(softcap=30.0, spread=3.0), dict(sinks=True), dict(sinks=True, causal=True), dict(sinks=True, window=(1, 0)),
    dict(alibi="heads"), dict(alibi="batch", causal=True), dict(softcap=5.0, alibi="heads", sinks=True, window=(4, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("shape", [(7, 11), (11, 7), (9, 9)], ids=["sq<sk", "sq>sk", "square"])
def test_reference_equals_the_definitions(case, shape):
    rng = np.random.default_rng(zlib.crc32(repr((case, shape)).encode()))
    Sq, Sk = shape
    q, k, v = _qkv(rng, Sq=Sq, Sk=Sk, spread=case.get("spread", 1.0))
    sinks = rng.uniform(-1, 2, 4).astype(np.float32) if case.get("sinks") else None
    alibi = None
    if case.get("alibi") == "heads":
        alibi = rng.uniform(0, 0.5, 4).astype(np.float32)
    elif case.get("alibi") == "batch":
        alibi = rng.uniform(0, 0.5, (2, 4)).astype(np.float32)
    kw = dict(causal=case.get("causal", False), window_size=case.get("window"), softcap=case.get("softcap"),
              sinks=sinks, alibi_slopes=alibi)
    out, lse = reference.attention(q, k, v, return_lse=True, **kw)
    want, want_lse = _brute(q, k, v, causal=kw["causal"], window=case.get("window") or (-1, -1),
                            softcap=case.get("softcap") or 0.0, sinks=sinks, alibi=alibi)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-10, atol=1e-12)


def test_identities_with_plain_attention():
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng)
    plain, plain_lse = reference.attention(q, k, v, return_lse=True)
    for kw in (dict(window_size=(-1, -1)), dict(softcap=0.0)):
        o, l = reference.attention(q, k, v, return_lse=True, **kw)
        np.testing.assert_allclose(o, plain, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(l, plain_lse, rtol=1e-12)
    causal, causal_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    o, l = reference.attention(q, k, v, window_size=(-1, 0), return_lse=True)
    np.testing.assert_allclose(o, causal, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(l, causal_lse, rtol=1e-12)
    # a sink rescales the row: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse')
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    o, l = reference.attention(q, k, v, sinks=sinks, return_lse=True)
    want_l = np.logaddexp(plain_lse, sinks[None, :, None].astype(np.float64))
    np.testing.assert_allclose(l, want_l, rtol=1e-12)
    np.testing.assert_allclose(o, plain * np.exp(plain_lse - want_l).transpose(0, 2, 1)[..., None], rtol=1e-10,
                               atol=1e-14)


def test_rows_that_see_no_key():
    """Causal with Sq > Sk and a narrow window leave rows without keys: 0, LSE -inf or the sink."""
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, Sq=9, Sk=4)
    o, l = reference.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(o[:, :5] == 0) and np.all(l[:, :, :5] == -np.inf)
    sinks = np.array([0.25, 1.0, -3.0, 0.0], np.float32)
    o, l = reference.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    assert np.all(o[:, :5] == 0)
    np.testing.assert_array_equal(l[:, :, :5], np.broadcast_to(sinks[None, :, None].astype(np.float64), (2, 4, 5)))


def test_naive_follows_the_reference():
    import ml_dtypes

    rng = np.random.default_rng(3)
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in _qkv(rng, Sq=33, Sk=40, D=32))
    kw = dict(causal=True, window_size=(5, 0), softcap=10.0, sinks=np.full(4, 0.5, np.float32),
              alibi_slopes=np.full(4, 0.1, np.float32))
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, **kw)
    naive, naive_lse = reference.attention_naive(q, k, v, return_lse=True, **kw)
    assert naive.dtype == ml_dtypes.bfloat16 and naive_lse.dtype == np.float32
    assert np.abs(naive.astype(np.float64) - ref).max() < 2e-2
    np.testing.assert_allclose(naive_lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_varlen_and_kvcache_references_apply_them_per_sequence():
    rng = np.random.default_rng(4)
    lens_q, lens_k = [3, 0, 5], [6, 2, 0]
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cq[-1], 4, 8))
    k, v = rng.standard_normal((ck[-1], 2, 8)), rng.standard_normal((ck[-1], 2, 8))
    sinks = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    alibi = rng.uniform(0, 1, (3, 4)).astype(np.float32)
    kw = dict(causal=True, window_size=(2, 0), sinks=sinks, alibi_slopes=alibi, softcap=4.0)
    out, lse = reference.attention_varlen(q, k, v, cq, ck, return_lse=True, **kw)
    o0, l0 = reference.attention(q[None, 0:3], k[None, 0:6], v[None, 0:6], return_lse=True,
                                 **{**kw, "alibi_slopes": alibi[0]})
    np.testing.assert_array_equal(out[0:3], o0[0])
    np.testing.assert_array_equal(lse[:, 0:3], l0[0])
    assert np.all(out[3:8] == 0)  # sequence 2 has no key: 0 and its sinks' logits
    np.testing.assert_array_equal(lse[:, 3:8], np.broadcast_to(sinks[:, None].astype(np.float64), (4, 5)))
    # KV cache: sequence b over its L_b keys, its row of the slopes
    kc = rng.standard_normal((2, 10, 2, 8))
    vc = rng.standard_normal((2, 10, 2, 8))
    qq = rng.standard_normal((2, 4, 4, 8))
    lens = np.array([7, 0], np.int32)
    o, l = reference.attention_with_kvcache(qq, kc, vc, cache_seqlens=lens, return_lse=True,
                                            **{**kw, "alibi_slopes": alibi[:2]})
    o0, l0 = reference.attention(qq[:1], kc[:1, :7], vc[:1, :7], return_lse=True, **{**kw, "alibi_slopes": alibi[0]})
    np.testing.assert_array_equal(o[:1], o0)
    np.testing.assert_array_equal(l[:1], l0)
    assert np.all(o[1] == 0)
    np.testing.assert_array_equal(l[1], np.broadcast_to(sinks[:, None].astype(np.float64), (4, 4)))
    naive = reference.attention_with_kvcache_naive(qq.astype(np.float16), kc.astype(np.float16),
                                                   vc.astype(np.float16), cache_seqlens=lens,
                                                   **{**kw, "alibi_slopes": alibi[:2]})
    assert np.abs(naive.astype(np.float64) - o).max() < 1e-2


@pytest.mark.parametrize("kw, error, words", [
    (dict(window_size=(1,)), TypeError, "pair"),
    (dict(window_size=3), TypeError, "pair"),
    (dict(window_size=(-2, 0)), ValueError, ">= -1"),
    (dict(window_size=(1.5, 0)), TypeError, "left must be an int"),
    (dict(window_size=(0, True)), TypeError, "right must be an int"),
    (dict(softcap=-1.0), ValueError, "finite and >= 0"),
    (dict(softcap=math.inf), ValueError, "finite and >= 0"),
    (dict(softcap="30"), TypeError, "real number"),
    (dict(sinks=np.zeros(3, np.float32)), ValueError, r"\(heads_q,\) = \(4,\)"),
    (dict(sinks=np.zeros(4, np.float64)), TypeError, "float32"),
    (dict(sinks=np.array([0, 0, np.nan, 0], np.float32)), ValueError, "finite"),
    (dict(sinks=[0.0] * 4), TypeError, "float32 array"),
    (dict(alibi_slopes=np.zeros((3, 4), np.float32)), ValueError, r"\(batch, heads_q\) = \(2, 4\)"),
    (dict(alibi_slopes=np.zeros(4, np.float16)), TypeError, "float32"),
])
def test_argument_rules(kw, error, words):
    with pytest.raises(error, match=words):
        parse_modifiers(batch=2, heads_q=4, **kw)


def test_causal_sets_the_right_window_to_zero():
    assert parse_modifiers(window_size=(5, 9), causal=True, batch=1, heads_q=1).window == (5, 0)
    assert parse_modifiers(causal=True, batch=1, heads_q=1).window == (-1, 0)
    assert not parse_modifiers(batch=1, heads_q=1).active


def test_attention_checks_the_window_before_gpu_work():
    import ml_dtypes

    import cudattn

    q = np.zeros((1, 8, 2, 64), np.float16)
    with pytest.raises(TypeError, match="pair"):
        cudattn.attention(q, q, q, window_size=(1,))
    with pytest.raises(ValueError, match=">= -1"):
        cudattn.attention(q, q, q, window_size=(0, -3))
    q8 = np.zeros((1, 8, 2, 64), ml_dtypes.float8_e4m3fn)  # FP8 takes windows, checked alike
    with pytest.raises(ValueError, match=">= -1"):
        cudattn.attention(q8, q8, q8, window_size=(4, -2))
    with pytest.raises(ValueError, match="softcap"):
        cudattn.attention(q8, q8, q8, softcap=-1.0)


def test_plain_windows_are_no_window():
    from cudattn._spec.modifiers import window_of

    assert window_of((-1, -1), False) is None and window_of((-1, 3), True) is None
    assert window_of((5, 2), True) == (5, 0) and window_of((0, 0), False) == (0, 0)


def test_kernel_params_of_a_softcap():
    """fill_params: a softcap takes the score scale inside the tanh; a scale that makes scale /
    softcap 0 in float32 (scale 0) leaves the scores uncapped (softcap * tanh(x) = softcap * x
    there), so the decode kernel, which reads softcap_pre = 0 as no softcap, agrees with prefill."""
    from cudattn._kernels.params import fill_params
    from cudattn._spec.modifiers import KernelMods
    from cudattn._kernels.params import LOG2E, DecodeParams, scale_log2

    p = DecodeParams(heads_q=4)
    p.scale_log2 = scale_log2(0.125)
    fill_params(p, KernelMods(softcap=30.0), 0.125)
    assert p.softcap_pre == pytest.approx(0.125 / 30) and p.scale_log2 == pytest.approx(30 * LOG2E)
    assert p.alibi_mul == pytest.approx(-1 / 30)
    q = DecodeParams(heads_q=4)
    q.scale_log2 = scale_log2(0.0)
    fill_params(q, KernelMods(softcap=30.0, alibi=True, alibi_per_batch=True), 0.0)
    assert q.softcap_pre == 0 and q.scale_log2 == pytest.approx(1e-30)
    assert q.alibi_mul == pytest.approx(-LOG2E / 1e-30) and q.alibi_stride_b == 4


def test_fp8_window_builds():
    """A windowed FP8 call on Hopper takes a build with the window compiled in (MOD_WINDOW) and a
    key tile narrow enough that the window's bounds do not spill (ALiBi too); plain FP8 calls and
    softcap ones keep their tiles; the portable family and 16-bit builds take windows without the
    bit."""
    from cudattn._kernels import traits as _traits
    from cudattn._spec.modifiers import MOD_ALIBI, MOD_SOFTCAP, MOD_WINDOW

    limit = _traits.ARCH_SMEM_LIMIT["sm_90a"]
    for d, keys in ((64, 128), (128, 128), (256, 96)):
        plain = _traits.select(_traits.FP8, d, True, limit, "sm90")
        win = _traits.select(_traits.FP8, d, True, limit, "sm90", mods=MOD_WINDOW | MOD_SOFTCAP)
        assert plain.mods == 0 and "CUDATTN_MODS" not in plain.defines()
        assert win.mods == MOD_WINDOW | MOD_SOFTCAP and win.tiles.block_n == keys
        assert win.defines()["CUDATTN_MODS"] == MOD_WINDOW | MOD_SOFTCAP and win.smem_bytes <= limit
        assert _traits.select(_traits.FP8, d, True, limit, "sm90", mods=MOD_ALIBI).tiles.block_n == keys
        assert _traits.select(_traits.FP8, d, True, limit, "sm90", mods=MOD_SOFTCAP).tiles == plain.tiles
    assert _traits.select(_traits.FP8, 128, False, limit, "sm80", mods=MOD_WINDOW | MOD_ALIBI).mods == MOD_ALIBI
    assert _traits.select("bfloat16", 128, False, limit, "sm90", mods=MOD_WINDOW) == \
        _traits.select("bfloat16", 128, False, limit, "sm90")
