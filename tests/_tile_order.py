"""The Hopper forward kernel's tile order in GPU tests: a call made after `fixed_rounds` takes its
tiles in fixed rounds (no counter from the stream), the order the dynamic one must match bit for bit."""

from __future__ import annotations

import numpy as np


class _NoCounters:
    """Stands in for `_arrays.stream_memory` in `_kernels.attention`: a null counter."""

    @staticmethod
    def counters(*args, **kwargs):
        return type("Null", (), {"ptr": 0})()


def counters_taken(monkeypatch, kernel_family) -> list:
    """Skips the test where the dynamic tile order does not exist (the portable kernel, a GPU before
    Hopper); else a list that collects the address of every tile counter a prefill call takes from
    here on through the Python path (a call's first run; recorded calls replayed by the compiled
    warm path take the stream's kept counters in C, unseen here)."""
    import pytest

    from cudattn._arrays import stream_memory as _stream_memory
    from cudattn._kernels import traits as _traits
    from cudattn._runtime import device as _device

    if kernel_family == "portable" or _device.device_properties(0).arch not in _traits.HOPPER_ARCHS:
        pytest.skip("the dynamic tile order is the Hopper kernel's")
    taken = []
    real = _stream_memory.counters

    def spy(*args, **kwargs):
        c = real(*args, **kwargs)
        if c is _stream_memory._NULL or not isinstance(c, _stream_memory._Placeholder):  # not a recording's
            taken.append(c.ptr)
        return c

    monkeypatch.setattr(_stream_memory, "counters", spy)
    return taken


def fixed_rounds(monkeypatch) -> None:
    """From here on (for the test), prefill calls take their tiles in fixed rounds; the recorded
    plans are dropped so that the next call plans anew."""
    from cudattn._calls import call as _call
    from cudattn._kernels import attention as _attention
    from cudattn._kernels import plan as _plan

    monkeypatch.setattr(_call, "_plans", {})
    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_attention, "_stream_memory", _NoCounters)


def stream_counters_read_zero() -> int:
    """Every stream's kept arrival counters, read back after the device is idle: how many blocks
    (each must read all zeros, as the kernels leave them; asserted here)."""
    from cuda.bindings import driver

    from cudattn._arrays import stream_memory as _stream_memory
    from cudattn._runtime import device as _device

    _device.get_device(0)
    assert driver.cuCtxSynchronize()[0] == driver.CUresult.CUDA_SUCCESS
    blocks = [b for key, b in _stream_memory._blocks.items() if key[2] == _stream_memory._COUNTERS]
    for b in blocks:
        host = np.full(b.count, -1, np.int32)
        assert driver.cuMemcpyDtoH(host.ctypes.data, b.ptr, b.nbytes)[0] == driver.CUresult.CUDA_SUCCESS
        assert not host.any(), f"a stream's counters left at {host[host != 0][:8]}"
    return len(blocks)
