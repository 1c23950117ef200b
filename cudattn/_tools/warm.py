"""Compile every kernel the API can launch on an arch into the disk cache, in parallel processes.

NVRTC compiles one kernel on one core, and a cudattn build has dozens of kernels, so the
warm-up spreads the missing ones over a pool of processes (the disk cache is already safe
across processes: atomic writes, one entry per key). The parent first asks the cache which
kernels are missing, so a warm cache costs no process start. Workers are spawned, not forked:
the parent may have initialised CUDA, and a forked child of such a process must not touch it.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import nvrtc_cache

from .._kernels import registry as _kernels
from .._kernels import catalog as _catalog

__all__ = ["WarmReport", "default_jobs", "warm"]


@dataclass
class WarmReport:
    arch: str
    kernels: int  # distinct builds for this arch
    compiled: int = 0  # compiled now
    cached: int = 0  # found in the cache
    failed: list[tuple[str, str]] = field(default_factory=list)  # (kernel, error)
    jobs: int = 1  # processes used for the compiles
    seconds: float = 0.0
    compile_seconds: float = 0.0  # sum over the compiles: what one process would have taken

    def summary(self) -> str:
        text = (f"{self.kernels} kernels for {self.arch}: {self.compiled} compiled, {self.cached} already cached, "
                f"{len(self.failed)} failed, in {self.seconds:.1f} s")
        if self.compiled:
            text += f" ({self.jobs} processes; {self.compile_seconds:.1f} s of compiling)"
        return text


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cost(spec) -> int:
    """A rough compile cost, to start the slow builds first: Hopper > portable > decode > helpers."""
    rank = {"sm90": 3, "sm80": 2, "decode": 1}.get(spec.family, 0)
    return rank * 1000 + getattr(spec, "tile_dim", 0)


_worker_caches: dict[str, nvrtc_cache.Cache] = {}


def _compile_in_worker(spec, arch: str, cache_dir: str) -> tuple[str, float]:
    cache = _worker_caches.get(cache_dir)
    if cache is None:
        cache = _worker_caches[cache_dir] = nvrtc_cache.Cache(cache_dir)
    return _compile_one(spec, arch, cache)


def _compile_one(spec, arch: str, cache: nvrtc_cache.Cache) -> tuple[str, float]:
    """Compile (or find) one kernel; returns where it came from and the seconds."""
    t0 = time.perf_counter()
    res = _kernels.compile_variant(spec, arch, cache=cache)
    return res.source, time.perf_counter() - t0


class _Progress:
    """A bar on a terminal; one plain line per kernel otherwise (logs, CI)."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            width = 30
            filled = width * self.done // self.total
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label[:60]:<60}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done}/{self.total}] {label}\n")
        self.stream.flush()


def warm(arch: str | Sequence[str], *, jobs: int | None = None, cache: nvrtc_cache.Cache | None = None,
         progress: bool = True) -> WarmReport:
    """Compile every kernel :func:`cudattn._kernels.catalog.all_kernels` lists for ``arch`` (one
    compile target or several, sharing one pool), the ring's accumulators included, into ``cache``
    (default: the default cache) with ``jobs`` processes (default: the CPUs available). A kernel
    that fails to compile is reported in the result, and the others still compile."""
    t0 = time.perf_counter()
    cache = cache if cache is not None else nvrtc_cache.default_cache()
    archs = [arch] if isinstance(arch, str) else list(arch)
    builds = [(s, a) for a in archs for s in _catalog.all_kernels(a, distributed=True)]
    report = WarmReport(", ".join(archs), len(builds))
    todo = [(s, a) for s, a in builds if _kernels.cached_variant(s, a, cache) is None]
    report.cached = len(builds) - len(todo)
    todo.sort(key=lambda build: _cost(build[0]), reverse=True)
    jobs = max(1, min(jobs or default_jobs(), len(todo) or 1))
    if todo and jobs > 1:
        info = cache.info()
        if not (info["trusted"] and info["writable"]):  # other processes' compiles could not reach us
            jobs = 1
    report.jobs = jobs
    bar = _Progress(len(todo), enabled=progress)

    def finish(spec, outcome: tuple[str, float] | None, error: BaseException | None) -> None:
        if error is not None:
            report.failed.append((spec.describe(), f"{type(error).__name__}: {error}"))
            bar.step(f"{spec.describe()}: FAILED")
            return
        kind, seconds = outcome
        report.compile_seconds += seconds
        if kind == "compiled":
            report.compiled += 1
        else:  # another process compiled it meanwhile
            report.cached += 1
        bar.step(f"{spec.describe()} ({seconds:.1f} s)")

    if jobs == 1:
        for spec, a in todo:
            try:
                outcome = _compile_one(spec, a, cache)
            except Exception as exc:  # noqa: BLE001  (reported, and the others go on)
                finish(spec, None, exc)
            else:
                finish(spec, outcome, None)
    elif todo:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_compile_in_worker, s, a, str(cache.directory)): s for s, a in todo}
            for fut in concurrent.futures.as_completed(futures):
                exc = fut.exception()
                finish(futures[fut], None if exc else fut.result(), exc)
    report.seconds = time.perf_counter() - t0
    return report
