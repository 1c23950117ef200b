"""`CudaError` and the one checker for cuda.bindings' ``(err, *values)`` results.

Every driver call in cudattn goes through :func:`check`, in the style of
cuda.core's ``handle_return``: on success it hands back the values (``None`` for
none, the value itself for one, a tuple for several); on failure it raises
:class:`CudaError` carrying the driver's error name (``CUDA_ERROR_OUT_OF_MEMORY``)
and the name of the call that failed, so an error report says what failed where.
"""

from __future__ import annotations

__all__ = ["CudaError", "NoDeviceError", "OutOfMemoryError", "check"]


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    Attributes
    ----------
    name : str
        The driver's error name, e.g. ``"CUDA_ERROR_OUT_OF_MEMORY"``.
    code : int
        The numeric ``CUresult``.
    call : str
        What was being done: the driver call, with any detail the caller gave.
    """

    def __init__(self, name: str, code: int, call: str, description: str = "") -> None:
        self.name = name
        self.code = int(code)
        self.call = call
        self.description = description
        msg = f"{call} failed: {name} ({self.code})"
        if description:
            msg += f": {description}"
        super().__init__(msg)

    def __reduce__(self):  # keep the exception picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.name, self.code, self.call, self.description))


class NoDeviceError(CudaError):
    """No usable CUDA GPU: the driver library is missing, it fails to initialise, or it sees no device.

    Raised by the first call that needs the GPU (never at import). The message says what is
    missing and what to run; ``name`` is the driver's error name where the driver answered
    (``CUDA_ERROR_NO_DEVICE``, ``CUDA_ERROR_INSUFFICIENT_DRIVER``), else ``"DRIVER_NOT_FOUND"``.
    """

    def __init__(self, name: str, code: int, call: str, description: str = "") -> None:
        super().__init__(name, code, call, description)
        self.args = (f"no usable CUDA GPU: {description} ({name}). cudattn runs kernels on an NVIDIA GPU with a "
                     f"driver for CUDA 13.0 or newer; compiling them needs neither (python -m cudattn cache warm). "
                     f"Run `python -m cudattn info` to see what cudattn finds.",)


def no_device_error(exc: BaseException | None = None, result=None) -> NoDeviceError:
    """The :class:`NoDeviceError` for a failed ``cuInit``: ``exc`` when the driver library could not
    be loaded at all, ``result`` when the driver answered with an error."""
    if exc is not None:
        return NoDeviceError("DRIVER_NOT_FOUND", -1, "loading libcuda",
                             f"the NVIDIA driver library (libcuda.so.1) was not found [{exc}]")
    name, description = _describe(result)
    return NoDeviceError(name, int(result), "cuInit", description or "the CUDA driver did not initialise")


class OutOfMemoryError(CudaError, MemoryError):
    """A device allocation failed for lack of memory (``CUDA_ERROR_OUT_OF_MEMORY``).

    A :class:`MemoryError` and a :class:`CudaError`, so either ``except`` catches it. Nothing
    stays allocated for the failed call; freeing memory and calling again works.

    Attributes (beyond :class:`CudaError`'s)
    ----------
    nbytes : int
        The size of the allocation that failed, in bytes.
    device_id : int
    free, total : int
        The device's free and total memory in bytes, read just after the failure (-1 if unknown).
    """

    def __init__(self, nbytes: int, device_id: int, free: int = -1, total: int = -1,
                 call: str = "cuMemAllocFromPoolAsync") -> None:
        self.nbytes = int(nbytes)
        self.device_id = int(device_id)
        self.free = int(free)
        self.total = int(total)
        state = f"; {_gib(free)} free of {_gib(total)}" if free >= 0 and total >= 0 else ""
        detail = f"out of device memory allocating {self.nbytes} bytes ({_gib(self.nbytes)}) on device {device_id}{state}"
        super().__init__("CUDA_ERROR_OUT_OF_MEMORY", 2, call, detail)

    def __reduce__(self):
        return (type(self), (self.nbytes, self.device_id, self.free, self.total, self.call))


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _describe(err) -> tuple[str, str]:
    """(name, description) of a failed result; never raises."""
    name = ""
    description = ""
    try:
        from cuda.bindings import driver

        if type(err) is int:  # a bare code (the compiled warm path's entry points return these)
            err = driver.CUresult(err)
        if isinstance(err, driver.CUresult):
            e, s = driver.cuGetErrorName(err)
            if e == 0 and s:
                name = s.decode() if isinstance(s, bytes) else str(s)
            e, s = driver.cuGetErrorString(err)
            if e == 0 and s:
                description = s.decode() if isinstance(s, bytes) else str(s)
    except Exception:  # driver library missing or deinitialised: fall back to the enum's own name
        pass
    if not name:
        name = getattr(err, "name", None) or f"CUresult {int(err)}"
    return name, description


def check(result, what: str):
    """Unwrap a cuda.bindings result ``(err, *values)``; raise :class:`CudaError` on failure.

    ``what`` names the call (``"cuMemAllocAsync"``, or with detail:
    ``"cuLaunchKernel(fill_kernel)"``); it appears in the message.

    Returns ``None`` when the call returns no values, the value when it returns
    one, and the tuple of values otherwise. A bare error code (not a tuple) is
    accepted too.
    """
    if type(result) is tuple:
        err = result[0]
        if err == 0:
            n = len(result)
            if n == 1:
                return None
            if n == 2:
                return result[1]
            return result[1:]
    else:
        err = result
        if err == 0:
            return None
    name, description = _describe(err)
    raise CudaError(name, int(err), what, description)
