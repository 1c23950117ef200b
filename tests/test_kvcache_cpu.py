"""CPU: argument checks of attention_with_kvcache (before any GPU work) and the split heuristic."""

from __future__ import annotations

import numpy as np
import pytest

import cudattn
from cudattn._kernels import decode_plan as _decode_plan
from cudattn._ops.kvcache import validate_kvcache

F16 = np.float16


def _args(B=2, Sq=1, Hq=4, Hkv=2, D=64, cap=64, paged=None, seqlens=(3, 64), s_new=0):
    q = np.ones((B, Sq, Hq, D), F16)
    if paged:
        n_pages, ps, max_pages = paged
        k = np.ones((n_pages, ps, Hkv, D), F16)
        table = np.arange(B * max_pages, dtype=np.int32).reshape(B, max_pages) % n_pages
    else:
        k, table = np.ones((B, cap, Hkv, D), F16), None
    sl = None if seqlens is None else np.asarray(seqlens, np.int32)
    kn = vn = np.ones((B, s_new, Hkv, D), F16) if s_new else None
    return dict(q=q, k_cache=k, v_cache=k.copy(), seqlens=sl, table=table, k_new=kn, v_new=vn, causal=False,
                scale=None, return_lse=False, num_splits=None)


def _validate(**kw):
    a = _args(**{k: v for k, v in kw.items() if k in ("B", "Sq", "Hq", "Hkv", "D", "cap", "paged", "seqlens",
                                                     "s_new")})
    a.update({k: v for k, v in kw.items() if k in ("q", "k_cache", "v_cache", "table", "k_new", "v_new",
                                                   "num_splits")})
    return validate_kvcache(a["q"], a["k_cache"], a["v_cache"], a["seqlens"], a["table"], a["k_new"], a["v_new"],
                            a["causal"], a["scale"], a["return_lse"], a["num_splits"], host=True)


def test_valid_contiguous_and_paged():
    p, _ = _validate()
    assert p.seqlen_k == 64 and not p.kv_cache.paged and p.kv_cache.capacity == 64
    p, g = _validate(paged=(8, 32, 3), seqlens=(0, 96), s_new=0)
    assert p.kv_cache.paged and p.kv_cache.page_size == 32 and p.kv_cache.capacity == 96 and g is None
    p, g = _validate(paged=(8, 32, 3), seqlens=(0, 90), s_new=4)
    assert p.kv_cache.seqlen_add == 4 and g is not None


@pytest.mark.parametrize("kw,exc,match", [
    (dict(seqlens=(3, 65)), ValueError, r"cache_seqlens\[1\] = 65: each length must fit the cache's capacity of 64"),
    (dict(seqlens=(-1, 3)), ValueError, r"cache_seqlens\[0\] = -1"),
    (dict(seqlens=(3, 62), s_new=3), ValueError, r"cache_seqlens\[1\] = 62: each length \(and 3 appended keys\)"),
    (dict(seqlens=None, s_new=2), ValueError, r"k_new/v_new need cache_seqlens"),
    (dict(seqlens=(1, 2, 3)), ValueError, r"cache_seqlens must be int32 \(batch,\) = \(2,\)"),
    (dict(paged=(8, 24, 3), seqlens=(1, 2)), ValueError, r"page size .* multiple of 16; got 24"),
    (dict(paged=(2, 32, 3), seqlens=(40, 90), table=np.array([[0, 1, 0], [1, 2, 0]], np.int32)), ValueError,
     r"block_table\[1, 1\] = 2 is not a page of the cache \(0 <= page < 2\); sequence 1 uses its first 3 pages"),
    (dict(k_cache=np.ones((3, 64, 2, 64), F16), v_cache=np.ones((3, 64, 2, 64), F16)), ValueError, r"k_cache's batch \(3\) must equal q's \(2\)"),
    (dict(Hq=3), ValueError, r"heads_q \(3\) must be a multiple"),
    (dict(num_splits=0), ValueError, r"num_splits must be from 1 to 128"),
    (dict(k_new=np.ones((2, 1, 2, 64), F16)), ValueError, r"k_new and v_new must be given together"),
])
def test_bad_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        _validate(**kw)


def test_bad_table_dtype_and_shape():
    a = _args(paged=(8, 32, 3), seqlens=(1, 2))
    with pytest.raises(TypeError, match=r"block_table must be int32; got int64"):
        _validate(paged=(8, 32, 3), seqlens=(1, 2), table=a["table"].astype(np.int64))
    with pytest.raises(ValueError, match=r"block_table must be int32 \(batch, max_pages\)"):
        _validate(paged=(8, 32, 3), seqlens=(1, 2), table=a["table"][:1])


def test_unused_table_entries_are_not_checked():
    """Only the pages a sequence uses must be valid (-1 padding past them is fine)."""
    a = _args(paged=(8, 32, 3), seqlens=(10, 40))
    t = a["table"].copy()
    t[0, 1:] = -1  # sequence 0 uses one page
    t[1, 2] = -1  # sequence 1 uses two
    _validate(paged=(8, 32, 3), seqlens=(10, 40), table=t)


def test_shared_append_slot_is_refused():
    a = _args(paged=(8, 32, 2), seqlens=(5, 5), s_new=1)
    t = np.array([[3, 4], [3, 5]], np.int32)  # both sequences append to row 5 of page 3
    with pytest.raises(ValueError, match=r"two sequences append to the same cache slot \(page 3, row 5\)"):
        _validate(paged=(8, 32, 2), seqlens=(5, 5), s_new=1, table=t)
    del a


def test_split_heuristic():
    c = _decode_plan.choose_num_splits
    assert c(8, 2048, 132) == 16  # one long sequence, 8 kv heads: about one block per SM
    assert c(64, 512, 132) == 2
    assert c(256, 64, 132) == 1 and c(106, 64, 132) == 1  # the grid already fills the GPU
    assert c(8, 7, 132) == 1  # too few tiles to cut
    assert c(1, 40, 132) == 10  # at least MIN_TILES_PER_SPLIT tiles per split
    # One kv head, 8 packed rows on 4 warps (2 rows a warp), two blocks an SM: with 128 key tiles the
    # split count that gives each block 4 tiles (32; 31 gave some 5: H200 15.8 us against 18.0),
    # with 512 the merge's cost outweighs the last tiles (H200: 48-64 splits 23.2-24.8 us against
    # 122 splits' 32.5)
    assert c(1, 128, 132, 2, 2) == 32
    assert 48 <= c(1, 512, 132, 2, 2) <= 64
    assert c(1, 512, 132, 2, 1) > c(1, 512, 132, 2, 2)  # fewer rows to merge: more splits pay
    # The one-fragment build of 8 warps and 128-key tiles (one block an SM, one row a warp): 32 splits
    # of 2 tiles at 8192 keys (H200: 12.6 us; 16 splits, all 4 tiles allowed before, 13.8), 64 at 32768
    assert c(1, 64, 132, 1, 1, 2) == 32
    assert c(1, 256, 132, 1, 1, 2) == 64
    # One row block's splits on at most half the SMs (H200, the same build: 64 splits at 65536 and
    # 131072 keys 22.5 and 31.2 us, against the 86 and 114 that the models chose, 24.7 and 34.7 us);
    # grids of several row blocks, and builds of four blocks an SM, are not capped so
    assert c(1, 512, 132, 1, 1, 2) == 64 and c(1, 1024, 132, 1, 1, 2) == 64 and c(1, 2048, 132, 1, 1, 2) == 64
    assert all(c(1, t, sm, per_sm, 1, 2) <= sm // 2 for t in (512, 1024, 4096) for sm in (78, 108, 132)
               for per_sm in (1, 2))
    assert c(2, 1024, 132, 2, 1, 2) > 66 and c(1, 1024, 132, 4, 1, 2) > 66
    # A single row block whose merge may be spread (the builds not short of registers): a split a key
    # tile up to half the SMs (H200, 8 heads D 64: 8192 keys, 64 tiles, 64 splits 10.4 us against the
    # models' 16 splits' 11.8), past half only while each keeps ONE_BLOCK_SPLIT_TILES (D 256, 131072
    # keys: 128 splits 47.6 us against 64's 55.7; D 128, 65536 keys: 64 splits of 8 tiles 20.5 us
    # against 128 of 4, 21.1), then the fewest splits of the same tiles a split
    def spread(tiles, sm=132, per_sm=1, min_tiles=2, blocks=1):
        return c(blocks, tiles, sm, per_sm, 1, min_tiles, spread_merge=True)

    assert spread(4) == 4 and spread(8) == 8 and spread(64) == 64 and spread(3) == 1
    assert spread(256) == 64 and spread(512) == 64 and spread(1024) == 128 and spread(2048) == 128
    assert spread(100, min_tiles=4) == 50  # 66 splits would leave some 1 tile and some 2: 50 of 2
    assert spread(800) == 100 and spread(4096, sm=108) == 108 and spread(4096, sm=78) == 78
    assert spread(1024, per_sm=2) == 128 and spread(1024, per_sm=4) == c(1, 1024, 132, 4, 1, 2)
    assert spread(1024, blocks=2) == c(2, 1024, 132, 1, 1, 2)  # several row blocks: the models
    for sm in (16, 78, 108, 132):
        for tiles in range(4, 5000, 37):
            s = spread(tiles, sm=sm)
            assert 1 <= s <= min(128, sm, tiles), (sm, tiles, s)
            assert s == 1 or -(-tiles // (s - 1)) > -(-tiles // s), (sm, tiles, s)  # one fewer: more a split
    for blocks in range(1, 200, 7):
        for tiles in (1, 9, 100, 5000):
            s = c(blocks, tiles, 132)
            assert 1 <= s <= 128 and (s == 1 or s * _decode_plan.MIN_TILES_PER_SPLIT <= tiles)
            s = c(blocks, tiles, 132, 1, 1, 2)
            assert 1 <= s <= 128 and (s == 1 or s * 2 <= tiles)


def test_merge_sharers():
    """How many of a block of rows' last blocks share its merge (decode/store.cuh, combine_spread): a
    warp a (row, 32 columns) piece, at most 16 and the split count; the last alone without splits,
    with a row a warp of 32 parts or fewer, for the builds short of registers, and where the grid
    has more blocks than SMs (waiting blocks would hold SMs that blocks not yet started need)."""
    m = _decode_plan.choose_merge_ctas
    assert m(64, 64, 8, 128, 8, 132) == 4  # 8 rows x 4 pieces on 8 warps
    assert m(32, 32, 8, 128, 8, 132) == 1 and m(128, 32, 8, 128, 8, 132) == 1  # a row a warp, 32 parts
    assert m(33, 33, 8, 128, 8, 132) == 4 and m(32, 32, 16, 128, 8, 132) == 8  # 33 parts; two rows a warp
    assert m(64, 64, 16, 128, 8, 132) == 8 and m(64, 64, 32, 128, 8, 132) == 16  # a piece a warp
    assert m(64, 64, 16, 256, 8, 132) == 16 and m(64, 64, 32, 256, 8, 132) == 16  # capped at 16
    assert m(128, 8, 32, 128, 8, 132) == 8  # no more sharers than splits
    assert m(16, 16, 8, 64, 4, 132) == 4 and m(64, 64, 1, 64, 4, 132) == 1  # one row of 2 pieces: one block
    assert m(3, 3, 16, 128, 8, 132) == 3  # no more sharers than splits
    assert m(64, 1, 16, 128, 8, 132) == 1  # no splits, no merge
    assert m(132, 66, 16, 128, 8, 132) == 8 and m(133, 66, 16, 128, 8, 132) == 1  # the whole grid resident
    assert m(64, 64, 16, 128, 8, 132, tight=True) == 1
    assert m(64, 64, 8, 96, 4, 132) == 6  # a row of 96 columns: 3 pieces, the last ending early


def _one_token_plan(hq, sk, d=128, batch=1, splits=None, **extra):
    """`_decode_plan.choose_plan` of one token, ``hq`` query heads on one kv head, on an H200's numbers."""
    from types import SimpleNamespace

    problem = SimpleNamespace(dtype="bfloat16", head_dim=d, seqlen_q=1, heads_q=hq, heads_kv=1, batch=batch,
                              group_size=hq, seqlen_k=sk, num_splits=splits, kv_cache=None, window=None, mods=None)
    for k, v in extra.items():
        setattr(problem, k, v)
    props = SimpleNamespace(sm_count=132, max_shared_memory_per_block_optin=232448,
                            max_shared_memory_per_multiprocessor=233472)
    p = _decode_plan.choose_plan(problem, props)
    t = p.variant.tiles
    return t.row_frags, t.warps, p.num_m_blocks, p.num_splits, p.merge_ctas


def test_rows_of_two_fragments_halved_where_the_halved_blocks_fit_one_wave_of_short_splits():
    """17-32 packed rows on the 8-warp two-fragment build (head dim 128, no modifiers) or head dim
    64's: two one-fragment blocks of 16 rows, their splits a key tile each up to a block an SM (a
    warp a piece of the merge: 8 sharers), where those blocks fit one wave and a split has at most 8
    key tiles, or, where those blocks alone fill more than half the SMs, unsplit with at most 16; else
    one block with up to 16 sharers."""
    assert _one_token_plan(32, 8192) == (1, 8, 2, 64, 8)  # 64 splits: 64 blocks -> 2 x 64
    assert _one_token_plan(24, 32768) == (1, 8, 2, 64, 8)
    assert _one_token_plan(32, 65536) == (1, 8, 2, 64, 8)  # 8 tiles a split
    assert _one_token_plan(32, 8192, batch=2) == (1, 8, 2, 32, 8)  # 4 blocks of rows: 32 splits fill the SMs
    assert _one_token_plan(32, 8192, d=64, batch=2) == (1, 4, 2, 32, 8)  # (the models gave 11 for 2 blocks)
    assert _one_token_plan(32, 2048, d=64, batch=4) == (1, 4, 2, 16, 8)  # a split a key tile
    assert _one_token_plan(32, 32768, d=64, batch=2)[3] == 32  # 8 tiles a split (33 would leave some 7)
    # where the two-fragment grid's own splits fill more than half the SMs too (11 and 8 splits)
    assert _one_token_plan(32, 4096, batch=8) == (1, 8, 2, 8, 8)
    assert _one_token_plan(32, 4096, batch=16) == (1, 8, 2, 4, 4)
    assert _one_token_plan(32, 8192, d=64, batch=8) == (1, 4, 2, 8, 8)
    assert _one_token_plan(32, 512, batch=64) == (1, 8, 2, 1, 1)  # 128 blocks, unsplit
    assert _one_token_plan(32, 8192, splits=66)[:3] == (1, 8, 2)  # a forced count the same way
    assert _one_token_plan(32, 8192, splits=67)[:3] == (2, 8, 1)  # 134 blocks: more than one wave
    assert _one_token_plan(32, 131072) == (2, 8, 1, 128, 16)  # halved, 16 tiles a split: one block of 32 rows
    assert _one_token_plan(32, 32768, batch=4) == (2, 8, 1, 32, 16)  # (16 tiles a split)
    assert _one_token_plan(32, 12288, batch=8)[:3] == (2, 8, 1)  # (12)
    assert _one_token_plan(32, 4096, batch=33)[:3] == (2, 8, 1)  # 66 blocks of 2 splits: 16 tiles each
    assert _one_token_plan(32, 4096, batch=67)[:3] == (2, 8, 1)  # 134 blocks: more than one wave
    # halved blocks that fill more than half the SMs alone: unsplit, up to 16 tiles
    assert _one_token_plan(32, 2048, batch=48) == (1, 8, 2, 1, 1)  # 96 blocks of 16 tiles
    assert _one_token_plan(32, 2048, batch=34) == (1, 8, 2, 1, 1)  # 68
    assert _one_token_plan(32, 2048, batch=66) == (1, 8, 2, 1, 1)  # 132
    assert _one_token_plan(32, 1536, d=64, batch=48) == (1, 4, 2, 1, 1)  # 12 tiles of 128 keys
    assert _one_token_plan(32, 2048, batch=32) == (1, 8, 2, 2, 2)  # 64 blocks: two splits of 8 tiles
    assert _one_token_plan(32, 2176, batch=48)[:3] == (2, 8, 1)  # 17 tiles
    assert _one_token_plan(32, 2048, batch=67)[:3] == (2, 8, 1)  # 134 blocks: more than one wave
    assert _one_token_plan(16, 8192)[:3] == (1, 8, 1)  # one fragment already
    assert _one_token_plan(32, 8192, d=64)[:3] == (1, 4, 2)  # head dim 64's two-fragment build (4 warps) the same
    assert _one_token_plan(32, 8192, d=40)[:3] == (1, 4, 2)  # (its head-dim tile)
    assert _one_token_plan(32, 8192, d=256)[:3] == (1, 4, 2)  # head dim 256 had two blocks of 16 rows already
    assert _one_token_plan(32, 8192, window=(1024, 0))[:3] == (2, 4, 1)  # modifiers: the 4-warp build, as it was


def test_one_buffer_as_both_caches_is_refused_when_appending():
    """Appending writes k_new and v_new into the caches in place: with k_cache and v_cache the same
    memory, v_new would overwrite the keys (found by the issue-7 review)."""
    c = np.ones((2, 64, 2, 64), F16)
    with pytest.raises(ValueError, match="^k_cache and v_cache share memory"):
        _validate(k_cache=c, v_cache=c, seqlens=(3, 5), s_new=1)
    _validate(k_cache=c, v_cache=c, seqlens=(3, 5))  # nothing written: reading one buffer twice is fine


def test_interleaved_k_and_v_views_of_one_buffer_may_append():
    kv = np.ones((2, 64, 2, 2, 64), F16)  # (B, capacity, k|v, Hkv, D)
    _validate(k_cache=kv[:, :, 0], v_cache=kv[:, :, 1], seqlens=(3, 5), s_new=1)


# ---------------------------------------------------------------------- FP8 caches: checked before any GPU work


def test_fp8_cache_rules():
    import ml_dtypes

    f8 = np.dtype(ml_dtypes.float8_e4m3fn)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 1, 4, 64)).astype(np.float16)
    c16 = rng.standard_normal((1, 64, 4, 64)).astype(np.float16)
    c8 = c16.astype(f8)
    with pytest.raises(ValueError, match="k_descale applies to FP8"):
        cudattn.attention_with_kvcache(q, c16, c16, k_descale=0.5)
    with pytest.raises(TypeError, match="an FP8 q .* needs an FP8 cache"):
        cudattn.attention_with_kvcache(q.astype(f8), c16, c16)
    with pytest.raises(ValueError, match="q_descale applies to an FP8"):
        cudattn.attention_with_kvcache(q, c8, c8, q_descale=0.5)
    with pytest.raises(ValueError, match="q_descale must have shape"):
        cudattn.attention_with_kvcache(q.astype(f8), c8, c8, q_descale=np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="with an FP8 q, k_new and v_new must both be float16 or both bfloat16"):
        cudattn.attention_with_kvcache(q.astype(f8), c8, c8, cache_seqlens=np.zeros(1, np.int32),
                                       k_new=c8[:, :1], v_new=c8[:, :1])
    with pytest.raises(TypeError, match="must have q's dtype, or both be float8_e4m3fn"):
        cudattn.attention_with_kvcache(q, c8, c16)
    with pytest.raises(ValueError, match="k_descale must have shape"):
        cudattn.attention_with_kvcache(q, c8, c8, k_descale=np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="multiple of 16"):
        cudattn.attention_with_kvcache(q[..., :24], c8[..., :24], c8[..., :24])
