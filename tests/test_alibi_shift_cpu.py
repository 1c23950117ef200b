"""CPU: ALiBi's diagonal shift (`cudattn._kernels.alibi_shift`), the context a ring's local calls run
in: per thread, restored on the way out (an exception included), an int or refused, and written
into the kernels' parameters by `fill_params`."""

from __future__ import annotations

import threading

import pytest

from cudattn._kernels import alibi_shift
from cudattn._kernels.params import DecodeParams, FwdParams, fill_params
from cudattn._spec.modifiers import KernelMods


def test_the_shift_is_restored_on_the_way_out_and_kept_per_thread():
    seen = {}
    with alibi_shift.shifted(5):
        t = threading.Thread(target=lambda: seen.setdefault("other", alibi_shift.local.n))
        t.start()
        t.join()
        with pytest.raises(RuntimeError):
            with alibi_shift.shifted(-3):
                assert alibi_shift.local.n == -3
                raise RuntimeError("a refused call")
        assert alibi_shift.local.n == 5
    assert alibi_shift.local.n == 0 and seen == {"other": 0}


@pytest.mark.parametrize("bad", [1.0, "2", True, None])
def test_a_shift_that_is_no_int_is_refused(bad):
    with pytest.raises(TypeError, match="the ALiBi shift must be an int"):
        with alibi_shift.shifted(bad):
            pass
    assert alibi_shift.local.n == 0


@pytest.mark.parametrize("struct", [FwdParams, DecodeParams])
def test_fill_params_writes_the_threads_shift(struct):
    mods = KernelMods(alibi=True, alibi_ptr=0x1000)
    p = struct()
    p.heads_q, p.scale_log2 = 4, 1.0
    fill_params(p, mods, 0.125)
    assert p.alibi_shift == 0
    with alibi_shift.shifted(-130):
        fill_params(p, mods, 0.125)
    assert p.alibi_shift == -130
