"""The NumPy (host) path's pipelined call on a fake GPU (device memory is host memory, the kernel
is the float64 reference, the lazy fake driver of `_host_fakes` runs stream work as late as it may):
bit-for-bit results, stream order, out, pinned inputs, resources.
"""

from __future__ import annotations

import itertools
import time
import types
import weakref

import numpy as np
import pytest

import cudattn
from cudattn import reference
from cudattn._kernels import attention as _launches
from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._numpy import attention as _host
from cudattn._arrays import pinned as _pinned
from cudattn._arrays import staging as _staging
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from _host_fakes import BF16, F16
from _host_fakes import lazy as lazy  # fixtures


# ---------------------------------------------------------------------------- the pipelined call, on fakes


class _Owner:
    """What keeps a fake allocation alive (a DeviceArray's ``owner``)."""


class FakeDevice:
    """Device memory is host memory (poisoned with 0xFF bytes: NaN in every float dtype used)."""

    device_id = 0

    def __init__(self, lazy):
        self.lazy = lazy
        self.live = {}  # base address -> host array standing for a device allocation
        self.handles = itertools.count(1001)
        self.streams_made = 0

    def alloc(self, shape, dtype, ref):
        """Stream-ordered allocation on ``ref``; when the last view is dropped, a free is queued on
        ``ref`` (work queued there earlier may still use the memory; other streams' may not)."""
        dtype = np.dtype(dtype)
        raw = np.full(max(1, int(np.prod(shape)) * dtype.itemsize), 0xFF, np.uint8)
        lo = raw.ctypes.data
        self.live[lo] = raw
        owner = _Owner()
        weakref.finalize(owner, self._free, lo, lo + raw.nbytes, ref.handle)
        return DeviceArray(lo, shape, dtype, device_id=0, owner=owner, stream_handle=ref.handle)

    def _free(self, lo, hi, stream):
        self.lazy.freed(lo, hi, stream)
        self.lazy.enqueue(stream, "free", lambda: self.live.pop(lo))

    def view(self, arr) -> np.ndarray:
        """NumPy view of live fake device memory; ``arr``: a DeviceArray or a (ptr, shape, strides, dtype)."""
        ptr, shape, strides, dtype = arr if isinstance(arr, tuple) else (arr.ptr, arr.shape, arr.strides, arr.dtype)
        for lo, raw in self.live.items():
            if lo <= ptr < lo + raw.nbytes:
                return np.ndarray(shape, dtype, buffer=raw, offset=ptr - lo, strides=strides)
        raise AssertionError(f"{ptr:#x} is not live fake device memory (used after free)")

    def create_stream(self, options=None):
        self.streams_made += 1
        return types.SimpleNamespace(handle=next(self.handles))

    def run_device(self, problem, qa, ka, va, oa, device, device_id, sref):
        """The kernel: the float64 reference, one batch element at a time, queued on the stream."""
        B = problem.batch
        if oa is None:
            oa = self.alloc(qa.shape, problem.out_dtype, sref)
        lse = self.alloc((B, problem.heads_q, problem.seqlen_q), np.float32, sref) if problem.return_lse else None

        # like a real kernel, the queued work holds raw pointers, not the arrays
        args = [(a.ptr, a.shape, a.strides, a.dtype) for a in (qa, ka, va, oa)]
        lse_arg = None if lse is None else (lse.ptr, lse.shape, lse.strides, lse.dtype)

        def kernel():
            qn, kn, vn, on = (self.view(a) for a in args)
            for b in range(B):
                o_b, l_b = reference.attention(qn[b:b + 1], kn[b:b + 1], vn[b:b + 1], causal=problem.causal,
                                               scale=problem.scale, layout=problem.layout, return_lse=True)
                on[b:b + 1] = o_b.astype(problem.out_dtype)
                if lse_arg is not None:
                    self.view(lse_arg)[b:b + 1] = l_b

        touched = [(a.ptr, a.ptr + max(1, a.nbytes)) for a in (qa, ka, va, oa, lse) if a is not None]
        self.lazy.enqueue(sref.handle, "kernel", kernel, touched)
        return (oa, lse) if problem.return_lse else oa


@pytest.fixture(params=["small-pool", "large-pool"])
def fake_gpu(request, lazy, monkeypatch):
    """small-pool: 4 chunks of 96 B, reused all the time (which forces DMAs early); large-pool: 8
    chunks of 64 KiB, never reused within a call, so only the stream dependencies order the work."""
    if request.param == "large-pool":
        monkeypatch.setattr(_transfer, "STAGING_CHUNK", 1 << 16)
        monkeypatch.setattr(_transfer, "STAGING_CHUNKS", 8)
    dev = FakeDevice(lazy)
    monkeypatch.setattr(_device, "get_device", lambda device_id=None: dev)
    monkeypatch.setattr(_device, "device_properties", lambda device=None: types.SimpleNamespace(device_id=0))
    monkeypatch.setattr(_transfer, "get_device", lambda device=None: dev)
    monkeypatch.setattr(_array, "empty_on", lambda shape, dtype, d, ref: dev.alloc(shape, dtype, ref))
    monkeypatch.setattr(_host_io, "empty", lambda shape, dtype, *, device=None, stream=None:
                        dev.alloc(shape, dtype, _host._stream.as_stream(stream, 0)))
    monkeypatch.setattr(_launches, "run_device", dev.run_device)
    monkeypatch.setattr(_host, "PIPELINE_MIN_BYTES", 0)  # pipeline even these small problems
    monkeypatch.setattr(_host, "PIPELINE_CHUNK_BYTES", 1)  # as many chunks as batch elements
    monkeypatch.setattr(_host, "PIPELINE_MAX_CHUNKS", 4)
    # Prefault the result arrays, slowly: a missing wait for it would let its zeros land on
    # delivered output.
    monkeypatch.setattr(_staging, "PREFAULT_ENABLED", True)
    monkeypatch.setattr(_staging, "PREFAULT_MIN", 0)
    real_touch = _staging._touch_pages

    def slow_touch(array):
        time.sleep(0.002)
        real_touch(array)

    monkeypatch.setattr(_staging, "_touch_pages", slow_touch)
    return dev


CALLER = 55  # the caller's stream handle


def _inputs(B, Sq=5, Sk=7, Hq=4, Hkv=2, D=8, dtype=BF16, layout="bshd", seed=0):
    rng = np.random.default_rng(seed)
    qs = (B, Sq, Hq, D) if layout == "bshd" else (B, Hq, Sq, D)
    ks = (B, Sk, Hkv, D) if layout == "bshd" else (B, Hkv, Sk, D)
    return tuple(rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in (qs, ks, ks))


def _expected(q, k, v, **kw):
    o, l = reference.attention(q, k, v, return_lse=True, **{a: b for a, b in kw.items() if a != "return_lse"})
    return o.astype(q.dtype), l.astype(np.float32)


def _same(a, b):
    if _staging._prefault_pool is not None:  # let any prefault still running land first (FIFO, one thread)
        _staging._prefault_pool.submit(lambda: None).result()
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("B", [1, 2, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_pipeline_matches_sequence_bit_for_bit(fake_gpu, lazy, monkeypatch, B, causal, layout):
    q, k, v = _inputs(B, layout=layout, seed=B)
    o_ref, l_ref = _expected(q, k, v, causal=causal, layout=layout)
    o, l = cudattn.attention(q, k, v, causal=causal, layout=layout, return_lse=True, stream=CALLER)
    kernels = [s for s, label in lazy.log if label == "kernel"]
    assert len(kernels) == min(B, 4) and set(kernels) == {CALLER}, "one kernel per chunk, on the caller's stream"
    assert _same(o, o_ref) and _same(l, l_ref)
    # the same call in sequence (pipelining off) gives the same bits
    monkeypatch.setattr(_host, "PIPELINE_MIN_BYTES", 1 << 60)
    o2, l2 = cudattn.attention(q, k, v, causal=causal, layout=layout, return_lse=True, stream=CALLER)
    assert _same(o2, o) and _same(l2, l)
    if B > 1:
        streams = {s for s, label in lazy.log if label in ("h2d", "d2h")}
        assert len(streams) == 3, "pipelined copies on two copy streams, sequential ones on the caller's"


def test_pipeline_orders_after_prior_work_on_the_callers_stream(fake_gpu, lazy):
    q, k, v = _inputs(3, seed=1)
    lazy.enqueue(CALLER, "prior", lambda: None)
    o = cudattn.attention(q, k, v, stream=CALLER)
    labels = [label for _, label in lazy.log]
    assert labels.index("prior") < labels.index("h2d")
    assert _same(o, _expected(q, k, v)[0])


def test_pipeline_gqa_noncontiguous_input_and_no_lse(fake_gpu, lazy):
    rng = np.random.default_rng(5)
    big = rng.standard_normal((6, 9, 8, 24), dtype=np.float32).astype(F16)
    q = big[:, :5, :, 8:16]  # a strided view, last axis contiguous
    k, v = _inputs(6, Sq=5, Sk=9, Hq=8, Hkv=2, dtype=F16, seed=6)[1:]
    assert not q.flags.c_contiguous
    o = cudattn.attention(q, k, v, causal=True, stream=CALLER)
    assert type(o) is np.ndarray and o.flags.c_contiguous
    assert _same(o, _expected(np.ascontiguousarray(q), k, v, causal=True)[0])


def test_pipeline_writes_into_out(fake_gpu, lazy):
    q, k, v = _inputs(5, seed=2)
    o_ref, l_ref = _expected(q, k, v, causal=True)
    out = np.full(q.shape, np.nan, BF16)
    o, l = cudattn.attention(q, k, v, causal=True, return_lse=True, out=out, stream=CALLER)
    assert o is out and _same(out, o_ref) and _same(l, l_ref)
    # a non-contiguous out (padded rows)
    pad = np.full(q.shape[:-1] + (q.shape[-1] + 8,), np.nan, BF16)
    out2 = pad[..., :q.shape[-1]]
    o2 = cudattn.attention(q, k, v, causal=True, out=out2, stream=CALLER)
    assert o2 is out2 and _same(np.ascontiguousarray(out2), o_ref)
    assert np.isnan(pad[..., q.shape[-1]:].astype(np.float32)).all(), "wrote outside out"


def test_pipeline_out_aliasing_an_input(fake_gpu, lazy):
    """out overlapping q three batch elements ahead: chunk i's output would land on chunk i+3's
    input before it is read, so the pipeline must not write into out directly."""
    B = 4
    q0, k, v = _inputs(B, Sq=7, Sk=7, Hq=2, Hkv=2, seed=9)
    buf = np.empty((B + 3,) + q0.shape[1:], BF16)
    buf[:B] = q0
    q, out = buf[:B], buf[3:]
    o_ref = _expected(q0, k, v)[0]
    o = cudattn.attention(q, k, v, out=out, stream=CALLER)
    assert o is out and _same(np.ascontiguousarray(out), o_ref)
    kq = k.copy()  # out=q itself (same shape): also fine
    o = cudattn.attention(kq, k, v, out=kq, stream=CALLER)
    assert _same(o, _expected(k, k, v)[0])


def _pinned_copy(a):
    p = cudattn.empty_pinned(a.shape, a.dtype)
    p[...] = a
    return p


@pytest.mark.parametrize("B", [1, 4])  # in sequence, pipelined
@pytest.mark.parametrize("pinned_out", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])  # without LSE, nothing staged waits for the DMAs
def test_pinned_arrays_skip_the_staging_copy(fake_gpu, lazy, monkeypatch, B, pinned_out, return_lse):
    """Pinned q, k, v go up by DMA straight from the caller's memory, and a pinned contiguous out is
    written by DMA: no host copy through the staging chunks for them; results as with pageable arrays.
    The fake driver runs a DMA only when something waits for it, so a missing wait shows as NaN."""
    q0, k0, v0 = _inputs(B, seed=20 + B)
    o_ref, l_ref = _expected(q0, k0, v0, causal=True)
    q, k, v = (_pinned_copy(a) for a in (q0, k0, v0))
    assert all(_pinned.is_pinned(a) for a in (q, k, v)) and not _pinned.is_pinned(q0)
    staged = []
    real = _staging.parallel_memmove
    monkeypatch.setattr(_transfer, "parallel_memmove", lambda dst, src, n, *a: (staged.append(src), real(dst, src, n, *a)))
    out = cudattn.empty_pinned(q.shape, q.dtype) if pinned_out else None
    if out is not None:
        out[...] = np.nan
    res = cudattn.attention(q, k, v, causal=True, return_lse=return_lse, out=out, stream=CALLER)
    o, l = res if return_lse else (res, l_ref)
    assert _same(o, o_ref) and _same(l, l_ref)
    if pinned_out:
        assert o is out
    for a in (q, k, v):  # no staging copy read the pinned inputs
        lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
        assert not any(lo <= src < hi for src in staged), "a pinned input went through the staging chunks"
    h2d = [s for s, label in lazy.log if label == "h2d"]
    assert h2d, "the inputs were DMA'd"


def test_pinned_input_reused_after_the_call_returns(fake_gpu, lazy):
    """The call returns after its DMAs from pinned inputs are done: overwriting q at once is safe."""
    q0, k0, v0 = _inputs(3, seed=31)
    for B in (1, 3):  # in sequence, pipelined
        q, k, v = (_pinned_copy(a[:B]) for a in (q0, k0, v0))
        o = cudattn.attention(q, k, v, stream=CALLER)
        left = [op[0] for s, ops in lazy.queues.items() for op in ops[lazy.done[s]:] if op[0] != "free"]
        assert not left, f"still queued when the call returned: {left}"
        q[...] = np.nan
        assert _same(o, _expected(q0[:B], k0[:B], v0[:B])[0])


def test_pinned_dmas_done_when_the_call_raises(fake_gpu, lazy, monkeypatch):
    """A failure after pinned inputs were queued for DMA: the call waits for those DMAs before the
    error reaches the caller, who may free or overwrite the arrays at once."""
    q0, k0, v0 = _inputs(1, seed=33)
    q, k, v = (_pinned_copy(a) for a in (q0, k0, v0))

    def failing(*args):
        raise cudattn.CudaError("CUDA_ERROR_LAUNCH_FAILED", 719, "cuLaunchKernel")

    monkeypatch.setattr(_launches, "run_device", failing)
    with pytest.raises(cudattn.CudaError):
        cudattn.attention(q, k, v, stream=CALLER)
    left = [op[0] for s, ops in lazy.queues.items() for op in ops[lazy.done[s]:] if op[0] == "h2d"]
    assert not left, f"uploads from the caller's pinned arrays still queued after the error: {left}"


def test_empty_pinned_shapes_and_dtypes(fake_gpu, lazy):
    a = cudattn.empty_pinned((2, 3), np.float16)
    assert a.shape == (2, 3) and a.dtype == np.float16 and a.flags.c_contiguous and a.flags.writeable
    assert _pinned.is_pinned(a) and _pinned.is_pinned(a[1:])
    z = cudattn.empty_pinned(0, np.float32)
    assert z.shape == (0,) and not _pinned.is_pinned(z)
    with pytest.raises(ValueError, match="negative"):
        cudattn.empty_pinned((2, -1))
    with pytest.raises(TypeError, match="object"):
        cudattn.empty_pinned(3, object)


def test_pipeline_resources_made_once(fake_gpu, lazy):
    q, k, v = _inputs(3, seed=4)
    for _ in range(3):
        assert _same(cudattn.attention(q, k, v, stream=CALLER), _expected(q, k, v)[0])
    assert fake_gpu.streams_made == 2
    st = _transfer.staging_pool(0)
    assert st.pipeline is not None and not st.lock.locked()
    assert all(p in (None, _transfer._WAIT) for p in st.pending), "no download left undelivered"


def test_pipeline_error_releases_the_pool(fake_gpu, lazy, monkeypatch):
    q, k, v = _inputs(3, seed=8)
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise cudattn.CudaError("CUDA_ERROR_LAUNCH_FAILED", 719, "cuLaunchKernel")
        return fake_gpu.run_device(*args)

    monkeypatch.setattr(_launches, "run_device", failing)
    with pytest.raises(cudattn.CudaError):
        cudattn.attention(q, k, v, stream=CALLER)
    st = _transfer.staging_pool(0)
    assert not st.lock.locked()
    assert all(p in (None, _transfer._WAIT) for p in st.pending)
    monkeypatch.setattr(_launches, "run_device", fake_gpu.run_device)
    assert _same(cudattn.attention(q, k, v, stream=CALLER), _expected(q, k, v)[0])
