"""GPU time of a call, with CUDA events, the launches queued behind a spin kernel.

The host enqueues all timed calls while a spin kernel holds the stream, so each event pair
measures GPU time alone, not the host's launch overhead (that is measured separately, as host
overhead). Median and 90th percentile over the timed calls, after warm-up calls.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .._runtime import device as _device
from .._runtime import launch as _launch
from .._runtime.device import restores_caller_context
from .._runtime.spin import spin


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p90_ms: float
    samples: int

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "p90_ms": self.p90_ms, "samples": self.samples}


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] (NumPy's default method)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@restores_caller_context
def gpu_time(fn, stream_handle: int, device_id: int, *, iters: int = 30, warmup: int = 5,
             host_us_per_call: float = 300.0) -> Timing:
    """Time ``fn(i)`` (which queues work on ``stream_handle``) for i = 0..iters-1.

    ``host_us_per_call`` bounds the host time to enqueue one call; the spin kernel covers
    ``iters`` of them so the GPU never waits for the host inside the timed region.
    """
    for i in range(warmup):
        fn(i)
    _device.get_device(device_id)  # the events belong to the stream's device
    _launch.synchronize(stream_handle)
    events = [(_launch.Event(stream_handle), _launch.Event(stream_handle)) for _ in range(iters)]
    spin(stream_handle, min(500.0, max(5.0, iters * host_us_per_call / 1e3)), device_id)
    for i, (start, end) in enumerate(events):
        start.record(stream_handle)
        fn(i)
        end.record(stream_handle)
    _launch.synchronize(stream_handle)
    ms = [_launch.elapsed_ms(s, e) for s, e in events]
    return Timing(statistics.median(ms), percentile(ms, 90), len(ms))
