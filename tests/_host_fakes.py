"""The lazy fake driver of the NumPy (host) path's CPU tests (test_host_staging_cpu.py,
test_host_pipeline_cpu.py), and the dtypes the test_host_* modules share.

Where the code would call the driver, a fake replaces the module-level ``driver``: "device memory"
is host memory and the fake driver runs queued stream work *as late as it may*: only when an event
or stream synchronisation forces it, following stream-wait dependencies. A missing event wait or a
staging chunk refilled before its DMA ran then shows up as wrong or poisoned (NaN) bytes in the
result.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

from cudattn._numpy import attention as _host
from cudattn._arrays import pinned as _pinned
from cudattn._arrays import transfer as _transfer

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


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
