"""The NumPy (host) path's planning and copies: batch-chunk planning (how a call is cut into
pipelined chunks) and the threaded staging copies (memmove, prefault). CPU only.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading

import numpy as np
import pytest

import cudattn
from cudattn._numpy import attention as _host
from cudattn._arrays import staging as _staging
from cudattn._numpy.attention import plan_batch_chunks
from _host_fakes import BF16, F16

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
