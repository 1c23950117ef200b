"""Soak: many calls in one thread over the load mix, every result checked (`_pool`), with memory
read before (after a warm-up call of each problem) and after.

What may grow, and so the limits:

- cudattn's pool, bytes of live allocations: nothing. Every array a call makes is dropped and
  freed stream-ordered; after `_memory.settle` the pool's in-use figure is exact, so the limit
  is 0 bytes: one leaked buffer of any size fails.
- the device as a whole (``cuMemGetInfo``, after trimming the pool): allocations outside the
  pool (driver modules, events, streams, a stray ``cuMemAlloc``). Every kernel is loaded during
  the warm-up and the driver maps memory in 2 MiB pages, so an honest run changes by a few
  pages at most; the slack is 16 MiB (8 pages). The figure is device-wide: run the soak alone
  on the GPU, or another process's allocations count against it.
- host RSS: allocator arenas and bounded caches (plans, TMA descriptors) settle after the
  warm-up but may keep freed memory; 64 MiB of slack catches a per-call leak of a few KiB over
  10000 calls, not allocator noise. Python's tracked-object count is reported, not judged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cudattn._runtime import device as _device
from cudattn._runtime import stream as _stream

from . import _exec, _memory, _pool
from ._cases import load_cases
from ._counter import LaunchCounter

DEVICE_SLACK_MIB = 16
RSS_SLACK_MIB = 64


@dataclass
class SoakResult:
    calls: int
    problems: int
    wall_s: float
    before: _memory.Snapshot
    after: _memory.Snapshot
    mismatches: list
    errors: list
    failed_checks: list
    launches: dict
    device_slack_mib: float
    rss_slack_mib: float

    @property
    def growth(self) -> dict:
        b, a = self.before.as_dict(), self.after.as_dict()
        return {k: a[k] - b[k] for k in b}

    @property
    def problems_found(self) -> list[str]:
        g = self.growth
        found = []
        if g["pool_used"] != 0:
            found.append(f"cudattn's pool holds {g['pool_used']} B more in live allocations (must be 0)")
        if _memory.mib(g["device_used"]) > self.device_slack_mib:
            found.append(f"device memory in use grew {_memory.mib(g['device_used']):.1f} MiB "
                         f"(slack {self.device_slack_mib} MiB)")
        if _memory.mib(g["host_rss"]) > self.rss_slack_mib:
            found.append(f"host RSS grew {_memory.mib(g['host_rss']):.1f} MiB (slack {self.rss_slack_mib} MiB)")
        found += [f"WRONG vs reference: {n}: {d}" for n, d in self.failed_checks]
        found += [f"MISMATCH call {i}: {n}: {d}" for i, n, d in self.mismatches[:20]]
        found += [f"ERROR call {i}: {n}: {e}" for i, n, e in self.errors[:20]]
        return found

    @property
    def ok(self) -> bool:
        return not self.problems_found

    def as_dict(self) -> dict:
        return {"ok": self.ok, "calls": self.calls, "problems": self.problems, "wall_s": self.wall_s,
                "before": self.before.as_dict(), "after": self.after.as_dict(), "growth": self.growth,
                "device_slack_mib": self.device_slack_mib, "rss_slack_mib": self.rss_slack_mib,
                "mismatches": self.mismatches, "errors": self.errors, "failed_checks": self.failed_checks,
                "launches": self.launches, "problems_found": self.problems_found}


def run_soak(n: int = 10000, *, problems: int = 40, seed: int = 0, device_slack_mib: float = DEVICE_SLACK_MIB,
             rss_slack_mib: float = RSS_SLACK_MIB, out=print) -> SoakResult:
    arch = _device.device_properties(0).arch
    stream = _stream.default_stream(0)
    pool = _pool.build(_pool.runnable(load_cases(problems, seed), arch), 1, stream)
    mismatches, errors = [], []

    def one(i: int, p: _pool.Problem) -> None:
        try:
            diff = p.record(0, _exec.fetch(_exec.call(p.prepared(0), stream), stream))
            if diff:
                mismatches.append((i, p.case.name, diff))
        except Exception as e:  # noqa: BLE001  reported; the soak goes on
            errors.append((i, p.case.name, f"{type(e).__name__}: {e}"))

    with LaunchCounter() as counter:
        for p in pool:  # warm-up: compile and load every kernel, check each first result
            one(-1, p)
        before = _memory.snapshot()
        out(f"soak: {n} calls over {len(pool)} problems; after the warm-up: " + _describe(before))
        order = np.random.default_rng(seed + 99).integers(0, len(pool), n)
        t0 = time.perf_counter()
        step = max(1, n // 10)
        for i, j in enumerate(order):
            one(i, pool[int(j)])
            if (i + 1) % step == 0:
                out(f"  {i + 1}/{n} calls, {len(mismatches)} mismatches, {len(errors)} errors, "
                    f"host RSS {_memory.mib(_memory.host_rss()):.0f} MiB")
        wall = time.perf_counter() - t0
        after = _memory.snapshot()
        launches = dict(sorted(counter.snapshot().items()))
    return SoakResult(n, len(pool), wall, before, after, mismatches, errors, _pool.failed(pool), launches,
                      device_slack_mib, rss_slack_mib)


def _describe(s: _memory.Snapshot) -> str:
    m = _memory.mib
    return (f"device {m(s.device_used):.1f} MiB in use, cudattn pool {m(s.pool_used):.2f} MiB live / "
            f"{m(s.pool_reserved):.2f} MiB reserved, host RSS {m(s.host_rss):.1f} MiB, {s.gc_objects} Python objects")


def summary(r: SoakResult) -> str:
    from ._report import table

    m = _memory.mib
    g = r.growth
    rows = [["device in use (MiB)", m(r.before.device_used), m(r.after.device_used), m(g["device_used"])],
            ["cudattn pool live (B)", r.before.pool_used, r.after.pool_used, g["pool_used"]],
            ["cudattn pool reserved (MiB)", m(r.before.pool_reserved), m(r.after.pool_reserved), m(g["pool_reserved"])],
            ["host RSS (MiB)", m(r.before.host_rss), m(r.after.host_rss), m(g["host_rss"])],
            ["Python objects", r.before.gc_objects, r.after.gc_objects, g["gc_objects"]]]
    lines = [f"soak: {r.calls} calls over {r.problems} problems in {r.wall_s:.1f} s "
             f"({r.calls / max(r.wall_s, 1e-9):.0f} calls/s), {sum(r.launches.values())} kernel launches",
             table(["memory", "before", "after", "change"], rows)]
    lines += [f"  {p}" for p in r.problems_found]
    lines.append(f"soak: {'PASS' if r.ok else 'FAIL'}")
    return "\n".join(lines)
