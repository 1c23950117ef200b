"""The KV-cache reference (kvcache_append, gather_kv, attention_with_kvcache[_naive]): contiguous
and paged caches, appended tokens, empty sequences, causal masks per sequence. CPU only.
"""

from __future__ import annotations

import numpy as np
import pytest

from cudattn import reference
from cudattn.reference import (
    attention,
    attention_naive,
    attention_with_kvcache,
    attention_with_kvcache_naive,
    gather_kv,
    kvcache_append,
)
from _merge_cases import NINF
from _merge_cases import _warnings_are_errors as _warnings_are_errors  # fixtures


# --------------------------------------------------------------------------------------------
# KV cache reference
# --------------------------------------------------------------------------------------------

B, HQ, HKV, D = 3, 4, 2, 16


def _contiguous_cache(rng, S_cache):
    k = rng.standard_normal((B, S_cache, HKV, D))
    v = rng.standard_normal((B, S_cache, HKV, D))
    return k, v


def _paged_from(k_full, v_full, page_size, rng, spare=3):
    """Scatter contiguous per-sequence K/V (B, max_pages*page_size, Hkv, D) into shuffled pages."""
    Bn, S = k_full.shape[:2]
    max_pages = S // page_size
    num_pages = Bn * max_pages + spare
    perm = rng.permutation(num_pages)[: Bn * max_pages]
    table = perm.reshape(Bn, max_pages).astype(np.int32)
    kc = rng.standard_normal((num_pages, page_size, HKV, D))  # unused pages hold junk
    vc = rng.standard_normal((num_pages, page_size, HKV, D))
    for b in range(Bn):
        for p in range(max_pages):
            kc[table[b, p]] = k_full[b, p * page_size:(p + 1) * page_size]
            vc[table[b, p]] = v_full[b, p * page_size:(p + 1) * page_size]
    return kc, vc, table


def _per_sequence(q, ks, vs, *, causal=False):
    """attention over each sequence's contiguous keys, stacked; L_b = 0 gives 0 / -inf."""
    Sq = q.shape[1]
    out = np.zeros(q.shape)
    lse = np.full((q.shape[0], q.shape[2], Sq), NINF)
    for b, (kb, vb) in enumerate(zip(ks, vs)):
        if kb.shape[0]:
            o, l = attention(q[b:b + 1], kb[None], vb[None], causal=causal, return_lse=True)
            out[b], lse[b] = o[0], l[0]
    return out, lse


def _assert_same(got, want):
    (go, gl), (wo, wl) = got, want
    assert go.dtype == np.float64 and gl.dtype == np.float64
    np.testing.assert_allclose(go, wo, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(gl), np.isneginf(wl))
    np.testing.assert_allclose(gl, wl, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_contiguous_with_seqlens(causal):
    rng = np.random.default_rng(10)
    kc, vc = _contiguous_cache(rng, 20)
    seqlens = np.array([5, 20, 11], dtype=np.int32)
    q = rng.standard_normal((B, 3, HQ, D))
    pairs = gather_kv(kc, vc, seqlens)
    for b, (kb, vb) in enumerate(pairs):
        np.testing.assert_array_equal(kb, kc[b, :seqlens[b]])
        np.testing.assert_array_equal(vb, vc[b, :seqlens[b]])
    want = _per_sequence(q, [kc[b, :seqlens[b]] for b in range(B)], [vc[b, :seqlens[b]] for b in range(B)],
                         causal=causal)
    got = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=causal, return_lse=True)
    _assert_same(got, want)
    # no cache_seqlens: the whole cache, i.e. plain attention
    full = attention_with_kvcache(q, kc, vc, causal=causal, return_lse=True)
    _assert_same(full, attention(q, kc, vc, causal=causal, return_lse=True))


@pytest.mark.parametrize("page_size", [16, 32])
def test_kvcache_paged_shuffled(page_size):
    rng = np.random.default_rng(11)
    max_pages = 3
    k_full, v_full = _contiguous_cache(rng, max_pages * page_size)
    kc, vc, table = _paged_from(k_full, v_full, page_size, rng)
    seqlens = np.array([1, page_size + 5, max_pages * page_size], dtype=np.int32)
    for b, (kb, vb) in enumerate(gather_kv(kc, vc, seqlens, table)):
        np.testing.assert_array_equal(kb, k_full[b, :seqlens[b]])
        np.testing.assert_array_equal(vb, v_full[b, :seqlens[b]])
    q = rng.standard_normal((B, 2, HQ, D))
    for causal in (False, True):
        want = _per_sequence(q, [k_full[b, :seqlens[b]] for b in range(B)],
                             [v_full[b, :seqlens[b]] for b in range(B)], causal=causal)
        got = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=causal,
                                     return_lse=True)
        _assert_same(got, want)
    # no cache_seqlens: all max_pages * page_size keys
    got = attention_with_kvcache(q, kc, vc, block_table=table, return_lse=True)
    _assert_same(got, attention(q, k_full, v_full, return_lse=True))


@pytest.mark.parametrize("page_size", [None, 16])
def test_kvcache_append_new_tokens(page_size):
    rng = np.random.default_rng(12)
    S_cache, S_new = 32, 3
    k_full, v_full = _contiguous_cache(rng, S_cache)
    if page_size is None:
        kc, vc, table = k_full.copy(), v_full.copy(), None
    else:
        kc, vc, table = _paged_from(k_full, v_full, page_size, rng)
    seqlens = np.array([0, 14, S_cache - S_new], dtype=np.int32)  # 14..16 crosses a page boundary
    k_new = rng.standard_normal((B, S_new, HKV, D))
    v_new = rng.standard_normal((B, S_new, HKV, D))
    kc0, vc0 = kc.copy(), vc.copy()

    k2, v2 = kvcache_append(kc, vc, k_new, v_new, seqlens, table)
    np.testing.assert_array_equal(kc, kc0)  # inputs untouched
    np.testing.assert_array_equal(vc, vc0)
    want_k, want_v = kc0.copy(), vc0.copy()
    written = np.zeros(kc.shape[:2], dtype=bool)
    for b in range(B):
        for t in range(S_new):
            pos = seqlens[b] + t
            slot = (b, pos) if table is None else (table[b, pos // page_size], pos % page_size)
            want_k[slot], want_v[slot] = k_new[b, t], v_new[b, t]
            written[slot] = True
    assert written.sum() == B * S_new
    np.testing.assert_array_equal(k2, want_k)  # the new slots written, every other slot unchanged
    np.testing.assert_array_equal(v2, want_v)
    np.testing.assert_array_equal(k2[~written], kc0[~written])

    ks = [np.concatenate([k_full[b, :seqlens[b]], k_new[b]]) for b in range(B)]
    vs = [np.concatenate([v_full[b, :seqlens[b]], v_new[b]]) for b in range(B)]
    q = rng.standard_normal((B, 4, HQ, D))
    for causal in (False, True):
        got = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, k_new=k_new,
                                     v_new=v_new, causal=causal, return_lse=True)
        _assert_same(got, _per_sequence(q, ks, vs, causal=causal))
    np.testing.assert_array_equal(kc, kc0)


def test_kvcache_append_errors():
    rng = np.random.default_rng(13)
    kc, vc = _contiguous_cache(rng, 8)
    kn = rng.standard_normal((B, 2, HKV, D))
    with pytest.raises(ValueError, match="cache_seqlens"):
        kvcache_append(kc, vc, kn, kn)
    with pytest.raises(ValueError, match="overflows the cache"):
        kvcache_append(kc, vc, kn, kn, np.array([0, 7, 1], dtype=np.int32))
    with pytest.raises(ValueError, match="cache_seqlens"):
        attention_with_kvcache(rng.standard_normal((B, 1, HQ, D)), kc, vc, k_new=kn, v_new=kn)


def test_kvcache_empty_sequence():
    rng = np.random.default_rng(14)
    kc, vc = _contiguous_cache(rng, 10)
    seqlens = np.array([0, 7, 0], dtype=np.int32)
    q = rng.standard_normal((B, 2, HQ, D))
    out, lse = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, return_lse=True)
    for b in (0, 2):
        assert np.all(out[b] == 0) and np.all(np.isneginf(lse[b]))
    _assert_same((out[1:2], lse[1:2]), attention(q[1:2], kc[1:2, :7], vc[1:2, :7], return_lse=True))
    q16, k16, v16 = (x.astype(np.float16) for x in (q, kc, vc))
    no, nl = attention_with_kvcache_naive(q16, k16, v16, cache_seqlens=seqlens, return_lse=True)
    assert no.dtype == np.float16 and nl.dtype == np.float32
    assert np.all(no[[0, 2]] == 0) and np.all(np.isneginf(nl[[0, 2]]))


def test_kvcache_causal_bottom_right_per_sequence():
    # Sq=4 with L = 2, 4, 9: query i sees key j iff j <= i + L - 4 (aligned to each L, not to Sk_cache).
    rng = np.random.default_rng(15)
    kc, vc = _contiguous_cache(rng, 9)
    seqlens = np.array([2, 4, 9], dtype=np.int32)
    q = rng.standard_normal((B, 4, HQ, D))
    out, lse = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True, return_lse=True)
    # L=2: rows 0, 1 see nothing; row 2 sees key 0 only, so its output is v[0] (per kv head).
    assert np.all(out[0, :2] == 0) and np.all(np.isneginf(lse[0, :, :2]))
    np.testing.assert_allclose(out[0, 2], np.repeat(vc[0, 0], HQ // HKV, axis=0), rtol=1e-15)
    # L=4 = Sq: the usual square causal mask; row 0 sees key 0 only.
    np.testing.assert_allclose(out[1, 0], np.repeat(vc[1, 0], HQ // HKV, axis=0), rtol=1e-15)
    want = _per_sequence(q, [kc[b, :seqlens[b]] for b in range(B)], [vc[b, :seqlens[b]] for b in range(B)],
                         causal=True)
    _assert_same((out, lse), want)


@pytest.mark.parametrize("page_size", [None, 16])
def test_kvcache_naive_matches_attention_naive(page_size):
    rng = np.random.default_rng(16)
    k_full, v_full = (x.astype(np.float16) for x in _contiguous_cache(rng, 32))
    if page_size is None:
        kc, vc, table = k_full, v_full, None
    else:
        kc, vc, table = (x.astype(np.float16) if x.dtype != np.int32 else x
                         for x in _paged_from(k_full, v_full, page_size, rng))
    seqlens = np.array([3, 17, 30], dtype=np.int32)
    q = rng.standard_normal((B, 2, HQ, D)).astype(np.float16)
    kn = rng.standard_normal((B, 2, HKV, D)).astype(np.float16)
    vn = rng.standard_normal((B, 2, HKV, D)).astype(np.float16)
    out, lse = attention_with_kvcache_naive(q, kc, vc, cache_seqlens=seqlens, block_table=table, k_new=kn,
                                            v_new=vn, causal=True, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    for b in range(B):
        kb = np.concatenate([k_full[b, :seqlens[b]], kn[b]])[None]
        vb = np.concatenate([v_full[b, :seqlens[b]], vn[b]])[None]
        wo, wl = attention_naive(q[b:b + 1], kb, vb, causal=True, return_lse=True)
        np.testing.assert_array_equal(out[b], wo[0])
        np.testing.assert_array_equal(lse[b], wl[0])
    ref = attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, k_new=kn, v_new=vn,
                                 causal=True)
    assert reference.check_close(out, ref, out)[0]
