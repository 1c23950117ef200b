"""Helpers shared by the asv suite.

Nothing here (or in any suite module) touches CUDA, or imports cudattn, at import time: asv
imports every module of the suite to discover benchmarks, in its forkserver too, and a process
forked after CUDA was initialised cannot use CUDA. So GPU detection and every cudattn import
happen inside `setup`, in the process that runs the benchmark.

Only API that old commits of cudattn have too is used (`attention`, `to_device`, `_launch.time_ms`,
`_launch.synchronize`, `_kernels.compile_variant`, `_traits.all_variants`), so one suite can
record results for any commit; a benchmark of a later feature (FP8, KV caches) checks for it with
`require_api` and is skipped where it is missing, never faked.

Every benchmark class states a `version`. asv's dashboard shows only results recorded under the
benchmark's current version, which by default is a hash of its code: any edit would hide the
history. The version changes only when what a benchmark measures changes (its unit, its method),
never for a refactoring, so results recorded over months stay on one graph.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

# Inputs are rotated among device copies totalling at least twice the L2 cache (50 MiB on H100,
# 60 MiB on H200; the device's own size when larger), so every timed call reads from HBM.
_MIN_L2_BYTES = 50 * 2**20

# Compile target of the NVRTC benchmarks where no GPU says otherwise.
DEFAULT_ARCH = "sm_90a"


class GpuTrack:
    """asv's timing attributes of the GPU track benchmarks, which time themselves (CUDA events,
    medians inside the track): one call a sample, a short warm-up."""

    rounds = 1  # asv's default (2) runs every parameter set in two processes: twice the set-up time
    repeat = (3, 10, 2.0)
    number = 1
    warmup_time = 0.1
    timeout = 180


def has_gpu() -> bool:
    try:
        from cuda.bindings import driver

        return driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS and driver.cuDeviceGetCount()[1] > 0
    except Exception:  # no driver library, no device, or a broken install: all mean "no GPU here"
        return False


def require_gpu() -> None:
    """Skip the benchmark (asv's convention: NotImplementedError from setup) where there is no GPU."""
    if not has_gpu():
        raise NotImplementedError("no CUDA GPU")


def device_attribute(name: str, default: int) -> int:
    """An attribute of device 0 (cudattn's default device), or `default` if it cannot be read."""
    try:
        from cuda.bindings import driver

        attr = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        err, dev = driver.cuDeviceGet(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return default
        err, value = driver.cuDeviceGetAttribute(attr, dev)
        return int(value) if err == driver.CUresult.CUDA_SUCCESS else default
    except Exception:
        return default


def compile_arch() -> str:
    """The cubin target for the compile benchmarks: this GPU's, else DEFAULT_ARCH.

    An arch cudattn has no tiles for (e.g. a newer GPU at an older commit) also falls back, so the
    benchmark measures the same work on every machine that can run it.
    """
    from cudattn._kernels import traits as _traits

    if has_gpu():
        major = device_attribute("COMPUTE_CAPABILITY_MAJOR", 0)
        minor = device_attribute("COMPUTE_CAPABILITY_MINOR", 0)
        arch = f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
        try:
            _traits.all_variants(arch)
            return arch
        except (KeyError, ValueError):
            pass
    return DEFAULT_ARCH


def compile_variant_for(arch: str, dtype="bfloat16", tile_dim=128, causal=False):
    """The variant cudattn launches for this (dtype, head dim, causal) on `arch`: the Hopper family's
    where the commit has one for the arch (what a Hopper user compiles), else the portable one."""
    from cudattn._kernels import traits as _traits

    found = [v for v in _traits.all_variants(arch)
             if v.dtype == dtype and v.tile_dim == tile_dim and v.causal == causal]
    if not found:
        raise LookupError(f"no {dtype} d{tile_dim} causal={causal} variant for {arch}")
    return next((v for v in found if getattr(v, "family", "sm80") == "sm90"), found[0])


def np_dtype(name: str):
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes

        return getattr(ml_dtypes, name)
    return {"float16": np.float16}[name]


# Period of the random pattern `randn` tiles: generating gigabytes of normals would dominate the
# suite's run time. Odd, so rows of any head dim do not repeat in step.
_PATTERN = (1 << 22) + 1


def randn(shape, dtype: str, seed: int) -> np.ndarray:
    """Standard-normal values (NumPy float32, cast to `dtype`), a random pattern tiled to `shape`."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(min(n, _PATTERN), dtype=np.float32).astype(np_dtype(dtype))
    return np.resize(base, n).reshape(shape)


def rotation_count(bytes_per_set: int) -> int:
    """How many device copies of one call's inputs and output exceed twice the L2 cache (at least 2)."""
    l2 = max(_MIN_L2_BYTES, device_attribute("L2_CACHE_SIZE", 0))
    return max(2, -(-2 * l2 // bytes_per_set))


def device_sets(host_arrays, copies: int):
    """`copies` device copies of the tuple `host_arrays`, uploaded and waited for."""
    import cudattn
    from cudattn._runtime import launch as _launch

    sets = [tuple(cudattn.to_device(a) for a in host_arrays) for _ in range(copies)]
    _launch.synchronize()
    return sets


def gpu_ms_per_call(call, sets, *, samples=10, calls_per_sample=10) -> float:
    """Median over `samples` of the GPU time of `calls_per_sample` back-to-back calls, per call.

    Each sample queues several calls cycling through `sets`, so only the first launch's host
    overhead lands in the events' window; the GPU stays busy for the others.
    """
    from cudattn._runtime import launch as _launch

    def batch():
        for i in range(calls_per_sample):
            call(*sets[i % len(sets)])

    _launch.time_ms(batch)  # warm-up: compile or load the kernel, settle clocks
    return statistics.median(_launch.time_ms(batch) / calls_per_sample for _ in range(samples))


def gpu_ms_behind_spin(call, sets, *, samples=30) -> float:
    """Median GPU time of one call, queued behind a spin kernel so that the host's time never shows
    (what a small call costs the GPU; `gpu_ms_per_call`'s back-to-back calls are bound by the host
    where a call's kernels take a few microseconds). Skipped (NotImplementedError) at a commit
    without `cudattn.bench.timing.gpu_samples`."""
    try:
        from cudattn._runtime import stream as _stream
        from cudattn.bench import timing as _timing

        handle = int(_stream.default_stream(0).handle)
        gpu_samples = _timing.gpu_samples
    except (ImportError, AttributeError):
        raise NotImplementedError("this cudattn has no spin-kernel GPU timing") from None
    n = len(sets)
    ms = gpu_samples(lambda i: call(*sets[i % n], stream=handle), handle, 0, iters=samples, warmup=5)
    return statistics.median(ms)


def as_called_ms(call, sets, *, samples=15) -> float:
    """Median over `samples` of one call as its caller sees it: CUDA events recorded on cudattn's
    stream around the call, the stream idle before it (the host's time of the call included)."""
    from cudattn._runtime import launch as _launch

    call(*sets[0])
    _launch.synchronize()
    times = []
    for i in range(samples):
        _launch.synchronize()
        times.append(_launch.time_ms(lambda: call(*sets[i % len(sets)])))
    return statistics.median(times)


def require_api(*names: str) -> None:
    """Skip (asv's NotImplementedError) at a commit whose cudattn lacks one of `names`."""
    import cudattn

    missing = [n for n in names if not hasattr(cudattn, n)]
    if missing:
        raise NotImplementedError(f"this cudattn has no {', '.join(missing)}")


def wall_seconds(fn, repeats: int) -> float:
    """Median wall time of `fn()` (which must wait for its own GPU work)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


_memo: dict = {}


def memo(key, factory):
    """`factory()` once per process for `key`; other keys are dropped.

    Newer asv runners re-run `setup` before every timing sample. Inputs of hundreds of MiB are
    made once per benchmark process instead (asv runs each parameter set in its own process).
    """
    if key not in _memo:
        _memo.clear()  # frees the previous key's device buffers first
        _memo[key] = factory()
    return _memo[key]
