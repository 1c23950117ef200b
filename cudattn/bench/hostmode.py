"""The NumPy user's real speed: ``attention(numpy...)`` end to end, transfers included.

Compared with the bytes-moved floor: inputs over the link at the pinned host->device bandwidth
plus the output back at the pinned device->host bandwidth, both measured in the same run. The
floor assumes the two directions do not overlap each other; a pipelined call can only approach
it, since the kernel needs inputs before it makes output.
"""

from __future__ import annotations

import statistics
import time

from .. import attention
from . import check, inputs
from .grids import Case
from .timing import percentile


def run_host_case(case: Case, s, *, iters: int = 5, warmup: int = 2) -> dict:
    q, k, v = inputs.host_inputs(case, s.rng)
    out = None
    for _ in range(warmup):
        out = attention(q, k, v, causal=case.causal)
    wall = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = attention(q, k, v, causal=case.causal)
        wall.append((time.perf_counter() - t0) * 1e3)
    bytes_in = q.nbytes + k.nbytes + v.nbytes
    bytes_out = out.nbytes
    c = s.ceilings
    floor_ms = bytes_in / c["h2d_gbps"] / 1e6 + bytes_out / c["d2h_gbps"] / 1e6
    med = statistics.median(wall)
    return {"case": case.as_dict(), "label": case.label(), "median_ms": med, "p90_ms": percentile(wall, 90),
            "samples": iters, "bytes_in": bytes_in, "bytes_out": bytes_out, "gbps": (bytes_in + bytes_out) / med / 1e6,
            "floor_ms": floor_ms, "fraction_of_floor": floor_ms / med,
            "check": check.check_output(case, q, k, v, out, s.rng)}
