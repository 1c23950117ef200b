"""GPU: chunked prefill, attention_with_kvcache with more than 16 query tokens, served by the
prefill kernels reading the cache in place (contiguous, or paged with page sizes 16, 48 and 256),
against the float64 reference under DESIGN §6's rule; per-sequence lengths including 0 and a
full cache; k_new/v_new appended first; both kernel families on Hopper. Stale cache slots past a
sequence's length hold NaN, which must not reach the output.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._kernels import decode as _decode
from _tile_order import counters_taken, fixed_rounds, stream_counters_read_zero
from test_decode_gpu import BF16, F16, _check, _paged, _rand, kvcache_case

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_family")]


def test_longer_queries_take_the_prefill_kernels():
    from dataclasses import replace

    from cudattn._spec.geometry import TensorGeom
    from cudattn._spec.problem import KvCache, Problem

    g = TensorGeom(1, 1, 1)
    p = Problem(2, _decode.DECODE_MAX_SQ + 1, 64, 4, 4, 64, np.dtype(F16), np.dtype(F16), "bshd", True, 1.0, False,
                False, g, g, g, kv_cache=KvCache(False, 64, 1, 2))
    assert not _decode.takes_split_kv(p)
    assert _decode.takes_split_kv(replace(p, seqlen_q=_decode.DECODE_MAX_SQ))
    assert _decode.takes_split_kv(replace(p, num_splits=2))


@pytest.mark.parametrize("page_size", [None, 16, 48, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq", [17, 130, 700])
def test_chunked_prefill(page_size, causal, sq):
    kvcache_case(4, sq, 1500, 8, 2, 128, [0, 1500 - sq, 257, 1000], page_size=page_size, causal=causal)


@pytest.mark.parametrize("D", [64, 256])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_chunked_prefill_head_dims(D, page_size):
    kvcache_case(3, 200, 900, 4, 4, D, [900, 5, 431], page_size=page_size, causal=True, dtype=BF16)


@pytest.mark.parametrize("page_size", [None, 16, 256])
@pytest.mark.parametrize("host", [False, True])
def test_chunked_prefill_append(page_size, host):
    """k_new/v_new (the chunk's own keys) appended in place, then attended with the cache."""
    kvcache_case(3, 300, 1024, 8, 1, 128, [0, 77, 700], page_size=page_size, s_new=300, host=host, causal=True)


def test_chunked_prefill_default_lengths():
    kvcache_case(2, 64, 512, 4, 2, 64, [512, 512], page_size=None, causal=True)


@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_stale_slots_do_not_leak(page_size):
    """Cache rows past each sequence's length (and unused pages) hold NaN: outputs stay finite."""
    rng = np.random.default_rng(77)
    B, Sq, cap, H, D = 3, 100, 600, 4, 128
    lens = np.array([150, 1, 333], np.int32)
    q = _rand(rng, (B, Sq, H, D), F16)
    k, v = _rand(rng, (B, cap, H, D), F16), _rand(rng, (B, cap, H, D), F16)
    for b in range(B):
        k[b, lens[b]:], v[b, lens[b]:] = np.nan, np.nan
    ref, ref_lse = reference.attention_with_kvcache(q, np.nan_to_num(k), np.nan_to_num(v), cache_seqlens=lens,
                                                    causal=False, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, np.nan_to_num(k), np.nan_to_num(v), cache_seqlens=lens)
    table = None
    if page_size:
        k, v, table = _paged(k, v, page_size, rng)
        for kv in (k, v):
            used = set(table.ravel().tolist())
            kv[[i for i in range(kv.shape[0]) if i not in used]] = np.nan
    dev = cudattn.to_device
    o, lse = cudattn.attention_with_kvcache(dev(q), dev(k), dev(v), cache_seqlens=dev(lens),
                                           block_table=None if table is None else dev(table), return_lse=True)
    _check(cudattn.to_host(o), cudattn.to_host(lse), ref, ref_lse, naive)


@pytest.mark.parametrize("page_size", [None, 16, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("host", [False, True])
def test_packed_chunks_against_the_cache(page_size, causal, host):
    """A packed q (cu_seqlens_q): sequence b's chunk of n_b queries against its L_b cached keys
    (the chunk's own keys among them), each sequence checked against the reference alone."""
    rng = np.random.default_rng(91 + (page_size or 0) + causal + 2 * host)
    B, cap, Hq, Hkv, D = 4, 1200, 8, 2, 128
    n = np.array([300, 1, 0, 129], np.int32)
    lens = np.array([1100, 40, 7, 129], np.int32)
    cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    q = _rand(rng, (int(cu[-1]), Hq, D), F16)
    k, v = _rand(rng, (B, cap, Hkv, D), F16), _rand(rng, (B, cap, Hkv, D), F16)
    kc, vc, table = (k, v, None) if not page_size else _paged(k, v, page_size, rng)
    kw = dict(cache_seqlens=lens, block_table=table, cu_seqlens_q=cu, max_seqlen_q=int(n.max()), causal=causal,
              return_lse=True)
    if host:
        o, lse = cudattn.attention_with_kvcache(q, kc, vc, **kw)
    else:
        dev = cudattn.to_device
        kw.update(cache_seqlens=dev(lens), block_table=None if table is None else dev(table), cu_seqlens_q=dev(cu))
        out = cudattn._arrays.array.empty(q.shape, F16)
        out.fill_nan()
        o, lse = cudattn.attention_with_kvcache(dev(q), dev(kc), dev(vc), out=out, **kw)
        assert o.ptr == out.ptr
        o, lse = cudattn.to_host(o), cudattn.to_host(lse)
    assert o.shape == q.shape and lse.shape == (Hq, q.shape[0])
    for b in range(B):
        rows = slice(cu[b], cu[b + 1])
        if n[b] == 0:
            continue
        one = dict(cache_seqlens=lens[b:b + 1], causal=causal)
        ref, ref_lse = reference.attention_with_kvcache(q[None, rows], k[b:b + 1], v[b:b + 1], **one, return_lse=True)
        naive = reference.attention_with_kvcache_naive(q[None, rows], k[b:b + 1], v[b:b + 1], **one)
        _check(o[None, rows], lse[None, :, rows], ref, ref_lse, naive)


def test_packed_q_without_rows():
    cache = np.zeros((2, 64, 2, 64), F16)
    q = np.zeros((0, 4, 64), F16)
    o, lse = cudattn.attention_with_kvcache(q, cache, cache, cache_seqlens=np.array([3, 4], np.int32),
                                           cu_seqlens_q=np.zeros(3, np.int32), max_seqlen_q=0, return_lse=True)
    assert o.shape == (0, 4, 64) and lse.shape == (4, 0)


@pytest.mark.parametrize("host_lengths", [False, True])
def test_gathered_copy_sized_by_known_lengths(host_lengths, monkeypatch):
    """With NumPy lengths the copy of a paged cache holds only the rows the longest sequence uses
    (capacity 4096 here, 300 used); with device lengths, the capacity."""
    from cudattn._kernels import kvcache as _kv_launches

    seen = []
    real = _kv_launches._gather
    monkeypatch.setattr(_kv_launches, "_gather", lambda *a: seen.append(a[-1]) or real(*a))
    kvcache_case(2, 64, 4096, 4, 2, 64, [300, 17], page_size=16, causal=True, table_on_device=not host_lengths)
    # the first call of a signature runs its full path twice (once recorded for the replay)
    assert seen and set(seen) == {300 if host_lengths else None}


@pytest.mark.parametrize("page_size", [None, 256])
def test_cached_lengths_take_tiles_from_the_counter(monkeypatch, kernel_family, page_size):
    """A non-causal chunk against caches of different lengths: each sequence's tiles read its own
    number of keys, so the Hopper kernel takes them from the stream's counter (the dynamic order).
    Calls back to back, each into a poisoned out, give the fixed rounds' result bit for bit, and
    that result passes the reference."""
    taken = counters_taken(monkeypatch, kernel_family)
    rng = np.random.default_rng(4242 + (page_size or 0))
    B, Sq, cap, Hq, Hkv, D = 6, 768, 3000, 8, 2, 128  # 6 x 8 x 6 whole tiles: over twice the SMs'
    lens = np.array([3000, 1, 1200, 2049, 0, 640], np.int32)
    q = _rand(rng, (B, Sq, Hq, D), BF16)
    k, v = _rand(rng, (B, cap, Hkv, D), BF16), _rand(rng, (B, cap, Hkv, D), BF16)
    kc, vc, table = (k, v, None) if not page_size else _paged(k, v, page_size, rng)
    dev = cudattn.to_device
    args = (dev(q), dev(kc), dev(vc))
    kw = dict(cache_seqlens=dev(lens), block_table=None if table is None else dev(table), causal=False,
              return_lse=True)

    def run():
        out = cudattn._arrays.array.empty(q.shape, BF16)
        out.fill_nan()
        o, lse = cudattn.attention_with_kvcache(*args, out=out, **kw)
        return cudattn.to_host(o), cudattn.to_host(lse)

    dynamic = [run() for _ in range(3)]
    assert taken and all(taken), "the calls took no tile counters"
    assert stream_counters_read_zero() >= 1
    fixed_rounds(monkeypatch)
    o, lse = run()
    for do, dl in dynamic:
        assert np.array_equal(do.view(np.uint16), o.view(np.uint16)) and np.array_equal(dl, lse)
    one = dict(cache_seqlens=lens, causal=False)
    ref, ref_lse = reference.attention_with_kvcache(q, k, v, **one, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, k, v, **one)
    _check(o, lse, ref, ref_lse, naive)
