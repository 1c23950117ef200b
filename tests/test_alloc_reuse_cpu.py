"""CPU: blocks kept on the host for reuse (`_arrays.alloc`), with the pool's calls faked.

A warm call's dropped output is kept by (device, stream, size) and serves the next allocation of
that size on that stream with no driver call; only allocations known to be outside graph capture
take part, only on lasting streams (the legacy default stream, cudattn's own), and the kept ones
are bounded, kept under a lock, and go back to the pool on `release_kept` (empty_cache, out of
memory) except on a stream that captures a graph at that moment.
"""

from __future__ import annotations

import gc

import pytest
from cuda.bindings import driver

from cudattn._arrays import alloc

OK = driver.CUresult.CUDA_SUCCESS
OOM = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
STREAM, OTHER, PASSING = 0x1000, 0x2000, 0x3000  # two lasting streams (cudattn's own), and another
OWNER = object()  # a stream owner (a cuda.core Stream, say) the block holds


class _Pool:
    def __init__(self):
        self.log = []
        self.next_ptr = 1 << 30
        self.oom = 0  # allocations to refuse
        self.capturing = set()  # streams capturing a graph

    def alloc(self, nbytes, pool, stream):
        if self.oom:
            self.oom -= 1
            self.log.append(("oom", nbytes, stream))
            return OOM, 0
        self.next_ptr += 1 << 24
        self.log.append(("alloc", self.next_ptr, nbytes, stream))
        return OK, self.next_ptr

    def free(self, ptr, stream):
        self.log.append(("free", ptr, stream))
        return (OK,)


@pytest.fixture
def pool(monkeypatch):
    p = _Pool()
    monkeypatch.setattr(alloc, "_alloc_async", p.alloc)
    monkeypatch.setattr(alloc, "_free_async", p.free)
    monkeypatch.setattr(alloc, "_pools", {0: "pool", 1: "pool"})
    monkeypatch.setattr(alloc, "_kept", {})
    monkeypatch.setattr(alloc, "_kept_bytes", {})
    monkeypatch.setattr(alloc, "LASTING_STREAMS", {0, 1, STREAM, OTHER})
    monkeypatch.setattr(alloc, "is_capturing", lambda s: s in p.capturing)
    ctx = driver.CUcontext(0x77)
    monkeypatch.setattr(alloc.driver, "cuCtxGetCurrent", lambda: (OK, ctx))
    return p


def _take(nbytes=4096, stream=STREAM, keep=OWNER, reuse=True, device_id=0):
    return alloc.allocate(device_id, nbytes, stream, keep, reuse)


def test_a_dropped_block_serves_the_next_allocation_of_its_size_on_its_stream(pool):
    b = _take()
    ptr = b.ptr
    del b
    gc.collect()
    assert [e[0] for e in pool.log] == ["alloc"]  # kept, not freed
    again = _take()
    assert again.ptr == ptr and again.stream == STREAM
    assert [e[0] for e in pool.log] == ["alloc"]  # no driver call for the second
    assert alloc._kept_bytes[0] == 0


def test_no_reuse_across_streams_sizes_or_devices(pool):
    b = _take()
    ptr = b.ptr
    del b
    others = [_take(stream=OTHER), _take(nbytes=8192), _take(device_id=1)]
    assert all(o.ptr != ptr for o in others)
    assert [e[0] for e in pool.log] == ["alloc"] * 4


@pytest.mark.parametrize("case", ["reuse not asked (capture not ruled out)", "per-thread default stream",
                                  "a stream that may be destroyed (its handle given to a new one)"])
def test_blocks_that_may_not_be_kept_are_freed_on_their_stream(pool, case):
    stream, keep, reuse = {"reuse not asked (capture not ruled out)": (STREAM, OWNER, False),
                           "per-thread default stream": (2, None, True),
                           "a stream that may be destroyed (its handle given to a new one)": (PASSING, OWNER, True)}[case]
    b = _take(stream=stream, keep=keep, reuse=reuse)
    ptr = b.ptr
    del b
    assert pool.log[-1] == ("free", ptr, stream)
    assert not any(alloc._kept.values())


def test_the_legacy_default_stream_keeps_its_blocks(pool):
    b = _take(stream=0, keep=None)
    ptr = b.ptr
    del b
    assert _take(stream=0, keep=None).ptr == ptr


def test_kept_blocks_are_bounded_by_count_and_bytes(pool, monkeypatch):
    blocks = [_take() for _ in range(alloc.KEEP_PER_SIZE + 2)]
    ptrs = [b.ptr for b in blocks]
    del blocks
    freed = [e[1] for e in pool.log if e[0] == "free"]
    kept = [k[0] for k in alloc._kept[(0, STREAM, 4096)]]
    assert len(kept) == alloc.KEEP_PER_SIZE and len(freed) == 2 and sorted(kept + freed) == sorted(ptrs)
    monkeypatch.setattr(alloc, "KEEP_BYTES", alloc._kept_bytes[0] + 100)
    big = _take(nbytes=1000)
    big_ptr = big.ptr
    del big
    assert pool.log[-1] == ("free", big_ptr, STREAM)  # past the device's byte budget


def test_a_block_dropped_while_another_thread_holds_the_lock_is_freed(pool):
    b = _take()
    ptr = b.ptr
    with alloc._kept_lock:  # as if another thread were taking or keeping a block now
        del b
    assert pool.log[-1] == ("free", ptr, STREAM) and not any(alloc._kept.values())


def test_a_capturing_streams_kept_blocks_stay_kept(pool):
    a, b = _take(), _take(stream=OTHER)
    pa, pb = a.ptr, b.ptr
    del a, b
    pool.capturing.add(OTHER)  # another thread captures a graph on OTHER: a free there would join it
    assert alloc.release_kept(0) == {STREAM}
    assert [e for e in pool.log if e[0] == "free"] == [("free", pa, STREAM)]
    assert _take(stream=OTHER).ptr == pb and alloc._kept_bytes[0] == 0


def test_release_kept_frees_them_on_their_streams(pool):
    a, b, c = _take(), _take(stream=OTHER), _take(device_id=1)
    pa, pb = a.ptr, b.ptr
    del a, b, c
    assert alloc.release_kept(0) == {STREAM, OTHER}
    assert sorted(e for e in pool.log if e[0] == "free") == sorted([("free", pa, STREAM), ("free", pb, OTHER)])
    assert alloc._kept_bytes[0] == 0 and alloc._kept_bytes[1] == 4096
    assert _take().ptr not in (pa, pb)


def test_out_of_memory_returns_kept_blocks_to_the_pool_before_failing(pool, monkeypatch):
    synced, trimmed = [], []
    monkeypatch.setattr(alloc, "get_device", lambda d: None)
    monkeypatch.setattr(alloc.driver, "cuStreamSynchronize", lambda s: synced.append(s) or (OK,))
    monkeypatch.setattr(alloc, "trim", lambda d: trimmed.append(d))
    k = _take(stream=OTHER)
    kp = k.ptr
    del k
    pool.oom = 1
    b = _take(nbytes=1 << 20)
    assert b.ptr and ("free", kp, OTHER) in pool.log
    assert synced == [OTHER] and trimmed == [0]  # the kept block's free done before the pool is trimmed
