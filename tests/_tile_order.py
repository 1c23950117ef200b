"""The Hopper forward kernel's tile order in GPU tests: a call made after `fixed_rounds` takes its
tiles in fixed rounds (no counter from the stream), the order the dynamic one must match bit for bit."""

from __future__ import annotations


class _NoCounters:
    """Stands in for `_arrays.stream_memory` in `_kernels.attention`: a null counter."""

    @staticmethod
    def counters(*args, **kwargs):
        return type("Null", (), {"ptr": 0})()


def fixed_rounds(monkeypatch) -> None:
    """From here on (for the test), prefill calls take their tiles in fixed rounds; the recorded
    plans are dropped so that the next call plans anew."""
    from cudattn._calls import call as _call
    from cudattn._kernels import attention as _attention
    from cudattn._kernels import plan as _plan

    monkeypatch.setattr(_call, "_plans", {})
    monkeypatch.setattr(_plan, "_plans", {})
    monkeypatch.setattr(_attention, "_stream_memory", _NoCounters)
