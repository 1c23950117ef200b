"""Cold processes: N fresh interpreters (spawned) on one empty cache directory, released together
by a barrier once each has initialised CUDA and uploaded its inputs, so that they compile and
write the same kernels at the same moment. Each runs the same two calls (a prefill and a
split-KV decode, two kernels) and checks them against the reference.

Afterwards the directory must hold exactly the kernels the processes loaded, every entry valid
(checksum), and no stray file (a temp file left by a writer). Processes that compile the same
key at once each write it (nvrtc_cache's atomic replace makes that safe); how many compiled is
reported.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass

from ._cases import Case

CALLS = (Case("attention", "bfloat16", 2, 203, 203, 4, 2, 128, causal=True, tag="cold-procs"),
         Case("attention", "float16", 2, 3, 511, 8, 2, 128, causal=True, num_splits=3, tag="cold-procs"))


def _child(index: int, cache_dir: str, barrier, results) -> None:
    """One process: set up, wait at the barrier, compile and run, report (never raises)."""
    os.environ["CUDATTN_CACHE_DIR"] = cache_dir
    report = {"index": index, "ok": False, "detail": "", "keys": [], "compiles": 0, "seconds": 0.0}
    try:
        import nvrtc_cache

        from cudattn._runtime import device as _device
        from cudattn._runtime import stream as _stream

        from . import _check, _coldcache, _exec
        from ._inputs import make_inputs

        _device.device_properties(0)  # cuInit, the primary context
        preps = [_exec.prepare(c, make_inputs(c)) for c in CALLS]
        _stream.default_stream(0).sync()
        barrier.wait()
        t0 = time.perf_counter()
        verdicts = []
        for p in preps:
            got = _exec.fetch(_exec.call(p))
            verdicts.append(_check.check(p.case, p.ref, got, p.block_n))
        report.update(seconds=time.perf_counter() - t0, ok=all(v.ok for v in verdicts),
                      detail="; ".join(v.detail for v in verdicts), keys=sorted(_coldcache.loaded_keys()),
                      compiles=nvrtc_cache.default_cache().nvrtc_compiles)
    except Exception as e:  # noqa: BLE001  the parent reports it
        report["detail"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        barrier.abort()  # the others (and the parent) stop waiting instead of timing out
    results.put(report)


@dataclass
class ColdProcsResult:
    procs: int
    reports: list
    missing: list  # indices that reported nothing (hung or died)
    cache_keys: list
    expected_keys: list
    stray: list
    wall_s: float
    cache_dir: str

    @property
    def problems(self) -> list[str]:
        found = [f"process {i} never reported (hung or died)" for i in self.missing]
        found += [f"process {r['index']}: {r['detail']}" for r in self.reports if not r["ok"]]
        key_sets = {tuple(r["keys"]) for r in self.reports if r["ok"]}
        if len(key_sets) > 1:
            found.append(f"the processes loaded different kernels: {sorted(key_sets)}")
        if not self.expected_keys:
            found.append("no process reported the kernels it loaded")
        elif self.cache_keys != self.expected_keys:
            found.append(f"the cache holds {len(self.cache_keys)} valid entries {self.cache_keys}, "
                         f"expected exactly {self.expected_keys}")
        if self.stray:
            found.append(f"stray files in the cache directory: {self.stray}")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"ok": self.ok, "procs": self.procs, "reports": self.reports, "missing": self.missing,
                "cache_keys": self.cache_keys, "expected_keys": self.expected_keys, "stray": self.stray,
                "wall_s": self.wall_s, "problems": self.problems}


def run_cold_procs(n: int = 8, *, timeout: float = 600.0, out=print) -> ColdProcsResult:
    from . import _coldcache

    cache_dir = tempfile.mkdtemp(prefix="cudattn-coldprocs-")
    ctx = multiprocessing.get_context("spawn")  # fork would copy a parent's CUDA state, which CUDA forbids
    barrier = ctx.Barrier(n + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(i, cache_dir, barrier, results), name=f"cold-{i}") for i in range(n)]
    out(f"cold-procs: {n} processes on an empty cache {cache_dir}")
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    reports = []
    try:
        barrier.wait(timeout=timeout)
        out(f"  all {n} ready after {time.perf_counter() - t0:.1f} s; released together")
    except Exception:  # a child failed before the barrier (it aborted it) or never arrived
        out("  not every process reached the start line")
    deadline = time.monotonic() + timeout
    while len(reports) < n and time.monotonic() < deadline:
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:  # keep waiting unless every child is gone
            if not any(p.is_alive() for p in procs) and results.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()  # ours, hung: the report names it
            p.join()
    wall = time.perf_counter() - t0
    reported = {r["index"] for r in reports}
    expected = sorted({k for r in reports if r["ok"] for k in r["keys"]})
    result = ColdProcsResult(n, sorted(reports, key=lambda r: r["index"]), [i for i in range(n) if i not in reported],
                             sorted(_coldcache.cache_keys(cache_dir)), expected, _coldcache.stray_files(cache_dir),
                             wall, cache_dir)
    if result.ok:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return result


def summary(r: ColdProcsResult) -> str:
    ok = sum(1 for x in r.reports if x["ok"])
    compiles = sum(x["compiles"] for x in r.reports)
    secs = [x["seconds"] for x in r.reports if x["ok"]]
    lines = [f"cold-procs: {ok}/{r.procs} processes correct against the reference; {compiles} NVRTC compiles "
             f"across them; first calls {min(secs, default=0):.2f}-{max(secs, default=0):.2f} s; "
             f"{len(r.cache_keys)} cache entries, expected {len(r.expected_keys)}; wall {r.wall_s:.1f} s"]
    lines += [f"  {p}" for p in r.problems]
    if not r.ok:
        lines.append(f"  cache directory kept for inspection: {r.cache_dir}")
    lines.append(f"cold-procs: {'PASS' if r.ok else 'FAIL'}")
    return "\n".join(lines)
