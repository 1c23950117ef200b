"""GPU: FP8 (e4m3) KV caches beyond the 16-bit-q decode: chunked prefill (the cache dequantized
into a 16-bit copy for the prefill kernels) and an FP8 q with an FP8 cache (decode and chunked
cases), against the float64 reference on the dequantized cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn import reference
from _kvcache_fp8_cases import BF16, F8, _dequant, _seed

pytestmark = pytest.mark.gpu


def _random_cache(rng, B, cap, Hkv, D, page):
    """(shape, block_table or None, k, v): e4m3 caches of random values, contiguous (page None) or
    paged with the pages in a random order."""
    if page is None:
        shape, table = (B, cap, Hkv, D), None
    else:
        pages = B * cap // page
        shape, table = (pages, page, Hkv, D), rng.permutation(pages).astype(np.int32).reshape(B, cap // page)
    kc, vc = (np.clip(rng.standard_normal(shape) * 20, -448, 448).astype(F8) for _ in range(2))
    return shape, table, kc, vc


def _copied(kf):
    """The dequantized cache as the chunked-prefill path copies it for the prefill kernels
    (rounded to bfloat16): the LSE is held to the 16-bit kernels' tolerance against that copy."""
    return kf.astype(BF16).astype(np.float32)


@pytest.mark.parametrize("page", [None, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_fp8_cache_chunked_prefill(page, packed):
    """More than 16 query tokens: the cache is dequantized into a 16-bit copy (kv_cache_gather)
    and the prefill kernels run on it; padded q with an append, or a packed q."""
    rng = np.random.default_rng(next(_seed))
    B, Hq, Hkv, D, cap = 3, 8, 2, 128, 768
    Sq = 40
    lens = np.array([100, 0, 700], np.int32) if packed else np.array([100, 0, 700 - Sq], np.int32)
    dk, dv = (rng.uniform(0.03, 0.08, (B, Hkv)).astype(np.float32) for _ in range(2))
    shape, table, kc, vc = _random_cache(rng, B, cap, Hkv, D, page)
    kcd, vcd = cudattn.to_device(kc), cudattn.to_device(vc)
    common = dict(block_table=None if table is None else cudattn.to_device(table), causal=True, return_lse=True,
                  k_descale=cudattn.to_device(dk), v_descale=cudattn.to_device(dv))
    if packed:
        qlens = np.array([Sq, 0, 17], np.int32)
        cu = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        q = rng.standard_normal((cu[-1], Hq, D)).astype(BF16)
        o, lse = cudattn.attention_with_kvcache(cudattn.to_device(q), kcd, vcd, cache_seqlens=cudattn.to_device(lens),
                                                cu_seqlens_q=cudattn.to_device(cu), max_seqlen_q=Sq, **common)
        full = lens
    else:
        q = rng.standard_normal((B, Sq, Hq, D)).astype(BF16)
        kn, vn = (rng.standard_normal((B, Sq, Hkv, D)).astype(BF16) for _ in range(2))
        o, lse = cudattn.attention_with_kvcache(cudattn.to_device(q), kcd, vcd, cache_seqlens=cudattn.to_device(lens),
                                                k_new=cudattn.to_device(kn), v_new=cudattn.to_device(vn), **common)
        full = lens + Sq
    o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    kf, vf = _dequant(cudattn.to_host(kcd), table, lens, dk, B), _dequant(cudattn.to_host(vcd), table, lens, dv, B)
    if packed:
        for b in range(B):
            if qlens[b] == 0:
                continue
            rows = slice(cu[b], cu[b + 1])
            qb = q[None, rows]
            args = (qb, kf[b:b + 1], vf[b:b + 1])
            ref = reference.attention_with_kvcache(*args, cache_seqlens=full[b:b + 1], causal=True)
            _, ref_lse = reference.attention_with_kvcache(qb, _copied(kf[b:b + 1]), vf[b:b + 1],
                                                          cache_seqlens=full[b:b + 1], causal=True, return_lse=True)
            naive = reference.attention_with_kvcache_naive(qb, kf[b:b + 1].astype(BF16), vf[b:b + 1].astype(BF16),
                                                           cache_seqlens=full[b:b + 1], causal=True)
            ok, err, bound = reference.check_close(o[rows], ref[0], naive[0])
            assert ok, (b, err, bound)
            np.testing.assert_allclose(lse[:, rows], ref_lse[0], rtol=1e-4, atol=1e-4)
        return
    ref = reference.attention_with_kvcache(q, kf, vf, cache_seqlens=full, causal=True)
    _, ref_lse = reference.attention_with_kvcache(q, _copied(kf), vf, cache_seqlens=full, causal=True, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, kf.astype(BF16), vf.astype(BF16), cache_seqlens=full,
                                                   causal=True)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, (err, bound)
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["decode", "decode-page16-splits5", "chunked-page256", "packed"])
@pytest.mark.parametrize("descale", ["scalar", "array"])
def test_fp8_q_with_fp8_cache(case, descale):
    """An FP8 q: converted to bfloat16 exactly, its descale scaling the scores with k's (decode
    kernel: in float32; chunked prefill: folded into the dequantized K copy); bf16 output; k_new in
    float16 quantized on append."""
    rng = np.random.default_rng(next(_seed))
    B, Hq, Hkv, D, cap = 3, 8, 2, 128, 512
    G = Hq // Hkv
    page = 16 if "page16" in case else 256 if "page256" in case else None
    Sq = 40 if case in ("chunked-page256", "packed") else 3
    splits = 5 if "splits5" in case else None
    shape, table, kc, vc = _random_cache(rng, B, cap, Hkv, D, page)
    dq, dk, dv = ((rng.uniform(0.01, 0.05, (B, Hkv)).astype(np.float32) if descale == "array" else 0.03)
                  for _ in range(3))
    arr = lambda d: np.broadcast_to(np.float32(d), (B, Hkv)).astype(np.float32)  # noqa: E731
    dev = lambda x: x if isinstance(x, float) else cudattn.to_device(x)  # noqa: E731
    kcd, vcd = cudattn.to_device(kc), cudattn.to_device(vc)
    common = dict(block_table=None if table is None else cudattn.to_device(table), causal=True, return_lse=True,
                  q_descale=dev(dq), k_descale=dev(dk), v_descale=dev(dv))
    if case == "packed":
        lens = np.array([100, 0, 450], np.int32)
        qlens = np.array([Sq, 0, 17], np.int32)
        cu = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        q8 = np.clip(rng.standard_normal((cu[-1], Hq, D)) * 30, -448, 448).astype(F8)
        o, lse = cudattn.attention_with_kvcache(cudattn.to_device(q8), kcd, vcd, cache_seqlens=cudattn.to_device(lens),
                                                cu_seqlens_q=cudattn.to_device(cu), max_seqlen_q=Sq, **common)
        full = lens
    else:
        lens = np.array([0, 9, cap - Sq], np.int32)
        q8 = np.clip(rng.standard_normal((B, Sq, Hq, D)) * 30, -448, 448).astype(F8)
        kn, vn = (rng.standard_normal((B, Sq, Hkv, D)).astype(np.float16) for _ in range(2))
        out = cudattn._arrays.array.empty(q8.shape, BF16, device=None, stream=None)
        out.fill_nan()
        o, lse = cudattn.attention_with_kvcache(cudattn.to_device(q8), kcd, vcd, cache_seqlens=cudattn.to_device(lens),
                                                k_new=cudattn.to_device(kn), v_new=cudattn.to_device(vn),
                                                num_splits=splits, out=out, **common)
        full = lens + Sq
    assert o.dtype == BF16
    o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    kf, vf = _dequant(cudattn.to_host(kcd), table, full, arr(dk), B), _dequant(cudattn.to_host(vcd), table, full, arr(dv), B)
    heads_dq = np.repeat(arr(dq), G, axis=1)  # (B, Hq): each query head's kv head's descale
    if case == "packed":
        for b in range(B):
            if qlens[b] == 0:
                continue
            rows = slice(cu[b], cu[b + 1])
            qb = (q8[rows].astype(np.float32) * heads_dq[b][None, :, None])[None]
            ref = reference.attention_with_kvcache(qb, kf[b:b + 1], vf[b:b + 1], cache_seqlens=full[b:b + 1],
                                                   causal=True)
            kq = _copied(kf[b:b + 1] * arr(dq)[b:b + 1, None, :, None])  # the K copy q's descale is folded into
            _, ref_lse = reference.attention_with_kvcache(q8[None, rows].astype(np.float32), kq, vf[b:b + 1],
                                                          cache_seqlens=full[b:b + 1], causal=True, return_lse=True)
            naive = reference.attention_with_kvcache_naive(qb.astype(BF16), kf[b:b + 1].astype(BF16),
                                                           vf[b:b + 1].astype(BF16), cache_seqlens=full[b:b + 1],
                                                           causal=True)
            ok, err, bound = reference.check_close(o[rows], ref[0], naive[0])
            assert ok, (b, err, bound)
            np.testing.assert_allclose(lse[:, rows], ref_lse[0], rtol=1e-4, atol=1e-4)
        return
    qf = q8.astype(np.float32) * heads_dq[:, None, :, None]
    ref, ref_lse = reference.attention_with_kvcache(qf, kf, vf, cache_seqlens=full, causal=True, return_lse=True)
    if Sq > 16:  # the prefill kernels read K dequantized into bfloat16, q's descale folded in
        kq = _copied(kf * arr(dq)[:, None, :, None])
        _, ref_lse = reference.attention_with_kvcache(q8.astype(np.float32), kq, vf, cache_seqlens=full, causal=True,
                                                      return_lse=True)
    naive = reference.attention_with_kvcache_naive(qf.astype(BF16), kf.astype(BF16), vf.astype(BF16),
                                                   cache_seqlens=full, causal=True)
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, (err, bound)
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)
    # the NumPy path gives the same bits
    kwh = dict(common, block_table=table, q_descale=dq, k_descale=dk, v_descale=dv)
    oh, lseh = cudattn.attention_with_kvcache(q8, kc, vc, cache_seqlens=lens, k_new=kn, v_new=vn,
                                              num_splits=splits, **kwh)
    np.testing.assert_array_equal(oh.view(np.uint16), o.view(np.uint16))
