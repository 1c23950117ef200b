"""`_kernels.sm_margin`: the SMs the persistent Hopper forward leaves free for other streams' kernels
(a ring's NCCL transfers). The plan's grid shrinks by the margin inside `leave_free` and only there,
per thread, and a recorded call's signature carries the margin, so no call replays a grid planned
for another margin."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

from cudattn._kernels import plan as _plan
from cudattn._kernels import sm_margin
from cudattn._runtime.device import DeviceProperties
from cudattn._spec import validate as _validate

H200 = DeviceProperties(0, "H200", (9, 0), 132, 232448, 49152, 233472, 60 * 2**20, 1024, (2**31 - 1, 65535, 65535))
A100 = DeviceProperties(0, "A100", (8, 0), 108, 166912, 49152, 167936, 40 * 2**20, 1024, (2**31 - 1, 65535, 65535))


def _problem(S=4096, H=16, causal=True):
    q = np.zeros((1, S, H, 128), ml_dtypes.bfloat16)
    return _validate.validate(q, q, q, causal=causal)


def test_the_persistent_grid_leaves_the_margin_free_only_inside():
    p = _problem()
    assert _plan.make_plan(p, H200).grid == (132, 1, 1)
    with sm_margin.leave_free(8):
        assert sm_margin.current() == 8
        assert _plan.make_plan(p, H200).grid == (124, 1, 1)
        with sm_margin.leave_free(200):  # more than the GPU has: one CTA still does the work
            assert _plan.make_plan(p, H200).grid == (1, 1, 1)
        assert sm_margin.current() == 8
    assert sm_margin.current() == 0
    assert _plan.make_plan(p, H200).grid == (132, 1, 1)  # the margin's plan was not kept for the default


def test_small_problems_and_the_portable_kernel_keep_their_grids():
    small = _problem(S=128, H=2)  # fewer tiles than SMs: one CTA a tile either way
    portable = _plan.make_plan(_problem(), A100).grid  # (heads, batch, blocks): not persistent
    with sm_margin.leave_free(8):
        plan = _plan.make_plan(small, H200)  # its 4 tiles of 64 rows (the small-grid build), a CTA each
        assert plan.variant.tiles.block_m == 64 and plan.grid == (4, 1, 1)
        assert _plan.make_plan(_problem(), A100).grid == portable
    assert portable == (16, 1, 4096 // _plan.make_plan(_problem(), A100).variant.tiles.block_m)


def test_the_margin_is_per_thread():
    seen = {}
    started, release = threading.Event(), threading.Event()

    def other():
        started.wait(5)
        seen["other"] = (sm_margin.current(), _plan.make_plan(_problem(), H200).grid[0])
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with sm_margin.leave_free(16):
        started.set()
        release.wait(5)
        seen["self"] = _plan.make_plan(_problem(), H200).grid[0]
    t.join(5)
    assert seen == {"other": (0, 132), "self": 116}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", None])
def test_a_margin_that_is_no_count_is_refused(bad):
    with pytest.raises(ValueError, match=r"sm_margin must be an int >= 0"):
        with sm_margin.leave_free(bad):
            pass


def test_recorded_calls_are_keyed_by_the_margin(monkeypatch):
    """The call path's plan table key ends with the margin and ALiBi's shift: a call inside
    `leave_free` or `alibi_shift.shifted` looks up (and records) its own entry."""
    from cudattn._calls import call as _call
    from cudattn._kernels import alibi_shift

    keys = []

    class Table(dict):
        def get(self, key, default=None):
            keys.append(key)
            raise TypeError("stop here")  # the test needs the key only

    monkeypatch.setattr(_call, "_plans", Table())
    c = _call.Call.__new__(_call.Call)
    c.objs = c.ops = c.names = ()
    c.op, c.sig, c.consumer, c.keep = "attention", (), 0, None

    def run():
        try:
            c.run((), None, lambda *a: None, (), tensors=0, out_index=None, allocates=False)
        except Exception:  # noqa: BLE001 (the stub call stops after the lookup)
            pass

    run()
    with sm_margin.leave_free(8):
        run()
    with alibi_shift.shifted(-77):
        run()
    assert [k[-2:] for k in keys] == [(0, 0), (8, 0), (0, -77)]
    assert alibi_shift.local.n == 0
