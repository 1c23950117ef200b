"""Devices: the primary context made current, and cached device properties.

cudattn runs in each device's *primary* context, the one PyTorch, CuPy and JAX use,
so pointers and streams pass between them and cudattn without translation.

Nothing here touches CUDA at import time. The first :func:`get_device` call runs
``cuInit``; after that a call costs one ``cuCtxGetCurrent`` and a dict lookup, which
also notices when another library has made a different context current on this thread
in the meantime (and then makes ours current again).

A public call gives the thread back the context it found: where :func:`get_device` makes another
one current, it remembers the caller's, and :func:`restore_caller_context` (at the end of every
public call) makes it current again. A torch user on ``cuda:0`` who passes ``cuda:1`` tensors
stays on ``cuda:0``; a thread with no current context is left with the call's (CUDA's default).
"""

from __future__ import annotations

import functools
import operator
import threading
from dataclasses import dataclass

from cuda.bindings import driver

from .errors import NoDeviceError, check, no_device_error

__all__ = [
    "DeviceProperties",
    "device_count",
    "gpu_count",
    "device_properties",
    "get_device",
    "nest",
    "restore_caller_context",
    "restores_caller_context",
    "unnest",
]

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_init_lock = threading.Lock()
_initialized = False
_device_count: int | None = None

# cuda.core Device objects are thread-local singletons, and whether a context is
# current is per thread too, so the "already current" cache is per thread.
_tls = threading.local()

# Threads whose caller's context awaits restoring (`restore_caller_context`): read without the lock
# on every call, so that a call that switched nothing pays one global read.
pending = 0
_pending_lock = threading.Lock()

# Library-owned streams and the property cache are per process.
_props_lock = threading.Lock()
_props: dict[int, "DeviceProperties"] = {}


def _ensure_init() -> None:
    global _initialized, _device_count
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            try:
                result = driver.cuInit(0)
            except RuntimeError as exc:  # cuda.pathfinder's DynamicLibNotFoundError: no libcuda at all
                raise no_device_error(exc) from None
            if result[0] != driver.CUresult.CUDA_SUCCESS:
                raise no_device_error(result=result[0])
            _device_count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
            _initialized = True


def device_count() -> int:
    """Number of CUDA devices visible to this process (runs ``cuInit`` on first use)."""
    _ensure_init()
    return _device_count  # type: ignore[return-value]


def gpu_count() -> int:
    """Number of CUDA devices, 0 when there is no driver or no GPU (never raises, unlike
    :func:`device_count`): what the CLI asks before any GPU work."""
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:
        return 0


def _thread_cache() -> tuple[dict, dict]:
    try:
        return _tls.by_id, _tls.by_ctx
    except AttributeError:
        _tls.by_id = {}  # device id -> (cuda.core Device, primary context handle as int)
        _tls.by_ctx = {}  # primary context handle as int -> cuda.core Device
        return _tls.by_id, _tls.by_ctx


def get_device(device_id: int | None = None):
    """Return the ``cuda.core.Device`` for ``device_id`` with its primary context current.

    ``device_id=None`` means the device of the context current on this thread, or
    device 0 when there is none (the CUDA runtime's rule). A current context that is
    not a primary context (one the application created itself) is replaced by the
    device's primary context: cudattn always works in primary contexts.
    """
    _ensure_init()
    cur = int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    by_id, by_ctx = _thread_cache()
    if device_id is None:
        dev = by_ctx.get(cur)
        if dev is not None:
            return dev
        device_id = int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice")) if cur else 0
        entry = by_id.get(device_id)
    else:
        if type(device_id) is not int:
            device_id = _as_ordinal(device_id)
        entry = by_id.get(device_id)
        if entry is not None and entry[1] == cur:
            return entry[0]
    if cur and getattr(_tls, "caller", None) is None:  # the caller's context, given back at the call's end
        _remember_caller(driver.CUcontext(cur))
    # a context seen before: one driver call (a call on cuda:1 from a thread on cuda:0 makes this
    # switch every time); else, or if the driver refuses it, cuda.core's activation
    if entry is not None and driver.cuCtxSetCurrent(driver.CUcontext(entry[1]))[0] == _SUCCESS:
        dev = entry[0]
    else:
        dev = _activate(device_id, by_id, by_ctx)
    if getattr(_tls, "caller", None) is not None:
        _tls.ours = by_id[device_id][1]  # what a restore expects to find current
    return dev


def is_current(device_id: int) -> bool:
    """Whether ``device_id``'s primary context is current on this thread (as far as cudattn knows it)."""
    entry = _thread_cache()[0].get(device_id)
    return entry is not None and entry[1] == int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))


def _remember_caller(ctx) -> None:
    global pending
    _tls.caller = ctx
    with _pending_lock:
        pending += 1


def nest() -> None:
    """Enter a public call's inner work (the full path of a call): public calls made inside leave
    the context to the outer one (see :func:`restores_caller_context`)."""
    _tls.depth = getattr(_tls, "depth", 0) + 1


def unnest() -> None:
    _tls.depth -= 1


def restore_caller_context() -> None:
    """At the end of a public call: make current again the context this thread had before the call
    switched it (nothing to do where none did, or inside an outer public call, which does it)."""
    global pending
    ctx = getattr(_tls, "caller", None)
    if ctx is None or getattr(_tls, "depth", 0):
        return
    _tls.caller = None
    with _pending_lock:
        pending -= 1
    # a context made current since (by the caller, between a failed call and this one) stays
    if int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) == getattr(_tls, "ours", None):
        check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent (the caller's context, back after the call)")


def restores_caller_context(fn):
    """``fn`` (a public entry point) giving the thread back its context when it returns or raises.
    The public calls it makes inside (a NumPy call's device call, a ring's steps) leave the
    context to it: they run with the device current that ``fn`` made so."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _tls.depth -= 1
            if pending:
                restore_caller_context()

    return call


def _as_ordinal(device) -> int:
    """An int ordinal from a cuda.core Device, an int-like (NumPy integer); TypeError otherwise."""
    if isinstance(device, bool):
        raise TypeError("device must be an int device ordinal or a cuda.core Device, not bool")
    ordinal = getattr(device, "device_id", None)  # cuda.core Device
    if isinstance(ordinal, int):
        return ordinal
    try:
        return operator.index(device)
    except TypeError:
        raise TypeError(
            f"device must be an int device ordinal or a cuda.core Device, not {type(device).__name__}"
        ) from None


def _activate(device_id: int, by_id: dict, by_ctx: dict):
    """Make device ``device_id``'s primary context current on this thread (slow path)."""
    from cuda.core import Device

    n = _device_count
    if n == 0:
        raise NoDeviceError("CUDA_ERROR_NO_DEVICE", 100, "cuDeviceGetCount", "the CUDA driver sees no GPU")
    if not 0 <= device_id < n:  # type: ignore[operator]
        raise ValueError(f"device {device_id} does not exist: this process sees {n} CUDA device(s)")
    dev = Device(device_id)
    dev.set_current()  # retains the primary context and makes it current
    ctx = int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    old = by_id.get(device_id)
    if old is not None:
        by_ctx.pop(old[1], None)
    by_id[device_id] = (dev, ctx)
    by_ctx[ctx] = dev
    return dev


def _device_id(device) -> int:
    """Ordinal of ``device`` (cuda.core Device or int); ``None`` -> :func:`get_device`'s choice."""
    if type(device) is int:
        return device
    if device is None:
        return get_device().device_id
    return _as_ordinal(device)


@dataclass(frozen=True)
class DeviceProperties:
    """What planning and launching need to know about a device (queried once, cached)."""

    device_id: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_shared_memory_per_block_optin: int  # bytes; the most dynamic + static smem a block may opt in to
    max_shared_memory_per_block: int  # bytes without opting in (48 KiB)
    max_shared_memory_per_multiprocessor: int
    l2_cache_size: int  # bytes
    max_threads_per_block: int
    max_grid_dim: tuple[int, int, int]

    @property
    def arch(self) -> str:
        """NVRTC target: ``"sm_90a"`` on compute capability 9.0 (Hopper's wgmma/TMA need the *a*), else ``"sm_XY"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def device_properties(device=None) -> DeviceProperties:
    """Cached :class:`DeviceProperties` of ``device`` (cuda.core Device, ordinal, or None)."""
    dev_id = _device_id(device)
    p = _props.get(dev_id)
    if p is not None:
        return p
    with _props_lock:
        p = _props.get(dev_id)
        if p is None:
            dev = get_device(dev_id)
            q = dev.properties
            cc = dev.compute_capability
            p = DeviceProperties(
                device_id=dev_id,
                name=dev.name,
                compute_capability=(int(cc[0]), int(cc[1])),
                sm_count=int(q.multiprocessor_count),
                max_shared_memory_per_block_optin=int(q.max_shared_memory_per_block_optin),
                max_shared_memory_per_block=int(q.max_shared_memory_per_block),
                max_shared_memory_per_multiprocessor=int(q.max_shared_memory_per_multiprocessor),
                l2_cache_size=int(q.l2_cache_size),
                max_threads_per_block=int(q.max_threads_per_block),
                max_grid_dim=(int(q.max_grid_dim_x), int(q.max_grid_dim_y), int(q.max_grid_dim_z)),
            )
            _props[dev_id] = p
    return p
