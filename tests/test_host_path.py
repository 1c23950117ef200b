"""The NumPy (host) path: threaded staging copies, the pinned chunk pool, batch-chunk planning and
the pipelined call.

CPU tests run everywhere. Where the code would call the driver, a fake replaces the module-level
``driver`` (and the few device functions): "device memory" is host memory and the fake driver
runs queued stream work *as late as it may*: only when an event or stream synchronisation forces
it, following stream-wait dependencies. A missing event wait or a staging chunk refilled before
its DMA ran then shows up as wrong or poisoned (NaN) bytes in the result.

GPU tests (marked ``gpu``) compare the NumPy path with the device-array path bit for bit and
with the float64 reference under FlashAttention's rule (``reference.check_close``).
"""

from __future__ import annotations

import ctypes
import itertools
import subprocess
import sys
import threading
import time
import types
import weakref
from collections import defaultdict

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from cudattn import reference
from cudattn._kernels import attention as _launches
from cudattn._ops import attention as _api
from cudattn._arrays import array as _array
from cudattn._runtime import device as _device
from cudattn._runtime import stream as _stream
from cudattn._numpy import attention as _host
from cudattn._arrays import pinned as _pinned
from cudattn._arrays import staging as _staging
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
from cudattn._arrays.array import DeviceArray
from cudattn._numpy.attention import plan_batch_chunks

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
MiB = 1 << 20


# ---------------------------------------------------------------------------- chunk planning


def _check_cover(chunks, batch):
    assert chunks[0][0] == 0 and chunks[-1][1] == batch
    for (a0, a1), (b0, b1) in zip(chunks, chunks[1:]):
        assert a1 == b0
    sizes = [b1 - b0 for b0, b1 in chunks]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # larger first


def test_plan_empty_and_single():
    assert plan_batch_chunks(0, 10 * MiB) == []
    assert plan_batch_chunks(-1, 10 * MiB) == []
    assert plan_batch_chunks(1, 10_000 * MiB) == [(0, 1)]  # B == 1 cannot be cut along B
    assert plan_batch_chunks(7, 1 * MiB) == [(0, 7)]  # small: in sequence
    assert plan_batch_chunks(3, 0) == [(0, 3)]


def test_plan_known_shapes():
    per_item = lambda sq, hq, hkv, d, sk=None: (sq * hq + 2 * (sk or sq) * hkv) * d * 2 + sq * hq * d * 2
    # (4, 4096, 16, 128) bf16: 64 MiB per batch element -> one element per chunk
    assert plan_batch_chunks(4, per_item(4096, 16, 16, 128)) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # (8, 2048, 16, 128): 32 MiB per element -> 4 chunks of 2
    assert plan_batch_chunks(8, per_item(2048, 16, 16, 128)) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    # (3, 2048, 16, 128): 96 MiB in all -> 2 chunks, the larger first
    assert plan_batch_chunks(3, per_item(2048, 16, 16, 128)) == [(0, 2), (2, 3)]
    # just under the threshold: in sequence
    assert plan_batch_chunks(2, (_host.PIPELINE_MIN_BYTES - 1) // 2) == [(0, 2)]
    assert len(plan_batch_chunks(2, _host.PIPELINE_MIN_BYTES // 2)) == 2


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 7, 8, 13, 64, 1000])
@pytest.mark.parametrize("per_item_mib", [0.25, 1, 7, 33, 64, 500])
def test_plan_invariants(batch, per_item_mib):
    per_item = int(per_item_mib * MiB)
    chunks = plan_batch_chunks(batch, per_item)
    _check_cover(chunks, batch)
    total = batch * per_item
    if batch == 1 or total < _host.PIPELINE_MIN_BYTES:
        assert chunks == [(0, batch)]
    else:
        assert 2 <= len(chunks) <= min(batch, _host.PIPELINE_MAX_CHUNKS)
        if len(chunks) < min(batch, _host.PIPELINE_MAX_CHUNKS):  # not capped: chunks near the target size
            want = (total + _host.PIPELINE_CHUNK_BYTES // 2) // _host.PIPELINE_CHUNK_BYTES
            assert len(chunks) == max(2, want)


def test_plan_overrides():
    assert plan_batch_chunks(7, 1, min_bytes=0, chunk_bytes=1) == [(i, i + 1) for i in range(7)]
    assert plan_batch_chunks(7, 1, min_bytes=0, chunk_bytes=1, max_chunks=3) == [(0, 3), (3, 5), (5, 7)]
    assert plan_batch_chunks(3, 1, min_bytes=0, chunk_bytes=100) == [(0, 2), (2, 3)]  # at least 2
    assert len(plan_batch_chunks(8, 32 * MiB + 128 * 1024, min_bytes=0)) == 4  # LSE bytes add no chunk


def test_bytes_per_item_counts_every_transfer():
    shape_q, shape_kv = (4, 300, 8, 64), (4, 500, 2, 64)
    q = np.broadcast_to(np.zeros((1, 1, 1, 64), BF16), shape_q)  # validate needs no real data
    kv = np.broadcast_to(np.zeros((1, 1, 1, 64), BF16), shape_kv)
    p = cudattn._spec.validate.validate(q, kv, kv, return_lse=False, host=True)
    assert _host._bytes_per_item(p) == (300 * 8 * 64 + 2 * 500 * 2 * 64) * 2 + 300 * 8 * 64 * 2
    p = cudattn._spec.validate.validate(q, kv, kv, return_lse=True, host=True)
    assert _host._bytes_per_item(p) == (300 * 8 * 64 + 2 * 500 * 2 * 64) * 2 + 300 * 8 * 64 * 2 + 8 * 300 * 4


def test_zero_heads_refused_before_gpu_work():
    """Zero heads is a ValueError naming the rule, raised before any CUDA call (empty batches and
    sequences are valid: tests/test_reliability_gpu.py runs them)."""
    x = np.zeros((2, 4, 0, 64), F16)
    with pytest.raises(ValueError, match="heads axis must be >= 1"):
        cudattn.attention(x, x, x)


# ---------------------------------------------------------------------------- threaded memmove


def test_split_ranges():
    assert _staging.split_ranges(0, 4) == []
    for n in [1, 7, 4095, 4096, 4097, 3 * 4096 + 1, 10 * MiB + 3]:
        for parts in [1, 2, 3, 4, 7]:
            r = _staging.split_ranges(n, parts)
            assert 1 <= len(r) <= parts
            assert r[0][0] == 0 and sum(s for _, s in r) == n
            assert all(o1 + s1 == o2 for (o1, s1), (o2, _) in zip(r, r[1:]))
            assert all(o % _staging.SLICE_ALIGN == 0 and s > 0 for o, s in r)
    assert _staging.split_ranges(10, 3, align=1) == [(0, 4), (4, 4), (8, 2)]
    with pytest.raises(ValueError):
        _staging.split_ranges(-1, 2)
    with pytest.raises(ValueError):
        _staging.split_ranges(5, 0)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_parallel_memmove_copies_every_byte(threads):
    rng = np.random.default_rng(threads)
    sizes = [0, 1, 4095, 4097, _staging.PARALLEL_MIN - 1, _staging.PARALLEL_MIN, _staging.PARALLEL_MIN + 12345,
             3 * MiB + 7]
    for n in sizes:
        src = rng.integers(0, 256, n + 16, dtype=np.uint8)
        dst = np.zeros(n + 32, np.uint8)
        # odd (unaligned) start addresses on both sides
        _staging.parallel_memmove(dst.ctypes.data + 5, src.ctypes.data + 3, n, threads=threads)
        assert np.array_equal(dst[5:5 + n], src[3:3 + n]), n
        assert not dst[:5].any() and not dst[5 + n:].any(), "wrote outside the destination"


def test_parallel_memmove_uses_helper_threads(monkeypatch):
    seen = []
    lock = threading.Lock()
    real = ctypes.memmove

    def recording(dst, src, n):
        with lock:
            seen.append((threading.get_ident(), n))
        return real(dst, src, n)

    monkeypatch.setattr(_staging, "_memmove", recording)
    n = 4 * _staging.PARALLEL_MIN + 1
    src = np.arange(n, dtype=np.uint8)
    dst = np.empty(n, np.uint8)
    _staging.parallel_memmove(dst.ctypes.data, src.ctypes.data, n, threads=3)
    assert np.array_equal(src, dst)
    assert len(seen) == 3 and sum(s for _, s in seen) == n
    assert threading.get_ident() in {t for t, _ in seen}  # the caller copies one slice itself
    assert len({t for t, _ in seen}) >= 2
    seen.clear()
    _staging.parallel_memmove(dst.ctypes.data, src.ctypes.data, _staging.PARALLEL_MIN - 1, threads=3)
    assert seen == [(threading.get_ident(), _staging.PARALLEL_MIN - 1)]  # small: one memmove, no hand-off


def test_prefault_touches_every_page_and_keeps_the_array_alive():
    n = 5 * 4096 + 3
    a = np.full(n, 7, np.uint8)
    f = _staging.prefault(a, force=True)
    f.result()
    assert (a[::4096] == 0).all() and (np.delete(a, np.arange(0, n, 4096)) == 7).all()
    b = np.full((64, 1024), 1.0, np.float32)  # the caller may drop the array: the task holds it
    f = _staging.prefault(b[8:16], force=True)
    del b
    f.result()
    assert _staging.prefault(np.empty(16, np.uint8)) is None  # small: nothing to gain
    assert _staging.prefault(np.empty(0, np.uint8), force=True) is None
    with pytest.raises(ValueError, match="contiguous"):
        _staging.prefault(np.empty((8, 8))[:, ::2], force=True)


def test_copy_pool_is_small_and_not_made_at_import():
    code = (
        "import cudattn, cudattn._arrays.array, cudattn._numpy.attention, cudattn._arrays.staging as s\n"
        "assert s._pool is None and s._prefault_pool is None\n"
        "import os\n"
        "assert 1 <= s.COPY_THREADS <= min(4, os.cpu_count() or 1)\n"
        "import threading; assert not [t for t in threading.enumerate() if t.name.startswith('cudattn')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- a lazy fake driver


class _Ev:
    __slots__ = ("target",)

    def __init__(self):
        self.target = None  # (stream, number of ops queued on it when recorded)


class LazyDriver:
    """Just enough of cuda.bindings.driver; queued stream work runs only when a sync forces it.

    Stream ops run in queue order; ``cuStreamWaitEvent`` queues a dependency that, when reached,
    first runs the producer stream up to the event's record. So work runs as late as CUDA allows,
    and any ordering the code forgot to ask for is not provided.
    """

    CUevent_flags = driver.CUevent_flags
    CUpointer_attribute = driver.CUpointer_attribute
    CU_MEMHOSTALLOC_PORTABLE = driver.CU_MEMHOSTALLOC_PORTABLE

    def __init__(self):
        self.queues = defaultdict(list)
        self.done = defaultdict(int)
        self.log = []  # (stream, label) of every op in the order it ran
        self.pinned = []
        self.fail_host_alloc = False
        self.touches = {}  # id of a queued op -> address ranges it reads or writes
        self.violations = []

    def enqueue(self, stream, label, fn, touches=()):
        op = (label, fn)
        self.queues[stream].append(op)
        self.touches[id(op)] = (op, tuple(touches))

    def freed(self, lo, hi, stream):
        """Memory [lo, hi) freed stream-ordered on ``stream``: no op still queued on another stream
        may touch it (the allocator could hand it out again at once)."""
        for s, q in self.queues.items():
            if s == stream:
                continue
            for op in q[self.done[s]:]:
                for a, b in self.touches.get(id(op), (None, ()))[1]:
                    if a < hi and lo < b:
                        self.violations.append(f"freed [{lo:#x}, {hi:#x}) on stream {stream} while {op[0]} "
                                               f"queued on stream {s} still uses it")

    def _run(self, stream, upto):
        q = self.queues[stream]
        while self.done[stream] < upto:
            label, fn = q[self.done[stream]]
            self.done[stream] += 1
            if label == "wait":
                self._run(*fn)
            else:
                self.log.append((stream, label))
                fn()

    def pending(self, stream=None) -> int:
        streams = [stream] if stream is not None else list(self.queues)
        return sum(len(self.queues[s]) - self.done[s] for s in streams)

    def run_all(self):
        while self.pending():
            for s in list(self.queues):
                self._run(s, len(self.queues[s]))

    def cuMemHostAlloc(self, size, flags):
        if self.fail_host_alloc:
            return (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        buf = ctypes.create_string_buffer(size)
        self.pinned.append(buf)
        return (0, ctypes.addressof(buf))

    def cuMemFreeHost(self, p):
        return (0,)

    def cuPointerGetAttribute(self, attribute, ptr):
        """Memory type: host for the fake pinned allocations, an error (as for pageable memory) elsewhere."""
        for buf in self.pinned:
            lo = ctypes.addressof(buf)
            if lo <= ptr < lo + ctypes.sizeof(buf):
                return (driver.CUresult.CUDA_SUCCESS, driver.CUmemorytype.CU_MEMORYTYPE_HOST)
        return (driver.CUresult.CUDA_ERROR_INVALID_VALUE, None)

    def cuEventCreate(self, flags):
        return (0, _Ev())

    def cuEventDestroy(self, ev):
        return (0,)

    def cuEventRecord(self, ev, stream):
        ev.target = (stream, len(self.queues[stream]))
        return (0,)

    def cuStreamWaitEvent(self, stream, ev, flags):
        if ev.target is not None:
            self.queues[stream].append(("wait", ev.target))
        return (0,)

    def cuEventSynchronize(self, ev):
        if ev.target is not None:
            self._run(*ev.target)
        return (0,)

    def cuStreamSynchronize(self, stream):
        self._run(stream, len(self.queues[stream]))
        return (0,)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.enqueue(stream, "h2d", lambda: ctypes.memmove(dst, src, n), [(dst, dst + n)])
        return (0,)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self.enqueue(stream, "d2h", lambda: ctypes.memmove(dst, src, n), [(src, src + n)])
        return (0,)


@pytest.fixture
def lazy(monkeypatch):
    fake = LazyDriver()
    yield from _install(fake, monkeypatch)
    assert not fake.violations, fake.violations


def _install(fake, monkeypatch):
    monkeypatch.setattr(_transfer, "driver", fake)
    monkeypatch.setattr(_host, "driver", fake)
    monkeypatch.setattr(_pinned, "driver", fake)
    monkeypatch.setattr(_transfer, "_staging", {})
    monkeypatch.setattr(_transfer, "_staging_enabled", True)
    monkeypatch.setattr(_transfer, "STAGING_CHUNK", 96)  # tiny chunks: every copy takes many, wrapping the pool
    monkeypatch.setattr(_transfer, "STAGING_MIN", 0)
    yield fake


def _bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_staged_h2d_is_asynchronous_and_source_reusable(lazy, monkeypatch, chunks):
    monkeypatch.setattr(_transfer, "STAGING_CHUNKS", chunks)
    for n in [1, 95, 96, 97, 1000, 96 * 7]:
        src = _bytes(n, n)
        keep = src.copy()
        dev = np.full(n, 0xEE, np.uint8)  # "device memory"
        _transfer._copy_h2d(dev.ctypes.data, src.ctypes.data, n, 11, 0)
        if n > 96 * chunks:
            assert lazy.pending(11), "the last DMAs should still be in flight when the copy returns"
        src[:] = 0  # the caller may reuse its array at once
        lazy.run_all()
        assert np.array_equal(dev, keep), n


@pytest.mark.parametrize("chunks", [2, 3, 4])
def test_staged_d2h_delivers_every_byte(lazy, monkeypatch, chunks):
    monkeypatch.setattr(_transfer, "STAGING_CHUNKS", chunks)
    for n in [1, 95, 96, 97, 1000, 96 * 9]:
        dev = _bytes(n, n + 1)
        host = np.zeros(n, np.uint8)
        _transfer._copy_d2h(host.ctypes.data, dev.ctypes.data, n, 12, 0)
        assert np.array_equal(host, dev), n
        assert lazy.pending(12) == 0


def test_staging_pool_interleaves_uploads_and_downloads(lazy, monkeypatch):
    """Pieces of uploads and downloads on two streams share the pool's chunks (as the pipeline does)."""
    monkeypatch.setattr(_transfer, "STAGING_CHUNKS", 3)
    st = _transfer.staging_pool(0)
    ups = [(_bytes(n, n), np.zeros(n, np.uint8)) for n in (250, 1, 500, 96)]
    downs = [(_bytes(n, n + 7), np.zeros(n, np.uint8)) for n in (300, 97, 5, 700)]
    with st.lock:
        for (src, dev), (dsrc, hdst) in zip(ups, downs):
            st.h2d(dev.ctypes.data, src.ctypes.data, src.nbytes, 21)
            src[:] = 1  # reusable as soon as h2d returns
            st.d2h(hdst.ctypes.data, dsrc.ctypes.data, dsrc.nbytes, 22)
        st.flush()
    for (dsrc, hdst) in downs:
        assert np.array_equal(dsrc, hdst)
    lazy.run_all()
    for n, (_, dev) in zip((250, 1, 500, 96), ups):
        assert np.array_equal(dev, _bytes(n, n))


def test_staging_discard_forgets_deliveries(lazy):
    st = _transfer.staging_pool(0)
    dsrc = _bytes(200, 3)
    hdst = np.zeros(200, np.uint8)
    with st.lock:
        st.d2h(hdst.ctypes.data, dsrc.ctypes.data, 200, 5)
        st.discard()
        st.flush()
    assert not hdst.any(), "a discarded download must not be delivered"
    # the pool is still usable, and waits for the discarded DMAs before reusing their chunks
    src, dev = _bytes(500, 4), np.zeros(500, np.uint8)
    with st.lock:
        st.h2d(dev.ctypes.data, src.ctypes.data, 500, 5)
    lazy.run_all()
    assert np.array_equal(src, dev) and not hdst.any()


def test_failed_download_delivers_nothing_later(lazy, monkeypatch):
    """A D2H that fails half way raises, and its queued pieces are never delivered afterwards
    (their destination may be gone by then)."""
    real = lazy.cuMemcpyDtoHAsync
    calls = []

    def flaky(dst, src, n, stream):
        calls.append(n)
        if len(calls) == 3:
            return (driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
        return real(dst, src, n, stream)

    monkeypatch.setattr(lazy, "cuMemcpyDtoHAsync", flaky)
    dsrc = _bytes(1000, 5)
    hdst = np.zeros(1000, np.uint8)
    with pytest.raises(cudattn.CudaError, match="ILLEGAL_ADDRESS|cuMemcpyDtoHAsync"):
        _transfer._copy_d2h(hdst.ctypes.data, dsrc.ctypes.data, 1000, 9, 0)
    st = _transfer.staging_pool(0)
    assert all(p in (None, _transfer._WAIT) for p in st.pending)
    monkeypatch.setattr(lazy, "cuMemcpyDtoHAsync", real)
    other = np.zeros(500, np.uint8)
    _transfer._copy_d2h(other.ctypes.data, dsrc.ctypes.data, 500, 9, 0)  # reuses the chunks
    assert np.array_equal(other, dsrc[:500])
    assert not hdst.any(), "pieces of the failed download were delivered"


def test_staging_pool_is_made_once_lazily(lazy):
    assert _transfer._staging == {}
    st = _transfer.staging_pool(0)
    assert st is _transfer.staging_pool(0) and len(st.ptrs) == _transfer.STAGING_CHUNKS
    assert len(lazy.pinned) == _transfer.STAGING_CHUNKS
    assert all(len(buf) == _transfer.STAGING_CHUNK for buf in lazy.pinned)


def test_staging_disabled_or_failed_falls_back_to_pageable(lazy, monkeypatch):
    monkeypatch.setattr(_transfer, "_staging_enabled", False)
    assert _transfer.staging_pool(0) is None
    src, dev = _bytes(300, 1), np.zeros(300, np.uint8)
    _transfer._copy_h2d(dev.ctypes.data, src.ctypes.data, 300, 3, 0)
    lazy.run_all()
    assert np.array_equal(src, dev) and not lazy.pinned
    monkeypatch.setattr(_transfer, "_staging_enabled", True)
    lazy.fail_host_alloc = True
    with pytest.warns(RuntimeWarning, match="pageable"):
        assert _transfer.staging_pool(0) is None
    assert _transfer.staging_pool(0) is None  # warned once, not retried
    host = np.zeros(300, np.uint8)
    _transfer._copy_d2h(host.ctypes.data, src.ctypes.data, 300, 3, 0)
    assert np.array_equal(host, src)


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
