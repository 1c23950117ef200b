"""A kernel that holds a stream for a given time: work queued behind it is timed on the GPU alone.

While it spins, the host queues the timed calls; the events around them then measure GPU time,
not the host's launch overhead (measured on its own, as host time per call).
"""

from __future__ import annotations

import ctypes
import functools

from . import device as _device
from . import launch as _launch

_SOURCE = r"""
extern "C" __global__ void cudattn_bench_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


class _Params(ctypes.Structure):
    _fields_ = [("ns", ctypes.c_uint64)]


@functools.lru_cache(maxsize=None)
def _kernel(device_id: int):
    import nvrtc_cache

    arch = _device.device_properties(device_id).arch
    res = nvrtc_cache.compile(_SOURCE, name="bench_spin.cu", options=[], arch=arch)
    return _launch.load_kernel(res.cubin, "cudattn_bench_spin", device=device_id, key=res.key)


def spin(stream_handle: int, ms: float, device_id: int) -> None:
    """Queue a kernel that keeps ``stream_handle`` busy for ``ms`` milliseconds."""
    _launch.launch(_kernel(device_id), (1, 1, 1), (1, 1, 1), 0, stream_handle, _Params(int(ms * 1e6)))
