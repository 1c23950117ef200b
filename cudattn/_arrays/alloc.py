"""Device memory for cudattn's own arrays: stream-ordered blocks from the device's memory pool.

A :class:`Block` is taken with ``cuMemAllocFromPoolAsync`` on the stream that will write it and
given back with ``cuMemFreeAsync`` on that same stream when its last reference goes, so a block
is reused only after the work queued before the free. The pool is the device's current memory
pool (the one cuda.core's ``Device.memory_resource`` wraps), which keeps freed memory for reuse
as PyTorch's caching allocator does; :func:`trim` gives it back to the driver.

**Reuse without the driver.** A warm call's output, dropped, is not handed to ``cuMemFreeAsync``
at once: its block is kept on the host, by device, stream and size, and the next warm call that
asks for that size on that stream takes it with no driver call (as PyTorch's caching allocator
reuses a block on its stream). Stream order makes this as safe as the pool's own reuse on the
stream: the new owner's work queues after everything the old owner queued there. Blocks come
back this way only where the allocation was known to be outside graph capture (``reuse=True``)
and on streams that stay the same stream for the life of the process
(`_runtime.stream.LASTING_STREAMS`: the legacy default stream, cudattn's own, and the streams
torch made itself, which it never destroys, once seen as torch's; another stream may be destroyed
and its handle given to a new one, which would not be ordered after the old work). The kept ones
are bounded (``KEEP_PER_SIZE`` a size, ``KEEP_BYTES`` a device), kept under a lock (a block
dropped while another thread holds it is freed instead), and go back to the pool at
:func:`release_kept` (`cudattn.empty_cache`, out of memory), except on a stream that captures a
graph at that moment. With a busy stream the pool's calls cost several microseconds each.

No call here synchronises the host on the normal path. Out of memory, the pool is trimmed and the
allocation tried again; then, unless the stream is capturing a CUDA graph, the allocating stream
(only it, never the whole device) is waited for, so that its pending frees complete, and the
allocation tried a last time before :class:`~cudattn._runtime.errors.OutOfMemoryError`. On a stream that
captures a CUDA graph a block becomes a graph memory node: the pool's allocation is captured as
one, or, where the driver refuses an explicit pool during capture, ``cuMemAllocAsync`` makes one.
cudattn allocates there only workspaces, freed before the call returns.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

from .._runtime.device import get_device
from .._runtime.errors import OutOfMemoryError, check
from .._runtime.stream import LASTING_STREAMS, is_capturing

__all__ = ["Block", "allocate", "pool_of", "release_kept", "trim"]

_OOM = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_CAPTURE_UNSUPPORTED = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_alloc_async = driver.cuMemAllocFromPoolAsync
_free_async = driver.cuMemFreeAsync
_pools: dict[int, object] = {}  # device id -> driver.CUmemoryPool


_SPECIAL_STREAMS = (0, 1, 2)  # the legacy and per-thread default streams: the current context's

KEEP_PER_SIZE = 4  # blocks kept for reuse per (device, stream, size)
KEEP_BYTES = 256 << 20  # bytes kept for reuse per device
_kept: dict[tuple[int, int, int], list] = {}  # (device id, stream, bytes) -> [(ptr, ctx), ...]
_kept_bytes: dict[int, int] = {}  # device id -> bytes in _kept
_kept_lock = threading.Lock()


class Block:
    """``nbytes`` of device memory at ``ptr``, freed stream-ordered on ``stream`` when dropped.

    ``keep`` holds the stream's owner (a cuda.core or torch stream object), so the stream outlives
    the free queued on it. On a default stream (handle 0, 1 or 2, which mean the current
    context's) ``ctx`` is the context it was allocated in, made current around the free: a block
    dropped while another device is current is freed on its own device's stream.

    ``device_id`` is set on blocks that go back to the kept lists when dropped (None: freed)."""

    __slots__ = ("ptr", "nbytes", "stream", "keep", "ctx", "device_id", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, stream: int, keep: object = None, device_id: int | None = None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.keep = keep
        self.ctx = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent") if stream in _SPECIAL_STREAMS else None
        self.device_id = device_id

    def __del__(self):
        ptr, self.ptr = self.ptr, 0
        if not ptr:
            return
        try:
            d = self.device_id
            # never wait for the lock: a collection can run this inside `allocate` on this thread
            if d is not None and _kept_lock.acquire(blocking=False):
                try:
                    kept = _kept.setdefault((d, self.stream, self.nbytes), [])
                    total = _kept_bytes.get(d, 0) + self.nbytes
                    if len(kept) < KEEP_PER_SIZE and total <= KEEP_BYTES:
                        _kept_bytes[d] = total
                        kept.append((ptr, self.ctx))
                        return
                finally:
                    _kept_lock.release()
            _free(ptr, self.stream, self.ctx)
        except Exception:  # interpreter shutdown: this module's globals may be gone already
            pass


def _free(ptr: int, stream: int, ctx) -> None:
    """``cuMemFreeAsync(ptr, stream)``, in ``ctx`` where the stream is a default one (None: any)."""
    try:
        if ctx is None or int(driver.cuCtxGetCurrent()[1]) == int(ctx):
            _free_async(ptr, stream)
        elif driver.cuCtxPushCurrent(ctx)[0] == _SUCCESS:
            try:
                _free_async(ptr, stream)
            finally:
                driver.cuCtxPopCurrent()
    except Exception:  # interpreter shutdown: the driver may be gone already
        pass


def release_kept(device_id: int) -> set:
    """Free the blocks kept for reuse on ``device_id`` (stream-ordered, on their streams) but those
    of a stream that captures a graph now (a free there would join the graph); returns the streams
    freed on."""
    capturing = {}
    with _kept_lock:
        taken = []
        for key in list(_kept):
            if key[0] != device_id or not _kept[key]:
                continue
            s = key[1]
            if s not in capturing:
                try:
                    capturing[s] = is_capturing(s)
                except Exception:  # the query itself refused (another thread's global capture): leave them
                    capturing[s] = True
            if not capturing[s]:
                blocks = _kept.pop(key)
                _kept_bytes[device_id] = _kept_bytes.get(device_id, 0) - key[2] * len(blocks)
                taken.extend((ptr, s, ctx) for ptr, ctx in blocks)
    for ptr, s, ctx in taken:  # outside the lock: a free never waits for it
        _free(ptr, s, ctx)
    return {s for _, s, _ in taken}


def pool_of(device_id: int):
    """The device's current memory pool (cached; the device's context must be current)."""
    pool = _pools.get(device_id)
    if pool is None:
        pool = _pools[device_id] = driver.CUmemoryPool(int(get_device(device_id).memory_resource.handle))
    return pool


def allocate(device_id: int, nbytes: int, stream: int, keep: object = None, reuse: bool = False) -> Block:
    """A stream-ordered block of ``nbytes`` (> 0) on ``stream``; OutOfMemoryError naming the bytes.

    ``reuse``: the caller knows ``stream`` is not capturing a graph, so a block kept from an
    earlier allocation of this size on this stream may serve, and this one is kept when dropped
    (on a lasting stream only: see the module docstring)."""
    kept_later = reuse and stream in LASTING_STREAMS
    if kept_later and _kept.get((device_id, stream, nbytes)):
        with _kept_lock:
            kept = _kept.get((device_id, stream, nbytes))
            found = kept.pop() if kept else None
            if found is not None:
                _kept_bytes[device_id] -= nbytes
        if found is not None:
            b = object.__new__(Block)
            b.ptr, b.nbytes, b.stream, b.keep, b.ctx, b.device_id = found[0], nbytes, stream, keep, found[1], device_id
            return b
    err, ptr = _alloc_async(nbytes, _pools.get(device_id) or pool_of(device_id), stream)
    if err == _SUCCESS:
        return Block(int(ptr), nbytes, stream, keep, device_id if kept_later else None)
    if err == _CAPTURE_UNSUPPORTED:  # a capturing stream: a graph memory node (freed in the graph too)
        return Block(int(check(driver.cuMemAllocAsync(nbytes, stream), f"cuMemAllocAsync({nbytes} bytes)")),
                     nbytes, stream, keep)
    if err != _OOM:
        check(err, f"cuMemAllocFromPoolAsync({nbytes} bytes)")
    return Block(_retry(device_id, nbytes, stream), nbytes, stream, keep)


def _retry(device_id: int, nbytes: int, stream: int) -> int:
    get_device(device_id)  # the stream's and the memory query's device
    pool = pool_of(device_id)
    if not is_capturing(stream):  # kept blocks back to the pool, their frees done
        for s in release_kept(device_id) - {stream}:
            check(driver.cuStreamSynchronize(s), "cuStreamSynchronize (out of memory: waiting for kept blocks' frees)")
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
