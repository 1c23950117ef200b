"""Host time of one warm call on device arrays, from call to return and from call to its first
kernel launch (the part that delays the GPU), by the kind of operands.

The shapes are small, so the GPU keeps up and launches never block: what is measured is the call
path (operands, plan, output allocation) and the launch itself, which bound the speed of small
decode steps. Operands: cudattn DeviceArrays; torch tensors and CuPy arrays where those import
with CUDA (what their users pay: each array's import on top), passed with no stream= (the
operands' default).
"""

import statistics
import time

import numpy as np

from . import _common

_CALLS = 2000
_SYNC_EVERY = 200  # keeps the queue short, so a full launch queue never blocks a call
_SHAPE = (1, 128, 1, 64)  # (B, S, H, D)
_SEQLENS = np.array([1024, 1000, 700, 513], np.int32)  # KV-cache decode: 4 sequences, capacity 1024


def _package(name):
    """torch or CuPy with a CUDA device, or NotImplementedError (asv's "skipped")."""
    try:
        if name == "torch":
            import torch

            if not torch.cuda.is_available():
                raise NotImplementedError("torch has no CUDA device")
            return torch
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except ImportError:
        raise NotImplementedError(f"{name} not installed") from None
    except NotImplementedError:
        raise
    except Exception as exc:  # a CuPy without a usable CUDA runtime
        raise NotImplementedError(f"{name} has no CUDA device: {exc}") from None


def _importer(operands):
    """(host array -> device array of that kind, sync of every stream the calls may use)."""
    import cudattn
    from cudattn._runtime import launch as _launch

    if operands == "DeviceArray":
        return cudattn.to_device, _launch.synchronize
    pkg = _package(operands)
    if operands == "torch":
        return (lambda a: pkg.from_numpy(a).cuda()), (lambda: (pkg.cuda.synchronize(), _launch.synchronize()))
    return pkg.asarray, (lambda: (pkg.cuda.Device().synchronize(), _launch.synchronize()))


def _median_us(call, sync) -> float:
    times = []
    for i in range(_CALLS):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if i % _SYNC_EVERY == _SYNC_EVERY - 1:
            sync()
    sync()
    return statistics.median(times) * 1e6


def _median_pre_launch_us(call, sync) -> float:
    """Median host µs from a call's start to its first cuLaunchKernel (cudattn launches through
    ``cudattn._runtime.launch._cuLaunchKernel``, wrapped here, or through its compiled warm path,
    which stamps its first launch when asked; commits without the wrapped function: skipped)."""
    from cudattn._runtime import launch as _launch

    real = getattr(_launch, "_cuLaunchKernel", None)
    if real is None:
        raise NotImplementedError("this cudattn launches without _runtime.launch._cuLaunchKernel")
    try:
        from cudattn._calls import warm as _warm
    except ImportError:  # commits before the compiled warm path
        _warm = None
    stamp = [None]

    def stamped(*args):
        if stamp[0] is None:
            stamp[0] = time.perf_counter_ns()
        return real(*args)

    times = []
    _launch._cuLaunchKernel = stamped
    if _warm is not None:
        _warm.stamp_launches(True)
    try:
        for i in range(_CALLS):
            stamp[0] = None
            if _warm is not None:
                _warm.take_stamp()
            t0 = time.perf_counter_ns()
            call()
            at = stamp[0]
            compiled = _warm.take_stamp()[0] if _warm is not None else None
            if at is None or compiled is not None and compiled < at:
                at = compiled
            times.append(at - t0)
            if i % _SYNC_EVERY == _SYNC_EVERY - 1:
                sync()
    finally:
        _launch._cuLaunchKernel = real
        if _warm is not None:
            _warm.stamp_launches(False)
    sync()
    return statistics.median(times) / 1e3


class HostOverhead:
    version = "1"  # what it measures (see _common): bump only when that changes
    params = (["DeviceArray", "torch", "cupy"], ["new_output", "out="])
    param_names = ["operands", "output"]
    timeout = 120

    def setup(self, operands, output):
        _common.require_gpu()
        import cudattn

        to_dev, self.sync = _importer(operands)
        q = to_dev(_common.randn(_SHAPE, "float16", 0))
        if output == "out=":
            o = to_dev(_common.randn(_SHAPE, "float16", 1))
            self.call = lambda: cudattn.attention(q, q, q, out=o)
        else:
            self.call = lambda: cudattn.attention(q, q, q)
        for _ in range(50):  # warm: kernel loaded, plan cached, memory pool grown
            self.call()
        self.sync()

    def track_host_overhead_us(self, operands, output):
        return _median_us(self.call, self.sync)

    track_host_overhead_us.unit = "us"

    def track_pre_launch_us(self, operands, output):
        return _median_pre_launch_us(self.call, self.sync)

    track_pre_launch_us.unit = "us"


class HostOverheadKvcache:
    """`attention_with_kvcache` decode step (4 sequences of up to 1024 keys, 8 heads, D=128) into `out`."""

    version = "1"  # what it measures (see _common): bump only when that changes
    params = (["DeviceArray", "torch", "cupy"],)
    param_names = ["operands"]
    timeout = 120

    def setup(self, operands):
        _common.require_gpu()
        _common.require_api("attention_with_kvcache")
        import inspect

        import cudattn

        if "out" not in inspect.signature(cudattn.attention_with_kvcache).parameters:
            raise NotImplementedError("this cudattn's attention_with_kvcache takes no out=")

        to_dev, self.sync = _importer(operands)
        q, o = (to_dev(_common.randn((4, 1, 8, 128), "float16", s)) for s in (0, 1))
        kc, vc = (to_dev(_common.randn((4, 1024, 8, 128), "float16", s)) for s in (2, 3))
        sl = to_dev(_SEQLENS)
        self.call = lambda: cudattn.attention_with_kvcache(q, kc, vc, cache_seqlens=sl, out=o)
        for _ in range(50):
            self.call()
        self.sync()

    def track_host_overhead_us(self, operands):
        return _median_us(self.call, self.sync)

    track_host_overhead_us.unit = "us"

    def track_pre_launch_us(self, operands):
        return _median_pre_launch_us(self.call, self.sync)

    track_pre_launch_us.unit = "us"
