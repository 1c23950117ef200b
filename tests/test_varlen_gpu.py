"""GPU: packed variable-length batches (``cu_seqlens``) against the float64 reference.

FlashAttention's varlen grid: random lengths per sequence, including 0, 1 and lengths that cross
tile edges; MHA, GQA and MQA; causal and not; head dims 64 to 256; float16, bfloat16 and FP8
with (B, Hkv) descales; both kernel families on Hopper (the portable one forced). Outputs are
poisoned with NaN before each launch and compared under DESIGN §6's rule (2 x the naive
input-dtype error, per sequence, + 1e-5); LSE is (Hq, total_q). Each sequence is also compared
bit for bit with a call on that sequence alone where both calls pick the same kernel.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._runtime import device as _device
from cudattn._kernels import traits as _traits
from _tile_order import counters_taken, fixed_rounds, stream_counters_read_zero

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
_seed = itertools.count(9100)


def _offsets(lens) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _inputs(rng, lens_q, lens_k, Hq, Hkv, D, dtype):
    cq, ck = _offsets(lens_q), _offsets(lens_k)
    q = rng.standard_normal((int(cq[-1]), Hq, D)).astype(dtype)
    k = rng.standard_normal((int(ck[-1]), Hkv, D)).astype(dtype)
    v = rng.standard_normal((int(ck[-1]), Hkv, D)).astype(dtype)
    return q, k, v, cq, ck


def _naive(q, k, v, cq, ck, causal):
    """attention_naive (the input dtype's arithmetic) per sequence, packed like the output."""
    out = np.zeros(q.shape, np.float64)
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if cq[b + 1] == cq[b] or ck[b + 1] == ck[b]:
            continue
        out[qs] = reference.attention_naive(q[None, qs], k[None, ks], v[None, ks], causal=causal)[0]
    return out


def _run(q, k, v, cq, ck, *, causal, host=False, device_offsets=True, **kw):
    """cudattn.attention on the packed inputs into a NaN-poisoned out; (out, lse) as NumPy."""
    mq = int(np.diff(cq).max()) if len(cq) > 1 else 0
    mk = int(np.diff(ck).max()) if len(ck) > 1 else 0
    odt = kw.get("out_dtype") or (BF16 if q.dtype == FP8 else q.dtype)
    if host:
        out = np.full(q.shape, np.nan, odt)
        o, lse = cudattn.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk,
                                   causal=causal, return_lse=True, out=out, **kw)
        assert o is out
        return o, lse
    out = cudattn._arrays.array.empty(q.shape, odt, device=None, stream=None)
    out.fill_nan()
    dq, dk, dv = (cudattn.to_device(x) for x in (q, k, v))
    offs = (cudattn.to_device(cq), cudattn.to_device(ck)) if device_offsets else (cq, ck)
    kw = {n: cudattn.to_device(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    o, lse = cudattn.attention(dq, dk, dv, cu_seqlens_q=offs[0], cu_seqlens_k=offs[1], max_seqlen_q=mq,
                               max_seqlen_k=mk, causal=causal, return_lse=True, out=out, **kw)
    assert o.ptr == out.ptr
    return cudattn.to_host(o), cudattn.to_host(lse)


def _check(q, k, v, cq, ck, causal, o, lse):
    ref, ref_lse = reference.attention_varlen(q, k, v, cq, ck, causal=causal, return_lse=True)
    assert o.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    ok, err, bound = reference.check_close(o, ref, _naive(q, k, v, cq, ck, causal))
    assert ok, f"out: max err {err:.3g} > bound {bound:.3g}"
    ok, err, bound = reference.check_close(lse, ref_lse, ref_lse.astype(np.float32), atol=1e-4 * max(
        1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max(initial=0))))
    assert ok, f"lse: max err {err:.3g} > bound {bound:.3g}"


# Lengths that cross the tiles' edges (64, 128, 192 rows; 64..192 keys), with 0 and 1.
_LENGTHS = [
    ([1, 0, 65, 128, 7, 200], [1, 3, 65, 129, 0, 200]),
    ([127, 1, 300, 64, 0, 5, 191], [128, 513, 300, 63, 9, 0, 193]),
]


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128, 256, 72])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_grid(kernel_family, dtype, D, heads, causal):
    rng = np.random.default_rng(next(_seed))
    lens_q, lens_k = _LENGTHS[(D // 8 + heads[1]) % 2]
    q, k, v, cq, ck = _inputs(rng, lens_q, lens_k, *heads, D, dtype)
    o, lse = _run(q, k, v, cq, ck, causal=causal)
    _check(q, k, v, cq, ck, causal, o, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_each_sequence_equals_its_own_call(kernel_family, causal, D):
    """Bit for bit: sequence b of the packed call is the call on sequence b alone (same kernel:
    lengths below the short-causal rule's bound, so both calls pick the same tiles)."""
    rng = np.random.default_rng(next(_seed))
    lens_q, lens_k = [33, 200, 1, 129, 77], [40, 200, 5, 300, 77]
    q, k, v, cq, ck = _inputs(rng, lens_q, lens_k, 8, 2, D, np.float16)
    o, lse = _run(q, k, v, cq, ck, causal=causal)
    for b in range(len(lens_q)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ob, lb = cudattn.attention(q[None, qs], k[None, ks], v[None, ks], causal=causal, return_lse=True)
        np.testing.assert_array_equal(o[qs], ob[0], err_msg=f"sequence {b}")
        np.testing.assert_array_equal(lse[:, qs], lb[0], err_msg=f"sequence {b} lse")


def test_random_lengths_many_sequences(kernel_family):
    """40 sequences of random lengths (a third of them 0 or 1), GQA, causal and not, bf16. The seed is
    fixed: drawn from the module's counter, the lengths depended on which tests a worker ran first."""
    _random_lengths(9100)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(9100, 9206))
def test_random_lengths_seed_sweep(kernel_family, seed):
    """The same over every seed the module's counter could once have given it (9100, plus the
    draws of the tests before it, at most 105): a parallel GPU run failed it once, its seed unknown
    (most likely a timeout: every worker's BLAS then ran a thread a core, conftest.py)."""
    _random_lengths(seed)


def _random_lengths(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lens_q = rng.integers(0, 400, 40)
    lens_k = lens_q + rng.integers(0, 300, 40)
    lens_q[rng.random(40) < 0.2] = 0
    lens_q[rng.random(40) < 0.15] = 1
    lens_k[rng.random(40) < 0.1] = 0
    q, k, v, cq, ck = _inputs(rng, lens_q, lens_k, 8, 2, 128, BF16)
    for causal in (False, True):
        o, lse = _run(q, k, v, cq, ck, causal=causal)
        _check(q, k, v, cq, ck, causal, o, lse)


def test_numpy_path_and_host_offsets(kernel_family):
    rng = np.random.default_rng(next(_seed))
    q, k, v, cq, ck = _inputs(rng, [5, 0, 130, 64], [9, 4, 130, 1], 4, 2, 64, np.float16)
    o, lse = _run(q, k, v, cq, ck, causal=True, host=True)
    assert type(o) is np.ndarray
    _check(q, k, v, cq, ck, True, o, lse)
    o2, lse2 = _run(q, k, v, cq, ck, causal=True, device_offsets=False)  # device tensors, NumPy offsets
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


def test_neighbours_nan_does_not_leak(kernel_family):
    """A NaN in the next sequence's first key and value (and in a cache slot past a sequence's
    end) must not reach a sequence whose last key tile overlaps those rows: TMA loads whole
    tiles, so the kernel zeroes V rows past the sequence's end."""
    rng = np.random.default_rng(next(_seed))
    q, k, v, cq, ck = _inputs(rng, [70, 50], [70, 50], 4, 4, 128, np.float16)
    k[70], v[70] = np.nan, np.nan  # sequence 1's first key: every query of sequence 1 sees it
    o, _ = _run(q, k, v, cq, ck, causal=False)
    assert np.isfinite(o[:70]).all(), "sequence 0 read sequence 1's NaN"
    assert np.isnan(o[70:]).all()


@pytest.mark.parametrize("mods", [False, True], ids=["plain", "modifiers"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_varlen_fp8(kernel_family, causal, D, mods):
    """FP8 with (B, Hkv) descale arrays: packed Vt segments (zeros between sequences) and the
    per-sequence descales, against the emulation of the kernels' FP8 arithmetic per sequence;
    with ``mods``, a window, a softcap, (B, Hq) ALiBi slopes and sinks too."""
    if _device.device_properties(0).arch not in _traits.FP8_ARCHS:
        pytest.skip("FP8 needs sm_89+")
    rng = np.random.default_rng(next(_seed))
    lens_q, lens_k = [1, 130, 0, 257, 64], [200, 130, 5, 257, 1]
    B, Hq, Hkv = len(lens_q), 4, 2
    x, y, z, cq, ck = _inputs(rng, lens_q, lens_k, Hq, Hkv, D, np.float32)
    descs = [np.exp(rng.uniform(-2, 2, (B, Hkv))).astype(np.float32) for _ in range(3)]
    # quantise per sequence and kv head: x / descale, as cudattn.quantize_fp8 would
    q8, k8, v8 = (np.empty(a.shape, FP8) for a in (x, y, z))
    g = Hq // Hkv
    for b in range(B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        for h in range(Hq):
            q8[qs, h] = np.clip(x[qs, h] / descs[0][b, h // g], -448, 448).astype(FP8)
        for h in range(Hkv):
            k8[ks, h] = np.clip(y[ks, h] / descs[1][b, h], -448, 448).astype(FP8)
            v8[ks, h] = np.clip(z[ks, h] / descs[2][b, h], -448, 448).astype(FP8)
    kw = dict(q_descale=descs[0], k_descale=descs[1], v_descale=descs[2])
    mkw, bits = {}, 0
    if mods:
        from cudattn._spec import modifiers as _modifiers

        mkw = dict(window_size=(60, 7), softcap=4.0, alibi_slopes=(rng.random((B, Hq)) * 0.2).astype(np.float32),
                   sinks=rng.standard_normal(Hq).astype(np.float32))
        bits = _modifiers.MOD_WINDOW | _modifiers.MOD_SOFTCAP | _modifiers.MOD_ALIBI
    o, lse = _run(q8, k8, v8, cq, ck, causal=causal, **kw, **mkw)
    assert np.isfinite(o).all()
    ref, ref_lse = reference.attention_varlen(q8, k8, v8, cq, ck, causal=causal, return_lse=True, **kw, **mkw)
    bn = _traits.key_tile(_traits.FP8, D, causal, _device.device_properties(0), None, bits)
    for b in range(B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:
            assert np.all(o[qs] == 0)
            continue
        sub = {n: d[b:b + 1] for n, d in kw.items()}
        if mods:
            sub.update(mkw, alibi_slopes=mkw["alibi_slopes"][b:b + 1])
        emul = reference.attention_fp8_emulated(q8[None, qs], k8[None, ks], v8[None, ks], causal=causal,
                                                block_n=bn, **sub)[0]
        ok, stats = reference.check_close_fp8(o[qs], ref[qs], emul)
        assert ok, f"sequence {b}: {stats}"
        fin = np.isfinite(ref_lse[:, qs])
        np.testing.assert_allclose(lse[:, qs][fin], ref_lse[:, qs][fin], rtol=1e-2, atol=1e-2)


def test_zero_total_and_no_keys():
    """No query rows: empty results. No keys at all: O = 0, LSE = -inf, no kernel."""
    rng = np.random.default_rng(next(_seed))
    q, k, v, cq, ck = _inputs(rng, [0, 0], [3, 0], 2, 2, 64, np.float16)
    o, lse = _run(q, k, v, cq, ck, causal=False)
    assert o.shape == (0, 2, 64) and lse.shape == (2, 0)
    q, k, v, cq, ck = _inputs(rng, [3, 2], [0, 0], 2, 2, 64, np.float16)
    o, lse = _run(q, k, v, cq, ck, causal=True)
    assert np.all(o == 0) and np.all(lse == -np.inf)


def test_warm_calls_replay_with_new_offsets():
    """The second call of a signature replays; new offsets (other device arrays, other values
    of the same totals) give the new sequences' results."""
    rng = np.random.default_rng(next(_seed))
    q, k, v, cq, ck = _inputs(rng, [100, 28], [100, 28], 4, 4, 64, np.float16)
    dq, dk, dv = (cudattn.to_device(x) for x in (q, k, v))
    for lens in ([100, 28], [28, 100], [64, 64], [128, 0]):
        c = _offsets(lens)
        o, lse = cudattn.attention(dq, dk, dv, cu_seqlens_q=cudattn.to_device(c), cu_seqlens_k=cudattn.to_device(c),
                                   max_seqlen_q=128, max_seqlen_k=128, return_lse=True)
        _check(q, k, v, c, c, False, cudattn.to_host(o), cudattn.to_host(lse))


def test_no_keys_into_a_strided_out():
    """total_k == 0 writes O = 0 through a strided out= (no kernel), LSE -inf."""
    q = np.random.default_rng(3).standard_normal((5, 2, 64)).astype(np.float16)
    k = np.zeros((0, 2, 64), np.float16)
    big = cudattn._arrays.array.empty((5, 4, 64), np.float16, device=None, stream=None)
    big.fill_nan()
    out = big[:, :2, :]
    c0, c1 = np.array([0, 2, 5], np.int32), np.array([0, 0, 0], np.int32)
    o, lse = cudattn.attention(cudattn.to_device(q), cudattn.to_device(k), cudattn.to_device(k),
                               cu_seqlens_q=cudattn.to_device(c0), cu_seqlens_k=cudattn.to_device(c1),
                               max_seqlen_q=3, max_seqlen_k=0, out=out, return_lse=True)
    assert np.all(cudattn.to_host(o) == 0) and np.all(cudattn.to_host(lse) == -np.inf)
    assert np.isnan(cudattn.to_host(big)[:, 2:]).all(), "wrote outside out"


def test_device_offsets_with_no_sequence():
    """Device offsets of one entry (no sequence) with rows in q: O = 0, LSE = -inf, no kernel."""
    q = np.ones((4, 2, 64), np.float16)
    c = cudattn.to_device(np.array([0], np.int32))
    o, lse = cudattn.attention(*(cudattn.to_device(x) for x in (q, q, q)), cu_seqlens_q=c, cu_seqlens_k=c,
                               max_seqlen_q=4, max_seqlen_k=4, return_lse=True)
    assert np.all(cudattn.to_host(o) == 0) and np.all(cudattn.to_host(lse) == -np.inf)


@pytest.mark.parametrize("D", [64, 128])
def test_packed_tiles_from_the_counter_equal_the_fixed_rounds(monkeypatch, kernel_family, D):
    """Packed batches take their Hopper tiles from the stream's counter (mixed lengths: tiles past
    a shorter sequence's end are skipped, and whole consumers past a sequence's end skip theirs).
    Calls back to back, each into a poisoned out, give the fixed rounds' result bit for bit, and
    that result passes the reference."""
    taken = counters_taken(monkeypatch, kernel_family)
    rng = np.random.default_rng(next(_seed))
    lens = [1, 1000, 300, 77, 2049, 640, 129, 1500]  # over twice the SMs' tiles at 8 heads
    q, k, v, cq, ck = _inputs(rng, lens, lens, 8, 2, D, BF16)
    dynamic = [_run(q, k, v, cq, ck, causal=False) for _ in range(3)]
    assert taken and all(taken), "the calls took no tile counters"
    assert stream_counters_read_zero() >= 1

    fixed_rounds(monkeypatch)
    o, lse = _run(q, k, v, cq, ck, causal=False)
    for do, dl in dynamic:
        assert np.array_equal(do.view(np.uint16), o.view(np.uint16)) and np.array_equal(dl, lse)
    _check(q, k, v, cq, ck, False, o, lse)
