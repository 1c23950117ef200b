"""GPU (tests marked ``gpu``): the NumPy (host) path against the device-array path bit for bit
and against the float64 reference under FlashAttention's rule (``reference.check_close``):
pipelined and small calls, the staging pool, callers' streams, threads and pinned arrays.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._runtime import stream as _stream
from cudattn._numpy import attention as _host
from cudattn._arrays import pinned as _pinned
from cudattn._arrays import transfer as _transfer
from cudattn._numpy.attention import plan_batch_chunks
from _host_fakes import BF16, F16


# ---------------------------------------------------------------------------- on a GPU

_seed = itertools.count(5000)


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def _device_path(q, k, v, **kw):
    qd, kd, vd = (cudattn.to_device(x) for x in (q, k, v))
    res = cudattn.attention(qd, kd, vd, **kw)
    if kw.get("return_lse"):
        return cudattn.to_host(res[0]), cudattn.to_host(res[1])
    return cudattn.to_host(res), None


def _gpu_case(B, Sq, Sk, Hq, Hkv, D, *, causal, return_lse, dtype=BF16, layout="bshd", out=False, stream=None,
              strided=False, rows=None):
    rng = np.random.default_rng(next(_seed))
    qs = (B, Sq, Hq, D) if layout == "bshd" else (B, Hq, Sq, D)
    ks = (B, Sk, Hkv, D) if layout == "bshd" else (B, Hkv, Sk, D)
    if strided:  # a non-contiguous NumPy view (rows padded), last axis contiguous
        q = _rand(rng, qs[:-1] + (D + 16,), dtype)[..., 8:8 + D]
        assert not q.flags.c_contiguous
    else:
        q = _rand(rng, qs, dtype)
    k, v = _rand(rng, ks, dtype), _rand(rng, ks, dtype)
    kw = dict(causal=causal, layout=layout, return_lse=return_lse)
    o_dev, l_dev = _device_path(q, k, v, **kw)
    out_arr = np.full(qs, np.nan, dtype) if out else None
    res = cudattn.attention(q, k, v, **kw, out=out_arr, stream=stream)
    o, l = res if return_lse else (res, None)
    if out:
        assert o is out_arr
    assert type(o) is np.ndarray and o.dtype == dtype and o.shape == qs
    assert np.array_equal(o.view(np.uint16), o_dev.view(np.uint16)), "NumPy path differs from the device path"
    if return_lse:
        assert l.dtype == np.float32 and l.shape == (B, Hq, Sq)
        assert np.array_equal(l.view(np.uint32), l_dev.view(np.uint32))
    # against the float64 reference (a subsample of rows for the big cases)
    ref, ref_lse = reference.attention(q, k, v, causal=causal, layout=layout, return_lse=True, rows=rows)
    naive = reference.attention_naive(q, k, v, causal=causal, layout=layout, dtype=dtype, rows=rows)
    take = o if rows is None else (o[:, rows] if layout == "bshd" else o[:, :, rows])
    ok, err, bound = reference.check_close(take.astype(np.float64), ref, naive)
    assert ok, f"max|out-ref| = {err:.3g} > bound {bound:.3g}"
    if return_lse:
        lt = l if rows is None else l[:, :, rows]
        empty = np.isneginf(ref_lse)
        assert np.array_equal(np.isneginf(lt), empty)
        np.testing.assert_allclose(lt[~empty], ref_lse[~empty], rtol=1e-4, atol=1e-4)


BIG_ROWS = np.array([0, 1, 127, 128, 1000, 2047])


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_big_pipelined(B, causal):
    """(B, 2048, 16, 128) bf16 moves 32 MiB per batch element: B = 3 and 8 take the pipeline."""
    p = cudattn._spec.validate.validate(*(np.broadcast_to(np.zeros((1, 1, 1, 128), BF16), (B, 2048, 16, 128)),) * 3,
                                   return_lse=True, host=True)
    assert len(plan_batch_chunks(B, _host._bytes_per_item(p))) == {1: 1, 3: 2, 8: 4}[B]
    _gpu_case(B, 2048, 2048, 16, 16, 128, causal=causal, return_lse=True, rows=BIG_ROWS)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_gpu_small(B, causal, return_lse):
    _gpu_case(B, 113, 203, 4, 2, 64, causal=causal, return_lse=return_lse, dtype=F16)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gpu_big_gqa_out_strided_bhsd(layout):
    _gpu_case(6, 1500, 1700, 16, 4, 128, causal=True, return_lse=True, layout=layout, out=True, strided=True,
              rows=np.array([0, 5, 999, 1499]))


@pytest.mark.gpu
def test_gpu_round_trip_wraps_the_staging_pool():
    """to_device / to_host through more pieces than the pool has chunks, with a tail; the host
    array is overwritten as soon as to_device returns (its bytes were staged already)."""
    rng = np.random.default_rng(next(_seed))
    x = _rand(rng, (4, 8195, 8, 128), BF16)
    assert x.nbytes > _transfer.STAGING_CHUNKS * _transfer.STAGING_CHUNK and x.nbytes % _transfer.STAGING_CHUNK
    keep = x.copy()
    d = cudattn.to_device(x)
    x[...] = 0
    y = cudattn.to_host(d)
    assert np.array_equal(y.view(np.uint16), keep.view(np.uint16))


@pytest.mark.gpu
def test_gpu_big_with_small_staging_wraps_the_pool(monkeypatch):
    """Chunks of several staging pieces each, and a pipeline of many batch chunks."""
    monkeypatch.setattr(_host, "PIPELINE_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(_host, "PIPELINE_CHUNK_BYTES", 1 << 20)
    _gpu_case(7, 1023, 777, 8, 2, 64, causal=True, return_lse=True, dtype=F16, rows=np.array([0, 511, 1022]))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["core", "library", "int"])
def test_gpu_caller_stream(kind):
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    if kind == "core":
        stream = dev.create_stream()
    elif kind == "library":
        stream = _stream.default_stream(0)
    else:
        stream = 0  # the legacy default stream
    _gpu_case(4, 2048, 2048, 16, 16, 128, causal=False, return_lse=True, stream=stream, out=True, rows=BIG_ROWS)


@pytest.mark.gpu
def test_gpu_ordered_after_prior_work_on_the_callers_stream():
    """Kernels queued first on the caller's stream drop their outputs at once (freed stream-ordered
    on that stream), so the pipelined call's device buffers, allocated next on that stream, may
    reuse that memory: its uploads, on a copy stream, must wait for the caller's stream or the
    earlier kernels would overwrite them."""
    from cuda.core import Device

    dev = Device(0)
    dev.set_current()
    s = dev.create_stream()
    rng = np.random.default_rng(next(_seed))
    x = _rand(rng, (2, 4096, 16, 128), BF16)
    xd = cudattn.to_device(x, stream=s)
    for _ in range(3):  # keep the caller's stream busy
        cudattn.attention(xd, xd, xd, stream=s)
    q, k, v = (_rand(rng, (4, 2048, 16, 128), BF16) for _ in range(3))
    o = cudattn.attention(q, k, v, stream=s)
    o_dev, _ = _device_path(q, k, v)
    assert np.array_equal(o.view(np.uint16), o_dev.view(np.uint16))


@pytest.mark.gpu
def test_gpu_threads_share_the_pool():
    """Two threads calling the pipelined path at once: serialised on the pool, both exact."""
    rng = np.random.default_rng(next(_seed))
    cases = [tuple(_rand(rng, (3, 2048, 16, 128), BF16) for _ in range(3)) for _ in range(2)]
    want = [_device_path(*c)[0] for c in cases]
    got = [None, None]

    def work(i):
        from cuda.core import Device

        Device(0).set_current()
        got[i] = cudattn.attention(*cases[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for g, w in zip(got, want):
        assert np.array_equal(g.view(np.uint16), w.view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3])  # (B, 2048, 16, 128) bf16: B = 3 takes the pipeline
@pytest.mark.parametrize("pinned_out", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_gpu_pinned_arrays_match_pageable(B, pinned_out, return_lse):
    """q, k, v (and out) from cudattn.empty_pinned: DMA'd with no staging copy, results bit for bit
    those of the same call on ordinary arrays; the inputs are reusable when the call returns."""
    rng = np.random.default_rng(next(_seed))
    shape = (B, 2048, 16, 128)
    q0, k0, v0 = (_rand(rng, shape, BF16) for _ in range(3))
    expect = cudattn.attention(q0, k0, v0, causal=True, return_lse=return_lse)
    q, k, v = (cudattn.empty_pinned(shape, BF16) for _ in range(3))
    for p, a in zip((q, k, v), (q0, k0, v0)):
        p[...] = a
    assert all(_pinned.is_pinned(a) for a in (q, k, v)) and not _pinned.is_pinned(q0)
    out = None
    if pinned_out:
        out = cudattn.empty_pinned(shape, BF16)
        out[...] = np.nan
    got = cudattn.attention(q, k, v, causal=True, return_lse=return_lse, out=out)
    q[...] = np.nan  # the call is over: its DMAs from q are done
    o, l = got if return_lse else (got, None)
    e_o, e_l = expect if return_lse else (expect, None)
    if pinned_out:
        assert o is out
    assert np.array_equal(o.view(np.uint16), e_o.view(np.uint16))
    if return_lse:
        assert np.array_equal(l.view(np.uint32), e_l.view(np.uint32))


@pytest.mark.gpu
def test_gpu_is_pinned_sees_other_pinned_memory():
    """Memory pinned by another library (torch's pin_memory) counts too; freed pinned arrays go."""
    torch = pytest.importorskip("torch")
    t = torch.empty(1000, dtype=torch.float32).pin_memory()
    assert _pinned.is_pinned(t.numpy()) and not _pinned.is_pinned(np.empty(1000, np.float32))
    a = cudattn.empty_pinned((256, 1024), np.float32)
    view = a[3:]
    del a
    assert _pinned.is_pinned(view), "a view keeps the pinned block alive"
