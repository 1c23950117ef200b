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
