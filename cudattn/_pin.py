"""Page-locking a caller's host memory in place for the length of one NumPy-path call.

A DMA cannot read pageable memory: the pinned staging pool (`_transfer`) first copies the bytes
into pinned chunks on a few threads, and that host copy is the NumPy path's slowest stage.
``cuMemHostRegister`` instead page-locks the caller's own pages, so the DMA reads them where they
are and no host copy happens. On the H100 machine, registering 64 MiB of an input took about
1.1-1.7 ms and unregistering it about 1.1-1.5 ms, on one core (registrations from several
threads did not run faster), against 2.7 ms to copy it into staging on four cores; and the
registration leaves the memory bandwidth to the DMA.

Registration can fail (read-only pages, a range already registered by someone else, limits on
locked memory); the caller then stages that range as before, so a failure costs speed, never
correctness. A range that is already page-locked is staged too: its owner could unregister it
while our DMA is in flight. Registered ranges are released in groups, each once the event sealed
after its DMAs has completed, and all of them before the call returns (also on errors): a
caller's memory never stays locked after cudattn returns it.

``CUDATTN_HOST_REGISTER=0`` turns this off (every range is staged).
"""

from __future__ import annotations

import os

from cuda.bindings import driver

from ._errors import check

__all__ = ["InPlace", "PIN_MIN", "enabled"]

#: Ranges smaller than this are staged: registration has a fixed cost per call.
PIN_MIN = 1 << 20

_enabled = os.environ.get("CUDATTN_HOST_REGISTER", "1") != "0"


def enabled() -> bool:
    return _enabled


class InPlace:
    """Host ranges page-locked for one call, released group by group.

    ``pin(ptr, nbytes)`` registers a range (True) or declines (False: stage it). ``seal(stream)``
    records an event on ``stream`` after the DMAs that read the ranges pinned since the last seal;
    ``release(keep)`` unregisters every sealed group but the newest ``keep``, waiting for each
    group's event first; ``close()`` (after the streams are idle or synchronised) releases
    everything. Used by one thread.
    """

    def __init__(self) -> None:
        self._open: list[int] = []  # pinned since the last seal
        self._sealed: list[tuple[object, list[int]]] = []  # (event, pointers), oldest first
        self._held: dict[int, int] = {}  # every range locked now: start -> bytes

    def pin(self, ptr: int, nbytes: int) -> bool:
        if not _enabled or nbytes < PIN_MIN:
            return False
        if self._held.get(ptr) == nbytes:
            # the same range again (one array passed as both k and v): it stays locked until the
            # group holding it is released, which comes after this use's seal only if it was open
            if ptr in self._open:
                return True
            return False
        (err,) = driver.cuMemHostRegister(ptr, nbytes, 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False  # not sticky: the range is staged instead
        self._open.append(ptr)
        self._held[ptr] = nbytes
        return True

    def seal(self, stream: int) -> None:
        if not self._open:
            return
        ev = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate(pin)")
        group = (ev, self._open)
        self._open = []
        self._sealed.append(group)
        check(driver.cuEventRecord(ev, stream), "cuEventRecord(pin)")

    def release(self, keep: int = 0) -> None:
        while len(self._sealed) > keep:
            ev, ptrs = self._sealed[0]
            check(driver.cuEventSynchronize(ev), "cuEventSynchronize(pin)")
            self._sealed.pop(0)
            driver.cuEventDestroy(ev)
            for p in ptrs:
                del self._held[p]
            self._unregister(ptrs)

    def close(self) -> None:
        """Release every range left, unchecked: for error paths, where the DMAs reading them are
        finished or abandoned (their streams synchronised) and the error being raised is the one
        to report. A no-op after ``release()`` of everything sealed, with nothing pinned since."""
        groups, self._sealed = self._sealed, []
        groups.append((None, self._open))
        self._open = []
        self._held.clear()
        for ev, ptrs in groups:
            if ev is not None:
                driver.cuEventSynchronize(ev)
                driver.cuEventDestroy(ev)
            for p in ptrs:
                driver.cuMemHostUnregister(p)

    @staticmethod
    def _unregister(ptrs: list[int]) -> None:
        # every range is tried, then the first failure raised: one bad range leaves none locked
        errors = [err for err in (driver.cuMemHostUnregister(p)[0] for p in ptrs) if err != 0]
        if errors:
            check(errors[0], "cuMemHostUnregister")
