"""The Hopper forward kernel's tile order in GPU tests: a call made after `fixed_rounds` takes its
tiles in fixed rounds (no counter from the stream), the order the dynamic one must match bit for bit."""

from __future__ import annotations


class _NoCounters:
    """Stands in for `_arrays.stream_memory` in `_kernels.attention`: a null counter."""

    @staticmethod
    def counters(*args, **kwargs):
        return type("Null", (), {"ptr": 0})()


def counters_taken(monkeypatch, kernel_family) -> list:
    """Skips the test where the dynamic tile order does not exist (the portable kernel, a GPU before
    Hopper); else a list that collects the address of every tile counter a prefill call takes from
    here on (recorded calls: at each replay)."""
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
