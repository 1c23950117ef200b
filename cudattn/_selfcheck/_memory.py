"""Memory figures for leak checks: the device (``cuMemGetInfo``), cudattn's pool, host RSS.

cudattn allocates from the device's cuda.core memory pool (`_arrays.array.empty_on`), which keeps
freed memory reserved for reuse. `settle` lets stream-ordered frees land and gives the pool's
unused memory back (``cudattn.empty_cache``), so that ``cuMemGetInfo`` sees live allocations.
"""

from __future__ import annotations

import gc
import resource
from dataclasses import asdict, dataclass

from cuda.bindings import driver

import cudattn
from cudattn._runtime import device as _device
from cudattn._runtime.errors import check


@dataclass(frozen=True)
class Snapshot:
    device_used: int  # bytes in use on the whole device (total - free): other processes count too
    pool_used: int  # bytes of live allocations from cudattn's pool (exact, this process only)
    pool_reserved: int  # bytes the pool holds from the device
    host_rss: int  # this process's resident set (bytes)
    gc_objects: int  # Python objects the garbage collector tracks

    def as_dict(self) -> dict:
        return asdict(self)


def _pool(device_id: int):
    return _device.get_device(device_id).memory_resource


def settle(device_id: int = 0) -> None:
    """Collect garbage (frees queue stream-ordered), wait for the device, empty the pool's cache."""
    gc.collect()
    cudattn.empty_cache(device_id)


def host_rss() -> int:
    """Current resident set size from /proc (Linux); elsewhere the peak from getrusage."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def snapshot(device_id: int = 0) -> Snapshot:
    """`settle`, then read every figure."""
    settle(device_id)
    free, total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
    attrs = _pool(device_id).attributes
    return Snapshot(int(total) - int(free), int(attrs.used_mem_current), int(attrs.reserved_mem_current), host_rss(),
                    len(gc.get_objects()))


def mib(n: int) -> float:
    return n / 2**20
