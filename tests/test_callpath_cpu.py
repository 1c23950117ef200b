"""CPU: the call path's decisions and the recorded replay, with the driver's launch faked.

`Call.run` with a stand-in full path that launches one kernel through `_launch.launch`: the
first call runs the full path and records it (recording needs no GPU: launches are only noted),
later calls replay. The fake `cuLaunchKernel` reads the params block each launch receives, so the
tests see the addresses a replay patched in, the stream, and which path ran. What they pin down:
a replay with new addresses passes exactly those addresses; a misaligned address or an `out`
overlapping an input goes to the full path (which refuses the overlap); an operand made on another
stream orders the call after it; `out` takes the call's stream.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudattn._calls import call as _callpath
from cudattn._calls import operands as _operands
from cudattn._calls.call import Call
from cudattn._runtime import launch as _launch
from cudattn._runtime import recording as _recording
from cudattn._arrays.array import DeviceArray

CONSUMER, PRODUCER = 0x7000, 0x8000
F16 = np.dtype(np.float16)


class _Params(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("o", ctypes.c_void_p), ("n", ctypes.c_int32), ("pad", ctypes.c_int32)]


class _Kernel:
    function, name, smem_limit = 7, "fake", 1 << 20


def _array(ptr, shape=(2, 64, 4, 64), stream=CONSUMER):
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = ptr, shape, F16, 0, None, False
    st, acc = [], 2
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    a.strides, a.stream_handle = tuple(reversed(st)), stream
    return a


@pytest.fixture
def world(monkeypatch):
    """Faked launch (logs stream and params), stream waits and holds; no device needed."""
    log = {"launches": [], "waits": [], "holds": [], "full": 0}

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        params = _Params.from_address(ctypes.c_void_p.from_address(argv).value)
        log["launches"].append((stream, params.q, params.o, params.n))
        return (0,)

    monkeypatch.setattr(_launch, "_cuLaunchKernel", launch)
    monkeypatch.setattr(_operands, "stream_wait", lambda c, p: log["waits"].append((c, p)))
    monkeypatch.setattr(_callpath._lifetime, "hold", lambda c, refs, *rest: log["holds"].append((c, refs, *rest)))
    monkeypatch.setattr(_callpath._device, "get_device", lambda *a: None)
    monkeypatch.setattr(_callpath, "_plans", {})
    return log


def _call(log, q, o):
    def full(call, args, qa, oa):
        if _recording.current() is None:  # not the recording of the signature's first call
            log["full"] += 1
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, CONSUMER, _Params(qa.ptr, oa.ptr, 5, 0))
        return oa

    call = Call("fake", (q, o), ("q", "out"), None)
    assert call.consumer == CONSUMER
    return call.run((), None, full, None, tensors=2, out_index=1, allocates=False)


def test_a_replay_passes_the_new_addresses(world):
    q, o = _array(0x10000), _array(0x90000)
    assert _call(world, q, o) is o and world["full"] == 1
    q2, o2 = _array(0x20000), _array(0xA0000)
    assert _call(world, q2, o2) is o2
    assert world["full"] == 1, "the second call of a signature must replay"
    assert world["launches"] == [(CONSUMER, 0x10000, 0x90000, 5), (CONSUMER, 0x20000, 0xA0000, 5)]
    _call(world, q, o)  # an address combination seen before: its kept block
    assert world["launches"][-1] == (CONSUMER, 0x10000, 0x90000, 5) and world["full"] == 1


def test_a_misaligned_address_takes_the_full_path(world):
    _call(world, _array(0x10000), _array(0x90000))
    _call(world, _array(0x10008), _array(0x90000))
    assert world["full"] == 2 and world["launches"][-1][1] == 0x10008


def test_out_overlapping_an_input_is_refused_before_any_launch(world):
    _call(world, _array(0x10000), _array(0x90000))
    n = len(world["launches"])
    with pytest.raises(ValueError, match="overlaps q"):
        _call(world, _array(0x10000), _array(0x10000 + 4096))
    assert len(world["launches"]) == n


def test_an_input_from_another_stream_orders_the_call_and_out_takes_its_stream(world):
    _call(world, _array(0x10000), _array(0x90000))  # recorded with every operand on the call's stream
    o = _array(0x90000, stream=PRODUCER)
    q = _array(0x10000)
    _call(world, q, o)
    assert world["waits"] == [(CONSUMER, PRODUCER)] and world["full"] == 1
    assert world["holds"] and world["holds"][-1][0] == CONSUMER
    assert o.stream_handle == CONSUMER, "out must remember the stream its contents are now written on"


def test_a_replayed_foreign_operand_makes_its_device_current_before_the_wait(world, monkeypatch):
    """A replay with an operand of another stream makes the operands' device current only for the
    wait (whose event is recorded on the producer), and its hold names the device; a call that does
    not allocate leaves the capture query to the hold (None)."""
    events = []
    monkeypatch.setattr(_callpath._device, "get_device", lambda *a: events.append(("device", *a)))
    monkeypatch.setattr(_operands, "stream_wait", lambda c, p: events.append(("wait", c, p)))
    _call(world, _array(0x10000), _array(0x90000))  # recorded with every operand on the call's stream
    events.clear()
    o = _array(0x90000, stream=PRODUCER)  # (q sets the call's stream)
    _call(world, _array(0x10000), o)
    assert events == [("device", 0), ("wait", CONSUMER, PRODUCER)]
    assert world["holds"][-1] == (CONSUMER, (o,), 0, None)
    events.clear()
    _call(world, _array(0x10000), _array(0x90000))  # nothing foreign: no device switch, no wait
    assert events == []


def test_a_packages_current_stream_is_asked_once_per_call_not_per_operand(monkeypatch):
    """CuPy-like operands (the view and the package faked): every operand is ordered after its
    package's current stream on its own device; the package is asked for the first operand (its
    stream and what keeps it alive), and the later operands on that device reuse the answer."""
    import sys
    import types

    from cudattn._arrays import importer as _importer

    asked = []

    def get_current_stream(device_id):
        asked.append(device_id)
        return types.SimpleNamespace(ptr=0x5000 + device_id)

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(get_current_stream=get_current_stream)
    monkeypatch.setitem(sys.modules, "cupy", cupy)

    class Arr:  # a type of the package "cupy", as `kind_of` sees it
        __module__ = "cupy._core.core"

        def __init__(self, ptr, device_id):
            self.ptr, self.device_id = ptr, device_id

    class View:
        def __init__(self, obj):
            self.ptr, self.device_id, self.shape, self.strides = obj.ptr, obj.device_id, (2, 3), None
            self.dtype, self.readonly = F16, False

    monkeypatch.setattr(_importer, "_SMV", types.SimpleNamespace(from_any_interface=lambda obj, s: View(obj)))
    names = ("q", "k", "v", "out", "x")
    c = Call("fake", tuple(Arr(p << 16, 0) for p in range(1, 6)), names, None)
    consumer, keep, ops, unordered = c.consumer, c.keep, c.ops, c.unordered
    assert consumer == 0x5000 and keep.ptr == 0x5000 and not unordered
    assert [a.stream_handle for a in ops] == [0x5000] * 5
    assert asked == [0, 0], asked  # the first operand's stream, then its owner (the call's keep)
    asked.clear()  # operands on another device (refused later by the full path) get that device's stream
    objs = (Arr(0x10000, 0), Arr(0x20000, 0), Arr(0x30000, 1), Arr(0x40000, 1))
    c = Call("fake", objs, names[:4], None)
    consumer, keep, ops, unordered = c.consumer, c.keep, c.ops, c.unordered
    assert [a.stream_handle for a in ops] == [0x5000, 0x5000, 0x5001, 0x5001] and unordered


def test_the_callers_context_is_given_back_after_either_path_and_after_an_error(world, monkeypatch):
    """`Call.run` ends by restoring the thread's context where a switch is pending (`_runtime.device`):
    after the full path, after a replay, and when the full path raises."""
    restored = []
    monkeypatch.setattr(_callpath._device, "pending", 1)
    monkeypatch.setattr(_callpath._device, "restore_caller_context", lambda: restored.append(True))
    q, o = _array(0x10000), _array(0x90000)
    _call(world, q, o)  # full path
    _call(world, q, o)  # replay
    assert restored == [True, True]
    with pytest.raises(ValueError, match="overlaps q"):
        _call(world, _array(0x10000), _array(0x10000 + 4096))
    assert restored == [True, True, True]
