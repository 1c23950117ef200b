"""Device memory a stream keeps between calls: zeroed arrival counters and a workspace.

Kernels that count among their blocks (the split-KV decode's merge, whose last block finishes the
work; the Hopper prefill's tiles of uneven lengths, taken from a counter) need int32 counters that
are zero at their launch, and leave them at zero; split-KV calls also need a workspace for their
partial results, overwritten by each call. Both serve one kernel: it writes and reads them, and
kernels on one stream run one after another on the GPU, so each (device, stream) keeps one block
of each kind from the device's pool, taken on that stream when first needed (counters zeroed
then, once), and reused by every later call on the stream with no allocation, free or memset.
(A workspace that one kernel of a call writes and a later kernel reads is the call's own: another
thread's call on the same stream could run between them; `_calls.replay` asks for a kept workspace only
for single-launch calls.) Streams never share a block (calls on different streams may run at
once; a bare handle that may come to name another stream is told apart by the stream's id too:
`_key`); the per-thread default stream (handle 2, a different stream in each thread) keeps none.
Workspaces are kept only while they are small: one of more than `WORKSPACE_KEPT_MAX` bytes, or
one that would take the device's kept workspaces (retired ones included) past
`WORKSPACE_BUDGET`, is the call's own (allocated and freed stream-ordered, as other arrays), so
the memory that no array shows stays bounded.

A stream given with an object (a cuda.core, CuPy or torch stream) is keyed by its handle, and its
block holds the object; where the object is one cudattn cannot tell owns its stream (a cuda.core
`Stream.from_handle`, a CuPy `ExternalStream`), its stream may still be destroyed and the handle
handed to a new stream while the object lives. So a block made for an object on a stream that does
not last notes the stream's id (`_Kept.sid`), and a later call that brings another object for the
same handle gets that block only where the driver gives the same id (one query, only when the
object changes): a new stream at an old handle gets a block of its own. One object is taken to
name one stream for its life (the same object brought back after its stream was destroyed would
name a stream that no longer exists).

A block is never freed on its stream: a stream named by a bare handle may be destroyed by its
owner at any time (a free queued on it afterwards crashed the process), and another thread may
have read the block for a launch it has not queued yet. Outgrown blocks, and those dropped when
the table is full, are retired; `empty_cache` frees them all after synchronising the device, on
cudattn's own stream (:func:`release`); at exit they are left to the driver. A block holds the
object its stream was given with (a retired block lets it go), which keeps a stream that object
owns alive; one it only wraps is told apart by its id as above; a torch object that only wraps a
stream owned elsewhere (``torch.cuda.ExternalStream``) is keyed by the stream's id, as a bare
handle is.

While a stream captures a CUDA graph (asked of the driver at each call), both are the graph's
own: graph memory nodes (the counters zeroed by a memset node), so that replays of the graph
share nothing with eager calls; counters a kernel can do without (the Hopper prefill's tile order)
are then none at all.
"""

from __future__ import annotations

import atexit
import threading

from cuda.bindings import driver

from . import alloc as _alloc
from .._runtime import recording as _recording
from .._runtime.errors import check
from .._runtime import stream as _stream

__all__ = ["counters", "workspace", "release", "WORKSPACE_KEPT_MAX", "WORKSPACE_BUDGET"]

_MIN_COUNTERS = 1024  # 4 KiB: a block of rows per (batch, kv head) for most decode grids
_MIN_WORKSPACE = 256 << 10
WORKSPACE_KEPT_MAX = 8 << 20  # larger workspaces are allocated per call
WORKSPACE_BUDGET = 64 << 20  # per device: kept and retired workspaces together
_MAX_BLOCKS = 128  # blocks in the table; past it the table starts over (the old blocks are retired)
_COUNTERS, _WORKSPACE = 0, 1  # the kinds of block, in the table's keys
_PER_THREAD = 2  # CU_STREAM_PER_THREAD: one handle, a different stream in each thread


class _Kept:
    """``nbytes`` of pool memory of ``device_id`` at ``ptr``, kept for one stream (``keep``: its
    owner, or None; ``sid``: the stream's id where an object named a stream that does not last, else
    None). ``count``: the int32 counters it holds (counter blocks)."""

    __slots__ = ("ptr", "nbytes", "device_id", "keep", "sid")

    def __init__(self, ptr: int, nbytes: int, device_id: int, keep: object, sid: int | None = None):
        self.ptr, self.nbytes, self.device_id, self.keep, self.sid = ptr, nbytes, device_id, keep, sid

    @property
    def count(self) -> int:
        return self.nbytes // 4


class _Placeholder:
    """What a recorded call gets: the placeholder address of a counters slot (`_runtime.recording`)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


_NULL = _Placeholder(0)  # no counters: a null address (`counters` with optional=True)
_blocks: dict[tuple, _Kept] = {}  # (device id, stream, kind[, stream id]) -> its block (`_key`)
_retired: list[_Kept] = []
_workspace_bytes: dict[int, int] = {}  # device id -> bytes of its workspaces, kept or retired
_grow_lock = threading.Lock()  # the table's changes and the budget's count (not the lookups)


def counters(device_id: int, stream: int, count: int, keep: object = None, capturing: bool | None = None,
             optional: bool = False):
    """An object whose ``ptr`` addresses ``count`` zeroed int32 counters for a kernel on ``stream``;
    hold it until the launch is queued. ``capturing``: whether ``stream`` captures a graph, where the
    caller asked already (None: asked here). ``optional``: the kernel can do without (a null
    ``ptr``), as it does while the stream captures a graph, whose counters would be memory nodes
    (an allocation, a memset and a free in the graph, and the limits such graphs carry)."""
    rec = _recording.current() if _recording.active else None
    if rec is not None:
        return _Placeholder(rec.counters(count, optional))
    if capturing is None:
        capturing = _stream.is_capturing(stream)
    if capturing and optional:
        return _NULL
    if stream == _PER_THREAD or capturing:  # the call's own (in a graph: a memory
        block = _alloc.allocate(device_id, 4 * count, stream, keep)  # node, zeroed by a memset node)
        _zero(block.ptr, count, stream)
        return block
    key = _key(device_id, stream, _COUNTERS, keep)
    entry = _lookup(key, stream, keep)
    if entry is None or entry.nbytes < 4 * count:
        n = max(count, _MIN_COUNTERS, 0 if entry is None else 2 * entry.count)
        entry = _grow(key, device_id, stream, 4 * n, keep)
    return entry


def workspace(device_id: int, stream: int, nbytes: int, keep: object = None, capturing: bool | None = None):
    """An object whose ``ptr`` addresses ``nbytes`` (> 0) of device memory that the kernels queued
    next on ``stream`` may overwrite; hold it until they are queued. ``capturing``: as for
    `counters`."""
    if capturing is None:
        capturing = _stream.is_capturing(stream)
    if nbytes > WORKSPACE_KEPT_MAX or stream == _PER_THREAD or capturing:
        return _alloc.allocate(device_id, nbytes, stream, keep)  # the call's own (in a graph: a node)
    key = _key(device_id, stream, _WORKSPACE, keep)
    entry = _lookup(key, stream, keep)
    if entry is None or entry.nbytes < nbytes:
        n = max(-(-nbytes // _MIN_WORKSPACE) * _MIN_WORKSPACE, 0 if entry is None else 2 * entry.nbytes)
        n = min(n, WORKSPACE_KEPT_MAX)  # whole units of the least size (the cap is one too)
        with _grow_lock:
            if _workspace_bytes.get(device_id, 0) + n > WORKSPACE_BUDGET:  # spent: the call's own
                return _alloc.allocate(device_id, nbytes, stream, keep)
            _workspace_bytes[device_id] = _workspace_bytes.get(device_id, 0) + n
        try:
            entry = _grow(key, device_id, stream, n, keep)
        except BaseException:  # nothing was kept (out of memory): nothing counts
            with _grow_lock:
                _workspace_bytes[device_id] -= n
            raise
    return entry


def _key(device_id: int, stream: int, kind: int, keep: object) -> tuple:
    """The table's key for ``stream``'s block of ``kind``. A bare handle (no owner object here) of
    a stream that is not lasting, or one a torch object only wraps (`_stream.TORCH_EXTERNAL`: its
    owner is elsewhere), may be destroyed while its kernels run and handed to a new stream,
    and the handle 0 is a different stream in each thread where cuda-python maps it to the
    per-thread stream: such handles are told apart by the driver's stream id as well, which no
    other stream of the process ever gets, so that two streams never share counters or a
    workspace (one driver query a call)."""
    if (keep is None or stream in _stream.TORCH_EXTERNAL) and stream not in _stream.LASTING_STREAMS:
        return (device_id, stream, kind, _stream_id(stream))
    return (device_id, stream, kind)


def _stream_id(stream: int) -> int:
    """The driver's id of ``stream``: unique among the process's streams, never reused."""
    return check(driver.cuStreamGetId(stream), "cuStreamGetId")


def _lookup(key: tuple, stream: int, keep: object) -> _Kept | None:
    """The table's block under ``key``; one made for another object naming ``stream``'s handle only
    where it is the same stream still (the same id: one query). None where there is none, or the
    handle now names a new stream (the caller grows a block in its place: the old one is retired,
    its stream's kernels may still run)."""
    entry = _blocks.get(key)
    if entry is not None and entry.sid is not None and entry.keep is not keep and _stream_id(stream) != entry.sid:
        return None
    return entry


def _grow(key: tuple, device_id: int, stream: int, n: int, keep) -> _Kept:
    """A new block of ``n`` bytes for ``stream`` under ``key`` (`_key`), in the table in place of
    the one it outgrows."""
    sid = None if len(key) == 4 or keep is None or stream in _stream.LASTING_STREAMS else _stream_id(stream)
    fresh = _Kept(_raw_alloc(device_id, n, stream), n, device_id, keep, sid)
    if key[2] == _COUNTERS:
        try:
            _zero(fresh.ptr, n // 4, stream)
        except BaseException:
            _retire(fresh)
            raise
    with _grow_lock:
        # Whatever holds the key now is retired: the entry outgrown, or one another thread made
        # meanwhile. An entry no longer there was retired by whoever took it out (never twice).
        old = _blocks.pop(key, None)
        if old is not None:
            _retire(old)
        if len(_blocks) >= _MAX_BLOCKS:
            for b in _blocks.values():
                _retire(b)
            _blocks.clear()
        _blocks[key] = fresh
    return fresh


def _retire(block: _Kept) -> None:
    """Out of the table, freed by `release`; its stream's owner is no longer held (a kernel queued
    on that stream still runs if the owner destroys it: the driver frees the stream after its work)."""
    block.keep = None
    _retired.append(block)


def _raw_alloc(device_id: int, nbytes: int, stream: int) -> int:
    """Pool memory that no `_arrays.alloc.Block` owns (so nothing frees it on ``stream``)."""
    block = _alloc.allocate(device_id, nbytes, stream)
    ptr, block.ptr = block.ptr, 0  # the block's destructor frees nothing now: `release` will
    return ptr


def _zero(ptr: int, count: int, stream: int) -> None:
    check(driver.cuMemsetD32Async(ptr, 0, count, stream), "cuMemsetD32Async(arrival counters)")


def release(device_id: int) -> None:
    """Free the blocks of ``device_id``, retired ones included, on cudattn's stream, and wait for
    the frees. Their kernels must be done: the caller synchronises the device first, with the
    device's context current."""
    with _grow_lock:  # another thread may be growing another device's entries meanwhile
        done = [c for c in _retired if c.device_id == device_id]
        _retired[:] = [c for c in _retired if c.device_id != device_id]
        _workspace_bytes.pop(device_id, None)
        for key in [k for k in _blocks if k[0] == device_id]:
            done.append(_blocks.pop(key))
    if not done:
        return
    h = _stream._default_stream_ref(device_id).handle
    for c in done:
        check(driver.cuMemFreeAsync(c.ptr, h), "cuMemFreeAsync(a stream's kept memory)")
    check(driver.cuStreamSynchronize(h), "cuStreamSynchronize")


def _abandon() -> None:
    """At exit: nothing is freed (the driver takes the memory back with the process); another
    library's exit handler may have torn down a context already."""
    _blocks.clear()
    _retired.clear()
    _workspace_bytes.clear()


atexit.register(_abandon)
