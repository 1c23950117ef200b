"""Device memory for cudattn's own arrays: stream-ordered blocks from the device's memory pool.

A :class:`Block` is taken with ``cuMemAllocFromPoolAsync`` on the stream that will write it and
given back with ``cuMemFreeAsync`` on that same stream when its last reference goes, so a block
is reused only after the work queued before the free. The pool is the device's current memory
pool (the one cuda.core's ``Device.memory_resource`` wraps), which keeps freed memory for reuse
as PyTorch's caching allocator does; :func:`trim` gives it back to the driver.

No call here synchronises the host on the normal path. Out of memory, the pool is trimmed and the
allocation tried again; then, unless the stream is capturing a CUDA graph, the allocating stream
(only it, never the whole device) is waited for, so that its pending frees complete, and the
allocation tried a last time before :class:`~cudattn._runtime.errors.OutOfMemoryError`. On a stream that
captures a CUDA graph a block becomes a graph memory node: the pool's allocation is captured as
one, or, where the driver refuses an explicit pool during capture, ``cuMemAllocAsync`` makes one.
cudattn allocates there only workspaces, freed before the call returns.
"""

from __future__ import annotations

from cuda.bindings import driver

from .._runtime.device import get_device
from .._runtime.errors import OutOfMemoryError, check
from .._runtime.stream import is_capturing

__all__ = ["Block", "allocate", "pool_of", "trim"]

_OOM = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_CAPTURE_UNSUPPORTED = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_alloc_async = driver.cuMemAllocFromPoolAsync
_free_async = driver.cuMemFreeAsync
_pools: dict[int, object] = {}  # device id -> driver.CUmemoryPool


_SPECIAL_STREAMS = (0, 1, 2)  # the legacy and per-thread default streams: the current context's


class Block:
    """``nbytes`` of device memory at ``ptr``, freed stream-ordered on ``stream`` when dropped.

    ``keep`` holds the stream's owner (a cuda.core or torch stream object), so the stream outlives
    the free queued on it. On a default stream (handle 0, 1 or 2, which mean the current
    context's) ``ctx`` is the context it was allocated in, made current around the free: a block
    dropped while another device is current is freed on its own device's stream."""

    __slots__ = ("ptr", "nbytes", "stream", "keep", "ctx", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: int, keep: object = None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.keep = keep
        self.ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent") if stream in _SPECIAL_STREAMS else None

    def __del__(self):
        ptr, self.ptr = self.ptr, 0
        if ptr:
            try:
                if self.ctx is None or int(driver.cuCtxGetCurrent()[1]) == int(self.ctx):
                    _free_async(ptr, self.stream)
                elif driver.cuCtxPushCurrent(self.ctx)[0] == _SUCCESS:
                    try:
                        _free_async(ptr, self.stream)
                    finally:
                        driver.cuCtxPopCurrent()
            except Exception:  # interpreter shutdown: the driver may be gone already
                pass


def pool_of(device_id: int):
    """The device's current memory pool (cached; the device's context must be current)."""
    pool = _pools.get(device_id)
    if pool is None:
        pool = _pools[device_id] = driver.CUmemoryPool(int(get_device(device_id).memory_resource.handle))
    return pool


def allocate(device_id: int, nbytes: int, stream: int, keep: object = None) -> Block:
    """A stream-ordered block of ``nbytes`` (> 0) on ``stream``; OutOfMemoryError naming the bytes."""
    err, ptr = _alloc_async(nbytes, _pools.get(device_id) or pool_of(device_id), stream)
    if err == _SUCCESS:
        return Block(int(ptr), nbytes, stream, keep)
    if err == _CAPTURE_UNSUPPORTED:  # a capturing stream: a graph memory node (freed in the graph too)
        return Block(int(check(driver.cuMemAllocAsync(nbytes, stream), f"cuMemAllocAsync({nbytes} bytes)")),
                     nbytes, stream, keep)
    if err != _OOM:
        check(err, f"cuMemAllocFromPoolAsync({nbytes} bytes)")
    return Block(_retry(device_id, nbytes, stream), nbytes, stream, keep)


def _retry(device_id: int, nbytes: int, stream: int) -> int:
    get_device(device_id)  # the stream's and the memory query's device
    pool = pool_of(device_id)
    trim(device_id)
    err, ptr = _alloc_async(nbytes, pool, stream)
    if err == _OOM and not is_capturing(stream):
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize (out of memory: waiting for pending frees)")
        trim(device_id)
        err, ptr = _alloc_async(nbytes, pool, stream)
    if err == _OOM:
        free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        raise OutOfMemoryError(nbytes, device_id, int(free), int(total))
    check(err, f"cuMemAllocFromPoolAsync({nbytes} bytes)")
    return int(ptr)


def trim(device_id: int) -> None:
    """Hand the pool's unused memory back to the driver (blocks freed in small pieces cannot serve a
    larger request, but the driver can remap them)."""
    check(driver.cuMemPoolTrimTo(pool_of(device_id), 0), "cuMemPoolTrimTo")
