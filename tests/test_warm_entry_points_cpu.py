"""CPU: the compiled warm path's own entry points (`cudattn._calls._warm`) refuse what they cannot
serve with an exception, never a crash: a reset flag whose truth raises, calls after a configure()
that failed part way, a driver given one entry point of the two a call needs."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudattn._calls import call as _call
from cudattn._calls import warm

native = warm._native
pytestmark = pytest.mark.skipif(native is None, reason="built without the compiled warm path")


def test_stats_raises_the_reset_flags_own_error():
    with pytest.raises(ValueError, match="truth value"):
        native.stats(np.array([1, 2]))
    served, misses = native.stats()
    assert served >= 0 and isinstance(misses, dict)


def test_a_configure_that_failed_part_way_leaves_every_entry_point_closed():
    try:
        with pytest.raises(KeyError, match="missing"):
            native.configure({"miss": object()})  # the first object in place, none of the others
        with pytest.raises(TypeError, match="after configure"):
            native.run("attention", [object()], ("q",), 7, (), None, None, (), False)
        with pytest.raises(TypeError, match="after configure"):
            native.bind()
        with pytest.raises(TypeError, match="after configure"):
            native.hold(7, (), 0, True)
        with pytest.raises(TypeError, match="after configure"):
            native.release_holds()
    finally:
        warm.configure(_call, _call.RecordedCall)
    # configured again: an operand it does not know goes back to the Python path
    assert native.run("attention", [object()], ("q",), 7, (), None, None, (), False) is warm.MISS


def test_the_driver_is_given_both_entry_points_a_call_needs_or_none():
    fake = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    address = ctypes.cast(fake, ctypes.c_void_p).value
    for pair in ((address, 0), (0, address)):
        with pytest.raises(TypeError, match="both addresses, or 0, 0"):
            native.set_driver(*pair)
    native.set_driver(0, 0)  # none: the next warm call asks the driver for them
