"""GPU: softcap, attention sinks and ALiBi (with and without windows) against the float64
reference, DESIGN §6's rule, on both kernel families and the split-KV decode kernel.

Softcap 30 and 50; sinks with rows that see no key (output 0, LSE = the sink), with split-KV
decode (the sink counted once, in the merge) and merged with another key range by
`merge_attention_states`; ALiBi per head and per (batch, head) with GQA; all of them together
with a window; KV caches contiguous and paged (16 and 256), chunked prefill; packed batches,
the NumPy path, FP8 sinks; warm calls that replay with new sinks. Outputs poisoned with NaN.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_family")]

BF16 = np.dtype(ml_dtypes.bfloat16)
_seed = itertools.count(9100)


def _rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _check_lse(lse, ref_lse, naive_lse):
    """LSE: infinities where the reference has them; the rest within the other GPU tests' 1e-4
    (relative and absolute), or twice naive's error where that is larger (softcap's tanh is
    approximate in the kernels, as in naive's 16-bit arithmetic)."""
    lse, ref_lse, naive_lse = (np.asarray(x, np.float64) for x in (lse, ref_lse, naive_lse))
    inf = np.isinf(ref_lse)
    assert np.array_equal(np.isinf(lse), inf) and np.array_equal(lse[inf], ref_lse[inf]), "LSE infinities differ"
    err = np.abs(lse[~inf] - ref_lse[~inf]).max(initial=0)
    # the 16-bit kernels' own LSE tolerance (rtol = atol = 1e-4), or naive's error where larger
    bound = max(2 * np.abs(naive_lse[~inf] - ref_lse[~inf]).max(initial=0),
                1e-4 * (1 + np.abs(ref_lse[~inf]).max(initial=0)))
    assert err <= bound, f"LSE: max err {err:.3g} > bound {bound:.3g}"


def _check(o, lse, ref_fn, naive_fn, args, kw):
    ref, ref_lse = ref_fn(*args, return_lse=True, **kw)
    naive, naive_lse = naive_fn(*args, return_lse=True, **kw)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"out: max err {err:.3g} > bound {bound:.3g}"
    _check_lse(lse, ref_lse, naive_lse)
    return ref, ref_lse


def _device_kw(kw):
    return {n: cudattn.to_device(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}


def _run(q, k, v, kw, **extra):
    """cudattn.attention on device copies, out poisoned with NaN; (out, lse) on the host."""
    out = cudattn._arrays.array.empty(q.shape, q.dtype, device=None, stream=None)
    out.fill_nan()
    o, lse = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), return_lse=True, out=out,
                               **_device_kw(kw), **extra)
    return cudattn.to_host(o), cudattn.to_host(lse)


def _mods(rng, Hq, B=None, *, softcap=None, sinks=False, alibi=None, window=None):
    kw = {}
    if softcap is not None:
        kw["softcap"] = softcap
    if sinks:
        kw["sinks"] = _rand(rng, (Hq,), np.float32, 2.0)
    if alibi == "head":
        kw["alibi_slopes"] = (2.0 ** -rng.uniform(1, 8, Hq)).astype(np.float32)
    elif alibi == "batch":
        kw["alibi_slopes"] = (2.0 ** -rng.uniform(1, 8, (B, Hq))).astype(np.float32)
    if window is not None:
        kw["window_size"] = window
    return kw


PREFILL = [  # (B, Sq, Sk, Hq, Hkv, D, dtype)
    (2, 113, 203, 4, 2, 64, np.float16),
    (1, 300, 300, 8, 8, 128, BF16),
    (2, 333, 150, 4, 1, 96, np.float16),
    (1, 200, 257, 2, 2, 256, BF16),
    (1, 301, 280, 4, 2, 160, np.float16),  # three consumers (192-row tiles) but for windows
]


@pytest.mark.parametrize("shape", PREFILL, ids=lambda s: f"{s[1]}x{s[2]}-h{s[3]}/{s[4]}-d{s[5]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mods", ["softcap30", "softcap50", "sinks", "alibi_head", "alibi_batch", "all"])
def test_prefill_modifiers(shape, causal, mods):
    B, Sq, Sk, Hq, Hkv, D, dt = shape
    rng = np.random.default_rng(next(_seed))
    q, k, v = _rand(rng, (B, Sq, Hq, D), dt, 2.0), _rand(rng, (B, Sk, Hkv, D), dt, 2.0), _rand(rng, (B, Sk, Hkv, D), dt)
    kw = {"softcap30": dict(softcap=30.0), "softcap50": dict(softcap=50.0), "sinks": dict(sinks=True),
          "alibi_head": dict(alibi="head"), "alibi_batch": dict(alibi="batch"),
          "all": dict(softcap=30.0, sinks=True, alibi="batch", window=(70, 9))}[mods]
    kw = _mods(rng, Hq, B, **kw)
    o, lse = _run(q, k, v, kw, causal=causal)
    _check(o, lse, reference.attention, reference.attention_naive, (q, k, v), dict(kw, causal=causal))


def test_sinks_rows_without_keys():
    """Causal with Sq > Sk: the top rows see no key and get O = 0 and LSE = their head's sink."""
    rng = np.random.default_rng(next(_seed))
    q, k, v = (_rand(rng, (2, s, 4, 64), np.float16) for s in (300, 100, 100))
    sinks = np.array([-3.0, 0.0, 5.5, 40.0], np.float32)
    o, lse = _run(q, k, v, {"sinks": sinks}, causal=True)
    _check(o, lse, reference.attention, reference.attention_naive, (q, k, v), dict(sinks=sinks, causal=True))
    empty = slice(0, 200)
    assert np.all(o[:, empty] == 0)
    np.testing.assert_array_equal(lse[:, :, empty], np.broadcast_to(sinks[None, :, None], (2, 4, 200)))


def test_sinks_no_keys_at_all():
    """Sk = 0 with sinks: every row gets O = 0 and LSE = the sink (a kernel runs; no keys read)."""
    rng = np.random.default_rng(next(_seed))
    q = _rand(rng, (1, 40, 2, 64), np.float16)
    k = np.zeros((1, 0, 2, 64), np.float16)
    sinks = np.array([1.5, -2.0], np.float32)
    for Sq in (40, 3):  # prefill and decode shapes
        o, lse = _run(q[:, :Sq], k, k, {"sinks": sinks})
        assert np.all(o == 0)
        np.testing.assert_array_equal(lse, np.broadcast_to(sinks[None, :, None], (1, 2, Sq)))


def test_sinks_merge_exact():
    """A sinked result over keys A merged with a plain one over keys B is the sinked result over A + B."""
    rng = np.random.default_rng(next(_seed))
    q, k, v = _rand(rng, (1, 128, 4, 64), np.float16), _rand(rng, (1, 500, 4, 64), np.float16), \
        _rand(rng, (1, 500, 4, 64), np.float16)
    sinks = _rand(rng, (4,), np.float32, 3.0)
    o1, l1 = _run(q, k[:, :300], v[:, :300], {"sinks": sinks})
    o2, l2 = _run(q, k[:, 300:], v[:, 300:], {})
    om, lm = cudattn.merge_attention_states([o1.astype(np.float32), o2.astype(np.float32)], [l1, l2])
    ref, ref_lse = reference.attention(q, k, v, sinks=sinks, return_lse=True)
    naive = reference.attention_naive(q, k, v, sinks=sinks)
    ok, err, bound = reference.check_close(om, ref, naive)
    assert ok, (err, bound)
    np.testing.assert_allclose(lm, ref_lse, rtol=1e-4, atol=1e-4)


DECODE = [  # (B, Sq, Sk, Hq, Hkv, D, dtype)
    (3, 1, 5000, 8, 2, 128, BF16),
    (2, 5, 777, 4, 4, 64, np.float16),
    (1, 16, 3000, 32, 8, 128, np.float16),
]


@pytest.mark.parametrize("shape", DECODE, ids=lambda s: f"q{s[1]}-k{s[2]}-h{s[3]}/{s[4]}-d{s[5]}")
@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("mods", ["window", "softcap", "sinks", "alibi", "all"])
def test_decode_modifiers(shape, splits, mods):
    B, Sq, Sk, Hq, Hkv, D, dt = shape
    rng = np.random.default_rng(next(_seed))
    q, k, v = _rand(rng, (B, Sq, Hq, D), dt, 2.0), _rand(rng, (B, Sk, Hkv, D), dt, 2.0), _rand(rng, (B, Sk, Hkv, D), dt)
    kw = {"window": dict(window=(600, 0)), "softcap": dict(softcap=30.0), "sinks": dict(sinks=True),
          "alibi": dict(alibi="batch"), "all": dict(softcap=50.0, sinks=True, alibi="head", window=(1001, 3))}[mods]
    kw = _mods(rng, Hq, B, **kw)
    causal = mods != "window"
    o, lse = _run(q, k, v, kw, causal=causal, num_splits=splits)
    _check(o, lse, reference.attention, reference.attention_naive, (q, k, v), dict(kw, causal=causal))


@pytest.mark.parametrize("page", [None, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("Sq", [1, 4, 40], ids=["q1", "q4", "q40"])
def test_kvcache_modifiers(page, Sq):
    """attention_with_kvcache with every modifier (decode and chunked prefill), lengths 0, short
    and long, an append, split-KV forced on the decode shapes."""
    rng = np.random.default_rng(next(_seed))
    B, Hq, Hkv, D, cap = 4, 8, 2, 128, 1024
    dt = np.float16
    lens = np.array([0, 7, 500, 1000 - Sq], np.int32)
    q = _rand(rng, (B, Sq, Hq, D), dt, 2.0)
    kn, vn = _rand(rng, (B, Sq, Hkv, D), dt, 2.0), _rand(rng, (B, Sq, Hkv, D), dt)
    if page is None:
        kc, vc = _rand(rng, (B, cap, Hkv, D), dt, 2.0), _rand(rng, (B, cap, Hkv, D), dt)
        table = None
    else:
        pages = B * cap // page
        kc, vc = _rand(rng, (pages, page, Hkv, D), dt, 2.0), _rand(rng, (pages, page, Hkv, D), dt)
        table = rng.permutation(pages).astype(np.int32).reshape(B, cap // page)
    kw = _mods(rng, Hq, B, softcap=30.0, sinks=True, alibi="batch", window=(300, 0))
    ref_kw = dict(cache_seqlens=lens, block_table=table, k_new=kn, v_new=vn, causal=True, **kw)
    ref, ref_lse = reference.attention_with_kvcache(q, kc, vc, return_lse=True, **ref_kw)
    naive, naive_lse = reference.attention_with_kvcache_naive(q, kc, vc, return_lse=True, **ref_kw)
    dev = {n: None if x is None else cudattn.to_device(x) for n, x in
           dict(cache_seqlens=lens, block_table=table, k_new=kn, v_new=vn).items()}
    for splits in ((None, 5) if Sq <= 16 else (None,)):
        kcd, vcd = cudattn.to_device(kc), cudattn.to_device(vc)
        o, lse = cudattn.attention_with_kvcache(cudattn.to_device(q), kcd, vcd, causal=True, return_lse=True,
                                                num_splits=splits, **dev, **_device_kw(kw))
        o, lse = cudattn.to_host(o), cudattn.to_host(lse)
        ok, err, bound = reference.check_close(o, ref, naive)
        assert ok, (splits, err, bound)
        _check_lse(lse, ref_lse, naive_lse)


def test_varlen_and_numpy_modifiers():
    rng = np.random.default_rng(next(_seed))
    lens = [130, 1, 0, 257]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    Hq = 4
    q, k, v = (_rand(rng, (cu[-1], Hq, 64), np.float16) for _ in range(3))
    kw = _mods(rng, Hq, 4, softcap=50.0, sinks=True, alibi="batch", window=(40, 0))
    ref, ref_lse = reference.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True, **kw)
    for host in (True, False):
        args = (q, k, v) if host else tuple(cudattn.to_device(x) for x in (q, k, v))
        o, lse = cudattn.attention(*args, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=257, max_seqlen_k=257,
                                   causal=True, return_lse=True, **(kw if host else _device_kw(kw)))
        if not host:
            o, lse = cudattn.to_host(o), cudattn.to_host(lse)
        for b in range(4):
            rows = slice(cu[b], cu[b + 1])
            if lens[b] == 0:
                continue
            bkw = dict(kw, alibi_slopes=kw["alibi_slopes"][b:b + 1])
            naive, naive_lse = reference.attention_naive(q[None, rows], k[None, rows], v[None, rows], causal=True,
                                                         return_lse=True, **bkw)
            ok, err, bound = reference.check_close(o[rows], ref[rows], naive[0])
            assert ok, (host, b, err, bound)
            _check_lse(lse[:, rows], ref_lse[:, rows], naive_lse[0])
    # the padded NumPy path
    B, Sq = 2, 77
    q, k, v = (_rand(rng, (B, Sq, Hq, 64), BF16) for _ in range(3))
    kw = _mods(rng, Hq, B, softcap=30.0, sinks=True, alibi="batch")
    o, lse = cudattn.attention(q, k, v, causal=True, return_lse=True, **kw)
    _check(o, lse, reference.attention, reference.attention_naive, (q, k, v), dict(kw, causal=True))


def test_fp8_sinks_identity():
    """FP8 with sinks is the plain FP8 call renormalised: O·e^lse / (e^lse + e^sink)."""
    rng = np.random.default_rng(next(_seed))
    f8 = np.dtype(ml_dtypes.float8_e4m3fn)
    q, k, v = (_rand(rng, (2, 300, 4, 128), np.float32).astype(f8) for _ in range(3))
    sinks = np.array([-1.0, 0.5, 3.0, 9.0], np.float32)
    dq, dk, dv = (cudattn.to_device(x) for x in (q, k, v))
    for causal in (False, True):
        o0, l0 = (cudattn.to_host(x) for x in cudattn.attention(dq, dk, dv, causal=causal, return_lse=True,
                                                                 out_dtype=np.float32))
        o1, l1 = (cudattn.to_host(x) for x in cudattn.attention(dq, dk, dv, causal=causal, return_lse=True,
                                                                 out_dtype=np.float32,
                                                                 sinks=cudattn.to_device(sinks)))
        s = sinks[None, :, None].astype(np.float64)
        want_l = np.logaddexp(l0.astype(np.float64), s)
        np.testing.assert_allclose(l1, want_l, rtol=1e-5, atol=1e-5)
        w = np.exp(l0 - want_l).transpose(0, 2, 1)[..., None]
        np.testing.assert_allclose(o1, o0 * w, rtol=1e-5, atol=1e-6)


def test_warm_calls_read_new_sinks_and_slopes():
    """A warm call (replayed launch) reads the sinks and slopes it is given, not the first call's."""
    rng = np.random.default_rng(next(_seed))
    q, k, v = (cudattn.to_device(_rand(rng, (1, 200, 4, 64), np.float16)) for _ in range(3))
    for Sq in (200, 2):
        qq = q[:, :Sq]
        results = []
        for i in range(3):
            sinks = np.full(4, float(i), np.float32)
            slopes = np.full(4, 0.01 * (i + 1), np.float32)
            o, lse = cudattn.attention(qq, k, v, sinks=cudattn.to_device(sinks), alibi_slopes=cudattn.to_device(slopes),
                                       softcap=20.0, return_lse=True)
            results.append(cudattn.to_host(lse))
            ref_lse = reference.attention(*(cudattn.to_host(x) for x in (qq, k, v)), sinks=sinks,
                                          alibi_slopes=slopes, softcap=20.0, return_lse=True)[1]
            np.testing.assert_allclose(results[-1], ref_lse, rtol=1e-3, atol=1e-3)
        assert not np.array_equal(results[0], results[1])


def test_modifier_errors_on_device():
    rng = np.random.default_rng(next(_seed))
    q = cudattn.to_device(_rand(rng, (1, 8, 4, 64), np.float16))
    with pytest.raises(TypeError, match="sinks is a NumPy array"):
        cudattn.attention(q, q, q, sinks=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="sinks must have shape"):
        cudattn.attention(q, q, q, sinks=cudattn.to_device(np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        cudattn.attention(q, q, q, alibi_slopes=cudattn.to_device(np.zeros(4, np.float64)))
    with pytest.raises(ValueError, match="softcap must be finite"):
        cudattn.attention(q, q, q, softcap=-1.0)
    f8 = cudattn.to_device(_rand(rng, (1, 8, 4, 64), np.float32).astype(ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="softcap must be finite"):  # FP8 takes modifiers, checked alike
        cudattn.attention(f8, f8, f8, softcap=float("nan"))
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        cudattn.attention(f8, f8, f8, alibi_slopes=cudattn.to_device(np.zeros(4, np.float64)))


@pytest.mark.parametrize("softcap", [30.0, 34.6, 34.7], ids=["cap30", "cap34.6", "cap34.7"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_softcap_saturated_rows(softcap, D, sinks):
    """bfloat16 softcaps up to ~34.6 take the cap as every row's max (no running max): rows whose
    every score sits at -softcap (P ~ 2^-2c of the cap, still exact relative to the row), at
    +softcap, and ordinary rows, causal and not; 34.7 is past that bound (the running max)."""
    rng = np.random.default_rng(next(_seed))
    Sq, Sk, H = 150, 233, 2
    u = rng.standard_normal(D)
    u /= np.linalg.norm(u)
    k = (u * 4.0 + rng.standard_normal((1, Sk, H, D)) * 0.05).astype(BF16)
    q = _rand(rng, (1, Sq, H, D), np.float64)
    sign = rng.choice([-1.0, 1.0, 0.0], (1, Sq, H, 1))  # saturated low, high, or ordinary
    q = np.where(sign == 0, q, sign * 400.0 * u).astype(BF16)
    v = _rand(rng, (1, Sk, H, D), BF16)
    kw = _mods(rng, H, softcap=softcap, sinks=sinks)
    for causal in (False, True):
        o, lse = _run(q, k, v, kw, causal=causal)
        _check(o, lse, reference.attention, reference.attention_naive, (q, k, v), dict(kw, causal=causal))


def _softcap_nan_case(D):
    """q, k, v (bfloat16; row 250 of head 1 holds a NaN) and the call's (out, lse): softcap 30, causal,
    300 queries on 200 keys (rows below 100 see no key). The seed is fixed by D, not by the
    module's count, which moved with the test order under xdist."""
    rng = np.random.default_rng(9100 + D)
    q, k, v = _rand(rng, (1, 300, 2, D), BF16), _rand(rng, (1, 200, 2, D), BF16), _rand(rng, (1, 200, 2, D), BF16)
    q[0, 250, 1, 3] = np.nan
    return (q, k, v), _run(q, k, v, {"softcap": 30.0}, causal=True)


@pytest.mark.parametrize("D", [64, 128])
def test_softcap_nan_rows_stay_nan(D):
    """A NaN in one query row makes that row NaN (tanh and the FMA-pipe exp2 keep NaN) and no other
    row; a row that sees no key still gets O = 0 and LSE -inf."""
    _, (o, lse) = _softcap_nan_case(D)
    assert np.isnan(o[0, 250, 1]).all() and np.isnan(lse[0, 1, 250])
    keep = np.ones(300, bool)
    keep[250] = False
    assert not np.isnan(o[:, keep]).any() and not np.isnan(o[0, 250, 0]).any()
    assert np.all(o[:, :100] == 0) and np.isneginf(lse[:, :, :100]).all()


_FEW_KEY_ROWS = pytest.mark.xfail(strict=True, reason="bounded bfloat16 softcap: rows of few keys can land one ulp "
                                  "past the bound (test_softcapped_bf16_row_of_one_key_is_its_value)")


@pytest.mark.parametrize("D", [pytest.param(64, marks=_FEW_KEY_ROWS), 128])
def test_softcap_rows_beside_a_nan_row_meet_the_rule(D):
    """The rows beside the NaN row against the reference, by the rule. With D 64's seed, row 100
    (one key) is one bfloat16 ulp past the bound on an H200 (0.0156 against 0.0126, both kernel
    families, the same bits run after run); 25 of 400 seeds did so at D 64 and 128, all on rows of
    one or two keys: the defect that test_softcapped_bf16_row_of_one_key_is_its_value pins down."""
    (q, k, v), (o, _) = _softcap_nan_case(D)
    keep = np.ones(300, bool)
    keep[250] = False
    ref = reference.attention(q, k, v, causal=True, softcap=30.0)
    naive = reference.attention_naive(q, k, v, causal=True, softcap=30.0)
    ok, err, bound = reference.check_close(o[:, keep], ref[:, keep], naive[:, keep])
    assert ok, (err, bound)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
def test_softcapped_bf16_row_of_one_key_is_its_value(dtype, request):
    """A row that sees one key has P = 1 for it, so its output is that key's value, bit for bit.
    bfloat16 softcap calls take the softcap as every row's max (softmax.cuh, BOUNDED): the one
    key's P is then 2^(s c - c), rounded to bfloat16 for the P V product while the row sum keeps
    it unrounded, and the output lands up to one ulp off (a relative 2^-9 or less). Known, not yet
    fixed: the bfloat16 case is expected to fail until the row sum takes the rounded P."""
    if dtype == BF16:
        request.applymarker(pytest.mark.xfail(strict=True, reason="bounded softcap rounds P for P V only"))
    rng = np.random.default_rng(9500)
    q = _rand(rng, (2, 64, 2, 128), dtype)
    k, v = _rand(rng, (2, 1, 2, 128), dtype), _rand(rng, (2, 1, 2, 128), dtype)
    o, _ = _run(q, k, v, {"softcap": 30.0})
    want = np.broadcast_to(v, o.shape)
    assert np.array_equal(o.view(np.uint16), want.view(np.uint16)), \
        f"{int((o != want).sum())} of {o.size} outputs differ from the one key's value"


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
def test_alibi_with_a_shifted_diagonal_covers_slices_of_a_longer_call(dtype, D):
    """ALiBi's diagonal moved (`_kernels.alibi_shift`, as a ring's local calls use it): keys in two
    ranges, each call's diagonal moved so that its distances are the whole call's, merged by LSE,
    equal the whole call; and rows [a, b) against every key equal those rows of it (9 rows: the
    split-KV decode kernel). The unshifted first range is checked to differ, so the shift is seen."""
    from cudattn._kernels import alibi_shift

    rng = np.random.default_rng(next(_seed))
    B, S, Hq, Hkv, m = 2, 203, 8, 2, 77
    q = _rand(rng, (B, S, Hq, D), dtype)
    k, v = (_rand(rng, (B, S, Hkv, D), dtype) for _ in range(2))
    slopes = rng.uniform(0.02, 0.5, (B, Hq)).astype(np.float32)
    ref, ref_lse = reference.attention(q, k, v, alibi_slopes=slopes, return_lse=True)
    naive, naive_lse = reference.attention_naive(q, k, v, alibi_slopes=slopes, dtype=dtype, return_lse=True)
    qd, kd, vd, sd = (cudattn.to_device(x) for x in (q, k, v, slopes))

    def poisoned(shape):
        out = cudattn._arrays.array.empty(shape, dtype, device=None, stream=None)
        out.fill_nan()
        return out

    parts = []
    for (a, b), shift in (((0, m), S - m), ((m, S), 0)):
        with alibi_shift.shifted(shift):
            parts.append(cudattn.attention(qd, kd[:, a:b], vd[:, a:b], alibi_slopes=sd, return_lse=True,
                                           out=poisoned(q.shape)))
    o, lse = cudattn.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    ok, err, bound = reference.check_close(cudattn.to_host(o), ref, naive)
    assert ok, f"merged key ranges: max err {err:.3g} > bound {bound:.3g}"
    _check_lse(cudattn.to_host(lse), ref_lse, naive_lse)
    unshifted = cudattn.to_host(cudattn.attention(qd, kd[:, :m], vd[:, :m], alibi_slopes=sd, return_lse=True)[1])
    assert np.abs(unshifted - cudattn.to_host(parts[0][1])).max() > 1.0, "the shift changed nothing"
    for a, b in ((50, 59), (0, 120)):
        with alibi_shift.shifted(b - S):
            o, lse = cudattn.attention(qd[:, a:b], kd, vd, alibi_slopes=sd, return_lse=True,
                                       out=poisoned((B, b - a, Hq, D)))
        ok, err, bound = reference.check_close(cudattn.to_host(o), ref[:, a:b], naive[:, a:b])
        assert ok, f"rows {a}..{b}: max err {err:.3g} > bound {bound:.3g}"
        _check_lse(cudattn.to_host(lse), ref_lse[:, :, a:b], naive_lse[:, :, a:b])
