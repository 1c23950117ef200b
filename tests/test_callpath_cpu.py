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
from cudattn._calls import replay as _replay
from cudattn._calls import warm as _warm
from cudattn._calls.call import Call, dispatch
from cudattn._runtime import launch as _launch
from cudattn._runtime import recording as _recording
from cudattn._arrays.array import DeviceArray

CONSUMER, PRODUCER = 0x7000, 0x8000
F16 = np.dtype(np.float16)


class _Params(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("o", ctypes.c_void_p), ("n", ctypes.c_int32), ("pad", ctypes.c_int32)]


class _Kernel:
    function, name, smem_limit = 7, "fake", 1 << 20


def _jax_like_type():
    """A new type of the package "jax", as `kind_of` sees it (new, so that no earlier test's calls
    have told the call path its kind): ``__dlpack__`` logs the streams it is asked for; a deleted
    array refuses (an interrupt where ``deleted == "interrupt"``)."""

    class Arr:
        __module__ = "jax._src.array"

        def __init__(self, ptr):
            self.ptr, self.deleted, self.asked = ptr, False, []

        def __dlpack__(self, stream=None):
            if self.deleted == "interrupt":
                raise KeyboardInterrupt
            if self.deleted:
                raise RuntimeError("Array has been deleted")
            self.asked.append(stream)
            return f"capsule {self.ptr:#x} {len(self.asked)}"

        def is_deleted(self):
            return self.deleted

    return Arr


def _array(ptr, shape=(2, 64, 4, 64), stream=CONSUMER):
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.dtype, a.device_id, a.owner, a.readonly = ptr, shape, F16, 0, None, False
    st, acc = [], 2
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    a.strides, a.stream_handle = tuple(reversed(st)), stream
    return a


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p)
_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))


@pytest.fixture(params=["python", "compiled"])
def world(request, monkeypatch):
    """Faked launch (logs stream and params), stream waits and holds; no device needed. Run twice:
    warm calls on the Python path, and on the compiled one (`_calls.warm`, its driver entry points
    faked alike), which must launch the same and leave to the Python path what it does not take."""
    log = {"launches": [], "waits": [], "holds": [], "full": 0, "compiled": 0, "params": [], "params_bytes": 0,
           "capturing": False}  # what the compiled path's capture query answers

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        params = _Params.from_address(ctypes.c_void_p.from_address(argv).value)
        log["launches"].append((stream, params.q, params.o, params.n))
        if log["params_bytes"]:  # a test whose params are longer than _Params
            log["params"].append(ctypes.string_at(ctypes.addressof(params), log["params_bytes"]))
        return (0,)

    monkeypatch.setattr(_launch, "_cuLaunchKernel", launch)
    if request.param == "compiled":
        if not _warm.available():
            pytest.skip("cudattn was built without its compiled warm path")

        def native_launch(function, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
            log["compiled"] += 1
            return launch(function, gx, gy, gz, bx, by, bz, smem, stream or 0, argv, extra)[0]

        def capturing(stream, status):
            status[0] = 1 if log["capturing"] else 0
            return 0

        fakes = (_LAUNCH(native_launch), _CAPTURING(capturing))
        _warm._native.set_driver(*(ctypes.cast(f, ctypes.c_void_p).value for f in fakes))
        request.addfinalizer(lambda: _warm._native.set_driver(0, 0) or fakes)  # the fakes live until then
    else:
        monkeypatch.setattr(_warm, "run", None)
    monkeypatch.setattr(_operands, "stream_wait", lambda c, p: log["waits"].append((c, p)))
    monkeypatch.setattr(_callpath._lifetime, "hold", lambda c, refs, *rest: log["holds"].append((c, refs, *rest)))
    monkeypatch.setattr(_callpath._device, "get_device", lambda *a: None)
    monkeypatch.setattr(_callpath, "_plans", {})
    return log


def _call(log, q, o, *, stream=None, launch_on=CONSUMER):
    """One call of a fake entry (``q``, ``out``) given ``stream``, whose full path launches on ``launch_on``."""
    def full(call, args, qa, oa):
        if _recording.current() is None:  # not the recording of the signature's first call
            log["full"] += 1
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, launch_on, _Params(qa.ptr, oa.ptr, 5, 0))
        return oa

    return dispatch("fake", [q, o], ("q", "out"), stream, (), None, full, None, tensors=2, out_index=1,
                    allocates=False)


def _full_with_counters(log, optional):
    """A fake entry's full path (``q``, ``out``) that takes the stream's counters from
    `_arrays.stream_memory` (``optional`` as the causal prefill takes them) and launches with their
    address in the params' second slot."""
    from cudattn._arrays import stream_memory as _sm

    def full(call, args, qa, oa):
        if _recording.current() is None:
            log["full"] += 1
        ctr = _sm.counters(qa.device_id, call.consumer, 2, call.keep, None, optional)
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, call.consumer, _Params(oa.ptr, ctr.ptr, 5, 0))
        return oa

    return full


def test_a_replay_passes_the_new_addresses(world):
    q, o = _array(0x10000), _array(0x90000)
    assert _call(world, q, o) is o and world["full"] == 1
    q2, o2 = _array(0x20000), _array(0xA0000)
    assert _call(world, q2, o2) is o2
    assert world["full"] == 1, "the second call of a signature must replay"
    assert world["launches"] == [(CONSUMER, 0x10000, 0x90000, 5), (CONSUMER, 0x20000, 0xA0000, 5)]
    _call(world, q, o)  # an address combination seen before: its kept block
    assert world["launches"][-1] == (CONSUMER, 0x10000, 0x90000, 5) and world["full"] == 1
    assert world["compiled"] == (2 if _warm.run is not None else 0), "the warm calls' path"


@pytest.mark.parametrize("n", [60, 200])
def test_a_call_of_more_operands_than_the_compiled_path_takes_is_keyed(world, n):
    """A call of 60 operands (a merge of many separate parts has two a part): the compiled path
    leaves it to the Python path, whose signature key records and finds the plan; one of 200 (more
    arrays than a recording holds) runs its full path each time, its key made all the same."""
    ins = [_array(0x100000 * (i + 1), shape=(2, 64, 4, 8 + i)) for i in range(n - 1)]

    def call(o):
        def full(call, args, *ops):
            if _recording.current() is None:
                world["full"] += 1
            _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, CONSUMER, _Params(ops[0].ptr, ops[-1].ptr, n, 0))
            return ops[-1]

        return dispatch("many", [*ins, o], tuple(f"x{i}" for i in range(n)), None, (), None, full, None,
                        tensors=n, out_index=n - 1, allocates=False)

    for i in range(3):
        o = _array(0x40000000 + 0x100000 * i)
        assert call(o) is o
    assert world["full"] == (1 if n <= 64 else 3) and world["compiled"] == 0
    assert [p for _, _, p, _ in world["launches"]] == [0x40000000, 0x40100000, 0x40200000]
    assert len(_callpath._plans) == 1, "one signature, keyed"


def test_a_torch_stream_objects_handle_is_read_from_its_attribute_on_either_path(world):
    """A ``stream=`` object of torch's stream types gives its handle as its ``cuda_stream`` attribute
    (noted once `as_stream` has adapted one): the compiled path reads it there, for the same object
    or a new one each call (``torch.cuda.current_stream()`` makes a new one), and follows it where
    it changes; an object of another type is adapted by `as_stream` each call."""
    from cudattn._runtime import stream as _stream

    TorchLike = type("Stream", (), {"__module__": "torch.cuda.streams"})
    Other = type("Stream", (), {"__module__": "somewhere.else"})

    def stream_of(cls, handle):
        s = cls()
        s.cuda_stream = handle
        return s

    t1, other = stream_of(TorchLike, CONSUMER), stream_of(Other, CONSUMER)
    try:
        for s, at in ((t1, CONSUMER), (t1, CONSUMER), (stream_of(TorchLike, PRODUCER), PRODUCER),
                      (stream_of(TorchLike, CONSUMER), CONSUMER), (other, CONSUMER)):
            _call(world, _array(0x10000, stream=at), _array(0x90000, stream=at), stream=s)
            assert world["launches"][-1][0] == at
        for s in (t1, other):  # a handle that changes: the next call follows it
            s.cuda_stream = PRODUCER
            _call(world, _array(0x10000, stream=PRODUCER), _array(0x90000, stream=PRODUCER), stream=s)
            assert world["launches"][-1][0] == PRODUCER
        assert world["full"] == 1 and not world["waits"]
        assert world["compiled"] == (6 if _warm.run is not None else 0)
        assert TorchLike in _stream.HANDLE_ATTR_TYPES and Other not in _stream.HANDLE_ATTR_TYPES
    finally:
        _stream.HANDLE_ATTR_TYPES.discard(TorchLike)


def test_a_stream_torch_made_is_noted_lasting_on_either_path(world):
    """A torch stream object whose ``stream_id`` is odd (a stream torch made: torch never destroys
    those) puts its handle among the lasting streams, where dropped results are kept for reuse;
    one whose id is its handle (``torch.cuda.ExternalStream``) does not. On either path: for the
    first call (the Python path, which notes the type too), and for new objects of that type on
    warm calls (the compiled path reads their attribute)."""
    from cudattn._runtime import stream as _stream

    TorchLike = type("Stream", (), {"__module__": "torch.cuda.streams"})
    made, external, later = 0x7100, 0x7200, 0x7300

    def stream_of(handle, sid):
        s = TorchLike()
        s.cuda_stream, s.stream_id = handle, sid
        return s

    try:
        for h, sid in ((made, 17), (external, external), (later, 33), (external, external)):
            _call(world, _array(0x10000, stream=h), _array(0x90000, stream=h), stream=stream_of(h, sid), launch_on=h)
            assert world["launches"][-1][0] == h
        assert {made, later} <= _stream.LASTING_STREAMS and external not in _stream.LASTING_STREAMS
        assert external in _stream.TORCH_EXTERNAL
        assert world["full"] == 1 and world["compiled"] == (3 if _warm.run is not None else 0)
    finally:
        _stream.HANDLE_ATTR_TYPES.discard(TorchLike)
        _stream.LASTING_STREAMS.difference_update((made, later))
        _stream.TORCH_EXTERNAL.discard(external)


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
    assert world["compiled"] == (1 if _warm.run is not None else 0), "the compiled path waits itself"
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
    p2 = _array(0x20000, stream=PRODUCER)  # a second operand of the same producer: one wait

    class Launches(list):  # the launches, noted in `events` too
        def append(self, x):
            events.append(("launch",))
            super().append(x)

    monkeypatch.setitem(world, "launches", Launches(world["launches"]))
    _call(world, p2, o, stream=CONSUMER)
    assert events == [("device", 0), ("wait", CONSUMER, PRODUCER), ("launch",)], "waits before the launch"
    assert world["holds"][-1] == (CONSUMER, (p2, o), 0, None)
    assert world["launches"][-1] == (CONSUMER, 0x20000, 0x90000, 5)
    events.clear()
    assert o.stream_handle == CONSUMER  # out written on the call's stream now
    p3, o = _array(0x30000, stream=PRODUCER + 0x100), _array(0x90000, stream=PRODUCER)
    _call(world, p3, o, stream=CONSUMER)  # two producers: a wait for each, once
    assert events == [("device", 0), ("wait", CONSUMER, PRODUCER + 0x100), ("wait", CONSUMER, PRODUCER),
                      ("launch",)]
    assert world["compiled"] == (2 if _warm.run is not None else 0), "the compiled path waits itself"
    events.clear()
    _call(world, _array(0x10000), _array(0x90000))  # nothing foreign: no device switch, no wait
    assert events == [("launch",)]


def test_a_foreign_out_of_another_package_is_returned_on_the_calls_stream(world, monkeypatch):
    """A CuPy-like ``out`` made on its package's current stream (not the call's) and a DeviceArray
    q of the call's stream, called with ``stream=``: the call waits for out's producer, and the
    DeviceArray it returns for out carries the call's stream (its contents are written there now), on
    either path, so that a later call reading it is ordered after this one."""
    import sys
    import types

    from cudattn._arrays import accessors as _accessors
    from cudattn._arrays import importer as _importer

    cupy = types.ModuleType("cupy")

    class ndarray:
        __module__ = "cupy._core.core"

        def __init__(self, ptr):
            self.dtype, self.shape, self.strides = F16, (2, 64, 4, 64), (32768, 512, 128, 2)
            self.data = types.SimpleNamespace(ptr=ptr, device_id=0)

    cupy.ndarray = ndarray
    current = types.SimpleNamespace(ptr=PRODUCER)
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda d=None: current)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(_accessors, "_cupy_types", ())
    monkeypatch.setitem(_importer.KINDS, ndarray, _importer.CUPY)
    results = []
    for _ in range(3):
        o = ndarray(0x90000)
        results.append(_call(world, _array(0x10000), o, stream=CONSUMER))
        assert world["holds"][-1][0] == CONSUMER
    assert world["waits"] == [(CONSUMER, PRODUCER)] * 3
    assert [(type(r), r.stream_handle, r.ptr) for r in results] == [(DeviceArray, CONSUMER, 0x90000)] * 3
    assert world["full"] == 1 and world["compiled"] == (2 if _warm.run is not None else 0)


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


@pytest.fixture
def compiled(world):
    """`world` with the compiled warm path only."""
    if _warm.run is None:
        pytest.skip("the compiled warm path's own cases")
    return world


def test_a_failed_compiled_launch_raises_naming_the_kernel(compiled, monkeypatch):
    _call(compiled, _array(0x10000), _array(0x90000))
    from cudattn._runtime.errors import CudaError

    def failing(function, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        return 700  # CUDA_ERROR_ILLEGAL_ADDRESS

    fakes = (_LAUNCH(failing), _CAPTURING(lambda stream, status: 0))
    _warm._native.set_driver(*(ctypes.cast(f, ctypes.c_void_p).value for f in fakes))
    with pytest.raises(CudaError, match=r"cuLaunchKernel\(fake"):
        _call(compiled, _array(0x10000), _array(0x90000))
    _warm._native.set_driver(0, 0)  # before the fakes go


def test_the_compiled_path_leaves_recordings_and_capture_to_python_and_makes_the_device_current_for_stream_0(
        compiled, monkeypatch):
    """While a recording is under way, and for a call that would allocate on a capturing stream, the
    compiled path takes nothing: the Python path serves the call (and names the capture problem).
    On a stream handle 0-2 (the current context's streams: torch's default stream is 0) it makes the
    operands' device current before it launches, as the Python path does."""
    q, o = _array(0x10000), _array(0x90000)
    _call(compiled, q, o)
    monkeypatch.setattr(_recording, "active", True)
    _call(compiled, q, o)
    monkeypatch.setattr(_recording, "active", False)
    assert compiled["compiled"] == 0 and len(compiled["launches"]) == 2

    def full(call, args, qa, oa):
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, 0, _Params(qa.ptr, oa.ptr, 5, 0))
        return oa

    made_current = []
    monkeypatch.setattr(_callpath._device, "get_device", lambda *a: made_current.append(a))
    for _ in range(2):  # the signature recorded above, now on the legacy stream's handle
        dispatch("fake", [_array(0x10000, stream=0), _array(0x90000, stream=0)], ("q", "out"), None, (), None, full,
                 None, tensors=2, out_index=1, allocates=False)
    assert compiled["compiled"] == 2 and compiled["launches"][-2:] == [(0, 0x10000, 0x90000, 5)] * 2
    assert made_current == [(0,), (0,)], "each compiled launch on stream 0 made the operands' device current"

    def capturing(stream, status):
        status[0] = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
        return 0

    fakes = (_LAUNCH(lambda *a: 0), _CAPTURING(capturing))
    _warm._native.set_driver(*(ctypes.cast(f, ctypes.c_void_p).value for f in fakes))
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: True)
    with pytest.raises(ValueError, match="graph capture"):
        dispatch("fake", [q, o], ("q", "out"), None, (), None, full, None, tensors=2, out_index=1, allocates=True)
    _warm._native.set_driver(0, 0)  # before the fakes go


def _recorded_then_warm_twice(world, call, q, between, generic, launches=1):
    """One call of ``call(q)`` that records, ``between()``, then two warm calls (``launches`` each):
    their results. Both warm calls were served by the compiled path where it is present, without the
    Python replay's allocations (``generic`` counts those), or by the Python replay."""
    call(q)
    between()
    results = [call(q) for _ in range(2)]
    assert world["full"] == 1 and world["compiled"] == (2 * launches if _warm.run is not None else 0)
    assert len(generic) == (0 if _warm.run is not None else 2)
    return results


@pytest.mark.parametrize("outputs", [1, 2])
def test_a_replay_that_allocates_makes_the_arrays_the_full_path_made(world, monkeypatch, outputs):
    """A warm call that allocates its result takes its block from `_arrays.alloc.allocate` (reuse
    allowed: the stream was found not capturing) and returns an array like the full path's, on the
    call's stream, owning the block; the launch gets the block's address. With one result the
    compiled path makes the arrays itself, one or two (an LSE), as the Python replay makes them."""
    from cudattn._arrays import alloc as _alloc
    from cudattn._arrays import array as _arraymod

    blocks = []

    class Block:
        def __init__(self, ptr):
            self.ptr = ptr

    def allocate(device_id, nbytes, stream, keep=None, reuse=False):
        blocks.append(Block(0x100000 * (len(blocks) + 1)))
        blocks[-1].args = (device_id, nbytes, stream, keep, reuse)
        return blocks[-1]

    monkeypatch.setattr(_alloc, "allocate", allocate)
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: False)
    generic = []  # the Python replay's allocations
    real = _replay.Replay._allocate
    monkeypatch.setattr(_replay.Replay, "_allocate", lambda self, *a: generic.append(1) or real(self, *a))

    def full(call, args, qa):
        if _recording.current() is None:  # not the recording of the signature's first call
            world["full"] += 1
        made = [_arraymod.new_array(qa.shape, qa.dtype, qa.device_id, call.consumer, call.keep, None, True)
                for _ in range(outputs)]
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, call.consumer, _Params(qa.ptr, made[-1].ptr, 5, 0))
        return made[0] if outputs == 1 else tuple(made)

    def call(q):
        return dispatch("alloc", [q], ("q",), None, (outputs,), None, full, None, tensors=1, out_index=None,
                        allocates=True)

    q = _array(0x10000)
    results = _recorded_then_warm_twice(world, call, q, blocks.clear, generic)
    assert [b.args for b in blocks] == [(0, 2 * 64 * 4 * 64 * 2, CONSUMER, None, True)] * (2 * outputs)
    assert [x[2] for x in world["launches"][-2:]] == [blocks[outputs - 1].ptr, blocks[2 * outputs - 1].ptr]
    for i, r in enumerate(results):
        for j, a in enumerate((r,) if outputs == 1 else r):
            assert type(a) is DeviceArray and a.owner is blocks[i * outputs + j] and a.ptr == a.owner.ptr
            assert (a.shape, a.strides, a.dtype, a.device_id, a.stream_handle, a.readonly) == \
                (q.shape, q.strides, F16, 0, CONSUMER, False)


@pytest.mark.parametrize("launches, optional, given_out", [(1, True, False), (2, False, False), (1, True, True),
                                                         (2, False, True)])
def test_a_replay_with_counters_and_a_workspace_takes_the_streams_own_on_either_path(world, monkeypatch, launches,
                                                                                     optional, given_out):
    """A warm call whose one kernel also needs zeroed counters and a workspace (the causal Hopper
    prefill's tile counters, split-KV decode) takes the stream's kept ones from `_arrays.stream_memory`,
    told that the stream does not capture, with the result's block after them in slot order; the
    launch gets their addresses (the workspace's slice at its offset). A call of two launches takes
    a workspace of its own instead (`_arrays.alloc`, reuse allowed). The compiled path does this
    without the Python replay, also for a call given `out=` (no result to allocate, the rest alike)."""
    from cudattn._arrays import alloc as _alloc
    from cudattn._arrays import array as _arraymod
    from cudattn._arrays import stream_memory as _sm

    asked = []

    class Block:
        def __init__(self, ptr):
            self.ptr = ptr

    def allocate(device_id, nbytes, stream, keep=None, reuse=False):
        asked.append(("block", nbytes, stream, reuse))
        return Block(0x100000 * len(asked))

    real_counters = _sm.counters

    def counters(device_id, stream, count, keep=None, capturing=None, optional=False):
        if _recording.active and _recording.current() is not None:
            return real_counters(device_id, stream, count, keep, capturing, optional)
        asked.append(("counters", count, stream, capturing, optional))
        return Block(0xC0000)

    def workspace(device_id, stream, nbytes, keep=None, capturing=None):
        asked.append(("workspace", nbytes, stream, capturing))
        return Block(0xA0000)

    monkeypatch.setattr(_alloc, "allocate", allocate)
    monkeypatch.setattr(_sm, "counters", counters)
    monkeypatch.setattr(_sm, "workspace", workspace)
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: False)
    monkeypatch.setattr(_replay._stream, "is_capturing", lambda s: False)  # `_allocate`'s own question (out=)
    generic = []
    real = _replay.Replay._allocate
    monkeypatch.setattr(_replay.Replay, "_allocate", lambda self, *a: generic.append(1) or real(self, *a))

    def full(call, args, qa, oa=None):
        if _recording.current() is None:
            world["full"] += 1
        out = oa if given_out else _arraymod.new_array(qa.shape, qa.dtype, qa.device_id, call.consumer, call.keep,
                                                       None, True)
        ws = [_arraymod.new_array((300,), F16, qa.device_id, call.consumer, call.keep, None, True) for _ in range(2)]
        ctr = _sm.counters(qa.device_id, call.consumer, 2, call.keep, None, optional)
        for _ in range(launches):
            _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, call.consumer, _Params(ws[1].ptr, ctr.ptr, 5, 0))
        return out

    o = _array(0x90000)

    def call(q):
        if given_out:
            return dispatch("scratch_out", [q, o], ("q", "out"), None, (), None, full, None, tensors=2, out_index=1,
                            allocates=False)
        return dispatch("scratch", [q], ("q",), None, (), None, full, None, tensors=1, out_index=None,
                        allocates=True)

    q = _array(0x10000)
    results = _recorded_then_warm_twice(world, call, q, asked.clear, generic, launches)
    nbytes = 2 * 64 * 4 * 64 * 2
    scratch = ("workspace", 2 * 768, CONSUMER, False) if launches == 1 else ("block", 2 * 768, CONSUMER, True)
    result = [] if given_out else [("block", nbytes, CONSUMER, True)]
    assert asked == [scratch, *result, ("counters", 2, CONSUMER, False, optional)] * 2
    ws = 0xA0000 if launches == 1 else 0x100000 * (len(asked) // 2 + 1)  # own: the last call's first block
    assert [x[1:3] for x in world["launches"][-launches:]] == [(ws + 768, 0xC0000)] * launches
    for r in results:
        assert type(r) is DeviceArray and r.shape == q.shape and r.stream_handle == CONSUMER
        assert r is o if given_out else r.ptr == r.owner.ptr


@pytest.mark.parametrize("meanwhile", ["nothing", "lock held", "released"])
def test_kept_memory_serves_warm_calls_on_either_path(world, monkeypatch, meanwhile):
    """With the real `_arrays.alloc` and `_arrays.stream_memory` (the pool's calls faked): a warm call's
    dropped result is kept and its block serves the next call of its size on its (lasting) stream,
    with no pool call, as the same Block (stream, owner, device kept); the stream's counters are the
    same block each call. The compiled path takes both in C (memory.c): the block from `_kept` under
    the lock without waiting for it (`acquire(False)`), never entering the Python function's `with
    _kept_lock`, and the counters from the table without `_key`. With the lock held elsewhere it
    leaves the block to the Python function; where another thread gave the kept blocks back
    (`release_kept`) while the call made its Block, it looks the list up again under the lock and
    takes a new block from the pool, never one given back."""
    from cudattn._arrays import alloc as _alloc
    from cudattn._arrays import array as _arraymod
    from cudattn._arrays import stream_memory as _sm
    from cudattn._runtime import stream as _stream

    pool = []
    nbytes = 2 * 64 * 4 * 64 * 2

    def alloc_async(nbytes, p, stream):
        pool.append(("alloc", nbytes, stream))
        return 0, 0x4000000 * len(pool)

    class LockSpy:
        """`_kept_lock`, logging how it is taken; ``busy``: held by another thread (a non-blocking
        acquire fails); ``release_first``: another thread's `release_kept` ran just before it."""

        def __init__(self):
            self.log, self.inner, self.busy, self.release_first = [], __import__("threading").Lock(), False, False

        def _release_kept(self):
            if self.release_first:
                self.release_first = False
                for ptr, ctx in _alloc._kept.pop((0, CONSUMER, nbytes), []):
                    _alloc._kept_bytes[0] -= nbytes
                    pool.append(("free", ptr, CONSUMER))

        def acquire(self, *args, **kwargs):
            blocking = args[0] if args else kwargs.get("blocking", True)
            self.log.append(("acquire", args, tuple(kwargs.items())))
            if args == (False,):  # the compiled path's
                self._release_kept()
            return False if self.busy and not blocking else self.inner.acquire(*args, **kwargs)

        def release(self):
            self.inner.release()

        def __enter__(self):
            self.log.append(("enter",))
            self._release_kept()
            self.inner.acquire()

        def __exit__(self, *exc):
            self.inner.release()

    lock = LockSpy()
    lasting = {0, 1, CONSUMER}
    monkeypatch.setattr(_alloc, "_alloc_async", alloc_async)
    monkeypatch.setattr(_alloc, "_free_async", lambda ptr, stream: pool.append(("free", ptr, stream)) or (0,))
    monkeypatch.setattr(_alloc, "_pools", {0: "pool"})
    monkeypatch.setattr(_alloc, "_kept", {})
    monkeypatch.setattr(_alloc, "_kept_bytes", {})
    monkeypatch.setattr(_alloc, "_kept_lock", lock)
    monkeypatch.setattr(_alloc, "LASTING_STREAMS", lasting)
    monkeypatch.setattr(_stream, "LASTING_STREAMS", lasting)
    monkeypatch.setattr(_sm, "_blocks", {})
    monkeypatch.setattr(_sm, "_raw_alloc", lambda device_id, n, stream: pool.append(("raw", n, stream)) or 0xC00000)
    monkeypatch.setattr(_sm, "_zero", lambda ptr, count, stream: None)
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: False)
    monkeypatch.setattr(_stream, "is_capturing", lambda s: False)  # the full path's own question
    keyed = []  # the Python `counters` looks its block up through `_key`; the compiled path does not
    real_key = _sm._key
    monkeypatch.setattr(_sm, "_key", lambda *a: keyed.append(a) or real_key(*a))

    def full(call, args, qa):
        if _recording.current() is None:
            world["full"] += 1
        out = _arraymod.new_array(qa.shape, qa.dtype, qa.device_id, call.consumer, call.keep, None, True)
        ctr = _sm.counters(qa.device_id, call.consumer, 2, call.keep, None, False)
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, call.consumer, _Params(out.ptr, ctr.ptr, 5, 0))
        return out

    def call(q):
        return dispatch("kept", [q], ("q",), None, (), None, full, None, tensors=1, out_index=None, allocates=True)

    q = _array(0x10000)
    call(q)  # recorded
    first = call(q)  # warm: the pool's block, the stream's counters made
    ptr, owner_type = first.ptr, type(first.owner)
    assert [e[0] for e in pool] == ["alloc", "raw"], pool
    del first  # kept (Block.__del__: acquire(blocking=False))
    lock.log.clear()
    keyed.clear()
    lock.busy = meanwhile == "lock held"  # another thread holds it now: a non-blocking acquire fails
    lock.release_first = meanwhile == "released"
    second = call(q)
    compiled = _warm.run is not None
    b = second.owner
    if meanwhile == "released":  # given back to the pool meanwhile: never handed out as well
        assert pool[2:] == [("free", ptr, CONSUMER), ("alloc", nbytes, CONSUMER)] and second.ptr != ptr
    else:
        assert second.ptr == ptr and [e[0] for e in pool] == ["alloc", "raw"], "the kept block must serve"
        assert _alloc._kept_bytes[0] == 0 and not _alloc._kept[(0, CONSUMER, nbytes)]
    assert type(b) is owner_type and (b.ptr, b.nbytes, b.stream, b.keep, b.device_id) == (second.ptr, nbytes,
                                                                                           CONSUMER, None, 0)
    assert world["launches"][-1][1:3] == (second.ptr, 0xC00000) and world["launches"][-2][1:3] == (ptr, 0xC00000)
    took_in_c = compiled and meanwhile != "lock held"
    assert (("enter",) in lock.log) == (not took_in_c)
    if compiled:
        assert ("acquire", (False,), ()) in lock.log
    assert len(keyed) == (0 if compiled else 1), "the stream's counters: found in C on the compiled path"
    assert world["full"] == 1 and world["compiled"] == (2 if compiled else 0)
    lock.busy = False
    del second


def test_a_new_stream_object_for_a_handle_gets_the_old_block_only_for_the_same_stream(world, monkeypatch):
    """Calls given a stream object cudattn cannot tell owns its stream (its protocol only), on a
    handle that does not last: the stream's counters are made once with the stream's id noted, and
    serve the same object's later calls with no driver query (in C on the compiled path). Another
    object for that handle gets them where the driver gives the same id, and gets blocks of its own
    where the handle names a new stream now (the old ones retired)."""
    from cudattn._arrays import stream_memory as _sm
    from cudattn._runtime import stream as _stream

    handle = 0x7100

    class Stream:  # a wrapper of a stream it may not own (`Stream.from_handle`, CuPy's ExternalStream)
        def __cuda_stream__(self):
            return (0, handle)

    ids, queried, made = {handle: 1}, [], []
    monkeypatch.setattr(_sm, "_blocks", {})
    monkeypatch.setattr(_sm, "_retired", [])
    monkeypatch.setattr(_sm, "_stream_id", lambda s: queried.append(s) or ids[s])
    monkeypatch.setattr(_sm, "_raw_alloc", lambda device_id, n, stream: made.append(stream) or 0xC00000 * len(made))
    monkeypatch.setattr(_sm, "_zero", lambda ptr, count, stream: None)
    monkeypatch.setattr(_callpath, "is_capturing", lambda s: False)
    monkeypatch.setattr(_stream, "is_capturing", lambda s: False)
    assert handle not in _stream.LASTING_STREAMS

    full = _full_with_counters(world, optional=False)

    q, o = _array(0x10000, stream=handle), _array(0x90000, stream=handle)

    def call(s):
        dispatch("sid", [q, o], ("q", "out"), s, (), None, full, None, tensors=2, out_index=1, allocates=False)
        return world["launches"][-1][2]  # the counters' address the launch got

    first = Stream()
    call(first)  # recorded
    assert call(first) == 0xC00000 and queried == [handle], "made once, its stream's id noted"
    assert call(first) == 0xC00000 and queried == [handle], "the same object: no query"
    assert call(Stream()) == 0xC00000 and queried == [handle] * 2, "another object, the same stream: its block"
    ids[handle] = 2  # the stream destroyed, the handle given to a new one
    assert call(Stream()) == 0xC00000 * 2 and len(made) == 2, "a new stream: a block of its own"
    assert [b.ptr for b in _sm._retired] == [0xC00000], "the old stream's block retired (its kernels may run)"
    assert world["full"] == 1 and world["compiled"] == (4 if _warm.run is not None else 0)


def test_a_call_given_out_on_a_capturing_stream_leaves_its_memory_to_the_python_path(world, monkeypatch):
    """A call given ``out=`` that still needs the stream's counters asks whether its stream captures a
    graph before making them: capturing, the compiled path sends it back (nothing made), and the
    Python replay gives it the graph's counters (here optional ones: none)."""
    from cudattn._arrays import stream_memory as _sm
    from cudattn._runtime import stream as _stream

    class Counters:
        def __init__(self, ptr):
            self.ptr = ptr

    asked = []
    real_counters = _sm.counters

    def counters(device_id, stream, count, keep=None, capturing=None, optional=False):
        if _recording.active and _recording.current() is not None:  # the recording's placeholder
            return real_counters(device_id, stream, count, keep, capturing, optional)
        asked.append(capturing)
        return Counters(0 if capturing else 0xC0000)

    monkeypatch.setattr(_callpath, "is_capturing", lambda s: world["capturing"])
    monkeypatch.setattr(_stream, "is_capturing", lambda s: world["capturing"])
    monkeypatch.setattr(_sm, "counters", counters)

    full = _full_with_counters(world, optional=True)

    q, o = _array(0x10000), _array(0x90000)

    def call():
        return dispatch("out_capture", [q, o], ("q", "out"), None, (), None, full, None, tensors=2, out_index=1,
                        allocates=False)

    call()  # recorded
    call()  # warm, not capturing
    served = world["compiled"]
    assert served == (1 if _warm.run is not None else 0) and world["launches"][-1][2] == 0xC0000
    asked.clear()
    world["capturing"] = True
    assert call() is o
    assert world["compiled"] == served, "a capturing stream's call must not be served by the compiled path"
    assert asked == [True] and not world["launches"][-1][2], "the graph's counters: none (optional)"


def test_a_replay_writes_each_tensor_map_re_addressed_for_its_operand(world, monkeypatch):
    """A launch whose params carry a TMA map of an operand gets, for new addresses, the map
    re-addressed (`_kernels.tma.replace_address`, asked once an address) at the map's place, and the
    plain pointers beside it; on the compiled path too, which builds the block itself from the maps
    already re-addressed."""
    from cudattn._kernels import tma as _tma

    class _WithMap(ctypes.Structure):
        _fields_ = [("q", ctypes.c_void_p), ("o", ctypes.c_void_p), ("n", ctypes.c_int32), ("pad", ctypes.c_int32),
                    ("map", ctypes.c_ubyte * 128)]

    def raw_map(ptr):  # a stand-in map: the address, then a pattern
        return ptr.to_bytes(8, "little") + bytes(range(120))

    replaced = []
    monkeypatch.setattr(_tma, "replace_address", lambda raw, ptr: replaced.append(ptr) or raw_map(ptr))
    world["params_bytes"] = ctypes.sizeof(_WithMap)

    def full(call, args, qa, oa):
        rec = _recording.current()
        if rec is None:
            world["full"] += 1
        else:
            rec.tensor_map(qa.ptr, raw_map(qa.ptr))
        params = _WithMap(qa.ptr, oa.ptr, 5, 0, (ctypes.c_ubyte * 128)(*raw_map(qa.ptr)))
        _launch.launch(_Kernel, (1, 1, 1), (32, 1, 1), 0, CONSUMER, params)
        return oa

    def call(q, o):
        return dispatch("mapped", [q, o], ("q", "out"), None, (), None, full, None, tensors=2, out_index=1,
                        allocates=False)

    python_builds = []
    real_build = _replay._Step.build
    monkeypatch.setattr(_replay._Step, "build", lambda self, *a: python_builds.append(1) or real_build(self, *a))
    call(_array(0x10000), _array(0x20000))
    python_builds.clear()
    combos = [(qp, 0x100000 * (rnd + 1) + qp) for rnd in range(2) for qp in (0x30000, 0x40000)]
    for qp, op in combos:  # the second round: the maps' addresses seen, new outputs
        call(_array(qp), _array(op))
    assert world["full"] == 1 and world["compiled"] == (4 if _warm.run is not None else 0)
    assert replaced == [0x30000, 0x40000]  # each new address re-addressed once, then taken from the cache
    assert len(python_builds) == (2 if _warm.run is not None else 4)  # C builds blocks of maps seen before
    for raw, (qp, op) in zip(world["params"][-4:], combos):
        w = _WithMap.from_buffer_copy(raw)
        assert (w.q, w.o, w.n, bytes(w.map)) == (qp, op, 5, raw_map(qp))


def test_torch_operands_on_the_compiled_path_as_on_the_python_path(world, monkeypatch):
    """Torch tensors (CPU ones posing as CUDA tensors through a plain subclass) read by the compiled
    path: the same launch, and the same result (a DeviceArray over ``out`` carrying the call's stream)."""
    torch = pytest.importorskip("torch")
    from cudattn._arrays import accessors as _accessors
    from cudattn._arrays import importer as _importer

    class Cuda(torch.Tensor):  # what the accessors read of a CUDA tensor
        __torch_function__ = torch._C._disabled_torch_function_impl
        is_cuda = property(lambda self: True)

        def get_device(self):
            return 0

    _accessors._torch_table()
    monkeypatch.setattr(_accessors, "_torch_plain", {*_accessors._torch_plain, Cuda})
    monkeypatch.setitem(_importer.KINDS, Cuda, _importer.TORCH)
    monkeypatch.setattr(_importer, "_torch_stream", lambda d: CONSUMER)
    q, o = (torch.empty((2, 64, 4, 64), dtype=torch.float16).as_subclass(Cuda) for _ in range(2))
    results = [_call(world, q, o) for _ in range(3)]
    assert world["full"] == 1 and world["compiled"] == (2 if _warm.run is not None else 0)
    assert world["launches"] == [(CONSUMER, q.data_ptr(), o.data_ptr(), 5)] * 3
    for r in results:
        assert type(r) is DeviceArray and r.owner is o and r.ptr == o.data_ptr() and r.stream_handle == CONSUMER
        assert (r.shape, r.strides, r.dtype, r.readonly) == ((2, 64, 4, 64), (32768, 512, 128, 2), F16, False)


def test_jax_arrays_recalled_on_either_path_hold_their_capsules_until_the_work_is_done(world, monkeypatch):
    """JAX-like arrays imported before (`known_jax.recall` faked: a DeviceArray whose owner holds a
    fresh capsule, asked with the call's stream each call): the warm call recalls each, launches, and
    holds the recalled arrays on the call's stream, on the Python path and on the compiled one alike;
    an array that refuses its export raises naming the operand, before any launch."""
    from cudattn._arrays import known_jax as _known_jax

    class Arr:  # a type of the package "jax", as `kind_of` sees it
        __module__ = "jax._src.array"

        def __init__(self, ptr):
            self.ptr = ptr

    asked = []

    def recall(obj, consumer, sync, name):
        if obj.ptr is None:
            raise ValueError(f"{name}: the JAX array has been deleted or donated")
        asked.append((obj.ptr, consumer, sync))
        a = _array(obj.ptr, stream=consumer)
        a.owner = (obj, f"capsule {len(asked)}")
        return a

    monkeypatch.setattr(_known_jax, "recall", recall)
    q, o = Arr(0x10000), Arr(0x90000)

    def call(q, o):
        return _call(world, q, o, stream=CONSUMER)

    results = [call(q, o) for _ in range(3)]
    assert world["full"] == 1 and world["compiled"] == (2 if _warm.run is not None else 0)
    assert world["launches"] == [(CONSUMER, 0x10000, 0x90000, 5)] * 3
    assert asked[-4:] == [(0x10000, CONSUMER, CONSUMER), (0x90000, CONSUMER, CONSUMER)] * 2
    for r, (c, refs, device_id, capturing) in zip(results[1:], world["holds"][1:]):
        assert c == CONSUMER and device_id == 0 and capturing is None
        assert [a.owner[0] for a in refs] == [q, o] and refs[1] is r, "the recalled arrays, held"
        assert r.stream_handle == CONSUMER
    n = len(world["launches"])
    with pytest.raises(ValueError, match="out: the JAX array has been deleted"):
        call(q, Arr(None))

    def interrupted(obj, consumer, sync, name):
        raise KeyboardInterrupt

    monkeypatch.setattr(_known_jax, "recall", interrupted)
    with pytest.raises(KeyboardInterrupt):  # not taken for a miss: it reaches the caller
        call(q, o)
    assert len(world["launches"]) == n


@pytest.mark.parametrize("consumer", [CONSUMER, 0])
def test_jax_arrays_imported_before_are_recalled_with_a_capsule_for_the_calls_stream(world, consumer, monkeypatch):
    """JAX-like arrays that `known_jax` remembers (the compiled path recalls them itself, and finds
    the call's stream itself): with no stream given, the call runs on cudattn's stream of the first
    array's device; each warm call asks every array for a capsule with that stream (DLPack's 1 for
    the legacy stream, handle 0), launches with the remembered addresses, and holds the recalled
    arrays with their capsules. An array that refuses its export raises naming the operand, and an
    interrupt in the export reaches the caller, before any launch."""
    from cudattn._arrays import known_jax as _known_jax
    from cudattn._runtime import stream as _stream

    Arr = _jax_like_type()
    monkeypatch.setitem(_stream._default_stream_refs, 0, _stream.StreamRef(consumer, "cudattn's stream"))
    q, o = Arr(0x10000), Arr(0x90000)
    for x in (q, o):
        _known_jax.remember(x, _array(x.ptr, stream=None))
    in_python, recall, streams, consumer_stream = [], _known_jax.recall, [], _operands.consumer_stream
    monkeypatch.setattr(_known_jax, "recall", lambda *a: in_python.append(a[0]) or recall(*a))
    monkeypatch.setattr(_operands, "consumer_stream", lambda *a: streams.append(a) or consumer_stream(*a))

    def call(q, o):
        return _call(world, q, o, launch_on=consumer)  # the full path on the call's stream

    results = [call(q, o)]
    del streams[:]
    results += [call(q, o) for _ in range(2)]
    compiled = _warm.run is not None
    assert world["full"] == 1 and world["compiled"] == (2 if compiled else 0)
    assert len(in_python) == (2 if compiled else 6), "warm calls on the compiled path recall in C"
    assert not (compiled and streams), "warm calls on the compiled path find the stream in C"
    sync = consumer or 1
    assert world["launches"] == [(consumer, 0x10000, 0x90000, 5)] * 3
    assert q.asked == o.asked == [sync] * 3, "a capsule for the call's stream, every call"
    for i, (r, (c, refs, device_id, _)) in enumerate(zip(results, world["holds"])):
        assert c == consumer and device_id == 0
        assert [a.owner for a in refs] == [(q, f"capsule {0x10000:#x} {i + 1}"), (o, f"capsule {0x90000:#x} {i + 1}")]
        assert refs[1] is r and (r.ptr, r.stream_handle, r.shape, r.dtype) == (0x90000, consumer, (2, 64, 4, 64), F16)
    n = len(world["launches"])
    o.deleted = True
    with pytest.raises(ValueError, match="out: the JAX array has been deleted or donated"):
        call(q, o)
    o.deleted = "interrupt"
    with pytest.raises(KeyboardInterrupt):  # not taken for a miss: it reaches the caller
        call(q, o)
    assert len(world["launches"]) == n


def test_jax_arrays_are_exported_through_jaxs_own_function_of_their_shard(world, monkeypatch):
    """Where `known_jax._export` names JAX's export function for the array's type, a warm call (on
    either path) asks it for the capsule of the array's shard with the call's stream, as the array's
    ``__dlpack__`` would, and skips ``__dlpack__``; where that function refuses, ``__dlpack__`` is
    asked, and its refusal is what the call reports, naming the operand."""
    from cudattn._arrays import known_jax as _known_jax
    from cudattn._runtime import stream as _stream

    class Arr(_jax_like_type()):
        __module__ = "jax._src.array"

        def _fully_replicated_shard(self):
            return ("shard", self.ptr)

    exported, refusing = [], set()

    def export(shard, stream=None):
        if shard[1] in refusing:
            raise RuntimeError("refused")
        exported.append((shard, stream))
        return f"capsule {shard[1]:#x}"

    monkeypatch.setattr(_known_jax, "_export", (export, Arr))
    monkeypatch.setitem(_stream._default_stream_refs, 0, _stream.StreamRef(CONSUMER, "cudattn's stream"))
    q, o = Arr(0x10000), Arr(0x90000)
    for x in (q, o):
        _known_jax.remember(x, _array(x.ptr, stream=None))
    assert _known_jax._export == (export, Arr), "remember keeps an export already found"
    for _ in range(3):
        _call(world, q, o)
    assert world["full"] == 1 and world["compiled"] == (2 if _warm.run is not None else 0)
    assert exported == [(("shard", q.ptr), CONSUMER), (("shard", o.ptr), CONSUMER)] * 3
    assert q.asked == o.asked == []
    assert [[a.owner[1] for a in refs] for _, refs, _, _ in world["holds"]] == \
        [[f"capsule {0x10000:#x}", f"capsule {0x90000:#x}"]] * 3
    refusing.add(o.ptr)  # refused by the export, given by the method: the call runs
    _call(world, q, o)
    assert o.asked == [CONSUMER] and [a.owner[1] for a in world["holds"][-1][1]] == \
        [f"capsule {0x10000:#x}", f"capsule {0x90000:#x} 1"]
    n = len(world["launches"])
    o.deleted = True  # refused by both: the method's refusal, named
    with pytest.raises(ValueError, match="out: the JAX array has been deleted or donated.*Array has been deleted"):
        _call(world, q, o)
    assert len(world["launches"]) == n


def test_jaxs_export_function_is_found_where_jax_has_it(monkeypatch):
    """`known_jax._find_export`: JAX's ``buffer_to_dlpack_managed_tensor`` (as ``jax._src.dlpack``
    imports it) with the array's type where the type has ``_fully_replicated_shard``; False otherwise."""
    import sys
    import types

    from cudattn._arrays import known_jax as _known_jax

    class Arr:
        def _fully_replicated_shard(self):
            return self

    def fn(shard, stream=None):
        return None

    mod = types.ModuleType("jax._src.dlpack")
    mod._jax = types.SimpleNamespace(buffer_to_dlpack_managed_tensor=fn)
    monkeypatch.setitem(sys.modules, "jax._src.dlpack", mod)
    assert _known_jax._find_export(Arr()) == (fn, Arr)
    assert _known_jax._find_export(object()) is False  # no shard method
    del mod._jax  # JAX before 0.8: reached through xla_client._xla
    mod.xla_client = types.SimpleNamespace(_xla=types.SimpleNamespace(buffer_to_dlpack_managed_tensor=fn))
    assert _known_jax._find_export(Arr()) == (fn, Arr)
    mod._jax, mod.xla_client = types.SimpleNamespace(), types.SimpleNamespace()
    assert _known_jax._find_export(Arr()) is False  # no such function
    monkeypatch.delitem(sys.modules, "jax._src.dlpack")
    assert _known_jax._find_export(Arr()) is False


@pytest.mark.parametrize("per_thread", ["", "0", "1"])
def test_the_compiled_launch_takes_stream_0_as_cuda_bindings_does(per_thread, monkeypatch):
    """Handle 0 is the legacy default stream, or the per-thread one where cuda-python is told so
    (CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM): the compiled path's entry points are asked for
    the same one, so that a warm call on handle 0 runs on the stream the Python path would use."""
    from cuda.bindings import driver

    asked = []

    def get_proc(name, version, flags):
        asked.append((name, flags))
        return driver.CUresult.CUDA_SUCCESS, 0x1000 + len(asked), None

    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", per_thread)
    monkeypatch.setattr(driver, "cuGetProcAddress", get_proc)
    assert _warm._bind() == (0x1001, 0x1002, 0x1003, 0x1004, 0x1005)
    flag = driver.CUdriverProcAddress_flags
    want = flag.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread == "1" else \
        flag.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    assert asked == [(b"cuLaunchKernel", want), (b"cuStreamIsCapturing", want), (b"cuEventRecord", want),
                     (b"cuEventQuery", want), (b"cuThreadExchangeStreamCaptureMode", want)]
