"""Load: host threads, each with its own stream, calling a pool of problems many times.

Every result is checked (`_pool`): the first of each problem against the reference, the rest
bit for bit against it. Each thread first takes its share of the pool in a fixed order (so
every problem runs at least once when threads x calls >= pool size), then picks at random, so
threads both share problems at the same time and run different ones side by side.

``cold=True`` empties the kernel cache first (`_coldcache`): the threads then race on the first
compile and load of every kernel (`_kernels.get_kernel` compiles under one process-wide lock, so
the others wait: they must neither deadlock nor see a half-loaded kernel). A watchdog in the calling thread prints progress and, when a
thread makes no progress for ``stall_s``, prints its stack and gives up on the run (the worker
threads are daemons, so a hung one cannot keep the process alive).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from cudattn._runtime import device as _device
from cudattn._runtime import stream as _stream

from . import _coldcache, _exec, _pool
from ._cases import load_cases
from ._counter import LaunchCounter


@dataclass
class _State:
    threads: int
    calls: int
    done: list = field(default_factory=list)  # calls finished, per thread
    last: list = field(default_factory=list)  # monotonic time of the last finished call, per thread
    current: list = field(default_factory=list)  # problem in progress, per thread
    mismatches: list = field(default_factory=list)  # (thread, call, problem, what differs)
    errors: list = field(default_factory=list)  # (thread, call, problem, exception text)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        now = time.monotonic()
        self.done = [0] * self.threads
        self.last = [now] * self.threads
        self.current = [None] * self.threads


def schedule(thread: int, threads: int, calls: int, pool_size: int, seed: int) -> list[int]:
    """The problems thread ``thread`` calls: its share of a fixed order first (together, the
    threads cover the pool once), then random picks."""
    order = np.random.default_rng(seed).permutation(pool_size)
    first = [int(order[i]) for i in range(thread, pool_size, threads)][:calls]
    rng = np.random.default_rng(seed + 1 + thread)
    return first + [int(x) for x in rng.integers(0, pool_size, calls - len(first))]


def _worker(t: int, pool: list, plan: list[int], st: _State) -> None:
    from cuda.core import StreamOptions

    stream = _device.get_device(0).create_stream(options=StreamOptions(nonblocking=True))
    for i, j in enumerate(plan):
        p = pool[j]
        st.current[t] = p.case.name
        try:
            got = _exec.fetch(_exec.call(p.prepared(t), stream), stream)
            diff = p.record(t, got)
            if diff:
                with st.lock:
                    st.mismatches.append((t, i, p.case.name, diff))
        except Exception as e:  # noqa: BLE001  every failure is reported; the thread goes on
            with st.lock:
                st.errors.append((t, i, p.case.name, f"{type(e).__name__}: {e}"))
        st.done[t] = i + 1
        st.last[t] = time.monotonic()
    st.current[t] = None
    stream.sync()


@dataclass
class LoadResult:
    threads: int
    calls: int
    completed: int
    problems: int
    checked: int
    wall_s: float
    cold: bool
    compiles: int | None
    cache_entries: int | None
    mismatches: list
    errors: list
    failed_checks: list
    stuck: list  # (thread, problem, seconds without progress, stack)
    launches: dict

    @property
    def ok(self) -> bool:
        return (self.completed == self.threads * self.calls and not self.mismatches and not self.errors
                and not self.failed_checks and not self.stuck)

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["ok"] = self.ok
        return d


def run_load(*, threads: int = 8, calls: int = 1000, problems: int = 40, cold: bool = False, seed: int = 0,
             stall_s: float = 120.0, out=print) -> LoadResult:
    arch = _device.device_properties(0).arch
    cases = _pool.runnable(load_cases(problems, seed), arch)
    main_stream = _stream.default_stream(0)
    pool = _pool.build(cases, threads, main_stream)
    main_stream.sync()  # the uploads are done before other streams read them
    plans = [schedule(t, threads, calls, len(pool), seed) for t in range(threads)]
    st = _State(threads, calls)
    cache_dir = tempfile.mkdtemp(prefix="cudattn-load-cache-") if cold else None
    out(f"load: {threads} threads x {calls} calls over {len(pool)} problems"
        + (f", cold kernel cache in {cache_dir}" if cold else ""))
    compiles = entries = None
    with LaunchCounter() as counter:
        ctx = _coldcache.cold_cache(cache_dir) if cold else contextlib.nullcontext()
        with ctx as cache:
            t0 = time.perf_counter()
            workers = [threading.Thread(target=_worker, args=(t, pool, plans[t], st), name=f"load-{t}", daemon=True)
                       for t in range(threads)]
            for w in workers:
                w.start()
            stuck = _watch(workers, st, stall_s, out)
            wall = time.perf_counter() - t0
            if cold:
                compiles, entries = cache.nvrtc_compiles, len(list(cache.entries()))
        launches = dict(sorted(counter.snapshot().items()))
    if cold and not stuck:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return LoadResult(threads, calls, sum(st.done), len(pool), len(pool) - len(_pool.unchecked(pool)), wall, cold,
                      compiles, entries, st.mismatches, st.errors, _pool.failed(pool), stuck, launches)


def _watch(workers, st: _State, stall_s: float, out) -> list:
    """Wait for the workers, printing progress every few seconds; the stuck ones if any stall."""
    total = st.threads * st.calls
    next_print = time.monotonic() + 5
    while any(w.is_alive() for w in workers):
        for w in workers:
            w.join(timeout=0.2)
        now = time.monotonic()
        stuck = [t for t, w in enumerate(workers) if w.is_alive() and now - st.last[t] > stall_s]
        if stuck:
            frames = sys._current_frames()
            return [(t, st.current[t], round(now - st.last[t], 1),
                     "".join(traceback.format_stack(frames[workers[t].ident])) if workers[t].ident in frames else "")
                    for t in stuck]
        if now >= next_print:
            out(f"  {sum(st.done)}/{total} calls, {len(st.mismatches)} mismatches, {len(st.errors)} errors")
            next_print = now + 5
    return []


def summary(r: LoadResult) -> str:
    lines = [f"load: {r.threads} threads x {r.calls} calls = {r.completed}/{r.threads * r.calls} calls done in "
             f"{r.wall_s:.1f} s ({r.completed / max(r.wall_s, 1e-9):.0f} calls/s); {r.checked}/{r.problems} problems "
             f"checked against the reference, every later result compared bit for bit"]
    if r.cold:
        lines.append(f"  cold start: {r.compiles} NVRTC compiles, {r.cache_entries} cache entries written")
    per_kernel = ", ".join(f"{k} {n}" for k, n in r.launches.items())
    lines.append(f"  kernel launches: {sum(r.launches.values())} ({per_kernel})")
    for name, detail in r.failed_checks:
        lines.append(f"  WRONG vs reference: {name}: {detail}")
    for t, i, name, diff in r.mismatches[:20]:
        lines.append(f"  MISMATCH thread {t} call {i}: {name}: {diff}")
    for t, i, name, err in r.errors[:20]:
        lines.append(f"  ERROR thread {t} call {i}: {name}: {err}")
    for t, name, secs, stack in r.stuck:
        lines.append(f"  STUCK thread {t} for {secs} s in {name}:\n{stack}")
    lines.append(f"load: {'PASS' if r.ok else 'FAIL'} ({len(r.mismatches)} mismatches, {len(r.errors)} errors, "
                 f"{len(r.failed_checks)} wrong, {len(r.stuck)} stuck)")
    return "\n".join(lines)

