"""Copies between host memory and device arrays, and fills, on the arrays' raw views.

Large copies go through reusable pinned staging chunks (one pool per device, below);
:func:`memset` and :func:`zero_fill` write bit patterns (tests poison outputs with NaN). All are
stream-ordered on the stream given. The public :func:`cudattn.to_device` / :func:`cudattn.to_host`
(`host_io`) and DeviceArray's own copy and fill methods use these; nothing here imports the array
type, which is what lets DeviceArray call them.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from cuda.bindings import driver

from .._runtime import recording as _recording
from .._runtime.device import get_device, restores_caller_context
from .._runtime.errors import check
from .._spec.geometry import is_dense as _is_dense
from .._spec.geometry import span as _span
from .staging import parallel_memmove
from .._runtime.stream import as_stream, stream_wait

if TYPE_CHECKING:
    from .array import DeviceArray
    from .types import StreamLike

__all__ = ["device_to_host", "memset", "zero_fill", "staging_pool"]


def _stream_for(arr: DeviceArray, stream) -> int:
    """Stream to act on ``arr``: the given one, else the array's own, else the library stream.

    A given stream other than the array's own first waits for the array's stream
    (an event), so that the copy or memset sees the array's pending writes.
    """
    own = arr.stream_handle
    if stream is None:
        return own if own is not None else as_stream(None, arr.device_id).handle
    h = as_stream(stream, arr.device_id).handle
    if own is not None and own != h:
        stream_wait(h, own)
    return h


@restores_caller_context
def settle_default_stream(a: DeviceArray) -> None:
    """Wait on the host for ``a``'s producer: a default stream (handle 0-2) of another device than
    the current one, which a consumer of the CUDA Array Interface would take for its own device's
    stream (those handles name the current context's streams)."""
    get_device(a.device_id)
    check(driver.cuStreamSynchronize(a.stream_handle), "cuStreamSynchronize (an array on a default stream, exported)")


@restores_caller_context
def device_to_host(arr: DeviceArray, stream: StreamLike = None) -> NDArray[Any]:
    """Copy a device array (any strided view) into a new C-ordered NumPy array; returns when the
    copy is done. The covering byte span is copied and the view rebuilt on the host."""
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    if arr.size == 0:
        return np.empty(arr.shape, arr.dtype)
    itemsize = arr.dtype.itemsize
    if arr.is_c_contiguous:
        out = np.empty(arr.shape, arr.dtype)
        _copy_d2h(out.ctypes.data, arr.ptr, arr.nbytes, h, arr.device_id)
        return out
    lo, hi = _span(arr.shape, arr.strides, itemsize)
    raw = np.empty(hi - lo, np.uint8)
    _copy_d2h(raw.ctypes.data, arr.ptr + lo, hi - lo, h, arr.device_id)
    view = np.ndarray(arr.shape, arr.dtype, buffer=raw, offset=-lo, strides=arr.strides)
    return view.copy()  # C order


# ---------------------------------------------------------------------- pinned staging
#
# Pageable host memory cannot be DMA'd: the driver bounces it through its own
# staging buffers, one chunk at a time. cudattn does that bouncing itself for
# large copies, through a small pool of reusable pinned chunks per device
# (STAGING_CHUNKS of STAGING_CHUNK bytes, allocated on first use), so that the
# host memcpy of one chunk overlaps the DMAs of the others. The host memcpy is
# the slow half (one core copies slower than PCIe moves), so it is split across
# a few threads (`_arrays.staging.parallel_memmove`).
#
# Each chunk has an event recorded after its DMA, and a note of what is pending
# on it: nothing, a DMA to wait for (H2D), or a DMA to wait for and then bytes to
# copy out of the chunk into their host destination (D2H). Chunks are taken in
# round-robin order and a chunk is refilled only after its pending work is
# settled, so a copy may return while its last H2D DMAs are still in flight (H2D
# stays asynchronous) and a D2H copy is drained as late as possible (its DMA
# overlaps later work). One user at a time holds the pool (`_Staging.lock`) for a
# whole copy, or for a whole pipelined NumPy attention call (`_numpy.attention`), and
# ends with `flush()` (every D2H byte delivered) or, on error, `discard()`.
# CUDATTN_PINNED_STAGING=0 turns it off (then plain pageable copies).

STAGING_CHUNK = 16 << 20  # bytes per pinned chunk
STAGING_CHUNKS = 4  # pinned chunks per device (so up to 3 DMAs in flight while the host fills the 4th)
STAGING_MIN = 1 << 20  # copies smaller than this go direct from/to pageable memory
_staging_enabled = os.environ.get("CUDATTN_PINNED_STAGING", "1") != "0"
_staging_lock = threading.Lock()
_staging: dict[int, _Staging | None] = {}  # device id -> pool (None: pinned allocation failed, don't retry)

_WAIT = ("wait",)  # pending note: a DMA (H2D, or a discarded D2H) still reads or writes the chunk


class _Staging:
    """Pinned chunks, their "DMA done" events and pending notes, for one device; used under ``lock``."""

    def __init__(self, chunk: int, count: int = 2):
        self.lock = threading.Lock()
        self.chunk = chunk
        self.ptrs: list[int] = []
        self.events: list = []
        self.pending: list[tuple | None] = []  # None | _WAIT | (host dst, nbytes): see the section comment
        self.next = 0  # the chunk to take next: the one used longest ago
        self.pipeline = None  # streams and events of the pipelined NumPy path (`_numpy.attention`), made on first use
        try:
            for _ in range(count):
                self.ptrs.append(
                    int(check(driver.cuMemHostAlloc(chunk, driver.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"))
                )
                self.events.append(
                    check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                )
                self.pending.append(None)
        except BaseException:
            self.close()
            raise

    def _settle(self, i: int) -> None:
        """Finish what is pending on chunk ``i``: wait for its DMA, and deliver a D2H chunk's bytes."""
        p = self.pending[i]
        if p is None:
            return
        self.pending[i] = _WAIT  # until the wait below has succeeded
        check(driver.cuEventSynchronize(self.events[i]), "cuEventSynchronize(staging)")
        self.pending[i] = None
        if p is not _WAIT:
            dst, n = p
            parallel_memmove(dst, self.ptrs[i], n)

    def _take(self) -> int:
        """The next chunk (round robin), free: its pending work settled."""
        i = self.next
        self.next = (i + 1) % len(self.ptrs)
        self._settle(i)
        return i

    def h2d(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue host ``src`` -> device ``dst`` on ``stream``; returns once ``src`` has been read."""
        chunk = self.chunk
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            i = self._take()
            parallel_memmove(self.ptrs[i], src + off, n)
            check(driver.cuMemcpyHtoDAsync(dst + off, self.ptrs[i], n, stream), "cuMemcpyHtoDAsync")
            self.pending[i] = _WAIT
            check(driver.cuEventRecord(self.events[i], stream), "cuEventRecord(staging)")

    def d2h(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue device ``src`` -> host ``dst`` on ``stream``; the bytes reach ``dst`` by :meth:`flush`
        at the latest (earlier when a later copy needs the chunk)."""
        chunk = self.chunk
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            i = self._take()
            check(driver.cuMemcpyDtoHAsync(self.ptrs[i], src + off, n, stream), "cuMemcpyDtoHAsync")
            self.pending[i] = _WAIT
            check(driver.cuEventRecord(self.events[i], stream), "cuEventRecord(staging)")
            self.pending[i] = (dst + off, n)

    def flush(self) -> None:
        """Deliver every pending D2H chunk to its host destination, oldest first (H2D DMAs may go on)."""
        k = len(self.ptrs)
        for j in range(k):
            i = (self.next + j) % k
            if self.pending[i] not in (None, _WAIT):
                self._settle(i)

    def discard(self) -> None:
        """Forget pending D2H deliveries (after an error: their destinations may be gone); the DMAs
        are still waited for before a chunk is reused."""
        for i, p in enumerate(self.pending):
            if p is not None:
                self.pending[i] = _WAIT

    def close(self) -> None:  # only used when construction fails; pools otherwise live with the process
        for e in self.events:
            driver.cuEventDestroy(e)
        for p in self.ptrs:
            driver.cuMemFreeHost(p)
        self.events, self.ptrs, self.pending = [], [], []


def _get_staging(device_id: int) -> _Staging | None:
    """The device's pinned pool, made on first use; None when pinned allocation failed (warned once)."""
    st = _staging.get(device_id, False)
    if st is not False:
        return st
    with _staging_lock:
        st = _staging.get(device_id, False)
        if st is False:
            try:
                st = _Staging(STAGING_CHUNK, STAGING_CHUNKS)
            except Exception as e:  # e.g. pinned memory exhausted: fall back to pageable copies
                warnings.warn(f"cudattn: no pinned staging buffers ({e}); using pageable copies", RuntimeWarning, 2)
                st = None
            _staging[device_id] = st
    return st


def staging_pool(device_id: int) -> _Staging | None:
    """The pinned staging pool of ``device_id`` (whose context must be current), or None when
    staging is off (``CUDATTN_PINNED_STAGING=0``) or pinned memory could not be had.
    Hold its ``lock`` while using it."""
    return _get_staging(device_id) if _staging_enabled else None


def _copy_h2d(dst: int, src: int, nbytes: int, stream: int, device_id: int) -> None:
    """Host ``src`` -> device ``dst``, ordered on ``stream``; returns before the DMA ends (``src`` reusable)."""
    _recording.refuse("_copy_h2d")
    st = _get_staging(device_id) if _staging_enabled and nbytes >= STAGING_MIN else None
    if st is None:
        check(driver.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")
        return
    with st.lock:
        st.h2d(dst, src, nbytes, stream)


def _copy_d2h(dst: int, src: int, nbytes: int, stream: int, device_id: int) -> None:
    """Device ``src`` -> host ``dst``, ordered on ``stream``; returns when ``dst`` holds the data."""
    _recording.refuse("_copy_d2h")
    st = _get_staging(device_id) if _staging_enabled and nbytes >= STAGING_MIN else None
    if st is None:
        check(driver.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")
        check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return
    with st.lock:
        try:
            st.d2h(dst, src, nbytes, stream)
            st.flush()
        except BaseException:
            st.discard()
            raise


def zero_fill(arr: DeviceArray, *, stream=None) -> None:
    """Write zeros over every element of a view whose last axis is contiguous (asynchronous on
    ``stream``): one memset when the view is dense, else one 2-D memset per leading index pair."""
    _recording.refuse("zero_fill")
    if arr.size == 0:
        return
    itemsize = arr.dtype.itemsize
    if _is_dense(arr.shape, arr.strides, itemsize):
        memset(arr, 0, stream=stream)
        return
    if arr.ndim != 4 or arr.strides[3] != itemsize:
        raise ValueError("zero_fill needs a dense array or a 4-D view with a contiguous last axis")
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    arr.stream_handle = h
    n0, n1, n2, n3 = arr.shape
    s0, s1, s2, _ = arr.strides
    for i0 in range(n0):
        for i1 in range(n1):
            dst = arr.ptr + i0 * s0 + i1 * s1
            check(driver.cuMemsetD2D8Async(dst, s2, 0, n3 * itemsize, n2, h), "cuMemsetD2D8Async")


@restores_caller_context
def memset(arr: DeviceArray, pattern: int, *, stream=None) -> None:
    """Write the ``itemsize``-wide bit ``pattern`` over every element (asynchronous on ``stream``).

    ``cuMemsetD8/D16/D32Async`` over the array's byte span, so the view must be
    dense (no gaps, no overlap; any axis order). 8-byte elements only take
    ``pattern=0``.
    """
    _recording.refuse("memset")
    itemsize = arr.dtype.itemsize
    if arr.size == 0:
        return
    if not _is_dense(arr.shape, arr.strides, itemsize):
        raise ValueError("memset needs a dense array (its elements must cover their byte span exactly once)")
    pattern = int(pattern)
    if pattern < 0 or pattern >= 1 << (8 * itemsize):
        raise ValueError(f"pattern {pattern:#x} does not fit in {itemsize} byte(s)")
    get_device(arr.device_id)
    h = _stream_for(arr, stream)
    arr.stream_handle = h  # the contents are now produced on h
    lo, hi = _span(arr.shape, arr.strides, itemsize)
    dst = arr.ptr + lo
    n = arr.size
    if pattern == 0 or itemsize == 1:  # pattern is one byte wide, or zero
        check(driver.cuMemsetD8Async(dst, pattern, hi - lo, h), "cuMemsetD8Async")
    elif itemsize == 2:
        check(driver.cuMemsetD16Async(dst, pattern, n, h), "cuMemsetD16Async")
    elif itemsize == 4:
        check(driver.cuMemsetD32Async(dst, pattern, n, h), "cuMemsetD32Async")
    else:
        raise TypeError(f"memset: a non-zero pattern needs 1-, 2- or 4-byte elements, not {itemsize}")

