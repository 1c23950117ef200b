"""GPU: random valid attention_with_kvcache problems drawn by Hypothesis (issue 7, part 6): KV
caches contiguous or paged, lengths including 0, appended keys, the NumPy and the device path, each
checked against the float64 reference under DESIGN §6's rule (the inputs and checks of
`_fuzz_gpu_cases`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cudattn
from cudattn import reference
from _fuzz_gpu_cases import BF16, F16, _random, check_lse, gpu_fuzz, heads

pytestmark = pytest.mark.gpu


# ---------------------------------------------------------------------------------------------
# KV caches
# ---------------------------------------------------------------------------------------------


def _paged(rng, k, v, page_size):
    """Contiguous (B, cap, H, D) caches scattered into shuffled pages (plus spare random ones)."""
    B, cap, H, D = k.shape
    per = -(-cap // page_size)
    n = B * per + 2
    table = rng.permutation(n)[: B * per].reshape(B, per).astype(np.int32)
    kp, vp = _random(rng, (n, page_size, H, D), k.dtype), _random(rng, (n, page_size, H, D), k.dtype)
    for b in range(B):
        for i in range(per):
            rows = slice(i * page_size, min(cap, (i + 1) * page_size))
            kp[table[b, i], : rows.stop - rows.start] = k[b, rows]
            vp[table[b, i], : rows.stop - rows.start] = v[b, rows]
    return kp, vp, table


@gpu_fuzz(40)
@given(st.data())
def test_fuzz_kvcache(data):
    """attention_with_kvcache: contiguous or paged caches, lengths from 0 to full, appended keys,
    forced or heuristic splits, NumPy or device lengths and tables, NumPy path or device path."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    dtype = data.draw(st.sampled_from([F16, BF16]), label="dtype")
    B = data.draw(st.integers(1, 3), label="B")
    Sq = data.draw(st.sampled_from([1, 1, 2, 4]), label="Sq")
    Hq, Hkv = data.draw(heads(), label="Hq, Hkv")
    D = data.draw(st.sampled_from([64, 128, 128]), label="D")
    cap = data.draw(st.integers(1, 300), label="capacity")
    page_size = data.draw(st.sampled_from([None, None, 16, 48]), label="page_size")
    s_new = data.draw(st.sampled_from([0, 0, 1, 3]), label="S_new")
    if s_new > cap:
        s_new = 0
    lens = data.draw(st.lists(st.integers(0, cap - s_new), min_size=B, max_size=B), label="cache_seqlens")
    causal = data.draw(st.booleans(), label="causal")
    splits = data.draw(st.sampled_from([None, None, 1, 3, 8]), label="num_splits")
    host_path = data.draw(st.booleans(), label="numpy path")
    index_on_device = data.draw(st.booleans(), label="lengths and table on the device")
    q = _random(rng, (B, Sq, Hq, D), dtype)
    k, v = _random(rng, (B, cap, Hkv, D), dtype), _random(rng, (B, cap, Hkv, D), dtype)
    table = None
    if page_size:
        k, v, table = _paged(rng, k, v, page_size)
    sl = np.asarray(lens, np.int32)
    kn = vn = None
    if s_new:
        kn, vn = _random(rng, (B, s_new, Hkv, D), dtype), _random(rng, (B, s_new, Hkv, D), dtype)
    kw = dict(cache_seqlens=sl, block_table=table, k_new=kn, v_new=vn, causal=causal)
    ref, ref_lse = reference.attention_with_kvcache(q, k, v, **kw, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, k, v, **kw)
    k_after, v_after = reference.kvcache_append(k, v, kn, vn, sl, table) if s_new else (k, v)
    if host_path:
        o, lse = cudattn.attention_with_kvcache(q, k, v, **kw, return_lse=True, num_splits=splits)
        k_got, v_got = k, v  # appended in place
    else:
        dev = cudattn.to_device
        kd, vd = dev(k), dev(v)
        if index_on_device:
            kw.update(cache_seqlens=dev(sl), block_table=None if table is None else dev(table))
        kw.update(k_new=None if kn is None else dev(kn), v_new=None if vn is None else dev(vn))
        o, lse = cudattn.attention_with_kvcache(dev(q), kd, vd, **kw, return_lse=True, num_splits=splits)
        o, lse = cudattn.to_host(o), cudattn.to_host(lse)
        k_got, v_got = cudattn.to_host(kd), cudattn.to_host(vd)
    o64 = np.asarray(o).astype(np.float64)
    assert not np.isnan(o64).any(), f"{np.isnan(o64).sum()} outputs unwritten or NaN"
    ok, err, bound = reference.check_close(o64, ref, naive)
    assert ok, f"max|out-ref| = {err:.3g} > bound {bound:.3g}"
    check_lse(np.asarray(lse), ref_lse, (B, Hq, Sq))
    assert np.array_equal(k_got.view(np.uint16), k_after.view(np.uint16)), "k cache not updated as expected"
    assert np.array_equal(v_got.view(np.uint16), v_after.view(np.uint16)), "v cache not updated as expected"
