"""Arrival counters for kernels whose last block finishes the work (the split-KV decode merge).

Such a kernel needs int32 counters that are zero at its launch, and leaves them at zero. Each
(device, stream) keeps one block of them, zeroed once on that stream when it is made or grown, so
the calls on a stream reuse it with no memset per call: the stream orders them. Streams never share
a block (calls on different streams may run at once). A replaced block is freed stream-ordered on
its stream, after the kernels queued there that use it; a caller holds the block it was given
until its launch is queued, so a block replaced by another thread in between stays alive.

While a stream captures a CUDA graph, the counters are the graph's own (a graph memory node zeroed
by a memset node), so that replays of the graph share nothing with eager calls. `empty_cache`
gives the blocks back (:func:`release`); at exit they are left to the driver.
"""

from __future__ import annotations

import atexit

from cuda.bindings import driver

from . import _alloc, _recording
from ._errors import check

__all__ = ["counters", "release"]

_MIN_COUNT = 1024  # 4 KiB: a block of rows per (batch, kv head) for most decode grids
_MAX_STREAMS = 64  # blocks kept; past it the table starts over (the old blocks are freed stream-ordered)
_blocks: dict[tuple[int, int], _alloc.Block] = {}


class _Placeholder:
    """What a recorded call gets: the placeholder address of a counters slot (`_recording`)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


def counters(device_id: int, stream: int, count: int, keep: object = None, capturing: bool | None = None):
    """An object whose ``ptr`` addresses ``count`` zeroed int32 counters for a kernel on ``stream``;
    hold it until the launch is queued. ``capturing``: whether ``stream`` captures a graph (None:
    ask the driver)."""
    rec = _recording.current() if _recording.active else None
    if rec is not None:
        return _Placeholder(rec.counters(count))
    if capturing is None:
        capturing = _alloc.is_capturing(stream)
    if capturing:
        return _zeroed(device_id, stream, count, keep)
    key = (device_id, stream)
    block = _blocks.get(key)
    if block is None or block.nbytes < 4 * count:
        n = max(count, _MIN_COUNT, 0 if block is None else 2 * block.nbytes // 4)
        block = _zeroed(device_id, stream, n, keep)
        if key not in _blocks and len(_blocks) >= _MAX_STREAMS:
            _blocks.clear()
        _blocks[key] = block
    return block


def _zeroed(device_id: int, stream: int, count: int, keep: object) -> _alloc.Block:
    block = _alloc.allocate(device_id, 4 * count, stream, keep)
    check(driver.cuMemsetD32Async(block.ptr, 0, count, stream), "cuMemsetD32Async(arrival counters)")
    return block


def release(device_id: int | None = None) -> None:
    """Drop the blocks of ``device_id`` (every device: None); each is freed stream-ordered."""
    for key in [k for k in _blocks if device_id is None or k[0] == device_id]:
        del _blocks[key]


def _abandon() -> None:
    """At exit: the blocks are not freed (the driver takes the memory back with the process). A
    free queued then can meet a stream or context already torn down by another library's exit
    handler: freeing them from an exit handler segfaulted in the driver on an H100."""
    for block in _blocks.values():
        block.ptr = 0
    _blocks.clear()


atexit.register(_abandon)
