"""CPU: keeping foreign operands alive until their call's work is done (`_arrays.lifetime`), with
the driver's event calls faked: the same contract through cuda.bindings' wrappers and through the
compiled warm path's own entry points (`use_entry_points`, handed over once it has bound them)."""

from __future__ import annotations

import ctypes

import pytest

from cudattn._arrays import lifetime
from cudattn._runtime.errors import CudaError, check

NOT_READY, RELAXED, GLOBAL = 600, 2, 0


@pytest.fixture
def driver_log(monkeypatch):
    """Fake entry points (integer handles, CUresult ints); events 11 and 12 free on device 0; event
    12's work never finishes, 13's fails."""
    log = {"calls": [], "mode": GLOBAL}

    def record(event, stream):
        log["calls"].append(("record", event, stream))
        return 0

    def query(event):
        log["calls"].append(("query", event))
        return {12: NOT_READY, 13: 999}.get(event, 0)

    def exchange(mode):
        log["calls"].append(("exchange", mode))
        before, log["mode"] = log["mode"], mode
        return 0, before

    monkeypatch.setattr(lifetime, "_held", type(lifetime._held)())
    monkeypatch.setattr(lifetime, "pending", lifetime._held)
    monkeypatch.setitem(lifetime._free_events, 0, [12, 11])
    lifetime.use_entry_points(record, query, exchange)
    yield log
    lifetime.use_bindings()  # what a process starts with; a compiled warm call hands its own over again


def test_holds_go_once_their_work_is_done_in_order(driver_log):
    a, b = object(), object()
    lifetime.hold(0x7000, (a,), 0, capturing=False)  # takes event 11
    lifetime.hold(0x7000, (b,), 0, capturing=False)  # takes event 12, whose work stays queued
    assert driver_log["calls"] == [("record", 11, 0x7000), ("record", 12, 0x7000)]
    lifetime.release_done()
    assert [refs for _, _, refs in lifetime._held] == [(b,)], "the finished hold went, the queued one stays"
    assert driver_log["calls"][2:] == [("exchange", RELAXED), ("query", 11), ("query", 12), ("exchange", GLOBAL)]
    assert driver_log["mode"] == GLOBAL, "the thread's capture mode given back"
    assert lifetime._free_events[0] == [11]


def test_nothing_is_held_while_the_stream_captures(driver_log):
    lifetime.hold(0x7000, (object(),), 0, capturing=True)
    assert not lifetime._held and driver_log["calls"] == []


def test_a_failed_query_raises_naming_the_call_and_gives_the_mode_back(driver_log):
    lifetime._free_events[0] = [13]
    lifetime.hold(0x7000, (object(),), 0, capturing=False)
    with pytest.raises(CudaError, match="cuEventQuery"):
        lifetime.release_done()
    assert driver_log["mode"] == GLOBAL


def test_a_bare_error_code_is_named_as_the_driver_names_it():
    """The extension's entry points return plain ints: a failure still reads as the driver's name."""
    with pytest.raises(CudaError, match=r"cuEventQuery\(keep operands alive\) failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        check(700, "cuEventQuery(keep operands alive)")


def test_the_compiled_path_hands_over_its_own_entry_points(monkeypatch):
    """Once the compiled warm path has bound the driver's entry points, `lifetime` records and queries
    through them: `_warm.event_record`, `event_query` and `capture_mode` call the bound functions."""
    from cudattn._calls import call as _call
    from cudattn._calls import warm

    if not warm.available():
        pytest.skip("cudattn was built without its compiled warm path")
    native = warm._native
    log = []
    rec = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda e, s: log.append(("record", e, s)) or 0)
    qry = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(lambda e: log.append(("query", e)) or NOT_READY)

    def exchange(mode_p):
        log.append(("exchange", mode_p[0]))
        mode_p[0] = GLOBAL
        return 0

    exc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(exchange)
    keep = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in (keep, keep, rec, qry, exc)]
    monkeypatch.setattr(warm, "_bind", lambda: tuple(addresses))
    warm.configure(_call, _call.RecordedCall)  # the extension asks the fake `_bind`
    native.set_driver(0, 0)  # unbound: the next bind asks for the entry points
    try:
        assert native.bind(), "the entry points were not taken"
        assert lifetime._record is native.event_record and lifetime._query is native.event_query
        assert lifetime._record(0x11, 0x7000) == 0 and lifetime._query(0x11) == NOT_READY
        assert lifetime._exchange(RELAXED) == (0, GLOBAL)
        assert log == [("record", 0x11, 0x7000), ("query", 0x11), ("exchange", RELAXED)]
    finally:  # the fakes go with the test: the real `_bind` back, asked again at the next warm call
        monkeypatch.undo()
        warm.configure(_call, _call.RecordedCall)  # drops the entry points: `lifetime` on the wrappers
    assert lifetime._record is lifetime._bindings_record and lifetime._query is lifetime._bindings_query
    with pytest.raises(TypeError, match="once bound"):
        native.event_query(0x11)  # the stand-ins are no longer reachable


@pytest.fixture
def compiled_holds(monkeypatch):
    """The compiled warm path bound to fake event entry points (record, query, exchange: event 12's
    work never finishes, 13's query fails, recording 14 fails), `lifetime`'s state fresh with events
    11 and 12 free on device 0; yields (the extension, the log of driver calls)."""
    from cudattn._calls import call as _call
    from cudattn._calls import warm

    if not warm.available():
        pytest.skip("cudattn was built without its compiled warm path")
    native = warm._native
    log = []
    rec = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda e, s: log.append(("record", e, s)) or (999 if e == 14 else 0))
    qry = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(
        lambda e: log.append(("query", e)) or {12: NOT_READY, 13: 999}.get(e, 0))
    mode = [GLOBAL]

    def exchange(mode_p):  # fails where the test says: the thread's mode then stays
        log.append(("exchange", mode_p[0]))
        if fail_exchange and fail_exchange.pop(0):
            return 999
        mode[0], mode_p[0] = mode_p[0], mode[0]
        return 0

    fail_exchange: list = []  # the next exchanges' failures, in turn (True: that one fails)

    exc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(exchange)
    keep = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in (keep, keep, rec, qry, exc)]
    monkeypatch.setattr(warm, "_bind", lambda: tuple(addresses))
    monkeypatch.setattr(lifetime, "_held", type(lifetime._held)())
    monkeypatch.setattr(lifetime, "pending", lifetime._held)
    monkeypatch.setitem(lifetime._free_events, 0, [12, 11])
    warm.configure(_call, _call.RecordedCall)
    native.set_driver(0, 0)
    try:
        assert native.bind(), "the entry points were not taken"
        yield native, log, fail_exchange
    finally:
        monkeypatch.undo()
        warm.configure(_call, _call.RecordedCall)  # the real `_bind` asked again at the next warm call


def test_the_compiled_path_holds_and_releases_as_lifetime_does(compiled_holds):
    """A warm call's holds made in C: an event taken from the device's free list and recorded on the
    call's stream, the hold appended to `lifetime._held`; the release queries oldest first with the
    capture mode relaxed, gives finished events back, drops their references, and stops at one
    still running."""
    import gc
    import weakref

    native, log, _ = compiled_holds

    class Ref:
        pass

    a, b = Ref(), Ref()
    gone = weakref.ref(a)
    native.hold(0x7000, (a,), 0, True)  # takes event 11
    native.hold(0x7000, (b,), 0, True)  # takes event 12, whose work stays queued
    assert log == [("record", 11, 0x7000), ("record", 12, 0x7000)]
    assert [(ev, refs) for ev, _, refs in lifetime._held] == [(11, (a,)), (12, (b,))]
    assert lifetime._free_events[0] == []
    del a
    native.release_holds()
    gc.collect()
    assert gone() is None, "the finished hold's reference was kept"
    assert [refs for _, _, refs in lifetime._held] == [(b,)] and lifetime._free_events[0] == [11]
    assert log[2:] == [("exchange", RELAXED), ("query", 11), ("query", 12), ("exchange", GLOBAL)]


def test_the_compiled_path_leaves_to_lifetime_what_it_does_not_do(compiled_holds, monkeypatch):
    """Where the stream may capture, or `lifetime.hold` was replaced, C calls the Python function; a
    query or record that fails is named by it (CudaError), the event of a failed record back on the
    free list first."""
    native, log, _ = compiled_holds
    seen = []
    real_hold = lifetime.hold
    monkeypatch.setattr(lifetime, "hold", lambda *args: seen.append(args))
    native.hold(0x7000, ("x",), 0, False)
    native.hold(0x7000, ("y",), 0, True)
    assert seen == [(0x7000, ("x",), 0, None), (0x7000, ("y",), 0, False)] and log == []
    monkeypatch.setattr(lifetime, "hold", real_hold)
    lifetime._free_events[0] = [14]
    with pytest.raises(CudaError, match=r"cuEventRecord\(keep operands alive\) failed"):
        native.hold(0x7000, ("z",), 0, True)
    assert not lifetime._held
    lifetime._free_events[0] = [13]
    native.hold(0x7000, ("w",), 0, True)
    with pytest.raises(CudaError, match=r"cuEventQuery\(keep operands alive\) failed"):
        native.release_holds()
    assert [refs for _, _, refs in lifetime._held] == [("w",)]


def test_the_compiled_release_never_waits_and_names_a_mode_it_cannot_restore(compiled_holds):
    """A release that finds `lifetime._lock` held elsewhere releases nothing and touches no mode (a
    later call releases); a capture mode the driver will not restore raises, named as the Python
    path names it, the finished hold released all the same."""
    native, log, fail_exchange = compiled_holds
    native.hold(0x7000, ("a",), 0, True)  # event 11: done
    del log[:]
    with lifetime._lock:
        native.release_holds()
    assert log == [] and [refs for _, _, refs in lifetime._held] == [("a",)]
    fail_exchange[:] = [False, True]  # relaxed, then the restore fails
    with pytest.raises(CudaError, match=r"cuThreadExchangeStreamCaptureMode failed"):
        native.release_holds()
    assert not lifetime._held and lifetime._free_events[0] == [12, 11]


def test_an_error_inside_the_compiled_hold_is_raised_as_itself(compiled_holds, monkeypatch):
    """An append to `_held` that fails (an error inside the lock) comes out as that error, the lock
    let go (not a SystemError from releasing it with the error set)."""
    native, _, _ = compiled_holds

    class Refusing(type(lifetime._held)):
        def append(self, x):
            raise ValueError("no room")

    monkeypatch.setattr(lifetime, "_held", Refusing())
    with pytest.raises(ValueError, match="no room"):
        native.hold(0x7000, ("a",), 0, True)
    assert lifetime._lock.acquire(False), "the lock was left held"
    lifetime._lock.release()

