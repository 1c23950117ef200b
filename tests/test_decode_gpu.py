"""GPU: the split-KV (flash-decoding) path against the float64 reference, DESIGN.md §6's rule.

attention() with few query tokens (the decode kernel, GQA packing, forced and heuristic splits),
attention_with_kvcache (per-sequence lengths including 0 and full, paged caches with shuffled
block tables, appending k_new/v_new), the combine with splits that saw no key, determinism, and
merge_attention_states on device arrays. Outputs are poisoned with NaN before every launch.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._kernels import decode as _decode
from cudattn._kernels import decode_traits as _decode_traits
from cudattn._runtime import device as _device

pytestmark = pytest.mark.gpu

F16, BF16 = np.float16, ml_dtypes.bfloat16
_seed = itertools.count(5000)


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _poisoned(shape, dtype):
    out = cudattn._arrays.array.empty(shape, dtype)
    out.fill_nan()
    return out


def _check(o, lse, ref, ref_lse, naive):
    o = np.asarray(o).astype(np.float64)
    assert not np.isnan(o).any(), f"{np.isnan(o).sum()} outputs unwritten or NaN"
    ok, err, bound = reference.check_close(o, ref, naive)
    assert ok, f"max|out-ref| = {err:.3g} > bound {bound:.3g}"
    if lse is not None:
        lse = np.asarray(lse).astype(np.float64)
        empty = np.isneginf(ref_lse)
        assert np.array_equal(np.isneginf(lse), empty), "LSE must be -inf exactly on rows that see no key"
        assert not np.isnan(lse).any()
        np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)


def decode_case(B, Sq, Sk, Hq, Hkv, D, dtype=F16, causal=False, splits=None, layout="bshd"):
    rng = np.random.default_rng(next(_seed))
    qs = (B, Sq, Hq, D) if layout == "bshd" else (B, Hq, Sq, D)
    ks = (B, Sk, Hkv, D) if layout == "bshd" else (B, Hkv, Sk, D)
    q, k, v = _rand(rng, qs, dtype), _rand(rng, ks, dtype), _rand(rng, ks, dtype)
    out = _poisoned(qs, dtype)
    o, l = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), causal=causal, layout=layout,
                             return_lse=True, num_splits=splits, out=out)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    naive = reference.attention_naive(q, k, v, causal=causal, layout=layout, dtype=dtype)
    _check(cudattn.to_host(o), cudattn.to_host(l), ref, ref_lse, naive)


@pytest.mark.parametrize("sq", [1, 2, 5, 16])
@pytest.mark.parametrize("sk", [1, 17, 1000, 4095])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_lengths(sq, sk, causal):
    decode_case(2, sq, sk, 8, 2, 128, causal=causal)


@pytest.mark.parametrize("sk", [32768, 131072])
def test_decode_long(sk):
    decode_case(1, 1, sk, 8, 1, 128)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (16, 2), (6, 3), (32, 1)])
@pytest.mark.parametrize("sq", [1, 3])
def test_gqa_packing(hq, hkv, sq):
    decode_case(2, sq, 777, hq, hkv, 64, dtype=BF16, causal=True)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16, 64])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_forced_splits(splits, dtype):
    decode_case(2, 2, 3001, 8, 2, 128, dtype=dtype, causal=True, splits=splits)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq", [8, 16])
@pytest.mark.parametrize("splits,sk", [(47, 9000), (70, 9000), (128, 9000), (128, 1500)])
def test_merge_of_many_splits(d, hq, splits, sk):
    """The last split's merge of 33 to 128 parts, each lane's LSEs held at once: one kv head, so the
    block's rows are 8 or 16 query heads, a warp's one row merged through registers and two or more
    staged through shared memory a batch at a time (24 to 64 parts, by build): counts past one batch
    and two, and at 1500 keys splits that saw no key on either side of a batch's edge."""
    decode_case(1, 1, sk, hq, 1, d, dtype=BF16, splits=splits)


@pytest.fixture
def fresh_plans(monkeypatch):
    """Calls planned afresh (no recorded call of an earlier test replayed), their plans kept here."""
    from cudattn._calls import call as _call

    monkeypatch.setattr(_decode, "_plans", {})
    monkeypatch.setattr(_call, "_plans", {})


def _plan_of_last_call(splits):
    """The memoised plan with `splits` splits (the call just made; the plans start empty)."""
    found = [p for p, _ in _decode._plans.values() if p.num_splits == splits]
    assert len(found) == 1, found
    return found[0]


def _merge_ctas_of_last_call(splits):
    return _plan_of_last_call(splits).merge_ctas


def _queued_back_to_back(ops, calls, dtype):
    """`calls` split decode calls queued on one stream without a wait, the (q, k, v, num_splits) sets
    of `ops` in turn, each into its own NaN-poisoned output; returns them on the host, and the stream."""
    from cudattn._runtime import launch as _launch

    outs = []
    for i in range(calls):
        q, k, v, n = ops[i % len(ops)]
        outs.append(cudattn.attention(q, k, v, num_splits=n, out=_poisoned(q.shape, dtype)))
    _launch.synchronize(outs[0].stream_handle)
    return [cudattn.to_host(o) for o in outs], outs[0].stream_handle


def _counters_left(stream_handle):
    """How many of the stream's arrival counters are not zero."""
    from cudattn._arrays import stream_memory as sm

    block = sm._blocks[(0, stream_handle, sm._COUNTERS)]
    return np.count_nonzero(cudattn.to_host(cudattn._arrays.array.DeviceArray(block.ptr, (block.count,), np.int32,
                                                                              device_id=0)))


@pytest.mark.parametrize("d", [40, 64, 80, 128, 256])
@pytest.mark.parametrize("hq", [2, 8, 16, 32])
@pytest.mark.parametrize("splits,sk", [(2, 3000), (3, 3000), (33, 9000), (64, 33000), (128, 9000), (128, 1500)])
def test_merge_spread_over_the_last_blocks(d, hq, splits, sk, fresh_plans):
    """A grid no larger than the SM count, and more than 32 parts or more rows than warps: the merge is
    shared by the last blocks of the block of rows to arrive, a warp a (row, 32 columns) piece, each
    waiting block merging the share its arrival gives it once the last has arrived (the last takes
    share 0). One to sixteen sharers, 2 to 128 parts, head dims whose last piece ends early (40, 80: 8
    and 16 columns), parts that saw no key (128 splits of 1500 keys), and 32 query heads: two row
    fragments a block (8 warps at head dim 128, 128 splits: 16 sharers), two one-fragment blocks of
    16 rows (head dims 40, 64 and 128 where those blocks fit one wave and a split has at most 8 key
    tiles), or two blocks of rows (head dim 256)."""
    decode_case(1, 1, sk, hq, 1, d, dtype=BF16, splits=splits)
    plan = _plan_of_last_call(splits)
    warps = plan.variant.threads // 32
    rows = min(hq, plan.variant.tiles.block_m)
    fits = plan.grid[0] * plan.grid[1] * plan.grid[2] <= _device.device_properties(0).sm_count
    spread = fits and (splits > 32 or rows > warps)  # else the last block alone (a row a warp, 32 parts or fewer)
    want = min(16, splits, -(-rows * -(-d // 32) // warps)) if spread else 1
    assert plan.merge_ctas == want, "the case is not the one described"
    props = _device.device_properties(0)
    two = _decode_traits.select_decode("bfloat16", d, props.max_shared_memory_per_block_optin, rows=hq)
    one = _decode_traits.select_decode("bfloat16", d, props.max_shared_memory_per_block_optin, rows=16)
    halved = (two.tiles.row_frags == 2 and (two.tiles.warps == 8 or two.tile_dim == 64)
              and 2 * splits <= props.sm_count and -(-sk // one.tiles.block_n) <= 8 * splits)
    if halved:  # the two-fragment build on 8 warps or at head dim 64; two blocks of 16 rows fit a wave, 8 tiles a split at most
        assert (plan.variant, plan.num_m_blocks) == (one, 2)
    else:
        assert plan.variant == two


def test_spread_merge_with_sinks_lse_and_empty_splits(fresh_plans):
    """Sinks join the spread merge once a row (the partials exclude them), the LSE is written by the
    piece holding a row's first columns, and 128 splits of 700 keys leave most splits empty."""
    rng = np.random.default_rng(next(_seed))
    q, k, v = _rand(rng, (1, 1, 16, 128), BF16), _rand(rng, (1, 700, 1, 128), BF16), _rand(rng, (1, 700, 1, 128), BF16)
    sinks = rng.uniform(-2, 6, 16).astype(np.float32)
    for splits in (5, 128):
        out = _poisoned(q.shape, BF16)
        o, l = cudattn.attention(*(cudattn.to_device(x) for x in (q, k, v)), sinks=cudattn.to_device(sinks),
                                 return_lse=True, num_splits=splits, out=out)
        assert _merge_ctas_of_last_call(splits) > 1
        ref, ref_lse = reference.attention(q, k, v, sinks=sinks, return_lse=True)
        naive = reference.attention_naive(q, k, v, sinks=sinks, dtype=BF16)
        _check(cudattn.to_host(o), cudattn.to_host(l), ref, ref_lse, naive)


def test_spread_merge_back_to_back_leaves_counters_at_zero(fresh_plans):
    """Sixty spread-merge calls queued back to back on one stream, three shapes in turn (2, 4 and 8
    sharers): each equals the first call of its shape bit for bit (a share merged twice or not at
    all, or a claim crossing into the next kernel, would move bits or leave NaN), and the stream's
    arrival counters are zero afterwards."""
    cudattn.empty_cache()
    rng = np.random.default_rng(next(_seed))
    shapes = [((1, 1, 4, 128), (1, 12000, 1, 128), 36), ((1, 1, 8, 64), (1, 20000, 1, 64), 40),
              ((1, 1, 16, 128), (1, 33000, 1, 128), 64)]
    ops = [tuple(cudattn.to_device(_rand(rng, s, BF16)) for s in (qs, ks, ks)) + (n,) for qs, ks, n in shapes]
    got, stream = _queued_back_to_back(ops, 60, BF16)
    assert sorted(_merge_ctas_of_last_call(n) for *_, n in ops) == [2, 4, 8]
    for i, o in enumerate(got):
        assert not np.isnan(o.astype(np.float32)).any(), f"call {i}: outputs left unwritten"
        assert o.tobytes() == got[i % 3].tobytes(), f"call {i}: differs from the first call of its shape"
    for q, k, v, n in ops:
        host = [cudattn.to_host(x) for x in (q, k, v)]
        _check(cudattn.to_host(cudattn.attention(q, k, v, num_splits=n)), None, reference.attention(*host), None,
               reference.attention_naive(*host, dtype=BF16))
    assert not _counters_left(stream), "arrival counters left non-zero"


def test_spread_merge_shares_given_up_go_to_the_last(fresh_plans, monkeypatch):
    """The decode builds compiled with no wait (CUDATTN_SPREAD_WAIT_NS=0): a block waiting for the last
    gives its share up unless the last has arrived by its first look, and the last merges every share
    given up (read from its own arrival). Results within the rule, calls of a shape bit-identical to
    each other (the shares' sums are the same whoever merges them), counters zero afterwards."""
    from cudattn._kernels import registry

    plain = registry.options_for
    monkeypatch.setattr(registry, "options_for", lambda v: plain(v) + (
        ["-DCUDATTN_SPREAD_WAIT_NS=0"] if v.source == "flash_decode.cu" else []))
    monkeypatch.setattr(registry, "_loaded", {})
    rng = np.random.default_rng(next(_seed))
    for qs, ks, n in (((1, 1, 16, 128), (1, 33000, 1, 128), 64), ((1, 1, 8, 64), (1, 9000, 1, 64), 33)):
        q, k, v = (_rand(rng, s, BF16) for s in (qs, ks, ks))
        got, stream = _queued_back_to_back([tuple(cudattn.to_device(x) for x in (q, k, v)) + (n,)], 20, BF16)
        assert _merge_ctas_of_last_call(n) > 1
        assert all(o.tobytes() == got[0].tobytes() for o in got), "results moved between calls"
        _check(got[0], None, reference.attention(q, k, v), None, reference.attention_naive(q, k, v, dtype=BF16))
    assert not _counters_left(stream), "arrival counters left non-zero"


@pytest.mark.parametrize("hq,d,sk,splits", [(32, 128, 3000, 2), (16, 128, 3000, 3), (16, 64, 2500, 2),
                                             (32, 80, 3000, 4), (32, 128, 9000, 8), (16, 64, 200, 4)])
def test_spread_merge_pieces_together_give_the_pieces_bits(hq, d, sk, splits, fresh_plans, monkeypatch):
    """Where a warp has two or more pieces of the spread merge and few parts, it merges up to four of
    them together (their loads all in flight at once); built with that off (CUDATTN_MERGE_BATCH=0),
    a piece at a time: the outputs and LSEs are the same bits both ways, within the rule, with sinks,
    a head dim whose last piece ends early (80), a part count that is not a power of two (3), the
    most parts a batch takes (8) and splits that see no key (200 keys in two tiles over 4 splits)."""
    from cudattn._calls import call as _call
    from cudattn._kernels import registry

    rng = np.random.default_rng(next(_seed))
    q = _rand(rng, (1, 1, hq, d), BF16)
    k, v = (_rand(rng, (1, sk, 1, d), BF16) for _ in range(2))
    sinks = rng.uniform(-2, 6, hq).astype(np.float32)
    dev = [cudattn.to_device(x) for x in (q, k, v)]
    plain = registry.options_for
    got = []
    for batch in (1, 0):
        monkeypatch.setattr(registry, "options_for", lambda var, b=batch: plain(var) + (
            [f"-DCUDATTN_MERGE_BATCH={b}"] if var.source == "flash_decode.cu" else []))
        monkeypatch.setattr(registry, "_loaded", {})
        _decode._plans.clear()  # (the memo holds the loaded kernel; the recorded calls too)
        _call._plans.clear()
        o, lse = cudattn.attention(*dev, sinks=cudattn.to_device(sinks), return_lse=True, num_splits=splits,
                                   out=_poisoned(q.shape, BF16))
        plan = _plan_of_last_call(splits)
        pieces = min(hq, plan.variant.tiles.block_m) * -(-d // 32)
        assert plan.merge_ctas * plan.variant.threads // 32 < pieces, "no warp has two pieces"
        got.append((cudattn.to_host(o), cudattn.to_host(lse)))
    assert got[0][0].tobytes() == got[1][0].tobytes() and got[0][1].tobytes() == got[1][1].tobytes()
    ref, ref_lse = reference.attention(q, k, v, sinks=sinks, return_lse=True)
    _check(got[0][0], got[0][1], ref, ref_lse, reference.attention_naive(q, k, v, sinks=sinks, dtype=BF16))


def test_splits_beyond_keys_give_empty_splits():
    """64 splits of 17 keys: most splits see no key (LSE -inf) and the combine must skip them."""
    decode_case(3, 1, 17, 4, 4, 64, splits=64)


@pytest.mark.parametrize("d", [8, 32, 40, 64, 96, 128, 136, 192, 256])
def test_decode_head_dims(d):
    decode_case(2, 3, 555, 4, 2, d, dtype=BF16, causal=True, splits=3)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_decode_layouts(layout):
    decode_case(2, 4, 999, 8, 2, 128, layout=layout, splits=5)


def test_prefill_shapes_through_forced_splits():
    """num_splits forces the split-KV kernel for any Sq (many packed row blocks)."""
    decode_case(1, 77, 300, 4, 2, 64, causal=True, splits=4)


def test_causal_more_queries_than_keys():
    decode_case(2, 12, 5, 4, 1, 64, causal=True)


def test_split_results_are_bit_identical_across_runs():
    rng = np.random.default_rng(11)
    q, k, v = (cudattn.to_device(_rand(rng, s, F16)) for s in ((2, 1, 32, 128), (2, 20000, 8, 128),
                                                               (2, 20000, 8, 128)))
    first = None
    for _ in range(4):
        o, l = cudattn.attention(q, k, v, return_lse=True, num_splits=24)
        got = (cudattn.to_host(o).tobytes(), cudattn.to_host(l).tobytes())
        assert first is None or got == first, "split-KV results moved between runs"
        first = got


def test_last_split_merges_every_block_of_rows_back_to_back():
    """The decode kernel's last split of each block of rows merges the partials (arrival counters).
    Fifty calls queued back to back on one stream, alternating two shapes whose counter counts
    differ (the stream's counters are reused, and grown once), each into its own NaN-poisoned
    output, all equal the first call of their shape bit for bit; a miscounted arrival (a merge
    before every split has written, or none) would leave NaN or move bits. The counters are zero
    again afterwards. The warm calls' partials share the stream's kept workspace."""
    from cudattn._arrays import stream_memory as sm

    cudattn.empty_cache()  # earlier tests' kept blocks and spent workspace budget go
    rng = np.random.default_rng(next(_seed))
    shapes = [((3, 1, 16, 128), (3, 3000, 4, 128), 24), ((64, 2, 8, 64), (64, 700, 8, 64), 5)]
    ops = [tuple(cudattn.to_device(_rand(rng, s, F16)) for s in (qs, ks, ks)) + (n,) for qs, ks, n in shapes]
    got, stream = _queued_back_to_back(ops, 50, F16)
    for i, o in enumerate(got):
        assert not np.isnan(o.astype(np.float32)).any(), f"call {i}: outputs left unwritten (no merge)"
        assert o.tobytes() == got[i % 2].tobytes(), f"call {i}: differs from the first call of its shape"
    q, k, v, n = ops[0]
    ref = reference.attention(*(cudattn.to_host(x) for x in (q, k, v)))
    naive = reference.attention_naive(*(cudattn.to_host(x) for x in (q, k, v)), dtype=F16)
    _check(got[0], None, ref, None, naive)
    assert (0, stream, sm._WORKSPACE) in sm._blocks, "the warm calls did not keep a workspace"
    assert not _counters_left(stream), "arrival counters left non-zero"


@pytest.mark.parametrize("hq,hkv,batch", [(16, 2, 2), (16, 1, 1)])
def test_last_split_merge_on_concurrent_streams(hq, hkv, batch, fresh_plans):
    """Split decode calls on four streams at once (each stream its own counters): every result
    matches the same call made alone. With one kv head, two rows a warp: the merge spread over the
    last blocks to arrive, four such kernels sharing the SMs."""
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    rng = np.random.default_rng(next(_seed))
    q, k, v = (cudattn.to_device(_rand(rng, s, BF16)) for s in ((batch, 1, hq, 128), (batch, 6000, hkv, 128),
                                                                (batch, 6000, hkv, 128)))
    alone = cudattn.to_host(cudattn.attention(q, k, v, num_splits=32))
    assert _merge_ctas_of_last_call(32) == (8 if hkv == 1 else 1)
    streams = [dev.create_stream() for _ in range(4)]
    outs = [[cudattn.attention(q, k, v, num_splits=32, stream=s) for _ in range(10)] for s in streams]
    for s, row in zip(streams, outs):
        s.sync()
        for o in row:
            assert cudattn.to_host(o).tobytes() == alone.tobytes(), "a concurrent split decode differs"


def test_split_decode_from_threads_on_the_per_thread_stream():
    """Threads call split decode on the per-thread default stream (handle 2: a different stream in
    each thread, so their kernels run at once). Memory a stream keeps between calls would be shared
    by those kernels under the one handle: each call has its own there. Every result equals the
    same call made alone."""
    import threading

    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    rng = np.random.default_rng(next(_seed))
    cases = [tuple(cudattn.to_device(_rand(rng, s, F16)) for s in ((2, 1, 8, 64), (2, 3000, 2, 64), (2, 3000, 2, 64)))
             for _ in range(4)]
    alone = [cudattn.to_host(cudattn.attention(*c, num_splits=12)) for c in cases]
    got: dict = {}

    def work(i):
        dev.set_current()
        outs = [cudattn.attention(*cases[i], num_splits=12, stream=2) for _ in range(20)]
        cudattn._runtime.launch.synchronize(2)
        got[i] = [cudattn.to_host(o) for o in outs]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for o in got[i]:
            assert o.tobytes() == alone[i].tobytes(), f"thread {i}: a split decode on the per-thread stream differs"


def test_split_decode_on_a_stream_destroyed_afterwards():
    """A split decode on a stream named by a bare handle, whose owner then destroys it: the stream's
    arrival counters are not freed on it (a free queued on a destroyed stream crashed the process
    in empty_cache), empty_cache works, and a new stream gets correct results."""
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    rng = np.random.default_rng(next(_seed))
    q, k, v = (cudattn.to_device(_rand(rng, s, F16)) for s in ((2, 1, 8, 64), (2, 3000, 2, 64), (2, 3000, 2, 64)))
    want = cudattn.to_host(cudattn.attention(q, k, v, num_splits=12))
    for _ in range(2):
        s = dev.create_stream()
        got = cudattn.attention(q, k, v, num_splits=12, stream=int(s.handle))
        s.sync()
        assert cudattn.to_host(got).tobytes() == want.tobytes()
        del got
        s.close()
        cudattn.empty_cache()


def test_heuristic_splits():
    from cudattn._runtime import device as _device

    props = _device.device_properties(0)
    q = cudattn.to_device(np.zeros((1, 1, 32, 128), F16))
    problem = cudattn._spec.validate.validate(q, cudattn.to_device(np.zeros((1, 131072, 8, 128), F16)),
                                         cudattn.to_device(np.zeros((1, 131072, 8, 128), F16)))
    plan, _ = _decode.make_plan(problem, props, cudattn._runtime.device.get_device(0))
    assert plan.num_splits > 8, "one long sequence on 8 kv heads must be split to fill the GPU"
    big = cudattn._spec.validate.validate(cudattn.to_device(np.zeros((64, 1, 32, 128), F16)),
                                     cudattn.to_device(np.zeros((64, 2048, 32, 128), F16)),
                                     cudattn.to_device(np.zeros((64, 2048, 32, 128), F16)))
    assert _decode.make_plan(big, props, cudattn._runtime.device.get_device(0))[0].num_splits == 1


# ---------------------------------------------------------------------- KV caches


def _paged(k, v, page_size, rng, extra_pages=3):
    """Scatter contiguous (B, cap, H, D) caches into shuffled pages; return (kp, vp, table)."""
    B, cap, H, D = k.shape
    per = -(-cap // page_size)
    n = B * per + extra_pages
    order = rng.permutation(n)[: B * per].reshape(B, per).astype(np.int32)
    kp = _rand(rng, (n, page_size, H, D), k.dtype)  # unused pages hold random data, never zeros
    vp = _rand(rng, (n, page_size, H, D), k.dtype)
    for b in range(B):
        for i in range(per):
            rows = slice(i * page_size, min(cap, (i + 1) * page_size))
            kp[order[b, i], : rows.stop - rows.start] = k[b, rows]
            vp[order[b, i], : rows.stop - rows.start] = v[b, rows]
    return kp, vp, order


def kvcache_case(B, Sq, cap, Hq, Hkv, D, seqlens, *, page_size=None, s_new=0, causal=True, splits=None,
                 dtype=F16, host=False, table_on_device=True):
    rng = np.random.default_rng(next(_seed))
    q = _rand(rng, (B, Sq, Hq, D), dtype)
    k, v = _rand(rng, (B, cap, Hkv, D), dtype), _rand(rng, (B, cap, Hkv, D), dtype)
    table = None
    if page_size:
        k, v, table = _paged(k, v, page_size, rng)
    sl = np.asarray(seqlens, np.int32)
    kn = vn = None
    if s_new:
        kn, vn = _rand(rng, (B, s_new, Hkv, D), dtype), _rand(rng, (B, s_new, Hkv, D), dtype)
    kw = dict(cache_seqlens=sl, block_table=table, k_new=kn, v_new=vn, causal=causal)
    ref, ref_lse = reference.attention_with_kvcache(q, k, v, **kw, return_lse=True)
    naive = reference.attention_with_kvcache_naive(q, k, v, **kw)
    k_after, v_after = reference.kvcache_append(k, v, kn, vn, sl, table) if s_new else (k, v)
    if host:
        o, l = cudattn.attention_with_kvcache(q, k, v, **kw, return_lse=True, num_splits=splits)
        k_got, v_got = k, v  # updated in place
    else:
        dev = cudattn.to_device
        kd, vd = dev(k), dev(v)
        if table_on_device:
            kw.update(cache_seqlens=dev(sl), block_table=None if table is None else dev(table))
        kw.update(k_new=None if kn is None else dev(kn), v_new=None if vn is None else dev(vn))
        o, l = cudattn.attention_with_kvcache(dev(q), kd, vd, **kw, return_lse=True, num_splits=splits)
        o, l = cudattn.to_host(o), cudattn.to_host(l)
        k_got, v_got = cudattn.to_host(kd), cudattn.to_host(vd)
    _check(o, l, ref, ref_lse, naive)
    assert np.array_equal(k_got.view(np.uint16), k_after.view(np.uint16)), "k cache not updated as expected"
    assert np.array_equal(v_got.view(np.uint16), v_after.view(np.uint16)), "v cache not updated as expected"


@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("splits", [None, 1, 8])
def test_kvcache_variable_lengths(sq, splits):
    kvcache_case(5, sq, 1500, 8, 2, 128, [0, 1, 1500, 777, 33], splits=splits)


@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (16, 2)])
def test_kvcache_paged(page_size, hq, hkv):
    kvcache_case(3, 1, 1000, hq, hkv, 128, [1000, 0, 517], page_size=page_size, splits=None)


@pytest.mark.parametrize("page_size", [None, 32])
@pytest.mark.parametrize("host", [False, True])
def test_kvcache_append(page_size, host):
    kvcache_case(3, 2, 600, 8, 2, 64, [0, 300, 598], page_size=page_size, s_new=2, host=host, dtype=BF16,
                 splits=3)


def test_kvcache_append_across_pages_numpy_table_on_device_path():
    kvcache_case(2, 5, 512, 4, 1, 128, [30, 250], page_size=16, s_new=5, table_on_device=False)


def test_kvcache_full_and_default_lengths():
    rng = np.random.default_rng(3)
    q = _rand(rng, (2, 1, 4, 64), F16)
    k, v = _rand(rng, (2, 300, 2, 64), F16), _rand(rng, (2, 300, 2, 64), F16)
    o = cudattn.attention_with_kvcache(q, k, v)  # cache_seqlens None: every key
    ref = reference.attention(q, k, v)
    ok, err, bound = reference.check_close(o.astype(np.float64), ref, reference.attention_naive(q, k, v, dtype=F16))
    assert ok, (err, bound)


def test_kvcache_long_paged():
    kvcache_case(1, 1, 32768, 8, 1, 128, [32768], page_size=256, causal=False)


# ---------------------------------------------------------------------- merge on device


@pytest.mark.parametrize("n,D", [(1, 64), (2, 64), (3, 64), (20, 64), (45, 200), (70, 96)])
@pytest.mark.parametrize("stacked", [False, True])
def test_merge_on_device_matches_host(n, D, stacked):
    """Parts in chunks of 32 (45, 70), head dims over two column chunks (200); empty parts with NaN
    outputs in the first and a later chunk."""
    rng = np.random.default_rng(n)
    outs = _rand(rng, (n, 2, 3, 4, D), np.float32)
    lses = rng.standard_normal((n, 2, 4, 3)).astype(np.float32)
    for i in {0, n - 1, 40} & set(range(n)):
        lses[i, 0, 0, 0] = -np.inf
        outs[i, 0, 0, 0] = np.nan  # a part that saw no key: its output must not matter
    if n > 1:
        lses[:, 1, 1, 1] = -np.inf  # a row no part saw
    want_o, want_l = reference.merge_attention_states(list(outs), list(lses))
    if stacked:
        do, dl = cudattn.to_device(outs), cudattn.to_device(lses)
    elif n > 16:
        pytest.skip("more than 16 separate device parts must be stacked (tested below)")
    else:
        do, dl = [cudattn.to_device(x) for x in outs], [cudattn.to_device(x) for x in lses]
    o, l = cudattn.merge_attention_states(do, dl)
    o, l = cudattn.to_host(o), cudattn.to_host(l)
    assert not np.isnan(o).any()
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isneginf(l), np.isneginf(want_l))
    fin = np.isfinite(want_l)
    np.testing.assert_allclose(l[fin], want_l[fin], rtol=1e-5, atol=1e-5)


def test_merge_of_separate_parts_wherever_they_lie():
    """Warm calls of one signature replay the first call's launch: parts allocated in another order
    or with other arrays between them (a different distance apart, or the second before the first)
    must still be read where they are."""
    rng = np.random.default_rng(77)
    outs = _rand(rng, (3, 2, 5, 4, 64), np.float32)
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    want_o, want_l = reference.merge_attention_states(list(outs), list(lses))
    spacers = []
    for order, gap in (((0, 1, 2), 0), ((2, 1, 0), 0), ((1, 0, 2), 3), ((0, 2, 1), 1), ((0, 1, 2), 2)):
        do, dl = [None] * 3, [None] * 3
        for i in order:
            do[i], dl[i] = cudattn.to_device(outs[i]), cudattn.to_device(lses[i])
            spacers += [cudattn.to_device(np.ones(1000 * (gap + i), np.float32)) for _ in range(gap)]
        o, l = cudattn.merge_attention_states(do, dl)
        np.testing.assert_allclose(cudattn.to_host(o), want_o, rtol=1e-5, atol=1e-5, err_msg=f"order {order}")
        np.testing.assert_allclose(cudattn.to_host(l), want_l, rtol=1e-5, atol=1e-5, err_msg=f"order {order}")


def test_merge_of_many_views_and_of_mixed_kinds_on_warm_calls():
    """More separate parts than the kernel's pointer table (17 views of one stacked array, read by
    their spacing on the full path every call), and stacked outs with a list of LSEs, each merged
    twice from arrays at new addresses."""
    rng = np.random.default_rng(78)
    for n, mixed in ((17, False), (3, True)):
        outs = _rand(rng, (n, 1, 4, 2, 64), np.float32)
        lses = rng.standard_normal((n, 1, 2, 4)).astype(np.float32)
        want_o, want_l = reference.merge_attention_states(list(outs), list(lses))
        keep = []
        for rnd in range(2):
            keep.append(cudattn.to_device(np.ones(999 * (rnd + 1), np.float32)))  # move the next arrays
            do, dl = cudattn.to_device(outs), cudattn.to_device(lses)
            o, l = cudattn.merge_attention_states(do if mixed else [do[i] for i in range(n)],
                                                  [dl[i] for i in range(n)])
            np.testing.assert_allclose(cudattn.to_host(o), want_o, rtol=1e-5, atol=1e-5, err_msg=f"{n}, {rnd}")
            np.testing.assert_allclose(cudattn.to_host(l), want_l, rtol=1e-5, atol=1e-5, err_msg=f"{n}, {rnd}")


def test_merge_on_device_refuses_head_dims_it_cannot_move():
    for D in (6, 264):
        outs = cudattn.to_device(np.ones((2, 1, 1, 2, D), np.float32))
        lses = cudattn.to_device(np.zeros((2, 1, 2, 1), np.float32))
        with pytest.raises(ValueError, match="multiple of 4 up to 256"):
            cudattn.merge_attention_states(outs, lses)


def test_merge_of_split_attention_equals_whole():
    """Attention over keys [0, a) and [a, S) merged equals attention over [0, S) (fp16 parts)."""
    rng = np.random.default_rng(9)
    q = _rand(rng, (2, 3, 4, 128), F16)
    k, v = _rand(rng, (2, 1000, 2, 128), F16), _rand(rng, (2, 1000, 2, 128), F16)
    dev = cudattn.to_device
    parts = [cudattn.attention(dev(q), dev(k[:, a:b].copy()), dev(v[:, a:b].copy()), return_lse=True)
             for a, b in ((0, 300), (300, 1000))]
    o, l = cudattn.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    ref, ref_lse = reference.attention(q, k, v, return_lse=True)
    naive = reference.attention_naive(q, k, v, dtype=F16)
    # two roundings to fp16 (the parts, then the merge): allow the naive error twice over
    ok, err, bound = reference.check_close(cudattn.to_host(o).astype(np.float64), ref, naive)
    assert err <= 2 * bound, (err, bound)
    np.testing.assert_allclose(cudattn.to_host(l), ref_lse, rtol=1e-4, atol=1e-4)
