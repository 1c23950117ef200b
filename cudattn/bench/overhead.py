"""`--grid overhead`: host microseconds per warm call, by the kind of operands, beside torch SDPA's.

The problems (grids.OVERHEAD_PREFILL, grids.OVERHEAD_DECODE) are small, so the host, not the
GPU, bounds a call. Host time per call: wall clock of CALLS back-to-back calls over CALLS, with
the calls' stream held by a spin kernel longer than the batch, so that every launch is only
queued and the GPU's speed cannot enter; median over REPEATS batches, the stream drained between
them. A stream queues ~1024 commands before a launch blocks: a batch that fills the queue
outlasts its spin and is timed again with fewer calls. One that outlasts it at MIN_CALLS is
flagged (``outlasted_spin``): the call waits for the GPU (a sync in its path), and its figure
is not host time alone.

Each variant is also timed as called (`ascalled.single`: events around one call on an idle
stream, its own stream: the one the call's output was made on). cudattn's rows also give the host
time before the call's first launch (`pre_launch_us`): only that part delays the GPU, while the
work after the launch (wrapping the output, keeping operands alive) overlaps the kernel. torch
SDPA's launches are out of Python's sight: for its rows (and, to compare, cudattn's with cudattn
or torch operands) torch's profiler gives the same span as CUPTI records it
(`pre_launch_profiled_us`, CUPTI's own cost included).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
from cuda.bindings import driver

from .. import attention, attention_with_kvcache
from .._runtime import stream as _stream
from .._arrays import importer as _importer
from .._runtime import launch as _launch
from .._arrays import host_io as _host_io
from .._runtime.errors import check
from .._calls import warm as _warm
from . import ascalled, grids, timing

CALLS = 200
MIN_CALLS = 25  # fewest calls per batch, when CALLS calls fill the launch queue (host_us)
REPEATS = 7
PROBE_CALLS = 20  # an unheld batch first, to size the spin
SPIN_US_PER_CALL = 100.0  # spin per call at least; 3x the unheld batch's time per call where longer
WARM_CALLS = 20
KINDS = ("cudattn", "torch", "cupy", "jax")  # operand kinds, in the order measured (JAX last: it
# starts its own CUDA client and threads, which must not disturb the others)
CURRENT = "torch.cuda.current_stream()"


def host_us(fn, stream_handle: int, device_id: int, *, calls: int = CALLS, repeats: int = REPEATS) -> dict:
    """Host µs per call of ``fn()`` (median and p90 over batches) and whether a batch outlasted its spin.

    The spin is sized from an unheld batch (a call that waits for the GPU there waits only for
    its own kernel), so only a call that waits for the GPU outlasts it: one with a sync in its
    path, or one that finds the launch queue full. A call can queue several commands (two
    kernels, the operands' DLPack events), so a batch that outlasts its spin is timed again with
    half the calls, down to MIN_CALLS, where it stays flagged: the call itself waits."""
    _launch.synchronize(stream_handle)
    t0 = time.perf_counter_ns()
    for _ in range(PROBE_CALLS):
        fn()
    spin_us = max(SPIN_US_PER_CALL, 3 * (time.perf_counter_ns() - t0) / PROBE_CALLS / 1e3)
    while True:
        spin_ms = calls * spin_us / 1e3
        per_call, outlasted = [], False
        for _ in range(repeats):
            _launch.synchronize(stream_handle)
            timing.spin(stream_handle, spin_ms, device_id)
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            ns = time.perf_counter_ns() - t0
            outlasted |= ns >= 0.9 * spin_ms * 1e6
            per_call.append(ns / calls / 1e3)
        _launch.synchronize(stream_handle)
        if not outlasted or calls <= MIN_CALLS:
            return {"host_us": statistics.median(per_call), "host_p90_us": timing.percentile(per_call, 90),
                    "outlasted_spin": outlasted, "calls": calls, "repeats": repeats, "spin_us_per_call": spin_us}
        calls = max(MIN_CALLS, calls // 2)


class FirstLaunch:
    """While entered, the host time (``perf_counter_ns``) of the first kernel launch since
    :meth:`clear`, and the launches counted. cudattn launches through ``_launch._cuLaunchKernel``,
    which this wraps (about 0.1 µs a launch, after the stamp), or through its compiled warm path,
    which stamps its own first launch when asked (`_calls.warm`, a clock read)."""

    def __init__(self):
        self.at, self.count, self.real = None, 0, None

    def __enter__(self):
        real = self.real = _launch._cuLaunchKernel

        def stamped(*args):
            if self.at is None:
                self.at = time.perf_counter_ns()
            self.count += 1
            return real(*args)

        _launch._cuLaunchKernel = stamped
        _warm.stamp_launches(True)
        return self

    def clear(self) -> None:
        self.at = None
        _warm.take_stamp()

    def first(self) -> int | None:
        """The first launch's time since :meth:`clear` (None: no launch)."""
        compiled = _warm.take_stamp()[0]
        if compiled is None or self.at is not None and self.at < compiled:
            return self.at
        return compiled

    def __exit__(self, *exc):
        _launch._cuLaunchKernel = self.real
        self.count += _warm.take_stamp()[1]
        _warm.stamp_launches(False)


def pre_launch_us(fn, stream_handle: int, *, calls: int = CALLS, repeats: int = REPEATS) -> dict:
    """Host µs from the start of a warm call ``fn()`` to its first kernel launch: the part of the
    host's time that delays the GPU (the rest, after the launch, overlaps the kernel). Median over
    calls of each batch, median and p90 over ``repeats`` batches; the stream drained between batches
    so that the launch queue never fills. Also the launches a call makes."""
    per_batch = []
    with FirstLaunch() as stamp:
        for _ in range(repeats):
            _launch.synchronize(stream_handle)
            ns = []
            for _ in range(calls):
                stamp.clear()
                t0 = time.perf_counter_ns()
                fn()
                at = stamp.first()
                if at is None:
                    raise RuntimeError("pre_launch_us: the call launched no kernel through cudattn")
                ns.append(at - t0)
            per_batch.append(statistics.median(ns) / 1e3)
        _launch.synchronize(stream_handle)
    return {"pre_launch_us": statistics.median(per_batch), "pre_launch_p90_us": timing.percentile(per_batch, 90),
            "launches_per_call": stamp.count / (calls * repeats)}


PROFILED_CALLS = 100


def pre_launch_profiled_us(fn, torch_mod, *, calls: int = PROFILED_CALLS) -> dict:
    """Host µs from a marker just before ``fn()`` (a ``cudaStreamQuery`` on torch's current stream)
    to the call's first kernel launch, both as torch's profiler records them (CUPTI notes the host
    time of every CUDA API call, torch's runtime launches and cudattn's driver launches alike): the
    one measure that reaches torch SDPA's launches. CUPTI's own cost per API call enters it, so for
    cudattn it reads above `pre_launch_us`. {} where the profiler gives no such events."""
    from torch.profiler import ProfilerActivity, profile

    stream = torch_mod.cuda.current_stream()
    torch_mod.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            stream.query()
            fn()
        torch_mod.cuda.synchronize()
    marks = sorted(e.time_range.end for e in prof.events() if e.name == "cudaStreamQuery")
    launches = sorted(e.time_range.start for e in prof.events() if "LaunchKernel" in e.name)
    deltas, j = [], 0
    for i, m in enumerate(marks):
        while j < len(launches) and launches[j] < m:
            j += 1
        if j < len(launches) and (i + 1 == len(marks) or launches[j] < marks[i + 1]):
            deltas.append(launches[j] - m)
    if len(deltas) < calls // 2:
        return {}
    return {"pre_launch_profiled_us": statistics.median(deltas), "profiled_calls": len(deltas)}


def _load(kind: str, torch_mod):
    """``(to_device(numpy array) -> array of this kind, module)``, or ``(None, why not)``."""
    if kind == "cudattn":
        return _host_io.to_device, None
    if kind == "torch":
        if torch_mod is None:
            return None, "torch not importable with CUDA (or --no-peers)"
        return (lambda x: torch_mod.from_numpy(x).cuda()), torch_mod
    try:
        if kind == "cupy":
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            return cupy.asarray, cupy
        # JAX takes 75% of the GPU memory at its first use unless told not to.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax

        dev = jax.devices("gpu")[0]  # RuntimeError without a CUDA backend
        return (lambda x: jax.block_until_ready(jax.device_put(x, dev))), jax
    except ImportError:
        return None, f"{kind} not installed"
    except Exception as e:  # installed but unusable (no CUDA build, driver mismatch, ...)
        return None, f"{kind} has no usable CUDA device: {_first_line(e)}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def _host_operands(problem: str):
    """NumPy (inputs, out): prefill q, k, v (B, S, H, D); decode q, k_cache, v_cache, cache_seqlens."""
    rng = np.random.default_rng(0)
    c = grids.OVERHEAD_PREFILL if problem == "prefill" else grids.OVERHEAD_DECODE

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(np.float16)

    q, k, v = randn(c.B, c.Sq, c.Hq, c.D), randn(c.B, c.Sk, c.Hkv, c.D), randn(c.B, c.Sk, c.Hkv, c.D)
    ins = (q, k, v) if problem == "prefill" else (q, k, v, np.array(grids.OVERHEAD_SEQLENS, np.int32))
    return ins, np.zeros_like(q)


def _call(problem: str, ops, out, stream_kw: dict):
    kw = dict(stream_kw) if out is None else {**stream_kw, "out": out}
    if problem == "prefill":
        q, k, v = ops
        return lambda: attention(q, k, v, **kw)
    q, kc, vc, sl = ops
    return lambda: attention_with_kvcache(q, kc, vc, cache_seqlens=sl, **kw)


class _Namer:
    """A stream handle's name: the legacy default stream, torch's or CuPy's current stream, or cudattn's own."""

    def __init__(self, device_id: int, torch_mod):
        self.names: dict[int, str] = {0: "legacy default stream (0)"}
        self.add(int(_stream.default_stream(device_id).handle), "cudattn's stream")
        if torch_mod is not None:
            self.add(torch_mod.cuda.current_stream().cuda_stream, "torch's current stream")

    def add(self, handle: int, name: str) -> None:
        self.names.setdefault(int(handle), name)

    def __call__(self, handle: int) -> str:
        return self.names.get(handle, f"stream {handle:#x}")


def _measure(fn, stream_handle: int, device_id: int, iters: int, row: dict, *, ours: bool = True, torch_mod=None,
             profiled: list | None = None) -> None:
    """A row's figures, into ``row``. The profiler's (``torch_mod`` given) are deferred: ``(fn,
    torch_mod, row)`` is appended to ``profiled`` for `_profile`, since once CUPTI has been attached
    it stays, and every later driver call of the process pays its callbacks (rows measured after a
    profiled one read several µs slower)."""
    for _ in range(WARM_CALLS):  # kernel loaded, plan cached, memory pools grown
        fn()
    check(driver.cuCtxSynchronize(), "cuCtxSynchronize")  # nothing left over from the last variant
    res = host_us(fn, stream_handle, device_id)
    if ours:  # torch's launches go through its own runtime calls, out of sight here
        res.update(pre_launch_us(fn, stream_handle))
    res["as_called_us"] = 1e3 * ascalled.single(lambda i: fn(), stream_handle, iters=iters, warmup=0).median_ms
    row.update(res)
    if torch_mod is not None and profiled is not None:  # the profiler's view, which sees torch's launches too
        profiled.append((fn, torch_mod, row))


def _profile(profiled: list) -> None:
    """The deferred profiler figures (`_measure`), after every other figure of the grid."""
    for fn, torch_mod, res in profiled:
        try:
            res.update(pre_launch_profiled_us(fn, torch_mod))
        except Exception as e:  # a torch without a working profiler: the column stays empty
            res["pre_launch_profiled_error"] = _first_line(e)


def _current_stream(kind: str, mod, device_id: int) -> int:
    """The package's current stream (what ``stream=None`` means after the call-path rewrite); cudattn's own
    stream for cudattn arrays and for JAX, which has no current stream to speak of."""
    if kind == "torch":
        return int(mod.cuda.current_stream().cuda_stream)
    if kind == "cupy":
        return int(mod.cuda.get_current_stream().ptr)
    return int(_stream.default_stream(device_id).handle)


def _cudattn_rows(problem: str, kind: str, to_dev, mod, namer, device_id: int, iters: int, torch_mod=None,
                  profiled: list | None = None):
    ins, out = _host_operands(problem)
    ops, out_arr = tuple(to_dev(x) for x in ins), to_dev(out)
    streams = [("omitted", {})]
    if kind == "torch":
        streams.append((CURRENT, {"stream": mod.cuda.current_stream()}))
    for label, kw in streams:
        handle = None
        for with_out in (False, True):
            row = {"impl": "cudattn", "operands": kind, "stream": label, "out": with_out}
            fn = _call(problem, ops, out_arr if with_out else None, kw)
            try:
                if handle is None:  # where the call runs: the stream its new output was made on
                    handle = None if with_out else _importer.stream_of(fn())
                    handle = _current_stream(kind, mod, device_id) if handle is None else handle
                profiler = torch_mod if kind in ("cudattn", "torch") else None  # JAX's own CUDA client: left alone
                _measure(fn, handle, device_id, iters, row, torch_mod=profiler, profiled=profiled)
                row["launch_stream"] = namer(handle)
            except TypeError as e:
                if with_out and "unexpected keyword argument 'out'" in str(e):
                    row["skipped"] = "no out= in this cudattn"
                else:
                    row["error"] = _first_line(e)
            except Exception as e:
                row["error"] = _first_line(e)
            yield row


def row_function(problem: str) -> str:
    return "attention" if problem == "prefill" else "attention_with_kvcache"


def _sdpa_row(problem: str, torch_mod, namer, device_id: int, iters: int, profiled: list | None = None) -> dict:
    """torch SDPA on the same problem: (B, H, S, D) tensors, its default backend choice, torch's current stream."""
    row = {"impl": "torch_sdpa", "operands": "torch", "stream": "omitted", "out": False}
    if torch_mod is None:
        return {**row, "skipped": "torch not importable with CUDA (or --no-peers)"}
    ins, _ = _host_operands(problem)
    q, k, v = (torch_mod.from_numpy(x).cuda().transpose(1, 2).contiguous() for x in ins[:3])
    sdpa = torch_mod.nn.functional.scaled_dot_product_attention
    handle = int(torch_mod.cuda.current_stream().cuda_stream)
    try:
        _measure(lambda: sdpa(q, k, v), handle, device_id, iters, row, ours=False, torch_mod=torch_mod,
                 profiled=profiled)
        row["launch_stream"] = namer(handle)
    except Exception as e:
        row["error"] = _first_line(e)
    return row


def _rows(problem: str, torch_mod, loaded: dict, namer, device_id: int, iters: int, profiled: list):
    yield _sdpa_row(problem, torch_mod, namer, device_id, iters, profiled)
    for kind in KINDS:
        if kind not in loaded:
            loaded[kind] = _load(kind, torch_mod)
            if kind == "cupy" and loaded[kind][0] is not None:
                namer.add(_current_stream(kind, loaded[kind][1], device_id), "cupy's current stream")
        to_dev, mod = loaded[kind]
        if to_dev is None:
            yield {"impl": "cudattn", "operands": kind, "stream": "omitted", "out": False, "skipped": mod}
        else:
            yield from _cudattn_rows(problem, kind, to_dev, mod, namer, device_id, iters, torch_mod, profiled)


def run(device_id: int, torch_mod, *, iters: int = 30, progress=None, status=None) -> list[dict]:
    """Every overhead row: per problem, torch SDPA's, then cudattn's for each operand kind, stream and out=.
    The profiler's figures come last (`_measure`), so ``progress`` sees each row once they are in;
    ``status`` gets a line as each row's other figures are taken."""
    namer, loaded, rows, profiled = _Namer(device_id, torch_mod), {}, [], []
    for problem, case in (("prefill", grids.OVERHEAD_PREFILL), ("decode", grids.OVERHEAD_DECODE)):
        head = {"problem": problem, "function": row_function(problem), "label": case.label(), "case": case.as_dict()}
        for r in _rows(problem, torch_mod, loaded, namer, device_id, iters, profiled):
            rows.append((head, r))
            if status:
                status(f"[{len(rows)}] {problem}: {r['impl']}, {r['operands']} operands, out={r['out']}")
    if profiled and status:
        status(f"the profiler's figures ({len(profiled)} rows)")
    _profile(profiled)
    rows = [{**head, **r} for head, r in rows]
    for r in rows:
        if progress:
            progress(r)
    return rows
