"""Keeping a call's foreign operands alive until the call's work on its stream is done.

A call runs on one stream (the consumer). An operand produced on another stream is read only after
that stream's queued work (`_calls.operands.order_and_hold` waits with `_runtime.stream.stream_wait`:
an event, no host blocking). Its memory belongs to an allocator that frees it stream-ordered on the
producer's stream (PyTorch's and CuPy's caching allocators, cudattn's pool), which does not know the consumer:
dropped right after the call, it could be handed to new work while the kernel still reads it. So
such operands are held (:func:`hold`) until an event recorded on the consumer after the call's
work has completed; :func:`release_done` lets them go at the end of a later call (after its launch,
so that the queries add nothing to its latency).

While a stream captures a CUDA graph nothing is held (the graph's lifetime is its owner's duty),
and event queries run with the thread's capture mode relaxed, so that they never invalidate a
capture in progress on another stream.
"""

from __future__ import annotations

import collections
import threading

from cuda.bindings import driver

from .._runtime import device as _device
from .._runtime.errors import check
from .._runtime.stream import is_capturing

__all__ = ["hold", "release_done", "use_bindings", "use_entry_points"]

_DISABLE_TIMING = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
_NOT_READY = driver.CUresult.CUDA_ERROR_NOT_READY


# The driver's event calls, each returning its CUresult first: cuda.bindings' wrappers, or the
# compiled warm path's own entry points into the same driver functions once it has bound them
# (`use_entry_points`; a hold and its release measured 5.8 -> 3.4 µs on an H200 host).
def _bindings_record(event: int, stream: int):
    return driver.cuEventRecord(event, stream)[0]


def _bindings_query(event: int):
    return driver.cuEventQuery(event)[0]


def use_bindings() -> None:
    """Make the event calls through cuda.bindings' wrappers (the default)."""
    global _record, _query, _exchange, _RELAXED
    _record, _query = _bindings_record, _bindings_query
    _exchange = driver.cuThreadExchangeStreamCaptureMode  # (mode) -> (CUresult, the thread's mode before)
    _RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


def use_entry_points(record, query, exchange) -> None:
    """Make the event calls through ``record(event, stream)``, ``query(event)`` and
    ``exchange(mode)`` (the same contract as cuda.bindings' functions, on integer handles)."""
    global _record, _query, _exchange, _RELAXED
    _record, _query, _exchange = record, query, exchange
    _RELAXED = int(driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)


use_bindings()

_lock = threading.Lock()
# Events of released holds, reused, per device (made in its primary context, where cudattn works: an
# event is recorded only on its own context's streams).
_free_events: dict[int, list] = {}
_held: collections.deque = collections.deque()  # (event, its free list, refs), oldest first
pending = _held  # truthy while something is held (the call path tests it before `release_done`)


def hold(consumer: int, refs: tuple, device_id: int, capturing: bool | None = None) -> None:
    """Keep ``refs`` alive until the work queued so far on ``consumer``, a stream of device
    ``device_id``'s primary context, is done. ``capturing``: whether ``consumer`` captures a graph
    (None: asked here; a call that allocated has asked already)."""
    if capturing is None:
        capturing = is_capturing(consumer)
    if capturing:
        return
    free = _free_events.get(device_id)
    if free is None:
        free = _free_events.setdefault(device_id, [])
    try:
        ev = free.pop()
    except IndexError:
        _device.get_device(device_id)  # an event is made in the context current: the device's
        ev = int(check(driver.cuEventCreate(_DISABLE_TIMING), "cuEventCreate"))
    check(_record(ev, consumer), "cuEventRecord(keep operands alive)")
    with _lock:
        _held.append((ev, free, refs))


def release_done() -> None:
    """Drop the references whose work has completed (cheap when nothing is held)."""
    if not _held:
        return
    done = []
    query, exchange = _query, _exchange  # one pair for the whole release, should `use_entry_points` run meanwhile
    prev = check(exchange(_RELAXED), "cuThreadExchangeStreamCaptureMode")
    try:
        with _lock:
            while _held:
                ev, free, refs = _held[0]
                err = query(ev)
                if err == _NOT_READY:
                    break
                check(err, "cuEventQuery(keep operands alive)")
                _held.popleft()
                free.append(ev)
                done.append(refs)
    finally:
        check(exchange(prev), "cuThreadExchangeStreamCaptureMode")
    del done  # dropped outside the lock: a freed cudattn array queues its free here
