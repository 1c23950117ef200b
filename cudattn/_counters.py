"""Arrival counters for kernels whose last block finishes the work (the split-KV decode merge).

Such a kernel needs int32 counters that are zero at its launch, and leaves them at zero. Each
(device, stream) keeps one block of them from the device's pool, taken and zeroed on that stream
when first needed (stream-ordered, so legal while other streams capture graphs), and reused by
every later call on the stream with no memset: the stream orders them. Streams never share a
block (calls on different streams may run at once).

A block is never freed on its stream: a stream named by a bare handle may be destroyed by its
owner at any time, and a free queued on it afterwards crashed the process. Outgrown blocks, and
those dropped when the table is full, are retired (a kernel queued earlier may still count in
them); `empty_cache` frees them all after synchronising the device, on cudattn's own stream
(:func:`release`); at exit they are left to the driver. A stream with an owner object (a
cuda.core or CuPy stream) keeps its owner alive while its block is in the table, so its handle
cannot pass to another stream meanwhile.

While a stream captures a CUDA graph (asked of the driver at each call), the counters are the
graph's own: a graph memory node zeroed by a memset node, so that replays of the graph share
nothing with eager calls.
"""

from __future__ import annotations

import atexit

from cuda.bindings import driver

from . import _alloc, _recording
from ._errors import check

__all__ = ["counters", "release"]

_MIN_COUNT = 1024  # 4 KiB: a block of rows per (batch, kv head) for most decode grids
_MAX_STREAMS = 64  # blocks in the table; past it the table starts over (the old blocks are retired)


class _Counters:
    """``count`` zeroed int32 counters at ``ptr``: pool memory of ``device_id``, for one stream
    (``keep``: its owner, or None)."""

    __slots__ = ("ptr", "count", "device_id", "keep")

    def __init__(self, ptr: int, count: int, device_id: int, keep: object):
        self.ptr, self.count, self.device_id, self.keep = ptr, count, device_id, keep


class _Placeholder:
    """What a recorded call gets: the placeholder address of a counters slot (`_recording`)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


_blocks: dict[tuple[int, int], _Counters] = {}
_retired: list[_Counters] = []


def counters(device_id: int, stream: int, count: int, keep: object = None):
    """An object whose ``ptr`` addresses ``count`` zeroed int32 counters for a kernel on ``stream``;
    hold it until the launch is queued."""
    rec = _recording.current() if _recording.active else None
    if rec is not None:
        return _Placeholder(rec.counters(count))
    if _alloc.is_capturing(stream):  # a graph memory node (freed inside the graph) and a memset node
        block = _alloc.allocate(device_id, 4 * count, stream, keep)
        _zero(block.ptr, count, stream)
        return block
    key = (device_id, stream)
    entry = _blocks.get(key)
    if entry is None or entry.count < count:
        n = max(count, _MIN_COUNT, 0 if entry is None else 2 * entry.count)
        ptr = _raw_alloc(device_id, 4 * n, stream)
        fresh = _Counters(ptr, n, device_id, keep)
        try:
            _zero(ptr, n, stream)
        except BaseException:
            _retired.append(fresh)
            raise
        # Whatever held the key is retired: the entry outgrown, or one another thread made meanwhile.
        old = _blocks.pop(key, None)
        if old is not None:
            _retired.append(old)
        elif entry is not None:
            _retired.append(entry)
        if len(_blocks) >= _MAX_STREAMS:
            _retired.extend(_blocks.values())
            _blocks.clear()
        _blocks[key] = entry = fresh
    return entry


def _raw_alloc(device_id: int, nbytes: int, stream: int) -> int:
    """Pool memory that no `_alloc.Block` owns (so nothing frees it on ``stream``)."""
    block = _alloc.allocate(device_id, nbytes, stream)
    ptr, block.ptr = block.ptr, 0  # the block's destructor frees nothing now: `release` will
    return ptr


def _zero(ptr: int, count: int, stream: int) -> None:
    check(driver.cuMemsetD32Async(ptr, 0, count, stream), "cuMemsetD32Async(arrival counters)")


def release(device_id: int) -> None:
    """Free the blocks of ``device_id``, retired ones included, on cudattn's stream, and wait for
    the frees. Their kernels must be done: the caller synchronises the device first, with the
    device's context current."""
    from ._device import _default_stream_ref

    done = [c for c in _retired if c.device_id == device_id]
    _retired[:] = [c for c in _retired if c.device_id != device_id]
    for key in [k for k in _blocks if k[0] == device_id]:
        done.append(_blocks.pop(key))
    if not done:
        return
    h = _default_stream_ref(device_id).handle
    for c in done:
        check(driver.cuMemFreeAsync(c.ptr, h), "cuMemFreeAsync(arrival counters)")
    check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")


def _abandon() -> None:
    """At exit: nothing is freed (the driver takes the memory back with the process); another
    library's exit handler may have torn down a context already."""
    _blocks.clear()
    _retired.clear()


atexit.register(_abandon)
