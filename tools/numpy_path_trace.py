"""Where a NumPy-path call spends its calling thread's time (GPU machine).

Wraps the stages of `cudattn._numpy.attention` (device allocation, staged uploads and downloads, waits on
staging chunks, kernel launches, validation, result allocation and prefault), runs a warm call a
few times and prints, for the median call, each stage's count and total milliseconds on the
calling thread, then the timeline of the stages that took at least 0.2 ms. The staged host copies
run on helper threads too; they are counted inside the stage that waits for them.

    PYTHONPATH=. python tools/numpy_path_trace.py [B,S,H,D] [--dtype bfloat16|float16] [--calls N]
"""

from __future__ import annotations

import argparse
import functools
import threading
import time

import ml_dtypes
import numpy as np

import cudattn
from cudattn._kernels import attention as _launches
from cudattn._arrays import array as _array
from cudattn._numpy import attention as _host
from cudattn._arrays import staging as _staging
from cudattn._arrays import transfer as _transfer

_events: list[tuple[str, float, float]] = []  # (stage, start, seconds) on the calling thread
_t0 = [0.0]
_main = threading.get_ident()


def _wrap(owner, name: str, label: str) -> None:
    real = getattr(owner, name)

    @functools.wraps(real)
    def timed(*args, **kwargs):
        if threading.get_ident() != _main:
            return real(*args, **kwargs)
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            _events.append((label, t - _t0[0], time.perf_counter() - t))

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?", default="4,4096,16,128", help="B,S,H,D of q, k and v (default %(default)s)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--calls", type=int, default=7, help="timed warm calls (default %(default)s)")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    dtype = ml_dtypes.bfloat16 if a.dtype == "bfloat16" else np.float16

    for owner, name, label in [
        (_array, "empty_on", "device allocation"),
        (_host, "validate", "validation"),
        (_launches, "run_device", "kernel launch"),
        (_staging, "prefault", "prefault (submit)"),
        (_transfer._Staging, "h2d", "upload (host copy into staging)"),
        (_transfer._Staging, "d2h", "download (queue)"),
        (_transfer._Staging, "_settle", "staging chunk wait (+ copy out)"),
        (_transfer._Staging, "flush", "final downloads"),
        (np, "empty", "np.empty"),
    ]:
        _wrap(owner, name, label)

    rng = np.random.default_rng(0)
    qkv = [rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(3)]
    cudattn.attention(*qkv)
    cudattn.attention(*qkv)
    runs = []
    for _ in range(max(1, a.calls)):
        _events.clear()
        _t0[0] = time.perf_counter()
        cudattn.attention(*qkv)
        runs.append(((time.perf_counter() - _t0[0]) * 1e3, list(_events)))
    runs.sort(key=lambda r: r[0])
    total, events = runs[len(runs) // 2]
    moved = 4 * qkv[0].nbytes
    print(f"{shape} {a.dtype}: median call {total:.2f} ms, {moved / total / 1e6:.1f} GB/s end to end "
          f"(calls: {' '.join(f'{r[0]:.1f}' for r in runs)} ms)")
    totals: dict[str, tuple[int, float]] = {}
    for label, _, secs in events:
        n, s = totals.get(label, (0, 0.0))
        totals[label] = (n + 1, s + secs)
    for label, (n, s) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {label:34s} x{n:<4d} {s * 1e3:7.2f} ms")
    print("  timeline (start +duration, ms):")
    print("  " + "; ".join(f"{label} @{start * 1e3:.1f}+{secs * 1e3:.1f}"
                           for label, start, secs in events if secs >= 2e-4))


if __name__ == "__main__":
    main()
