"""Host-side byte copies for the pinned staging of the NumPy path, split across a few threads.

Moving a NumPy array to the GPU through pinned staging is two copies: a host ``memcpy`` from
pageable memory into a pinned chunk, then a DMA. One thread's ``memcpy`` (roughly 5–15 GB/s on
a server core) is slower than a PCIe Gen5 DMA, so :func:`parallel_memmove` splits each copy into
a few slices run at once: the calling thread copies the first slice itself, helper threads the
others, and it returns when all are done.

The helpers run ``ctypes.memmove``, a ``CFUNCTYPE`` foreign function: CPython's ``_ctypes``
releases the GIL around every foreign call whose function type lacks ``FUNCFLAG_PYTHONAPI``
(``Modules/_ctypes/callproc.c``, ``_call_function_pointer``: ``if ((flags & FUNCFLAG_PYTHONAPI)
== 0) Py_UNBLOCK_THREADS`` before ``ffi_call``), and only ``PYFUNCTYPE``/``pythonapi`` functions
have that flag, so the slices really copy in parallel.

Writing a fresh NumPy array (``np.empty``) costs more than the copy itself: each first touch of
a page is a page fault, in which the kernel zeroes the page. :func:`prefault` takes those faults
ahead of time on one more background thread, while the copies of earlier data run.

The thread pools are small (``min(4, os.cpu_count())`` copiers including the caller, plus one
prefault thread where the machine has a core to spare), created on first use (never at import)
and re-created in a forked child. No CUDA here: this module copies between host addresses and
knows nothing about devices, so its tests run anywhere.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["COPY_THREADS", "PARALLEL_MIN", "copy_threads", "parallel_memmove", "prefault", "split_ranges"]

#: Copiers per copy, the calling thread included (so ``COPY_THREADS - 1`` helper threads).
COPY_THREADS = max(1, min(4, os.cpu_count() or 1))
#: Copies smaller than this run on the calling thread alone: handing a slice to a helper costs
#: tens of microseconds, as much as copying a few hundred KiB.
PARALLEL_MIN = 2 << 20
#: Slice boundaries fall on multiples of this many bytes from the start (whole pages, whole lines).
SLICE_ALIGN = 4096
#: :func:`prefault` skips arrays smaller than this (their faults are cheap) ...
PREFAULT_MIN = 4 << 20
#: ... and runs only where the machine has more cores than the copiers use, so that it never
#: takes a core from them.
PREFAULT_ENABLED = (os.cpu_count() or 1) > COPY_THREADS + 1
_PAGE = 4096

_memmove = ctypes.memmove
_pool: ThreadPoolExecutor | None = None
_prefault_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_threads() -> int:
    """How many threads :func:`parallel_memmove` uses for a large copy (caller included)."""
    return COPY_THREADS


def split_ranges(nbytes: int, parts: int, align: int = SLICE_ALIGN) -> list[tuple[int, int]]:
    """Cut ``[0, nbytes)`` into at most ``parts`` consecutive, non-empty ``(offset, size)`` slices.

    Every boundary but the end is a multiple of ``align``; slices are as even as that allows (all
    but the last have the same size). ``nbytes == 0`` gives no slice.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if parts < 1 or align < 1:
        raise ValueError(f"parts and align must be >= 1, got {parts} and {align}")
    if nbytes == 0:
        return []
    step = -(-nbytes // parts)
    step = -(-step // align) * align
    return [(off, min(step, nbytes - off)) for off in range(0, nbytes, step)]


def _lazy_pool(name: str, workers: int, thread_prefix: str) -> ThreadPoolExecutor:
    """The module's executor stored in global ``name``, created on first use (never at import)."""
    pool = globals()[name]
    if pool is None:
        with _pool_lock:
            pool = globals()[name]
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_prefix)
                globals()[name] = pool
    return pool


def _executor() -> ThreadPoolExecutor:
    return _lazy_pool("_pool", max(1, COPY_THREADS - 1), "cudattn-copy")


def _prefault_executor() -> ThreadPoolExecutor:
    return _lazy_pool("_prefault_pool", 1, "cudattn-prefault")


def _forget_pool_in_child() -> None:
    # A forked child inherits the executor objects but none of their threads: submitting to them
    # would wait forever. Start afresh on first use there.
    global _pool, _prefault_pool, _pool_lock
    _pool = None
    _prefault_pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def parallel_memmove(dst: int, src: int, nbytes: int, threads: int | None = None) -> None:
    """Copy ``nbytes`` from host address ``src`` to host address ``dst`` (``memmove`` semantics
    per slice: the two ranges must not overlap), using up to ``threads`` threads (default
    :data:`COPY_THREADS`); returns when every byte is copied.

    Copies under :data:`PARALLEL_MIN` bytes, or with ``threads=1``, are a single ``memmove``.
    """
    n = threads if threads is not None else COPY_THREADS
    if n <= 1 or nbytes < PARALLEL_MIN:
        if nbytes:
            _memmove(dst, src, nbytes)
        return
    slices = split_ranges(nbytes, n)
    pool = _executor()
    futures = []
    try:
        for off, size in slices[1:]:
            futures.append(pool.submit(_memmove, dst + off, src + off, size))
        off, size = slices[0]
        _memmove(dst + off, src + off, size)
    finally:
        # Wait for every helper even if something failed here: the caller reuses or frees the
        # buffers as soon as this returns, so no slice may still be copying then.
        error = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # pragma: no cover (memmove cannot fail short of a crash)
                error = error or e
        if error is not None:
            raise error


def _touch_pages(array: np.ndarray) -> None:
    # One byte written per page faults the page in. The strided fill releases the GIL (NumPy
    # drops it for plain-dtype assignments of this size), so the copiers run meanwhile.
    flat = array.reshape(-1).view(np.uint8)
    flat[::_PAGE] = 0


def prefault(array: np.ndarray, *, force: bool = False) -> Future | None:
    """Start faulting in the pages of ``array`` (C-contiguous, about to be overwritten whole) on a
    background thread; returns the Future to wait on before writing to ``array``, or None when
    nothing was started (small array, or no spare core; ``force=True`` ignores both rules).

    It writes zeros into ``array`` (one byte a page): never call it on data to be kept, and wait
    for the Future before anything else writes there. The task holds a reference to ``array``,
    so the memory outlives it even if the caller drops the array.
    """
    if not array.flags.c_contiguous:
        raise ValueError("prefault needs a C-contiguous array")
    if not force and (not PREFAULT_ENABLED or array.nbytes < PREFAULT_MIN):
        return None
    if array.nbytes == 0:
        return None
    return _prefault_executor().submit(_touch_pages, array)
