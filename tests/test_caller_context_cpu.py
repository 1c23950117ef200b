"""CPU: a public call gives the thread back the context it found (`_runtime.device`), with the
driver faked: a call that makes another device's context current remembers the caller's and
restores it when it returns or raises; a thread with no context keeps the call's; other threads'
remembered contexts are theirs.
"""

from __future__ import annotations

import threading

import pytest
from cuda.bindings import driver

from cudattn._runtime import device as _device

CTX = {0: 0x1000, 1: 0x2000}  # device -> its primary context (as ints)
USER_CTX = 0x9000  # a context the application made itself


class _Driver:
    CUcontext = driver.CUcontext

    def __init__(self):
        self.current = threading.local()
        self.sets = []

    def cur(self):
        return getattr(self.current, "ctx", 0)

    def cuCtxGetCurrent(self):
        return driver.CUresult.CUDA_SUCCESS, driver.CUcontext(self.cur())

    def cuCtxSetCurrent(self, ctx):
        self.current.ctx = int(ctx)
        self.sets.append(int(ctx))
        return (driver.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def drv(monkeypatch):
    d = _Driver()
    monkeypatch.setattr(_device, "driver", d)
    monkeypatch.setattr(_device, "_ensure_init", lambda: None)
    monkeypatch.setattr(_device, "_tls", threading.local())
    monkeypatch.setattr(_device, "pending", 0)

    def activate(device_id, by_id, by_ctx):
        d.current.ctx = CTX[device_id]
        by_id[device_id] = (f"Device({device_id})", CTX[device_id])
        by_ctx[CTX[device_id]] = by_id[device_id][0]
        return by_id[device_id][0]

    monkeypatch.setattr(_device, "_activate", activate)
    return d


@_device.restores_caller_context
def _public_call(*devices, fail=False):
    for dev in devices:
        _device.get_device(dev)
    if fail:
        raise ValueError("a refused argument")
    return "result"


def test_a_call_on_another_device_gives_the_callers_context_back(drv):
    drv.current.ctx = CTX[0]  # torch on cuda:0, say
    assert _public_call(1) == "result"
    assert drv.cur() == CTX[0] and drv.sets == [CTX[0]] and _device.pending == 0


def test_the_first_context_is_the_one_given_back_after_several_switches(drv):
    drv.current.ctx = USER_CTX
    _public_call(0, 1, 0)
    assert drv.cur() == USER_CTX and _device.pending == 0


def test_a_call_that_raises_still_gives_it_back(drv):
    drv.current.ctx = CTX[0]
    with pytest.raises(ValueError):
        _public_call(1, fail=True)
    assert drv.cur() == CTX[0] and _device.pending == 0


def test_a_call_on_the_current_device_switches_nothing(drv):
    drv.current.ctx = CTX[1]
    _device._tls.by_id, _device._tls.by_ctx = {1: ("Device(1)", CTX[1])}, {CTX[1]: "Device(1)"}
    _public_call(1)
    assert drv.sets == [] and _device.pending == 0


def test_a_thread_with_no_context_keeps_the_calls(drv):
    _public_call(1)  # CUDA's own rule: the first call gives the thread a context
    assert drv.cur() == CTX[1] and drv.sets == [] and _device.pending == 0


def test_threads_give_back_their_own(drv):
    seen = {}
    in_call, release = threading.Event(), threading.Event()

    @_device.restores_caller_context
    def slow_call():
        _device.get_device(1)
        in_call.set()
        release.wait(5)

    def other():
        drv.current.ctx = CTX[0]
        slow_call()
        seen["other"] = drv.cur()

    t = threading.Thread(target=other)
    t.start()
    assert in_call.wait(5)
    drv.current.ctx = USER_CTX
    _public_call(0)  # this thread's own switch and restore, while the other's is pending
    seen["main"] = drv.cur()
    release.set()
    t.join(5)
    assert seen == {"main": USER_CTX, "other": CTX[0]} and _device.pending == 0


def test_public_calls_inside_a_public_call_leave_the_context_to_it(drv):
    """A NumPy call's device call, a ring's local calls: the inner calls end with the outer call's
    device still current (its later driver calls need it); the outer call gives it back."""
    drv.current.ctx = CTX[0]
    seen = []

    @_device.restores_caller_context
    def outer():
        _device.get_device(1)
        _public_call(1)
        seen.append(drv.cur())
        _device.restore_caller_context()  # what an inner call path's end does: nothing at depth > 0
        seen.append(drv.cur())

    outer()
    assert seen == [CTX[1], CTX[1]] and drv.cur() == CTX[0] and _device.pending == 0


def test_a_refused_call_gives_it_back_but_never_over_a_context_made_current_since(drv):
    """A call that switched and then failed before its end: the next call's end gives the caller's
    context back only if the one the call made is still current (the caller may have chosen
    another meanwhile)."""
    drv.current.ctx = CTX[0]
    _device.get_device(1)  # a switch whose call failed before giving it back
    drv.current.ctx = USER_CTX  # the caller makes its own choice
    _public_call()
    assert drv.cur() == USER_CTX and _device.pending == 0


def test_a_failed_switch_restores_nothing(drv, monkeypatch):
    drv.current.ctx = CTX[0]

    def refuse(device_id, by_id, by_ctx):
        raise ValueError("device 7 does not exist")

    monkeypatch.setattr(_device, "_activate", refuse)
    with pytest.raises(ValueError):
        _public_call(7)
    assert drv.cur() == CTX[0] and drv.sets == [] and _device.pending == 0


def test_the_full_path_runs_nested(drv, monkeypatch):
    """Inside `Call.run`'s full path the public helpers it uses (a memset, an upload) do not give
    the context back: the launches after them still need the operands' device."""
    from cudattn._calls import call as _callpath

    drv.current.ctx = CTX[0]
    during = []

    @_device.restores_caller_context
    def helper():  # as `_transfer.memset` is
        return None

    def full(call, args, qa):
        helper()
        during.append(drv.cur())
        return qa

    class _Op:
        ptr, shape, strides, dtype, device_id, readonly, stream_handle = 0x1000, (1,), (2,), None, 1, False, 5

    call = object.__new__(_callpath.Call)
    call.op, call.objs, call.names, call.consumer, call.keep = "fake", (_Op,), ("q",), 5, None
    call.ops, call.sig, call.unordered = [_Op], ((type(_Op), (1,), (2,), None, 1, False),), False
    monkeypatch.setattr(_callpath, "_plans", {})
    monkeypatch.setattr(_callpath._replay, "record", lambda *a: (_ for _ in ()).throw(_callpath._replay.NotReplayable()))
    monkeypatch.setattr(_callpath, "check_one_device", lambda *a: None)
    monkeypatch.setattr(_callpath, "check_addresses", lambda *a: None)
    monkeypatch.setattr(_callpath, "order_and_hold", lambda *a: None)
    assert call.run((), None, full, None, tensors=1, out_index=None, allocates=False) is _Op
    assert during == [CTX[1]] and drv.cur() == CTX[0] and _device.pending == 0


def test_a_device_seen_before_is_switched_to_with_one_driver_call(drv, monkeypatch):
    drv.current.ctx = CTX[0]
    _public_call(1)  # first time: cuda.core's activation (the fake) records the context
    activations = []
    monkeypatch.setattr(_device, "_activate", lambda *a: activations.append(a) or "unused")
    drv.sets.clear()
    assert _public_call(1) == "result"
    assert activations == [] and drv.sets == [CTX[1], CTX[0]] and drv.cur() == CTX[0]


def test_default_stream_calls_make_the_operands_device_current_before_asking_about_capture(monkeypatch):
    """Handles 0-2 name the current context's streams: the capture query must see the operands'."""
    from cudattn._calls import call as _callpath

    order = []
    monkeypatch.setattr(_callpath._device, "get_device", lambda d=None: order.append(("device", d)))
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: order.append(("capture", s)) or True)

    class _Op:
        ptr, shape, strides, dtype, device_id, readonly, stream_handle = 0x1000, (1,), (2,), None, 1, False, 0

    call = object.__new__(_callpath.Call)
    call.op, call.objs, call.names, call.consumer, call.keep = "fake", (_Op,), ("q",), 0, None
    call.ops, call.sig, call.unordered = [_Op], ((type(_Op), (1,), (2,), None, 1, False),), False
    with pytest.raises(ValueError, match="graph capture"):
        call.run((), None, None, None, tensors=1, out_index=None, allocates=True)
    assert order == [("device", 1), ("capture", 0)]
