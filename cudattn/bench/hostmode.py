"""The NumPy user's real speed: ``attention(numpy...)`` end to end, transfers included.

Each case runs with ordinary (pageable) NumPy arrays, and with q, k, v and ``out`` in pinned
memory (:func:`cudattn.empty_pinned`: DMA straight from and into them, no staging copy).
Compared with the bytes-moved floor: inputs over the link at the pinned host->device bandwidth
plus the output back at the pinned device->host bandwidth, both measured in the same run. The
floor assumes the two directions do not overlap each other; a pipelined call can only approach
it, since the kernel needs inputs before it makes output.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .. import attention, empty_pinned
from . import check, inputs
from .grids import Case
from .timing import percentile


MEMORY = ("pageable", "pinned")


def _pinned_copy(a: np.ndarray) -> np.ndarray:
    p = empty_pinned(a.shape, a.dtype)
    p[...] = a
    return p


def run_host_case(case: Case, s, *, memory: str = "pageable", iters: int = 5, warmup: int = 2) -> dict:
    q, k, v = inputs.host_inputs(case, s.rng)
    out = None
    if memory == "pinned":  # the caller's arrays live in pinned memory, the result lands in one too
        q, k, v = (_pinned_copy(x) for x in (q, k, v))
        out = empty_pinned(q.shape, q.dtype)
    elif memory != "pageable":
        raise ValueError(f"memory must be one of {MEMORY}, not {memory!r}")
    given = out
    for _ in range(warmup):
        out = attention(q, k, v, causal=case.causal, out=given)
    wall = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = attention(q, k, v, causal=case.causal, out=given)
        wall.append((time.perf_counter() - t0) * 1e3)
    bytes_in = q.nbytes + k.nbytes + v.nbytes
    bytes_out = out.nbytes
    c = s.ceilings
    floor_ms = bytes_in / c["h2d_gbps"] / 1e6 + bytes_out / c["d2h_gbps"] / 1e6
    med = statistics.median(wall)
    return {"case": case.as_dict(), "label": case.label(), "memory": memory, "median_ms": med, "p90_ms": percentile(wall, 90),
            "samples": iters, "bytes_in": bytes_in, "bytes_out": bytes_out, "gbps": (bytes_in + bytes_out) / med / 1e6,
            "floor_ms": floor_ms, "fraction_of_floor": floor_ms / med,
            "check": check.check_output(case, q, k, v, out, s.rng)}
