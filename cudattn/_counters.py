"""Arrival counters for kernels whose last block finishes the work (the split-KV decode merge).

Such a kernel needs int32 counters that are zero at its launch, and leaves them at zero. Each
(device, stream) keeps one block of them, zeroed once on that stream when it is made, so the calls
on a stream reuse it with no memset per call: the stream orders them. Streams never share a block
(calls on different streams may run at once).

The blocks come from ``cuMemAlloc``, not from the stream-ordered pool: a block outlives the calls
that made it, and a stream named by a bare handle may be destroyed by its owner at any time, after
which no free may be queued on it. A block that is outgrown, or dropped when the table is full,
is retired, not freed (a kernel queued earlier may still count in it); `empty_cache` frees every
block (:func:`release`, after the device is synchronised); at exit they are left to the driver. A
stream with an owner object (a cuda.core or CuPy stream) keeps its owner alive while its block is
in the table, so its handle cannot be reused by another stream meanwhile.

While a stream captures a CUDA graph, the counters are the graph's own (a graph memory node zeroed
by a memset node), so that replays of the graph share nothing with eager calls.
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
    """``count`` zeroed int32 counters at ``ptr`` on ``device_id``, for one stream (``keep``: its owner)."""

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


def counters(device_id: int, stream: int, count: int, keep: object = None, capturing: bool | None = None):
    """An object whose ``ptr`` addresses ``count`` zeroed int32 counters for a kernel on ``stream``;
    hold it until the launch is queued. ``capturing``: whether ``stream`` captures a graph (None:
    ask the driver)."""
    rec = _recording.current() if _recording.active else None
    if rec is not None:
        return _Placeholder(rec.counters(count))
    if capturing is None:
        capturing = _alloc.is_capturing(stream)
    if capturing:  # the graph's own: a memory node, zeroed by a memset node, freed inside the graph
        block = _alloc.allocate(device_id, 4 * count, stream, keep)
        check(driver.cuMemsetD32Async(block.ptr, 0, count, stream), "cuMemsetD32Async(arrival counters)")
        return block
    key = (device_id, stream)
    entry = _blocks.get(key)
    if entry is None or entry.count < count:
        n = max(count, _MIN_COUNT, 0 if entry is None else 2 * entry.count)
        ptr = int(check(driver.cuMemAlloc(4 * n), f"cuMemAlloc({4 * n} bytes: arrival counters)"))
        fresh = _Counters(ptr, n, device_id, keep)
        _blocks.pop(key, None)
        if len(_blocks) >= _MAX_STREAMS:
            _retired.extend(_blocks.values())
            _blocks.clear()
        if entry is not None:
            _retired.append(entry)
        try:
            check(driver.cuMemsetD32Async(ptr, 0, n, stream), "cuMemsetD32Async(arrival counters)")
        except BaseException:
            _retired.append(fresh)
            raise
        _blocks[key] = entry = fresh
    return entry


def release(device_id: int | None = None) -> None:
    """Free the blocks of ``device_id`` (every device: None), retired ones included. Their kernels
    must be done: the caller synchronises the device first (and its context is current)."""
    keep = [c for c in _retired if device_id is not None and c.device_id != device_id]
    done = [c for c in _retired if c not in keep]
    _retired[:] = keep
    for key in [k for k in _blocks if device_id is None or k[0] == device_id]:
        done.append(_blocks.pop(key))
    for c in done:
        check(driver.cuMemFree(c.ptr), "cuMemFree(arrival counters)")


def _abandon() -> None:
    """At exit: nothing is freed (the driver takes the memory back with the process); another
    library's exit handler may have torn down a context already."""
    _blocks.clear()
    _retired.clear()


atexit.register(_abandon)
