"""GPU: FP8 (e4m3) KV caches in `attention_with_kvcache` (split-KV decode).

The kernel converts each key tile exactly (into float16 products) and scales scores and output by the
descales, so it is held to the 16-bit rule (DESIGN §6) against the float64 reference on the
dequantized cache (``cache * descale``), with `attention_naive` in q's dtype as the yardstick:
a stricter rule than FP8 inputs' (whose P is rounded to e4m3). The cache is read back after each
call, so the appended rows (quantized by the append kernel) are checked as the kernel saw them,
and separately against the host's quantization bit for bit. Contiguous and paged (16, 256)
caches, scalar and (B, Hkv) descales, GQA, lengths 0 and tile-crossing, splits, the NumPy path,
score modifiers. Outputs are poisoned with NaN. Chunked prefill and FP8 q are in
test_kvcache_fp8_prefill_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn import reference
from _kvcache_fp8_cases import BF16, F8, _dequant, _seed

pytestmark = pytest.mark.gpu


def _descales(rng, kind, B, Hkv):
    if kind == "scalar":
        return 0.05, 0.05, np.full((B, Hkv), 0.05, np.float32), np.full((B, Hkv), 0.05, np.float32)
    dk = rng.uniform(0.03, 0.08, (B, Hkv)).astype(np.float32)
    dv = rng.uniform(0.03, 0.08, (B, Hkv)).astype(np.float32)
    return dk, dv, dk, dv


def _fp8_pair(rng, shape):
    """Two e4m3 caches (k, v) of clipped normal values (spread 30), drawn k first."""
    return tuple(np.clip(rng.standard_normal(shape) * 30, -448, 448).astype(F8) for _ in range(2))


def _decode_checked(q, kc, vc, lens, common=None, device_only=None, ref_only=None):
    """One device call with k/v descales 0.04/0.03 against the float64 reference on the dequantized
    cache (16-bit rule, LSE within 2e-3); ``common`` goes to both, the others to one side each.
    Returns the device's output and LSE on the host."""
    common = common or {}
    o, lse = cudattn.attention_with_kvcache(
        cudattn.to_device(q), cudattn.to_device(kc), cudattn.to_device(vc), cache_seqlens=cudattn.to_device(lens),
        return_lse=True, k_descale=0.04, v_descale=0.03, **common, **(device_only or {}))
    o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    kf, vf = kc.astype(np.float32) * np.float32(0.04), vc.astype(np.float32) * np.float32(0.03)
    kw = dict(common, **(ref_only or {}))
    ref, ref_lse = reference.attention_with_kvcache(q, kf, vf, cache_seqlens=lens, return_lse=True, **kw)
    naive = reference.attention_with_kvcache_naive(q, kf.astype(BF16), vf.astype(BF16), cache_seqlens=lens, **kw)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, (err, bound)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-3, atol=2e-3)
    return o, lse


@pytest.mark.parametrize("page", [None, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("descale", ["scalar", "array"])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_fp8_cache_decode(page, dtype, descale, splits):
    _check_fp8_decode(page, dtype, descale, splits, Sq=3, Hq=8)  # 12 packed rows: one 16-row fragment


@pytest.mark.parametrize("page", [None, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("splits", [None, 5])
@pytest.mark.parametrize("Sq, Hq", [(1, 8), (2, 8), (1, 16)], ids=["4rows", "8rows-2tokens", "8rows"])
def test_fp8_cache_decode_keys_as_m(page, dtype, splits, Sq, Hq):
    """Up to 8 packed rows: the keys-as-M products (S^T = K Q^T), causal with two tokens too."""
    _check_fp8_decode(page, dtype, "array", splits, Sq=Sq, Hq=Hq)


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "page16"])
@pytest.mark.parametrize("D", [48, 80, 208])
def test_fp8_cache_decode_head_dims_below_the_tile(page, D):
    """Head dims that fill part of the head-dim tile (64, 128, 256): the raw rows' chunks past the
    head dim are zero-filled, so the permuted products and the even/odd output columns hold."""
    _check_fp8_decode(page, BF16, "array", None, Sq=1, Hq=8, D=D)
    _check_fp8_decode(page, np.float16, "scalar", 3, Sq=4, Hq=8, D=D)  # 16 rows: one 16-row fragment


def _check_fp8_decode(page, dtype, descale, splits, Sq, Hq, D=128):
    rng = np.random.default_rng(next(_seed))
    B, Hkv, cap, s_new = 4, 2, 1024, 2
    lens = np.array([0, 9, 517, cap - s_new], np.int32)
    dk, dv, dk_arr, dv_arr = _descales(rng, descale, B, Hkv)
    if page is None:
        shape, table = (B, cap, Hkv, D), None
    else:
        pages = B * cap // page
        shape, table = (pages, page, Hkv, D), rng.permutation(pages).astype(np.int32).reshape(B, cap // page)
    kc, vc = np.clip(rng.standard_normal(shape) * 20, -448, 448).astype(F8), \
        np.clip(rng.standard_normal(shape) * 20, -448, 448).astype(F8)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(dtype)
    kn, vn = (rng.standard_normal((B, s_new, Hkv, D)).astype(dtype) for _ in range(2))
    dev = lambda x: x if x is None or np.isscalar(x) or isinstance(x, float) else cudattn.to_device(x)  # noqa: E731
    kcd, vcd = cudattn.to_device(kc), cudattn.to_device(vc)
    out = cudattn._arrays.array.empty(q.shape, q.dtype, device=None, stream=None)
    out.fill_nan()
    o, lse = cudattn.attention_with_kvcache(
        cudattn.to_device(q), kcd, vcd, cache_seqlens=cudattn.to_device(lens), block_table=dev(table),
        k_new=cudattn.to_device(kn), v_new=cudattn.to_device(vn), causal=True, return_lse=True, num_splits=splits,
        k_descale=dev(dk), v_descale=dev(dv), out=out)
    o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    kc2, vc2 = cudattn.to_host(kcd), cudattn.to_host(vcd)
    # the appended rows are the host's quantization, bit for bit
    want_k, want_v = kc.copy(), vc.copy()
    from cudattn._numpy.kvcache import _append_host
    from cudattn._spec.problem import KvCache

    kv = KvCache(paged=table is not None, page_size=shape[1], max_pages=1 if table is None else table.shape[1],
                 num_pages=shape[0], seqlen_add=s_new, fp8=True,
                 k_scale=dk if np.isscalar(dk) else 1.0, v_scale=dv if np.isscalar(dv) else 1.0)
    _append_host(want_k, want_v, kn, vn, lens, table, kv,
                 (None if np.isscalar(dk) else dk, None if np.isscalar(dv) else dv))
    np.testing.assert_array_equal(kc2.view(np.uint8), want_k.view(np.uint8))
    np.testing.assert_array_equal(vc2.view(np.uint8), want_v.view(np.uint8))
    # attention over the dequantized cache as the kernel saw it
    kf, vf = _dequant(kc2, table, lens, dk_arr, B), _dequant(vc2, table, lens, dv_arr, B)
    full = lens + s_new
    ref, ref_lse = reference.attention_with_kvcache(q, kf, vf, cache_seqlens=full, causal=True, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, kf.astype(dtype), vf.astype(dtype), cache_seqlens=full,
                                                   causal=True)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"max err {err:.3g} > bound {bound:.3g}"
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("D", [64, 256])
def test_fp8_cache_head_dims_and_modifiers(D):
    rng = np.random.default_rng(next(_seed))
    B, Sq, Hq, Hkv, cap = 2, 1, 4, 4, 700
    kc, vc = _fp8_pair(rng, (B, cap, Hkv, D))
    q = rng.standard_normal((B, Sq, Hq, D)).astype(BF16)
    lens = np.array([700, 333], np.int32)
    sinks = rng.standard_normal(Hq).astype(np.float32)
    _decode_checked(q, kc, vc, lens, dict(causal=True, window_size=(200, 0), softcap=20.0),
                    dict(num_splits=3, sinks=cudattn.to_device(sinks)), dict(sinks=sinks))


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_fp8_cache_bfloat16_q_scaling_ignores_a_bad_head(bad):
    """A NaN or inf in one query head does not change how the block's other heads enter the
    float16 products: beside values above float16's range, their outputs equal those of the call
    without it, bit for bit (the power-of-two scaling is exact either way)."""
    rng = np.random.default_rng(next(_seed))
    B, Sq, Hq, Hkv, D, cap = 2, 1, 8, 2, 128, 200
    kc, vc = _fp8_pair(rng, (B, cap, Hkv, D))
    q = (rng.standard_normal((B, Sq, Hq, D)) * 3e5).astype(BF16)
    q_bad = q.copy()
    q_bad[:, :, 0, 5] = bad
    kcd, vcd, lens = cudattn.to_device(kc), cudattn.to_device(vc), cudattn.to_device(np.array([200, 77], np.int32))
    o, o_bad = (cudattn.to_host(cudattn.attention_with_kvcache(cudattn.to_device(x), kcd, vcd, cache_seqlens=lens,
                                                               k_descale=0.04, v_descale=0.03, scale=0.15 / 3e5))
                for x in (q, q_bad))
    others = list(range(1, Hq))  # heads 1-3 share head 0's block of packed rows
    assert np.isfinite(o[:, :, others].astype(np.float32)).all()
    np.testing.assert_array_equal(o_bad[:, :, others].view(np.uint16), o[:, :, others].view(np.uint16))


@pytest.mark.parametrize("splits", [None, 1, 3])
def test_fp8_cache_keys_as_m_with_sinks(splits):
    """Sinks alone need no modifier build, so up to 8 packed rows take the keys-as-M products with
    them: the sink joins each row's denominator once (one split: the warp merge; more: the combine),
    rows that see no key (length 0) give output 0 and LSE equal to their sink."""
    rng = np.random.default_rng(next(_seed))
    B, Sq, Hq, Hkv, D, cap = 3, 2, 8, 2, 128, 640
    kc, vc = _fp8_pair(rng, (B, cap, Hkv, D))
    q = rng.standard_normal((B, Sq, Hq, D)).astype(BF16)
    lens = np.array([640, 0, 301], np.int32)
    sinks = (rng.standard_normal(Hq) * 2).astype(np.float32)
    o, lse = _decode_checked(q, kc, vc, lens, None, dict(sinks=cudattn.to_device(sinks), num_splits=splits),
                             dict(sinks=sinks))
    np.testing.assert_array_equal(o[1].astype(np.float32), 0.0)  # the empty sequence
    np.testing.assert_allclose(lse[1], np.broadcast_to(sinks[:, None], (Hq, Sq)), rtol=1e-6)


@pytest.mark.parametrize("magnitude", [3e5, 1e-6, 0.0], ids=["above-fp16", "tiny", "mixed"])
def test_fp8_cache_bfloat16_q_outside_float16_range(magnitude):
    """A bfloat16 q meets an FP8 cache in float16 products, scaled by a power of two per block:
    values far above float16's range or far below its normal range, and rows of very different
    magnitudes in one block (mixed), stay exact up to the 16-bit rule."""
    rng = np.random.default_rng(next(_seed))
    B, Sq, Hq, Hkv, D, cap = 2, 1, 8, 2, 128, 300
    kc, vc = _fp8_pair(rng, (B, cap, Hkv, D))
    qf = rng.standard_normal((B, Sq, Hq, D))
    if magnitude:
        q, scale = (qf * magnitude).astype(BF16), 0.15 / magnitude
    else:  # heads 1e4 apart in magnitude within each kv head's block
        q, scale = (qf * np.where(np.arange(Hq) % 2, 1e2, 1e-2)[None, None, :, None]).astype(BF16), 0.15
    _decode_checked(q, kc, vc, np.array([300, 177], np.int32), dict(scale=scale))


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_fp8_cache_decode_reads_every_code_exactly(D, dtype):
    """Every non-NaN e4m3 code (subnormals and both zeros included) reaches the products exactly:
    with one key, the output is V's row and the LSE is the score, and a one-hot q picks one key
    element per (sequence, head). 16 sequences x 16 heads probe the 256 codes through K."""
    rng = np.random.default_rng(next(_seed))
    B, Hq, cap = 16, 16, 16
    codes = np.arange(256, dtype=np.uint8)
    codes[[0x7F, 0xFF]] = 0x00  # the two NaN codes
    kc = rng.choice(codes, (B, cap, 1, D)).astype(np.uint8)
    vc = rng.choice(codes, (B, cap, 1, D)).astype(np.uint8)
    q = np.zeros((B, 1, Hq, D), dtype)
    for b in range(B):
        vc[b, 0, 0] = codes[(b * D + np.arange(D)) % 256]
        for h in range(Hq):
            j = h * (D // 16) + b % (D // 16)
            kc[b, 0, 0, j] = codes[16 * b + h]
            q[b, 0, h, j] = 1
    kc, vc = kc.view(F8), vc.view(F8)
    o = np.full((B, 1, Hq, D), np.nan, dtype)
    od = cudattn.to_device(o)
    _, lse = cudattn.attention_with_kvcache(
        cudattn.to_device(q), cudattn.to_device(kc), cudattn.to_device(vc), cache_seqlens=np.ones(B, np.int32),
        scale=1.0, return_lse=True, out=od, k_descale=1.0, v_descale=1.0)
    o, lse = cudattn.to_host(od), cudattn.to_host(lse)
    want_o = np.broadcast_to(vc[:, :1].astype(np.float32), o.shape)  # e4m3's -0 comes out +0 (0 + -0)
    np.testing.assert_array_equal(o.astype(np.float32), want_o)
    want_lse = np.array([[kc[b, 0, 0, h * (D // 16) + b % (D // 16)].astype(np.float32) for h in range(Hq)]
                         for b in range(B)])
    np.testing.assert_allclose(lse.reshape(B, Hq), want_lse, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("Sq", [2, 40], ids=["decode", "chunked"])
def test_fp8_cache_numpy_path_matches_device(Sq):
    rng = np.random.default_rng(next(_seed))
    B, Hq, Hkv, D, cap = 2, 8, 2, 64, 256
    kc = np.clip(rng.standard_normal((B, cap, Hkv, D)) * 20, -448, 448).astype(F8)
    vc = kc.copy()
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float16)
    kn, vn = (rng.standard_normal((B, Sq, Hkv, D)).astype(np.float16) for _ in range(2))
    lens = np.array([10, 200], np.int32)
    dk = rng.uniform(0.02, 0.1, (B, Hkv)).astype(np.float32)
    kcd, vcd = cudattn.to_device(kc), cudattn.to_device(vc)
    od = cudattn.to_host(cudattn.attention_with_kvcache(
        cudattn.to_device(q), kcd, vcd, cache_seqlens=cudattn.to_device(lens), k_new=cudattn.to_device(kn),
        v_new=cudattn.to_device(vn), k_descale=cudattn.to_device(dk), v_descale=0.05))
    oh = cudattn.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, k_new=kn, v_new=vn, k_descale=dk,
                                        v_descale=0.05)
    np.testing.assert_array_equal(oh, od)
    np.testing.assert_array_equal(kc.view(np.uint8), cudattn.to_host(kcd).view(np.uint8))
    np.testing.assert_array_equal(vc.view(np.uint8), cudattn.to_host(vcd).view(np.uint8))


def test_fp8_cache_errors():
    rng = np.random.default_rng(next(_seed))
    q = cudattn.to_device(rng.standard_normal((1, 1, 4, 64)).astype(np.float16))
    c16 = cudattn.to_device(rng.standard_normal((1, 64, 4, 64)).astype(np.float16))
    c8 = cudattn.to_device(rng.standard_normal((1, 64, 4, 64)).astype(F8))
    with pytest.raises(ValueError, match="k_descale applies to FP8"):
        cudattn.attention_with_kvcache(q, c16, c16, k_descale=0.5)
    with pytest.raises(TypeError, match="k_cache and v_cache must have q's dtype"):
        cudattn.attention_with_kvcache(q, c8, c16)


def test_warm_calls_take_new_scalar_descales():
    """Scalar descales are no operands of a warm call but part of its signature: a warm call with
    other scalars replays that signature's own plan (its result equals a cold call's bit for bit),
    and scalars beside a device-array descale keep their value too."""
    from cudattn._calls import call as _callpath

    rng = np.random.default_rng(next(_seed))
    B, Hq, Hkv, D, cap = 2, 8, 2, 128, 300
    kc, vc = (cudattn.to_device(x) for x in _fp8_pair(rng, (B, cap, Hkv, D)))
    q = cudattn.to_device(rng.standard_normal((B, 1, Hq, D)).astype(BF16))
    lens = cudattn.to_device(np.array([300, 123], np.int32))
    dk_arr = cudattn.to_device(np.full((B, Hkv), 0.04, np.float32))

    def call(**kw):
        return cudattn.to_host(cudattn.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, **kw)).view(np.uint16)

    cases = [dict(k_descale=0.04, v_descale=0.03), dict(k_descale=0.05, v_descale=0.03),
             dict(k_descale=0.04, v_descale=0.07), dict(k_descale=dk_arr, v_descale=0.03),
             dict(k_descale=dk_arr, v_descale=0.07)]
    _callpath._plans.clear()
    cold = [call(**kw) for kw in cases]  # each signature's first call: the full path
    assert not np.array_equal(cold[0], cold[1]) and not np.array_equal(cold[0], cold[2])
    np.testing.assert_array_equal(cold[3], cold[0])  # an array of 0.04 is the scalar 0.04
    for _ in range(2):  # warm, interleaved
        for kw, want in zip(cases, cold):
            np.testing.assert_array_equal(call(**kw), want)
