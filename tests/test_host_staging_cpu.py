"""The NumPy (host) path's pinned staging pool: asynchronous uploads and downloads through its
chunks, on the lazy fake driver of `_host_fakes` (a missing event wait shows up as wrong bytes).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver

import cudattn
from cudattn._arrays import transfer as _transfer
from _host_fakes import lazy as lazy  # fixtures


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
