"""Loading cubins and launching kernels: the per-call hot path.

Loading goes through cuda.core (``ObjectCode.from_cubin(...).get_kernel(name)``),
which loads the cubin as a context-independent ``CUlibrary`` and hands out a
``CUkernel``. cudattn launches that ``CUkernel`` with ``cuLaunchKernel`` by
casting it to ``CUfunction`` (allowed since CUDA 12.0; cuda.core's own
``launch`` does the same): the driver then runs it in the context of the stream
given (or of the current context for the NULL stream), loading the module into
that context on first use. Shared memory over 48 KiB is unlocked per device with
``cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)``, checked first against the
device's opt-in limit.

Every kernel takes exactly one by-value argument, a C struct; :func:`launch`
passes a ``ctypes.Structure`` with the identical layout, and the driver copies
it at launch, so the structure may be reused or freed as soon as
:func:`launch` returns.
"""

from __future__ import annotations

import ctypes
import threading

from cuda.bindings import driver

from . import recording as _recording
from .device import _device_id, device_properties, get_device, restores_caller_context
from .errors import check
from .stream import as_stream
__all__ = [
    "Event",
    "LoadedKernel",
    "clear_cache",
    "elapsed_ms",
    "launch",
    "launch_prepared",
    "load_kernel",
    "record_event",
    "synchronize",
    "time_ms",
]

DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic + static shared memory a block gets without opting in
MAX_GRID_X = (1 << 31) - 1
MAX_GRID_YZ = 65535

_lock = threading.Lock()
_cache: dict[tuple[int, str, str], "LoadedKernel"] = {}


class LoadedKernel:
    """A kernel loaded for one device, with what launching it needs.

    ``function`` is the ``CUkernel`` as a ``driver.CUfunction`` (built once, so the
    hot path converts nothing). ``smem_limit`` is the most dynamic shared memory a
    launch may ask for. ``object_code``/``kernel`` keep cuda.core's objects, and so
    the loaded library, alive.
    """

    __slots__ = (
        "function",
        "kernel_handle",
        "name",
        "device_id",
        "key",
        "static_smem",
        "max_dynamic_smem",
        "smem_limit",
        "num_regs",
        "kernel",
        "object_code",
    )

    def __init__(self, function, kernel_handle, name, device_id, key, kernel, object_code):
        self.function = function
        self.kernel_handle = kernel_handle  # driver.CUkernel (or CUfunction): for attribute calls
        self.name = name
        self.device_id = device_id
        self.key = key
        self.static_smem = 0
        self.max_dynamic_smem = 0
        self.smem_limit = DEFAULT_SMEM_LIMIT
        self.num_regs = 0
        self.kernel = kernel
        self.object_code = object_code

    def __repr__(self) -> str:
        return (
            f"LoadedKernel({self.name!r}, device={self.device_id}, regs={self.num_regs}, "
            f"static_smem={self.static_smem}, max_dynamic_smem={self.max_dynamic_smem})"
        )


def _get_attr(k: LoadedKernel, attr, what: str) -> int:
    if isinstance(k.kernel_handle, driver.CUkernel):
        cudev = check(driver.cuDeviceGet(k.device_id), "cuDeviceGet")
        r = driver.cuKernelGetAttribute(attr, k.kernel_handle, cudev)
    else:  # a CUfunction (module-loaded): per-context attributes
        r = driver.cuFuncGetAttribute(attr, k.kernel_handle)
    return int(check(r, f"get attribute {what} of kernel {k.name}"))


def _set_attr(k: LoadedKernel, attr, value: int, what: str) -> None:
    if isinstance(k.kernel_handle, driver.CUkernel):
        cudev = check(driver.cuDeviceGet(k.device_id), "cuDeviceGet")
        r = driver.cuKernelSetAttribute(attr, value, k.kernel_handle, cudev)
    else:
        r = driver.cuFuncSetAttribute(k.kernel_handle, attr, value)
    check(r, f"set attribute {what}={value} of kernel {k.name}")


def _unlock_smem(k: LoadedKernel, dynamic_smem: int) -> None:
    """Raise ``k``'s dynamic shared memory limit to ``dynamic_smem`` (caller holds ``_lock``)."""
    props = device_properties(k.device_id)
    optin = props.max_shared_memory_per_block_optin
    if k.static_smem + dynamic_smem > optin:
        raise ValueError(
            f"kernel {k.name!r} needs {dynamic_smem} B of dynamic + {k.static_smem} B of static shared memory "
            f"per block, but device {k.device_id} ({props.name}) allows at most {optin} B per block"
        )
    if k.static_smem + dynamic_smem > DEFAULT_SMEM_LIMIT:
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _set_attr(k, attr, dynamic_smem, "MAX_DYNAMIC_SHARED_SIZE_BYTES")
    k.max_dynamic_smem = dynamic_smem
    k.smem_limit = max(dynamic_smem, DEFAULT_SMEM_LIMIT - k.static_smem)


def load_kernel(cubin: bytes, name: str, *, device, key: str, dynamic_smem: int = 0) -> LoadedKernel:
    """Load kernel ``name`` from ``cubin`` for ``device``, cached in process by ``(device, key, name)``.

    ``key`` identifies the cubin (e.g. its nvrtc_cache key): the cache trusts it
    and does not hash ``cubin``. ``dynamic_smem`` is the most dynamic shared
    memory launches will request; above 48 KiB the kernel is opted in, and more
    than the device allows raises ``ValueError``. A later call asking for more than
    an earlier one raises the limit.
    """
    dev_id = _device_id(device)
    dynamic_smem = int(dynamic_smem)
    if dynamic_smem < 0:
        raise ValueError(f"dynamic_smem must be >= 0, got {dynamic_smem}")
    ck = (dev_id, key, name)
    k = _cache.get(ck)
    if k is not None and dynamic_smem <= k.max_dynamic_smem:
        return k
    with _lock:
        k = _cache.get(ck)
        if k is None:
            k = _load(cubin, name, dev_id, key)
            _unlock_smem(k, dynamic_smem)
            _cache[ck] = k
        elif dynamic_smem > k.max_dynamic_smem:
            _unlock_smem(k, dynamic_smem)
    return k


def _load(cubin: bytes, name: str, dev_id: int, key: str) -> LoadedKernel:
    from cuda.core import ObjectCode

    get_device(dev_id)
    object_code = ObjectCode.from_cubin(cubin)
    kernel = object_code.get_kernel(name)
    handle = kernel.handle  # cuda.core 1.x: a driver.CUkernel (context-independent library kernel)
    if not isinstance(handle, (driver.CUkernel, driver.CUfunction)):
        handle = driver.CUkernel(int(handle))
    k = LoadedKernel(driver.CUfunction(int(handle)), handle, name, dev_id, key, kernel, object_code)
    attr = driver.CUfunction_attribute
    k.static_smem = _get_attr(k, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "SHARED_SIZE_BYTES")
    k.num_regs = _get_attr(k, attr.CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS")
    k.smem_limit = DEFAULT_SMEM_LIMIT - k.static_smem
    return k


def clear_cache() -> None:
    """Forget loaded kernels (tests; the libraries unload once nothing else holds them)."""
    with _lock:
        _cache.clear()


ArgPointers = ctypes.c_void_p * 1  # the kernel-argument array: one pointer, to the params struct
_cuLaunchKernel = driver.cuLaunchKernel


def launch(
    kernel: LoadedKernel,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    stream_handle: int,
    params: ctypes.Structure,
) -> None:
    """Launch ``kernel`` with its single by-value struct argument ``params`` on ``stream_handle``.

    Asynchronous. ``grid`` is checked against the hardware limits (x < 2**31,
    y and z <= 65535) and ``shared_mem`` against what :func:`load_kernel` unlocked,
    both raising ``ValueError``; launch failures raise :class:`CudaError` with the
    driver's error name. The stream decides the context the kernel runs in; for
    the NULL stream (0) the kernel's device must be current (:func:`get_device`).
    """
    if _recording.active:
        rec = _recording.current()
        if rec is not None:  # a recorded call (`_calls.replay`): remember the launch instead
            rec.launch(kernel, grid, block, shared_mem, stream_handle, params)
            return
    gx, gy, gz = grid
    if not (0 < gx <= MAX_GRID_X and 0 < gy <= MAX_GRID_YZ and 0 < gz <= MAX_GRID_YZ):
        raise ValueError(
            f"grid {tuple(grid)} for kernel {kernel.name!r} is out of range: each dimension must be >= 1, "
            f"x <= {MAX_GRID_X}, y and z <= {MAX_GRID_YZ}"
        )
    if shared_mem > kernel.smem_limit:
        raise ValueError(
            f"launch of {kernel.name!r} asks for {shared_mem} B of dynamic shared memory; "
            f"load_kernel unlocked {kernel.smem_limit} B (pass dynamic_smem= to load_kernel)"
        )
    bx, by, bz = block
    argv = ArgPointers(ctypes.addressof(params))
    err = _cuLaunchKernel(
        kernel.function, gx, gy, gz, bx, by, bz, shared_mem, stream_handle, ctypes.addressof(argv), 0
    )[0]
    if err:
        check(err, f"cuLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)}, smem={shared_mem})")


def launch_prepared(args: tuple, stream_handle: int, argv: int, name: str) -> None:
    """Launch from arguments prepared and checked once (`_calls.replay`): ``args`` = (function, grid x, y,
    z, block x, y, z, shared memory), ``argv`` the address of a ``void*[1]`` pointing at the params
    block. No recording hook and no range checks: the warm call path."""
    err = _cuLaunchKernel(*args, stream_handle, argv, 0)[0]
    if err:
        check(err, f"cuLaunchKernel({name}, grid={args[1:4]}, block={args[4:7]}, smem={args[7]})")


# ---------------------------------------------------------------------- events and sync


class Event:
    """A timing-enabled CUDA event (destroyed with the object), made in the context of the stream
    it will be recorded on, ``stream_handle`` (an event of another context is an invalid handle
    there, and a public call gives the thread back its own context), else in the current one."""

    __slots__ = ("handle",)

    def __init__(self, stream_handle: int | None = None):
        self.handle = None
        ctx = None
        if stream_handle is not None and stream_handle not in (0, 1, 2):  # 0-2: the current context's
            ctx = check(driver.cuStreamGetCtx(stream_handle), "cuStreamGetCtx")
            if int(ctx) == int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")):
                ctx = None
        if ctx is None:
            self.handle = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
            return
        check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            self.handle = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")
        finally:
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def record(self, stream_handle: int) -> Event:
        check(driver.cuEventRecord(self.handle, stream_handle), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        check(driver.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def __del__(self):
        h, self.handle = self.handle, None
        if h is not None:
            try:
                driver.cuEventDestroy(h)
            except Exception:  # interpreter shutdown
                pass


def record_event(stream_handle: int, *, device=None) -> Event:
    """A new timing event recorded on ``stream_handle`` (``device`` made current first if given)."""
    if device is not None:
        get_device(device)
    return Event(stream_handle).record(stream_handle)


def elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events; waits for ``end`` to complete."""
    end.synchronize()
    return float(check(driver.cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime"))


@restores_caller_context
def time_ms(fn, stream=None, *, device=None) -> float:
    """GPU time of the work ``fn()`` queues on ``stream`` (anything :func:`~cudattn._runtime.stream.as_stream` takes).

    Events recorded before and after ``fn()`` on the stream; waits for the end.
    """
    dev = get_device(device)
    h = as_stream(stream, dev.device_id).handle
    start, end = Event(h), Event(h)
    start.record(h)
    fn()
    end.record(h)
    return elapsed_ms(start, end)


def synchronize(stream=None) -> None:
    """Block the host until all work queued on ``stream`` is done.

    ``stream``: an int handle, or anything :func:`~cudattn._runtime.stream.as_stream` takes;
    ``None`` is cudattn's own stream for the current device. Note that ``0`` (the
    legacy default stream) does *not* wait for cudattn's stream, which is non-blocking.
    """
    if type(stream) is not int:
        stream = as_stream(stream, get_device().device_id).handle
    check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")

