"""Fuzzing the argument checks of every public entry point (issue 7, part 6). CPU only, no GPU.

Hypothesis draws random shapes (0, 1, large-but-cheap, wrong ranks), dtypes, strides (views,
negative, broadcast, non-unit last stride, misaligned byte offsets), layouts, scalar arguments of
every type and value, NumPy arrays, cudattn DeviceArrays, and fake device arrays (objects with a
random or malformed ``__cuda_array_interface__`` dict, or a ``__dlpack__`` producer), and calls
`cudattn.attention`, `attention_with_kvcache`, `merge_attention_states`, `quantize_fp8` and
`dequantize`. The property (DESIGN §2):

- a call either raises a **documented** error: ValueError, TypeError or NotImplementedError,
  raised on purpose by cudattn (the innermost frame is a ``raise`` statement in the package, so
  the message was written for the caller; a TypeError leaked from ``int("x")`` or a subscript does
  not count), with a non-empty message;
- or it passes every check and reaches its first GPU work (below), with arguments that the driver
  and the kernels' parameter structs can take (32-bit sizes, 64-bit pointers and stream handles,
  a float32 score scale that is finite and not flushed to 0);
- never any other exception (IndexError, KeyError, AttributeError, OverflowError, SyntaxError, ...)
  and never a crash.

Where the call runs fully on the CPU (quantize_fp8 / dequantize / merge_attention_states of NumPy
arrays) the results are checked too: shapes, dtypes, finite and saturated values where documented.

No GPU here, so the module fixture `_no_gpu` replaces, for this module only:

- ``_protocols._pointer_device`` (the one driver call made while wrapping a foreign array,
  ``cuPointerGetAttribute``: which device owns a CAI pointer): every pointer is on device 0;
- ``_device.get_device`` (cuInit, primary context): a stand-in device object, with the real
  function's ordinal rules (only device 0 exists); ``_stream._default_stream_ref`` (the library
  stream, created on first use): handle 0x5EED; ``_protocols.stream_wait`` (an event): nothing;
  ``_callpath.is_capturing`` (a stream query): never capturing;
- the first GPU work of each entry point raises `ReachedGPU`: ``_kernels.attention.run_device`` (the device
  path of attention, after validate), ``_kernels.kvcache.run_kvcache``, ``_device.device_properties`` (the NumPy
  paths, and quantize/dequantize on the device, ask for it right after their checks),
  ``_array.empty_on`` / ``_host_io.to_device`` (allocations and uploads).

Reproducible: ``derandomize=True`` and ``database=None``; the whole module runs in a few seconds.
"""

from __future__ import annotations

import ctypes
import decimal
import fractions
import linecache
import math
import os
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cudattn
from cudattn._kernels import attention as _launches
from cudattn._kernels import kvcache as _kv_launches
from cudattn._ops import attention as _api
from cudattn._arrays import array as _array
from cudattn._calls import call as _callpath
from cudattn._runtime import device as _device
from cudattn._arrays import dlpack as _dlpack
from cudattn._arrays import importer as _importer
from cudattn._arrays import protocols as _protocols
from cudattn._ops import kvcache as _kvcache
from cudattn._kernels import params as _params
from cudattn._runtime import stream as _stream
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
from cudattn._spec import validate as _validate
from cudattn._arrays.array import DeviceArray
from cudattn._runtime.stream import StreamRef

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
PKG_DIR = os.path.dirname(os.path.realpath(cudattn.__file__))
LOG2E = 1.4426950408889634


def fuzz(n: int):
    """Hypothesis settings for CI: fixed examples (derandomize), no example database, no deadline;
    marked ``slow`` (CI runs them; ``-m "not slow"`` leaves them out of a quick run)."""
    fixed = settings(max_examples=n, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))
    return lambda test: pytest.mark.slow(fixed(test))


# ---------------------------------------------------------------------------------------------
# The GPU stand-ins
# ---------------------------------------------------------------------------------------------


class ReachedGPU(Exception):
    """The call passed every argument check and got to its first GPU work."""


class _FakeDevice:
    def __init__(self, device_id: int):
        self.device_id = device_id


def _fake_get_device(device_id=None):
    # The real get_device's rules for the ordinal (an int or int-like; ValueError for a device that
    # does not exist), on a machine with one device.
    if device_id is None:
        device_id = 0
    if type(device_id) is not int:
        device_id = _device._as_ordinal(device_id)
    if not 0 <= device_id < 1:
        raise ValueError(f"device {device_id} does not exist: this process sees 1 CUDA device(s)")
    return _FakeDevice(device_id)


def _int_fits(x, bits: int, signed: bool = True) -> bool:
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    return isinstance(x, int) and lo <= x < hi


def _check_launchable(problem, arrays, handle) -> None:
    """What the parameter structs and the driver will be handed fits their types."""
    for f in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
        n = getattr(problem, f)
        assert _int_fits(n, 32) and n >= 0, f"{f} = {n!r} does not fit the kernels' int32"
    for f in ("q_strides", "k_strides", "v_strides", "out_strides"):
        g = getattr(problem, f)
        if g is not None:
            assert all(_int_fits(s, 64) for s in (g.batch, g.seq, g.head)), f"{f} = {g} does not fit int64"
    for a in arrays:
        if a is not None:
            assert _int_fits(a.ptr, 64, signed=False), f"pointer {a.ptr!r} is not 64-bit"
    assert _int_fits(handle, 64, signed=False), f"stream handle {handle!r} is not 64-bit"
    scale = problem.scale
    if problem.descales is not None:
        scale = scale * problem.descales.q * problem.descales.k
        assert math.isfinite(np.float32(problem.descales.v)), f"v_descale {problem.descales.v!r} overflows float32"
    s32 = ctypes.c_float(_params.scale_log2(scale)).value
    assert math.isfinite(s32) and s32 != 0, f"scale {problem.scale!r} gives a float32 score scale of {s32}"


def _reached_run_device(problem, qa, ka, va, oa, device, device_id, sref):
    _check_launchable(problem, (qa, ka, va, oa), sref.handle)
    raise ReachedGPU("run_device")


def _reached_kvcache_run(problem, qa, ka, va, kn, vn, sl, bt, new_geoms, device, device_id, sref, oa=None, cq=None, rows=None):
    _check_launchable(problem, (qa, ka, va, kn, vn, sl, bt), sref.handle)
    raise ReachedGPU("kvcache._run")


def _reached(what):
    def stop(*args, **kwargs):
        raise ReachedGPU(what)
    return stop


@pytest.fixture(scope="module", autouse=True)
def _no_gpu():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_protocols, "_pointer_device", lambda ptr: 0)
        mp.setattr(_device, "get_device", _fake_get_device)
        for module in (_array, _protocols, _transfer):
            mp.setattr(module, "get_device", _fake_get_device)
        mp.setattr(_stream, "_default_stream_ref", lambda device_id: StreamRef(0x5EED, None))
        mp.setattr(_protocols, "stream_wait", lambda consumer, producer: None)
        mp.setattr(_callpath, "is_capturing", lambda stream: False)
        mp.setattr(_device, "device_properties", _reached("device_properties"))
        mp.setattr(_launches, "run_device", _reached_run_device)
        mp.setattr(_kv_launches, "run_kvcache", _reached_kvcache_run)
        mp.setattr(_array, "empty_on", _reached("empty_on"))
        mp.setattr(_host_io, "to_device", _reached("to_device"))
        yield


# ---------------------------------------------------------------------------------------------
# The property
# ---------------------------------------------------------------------------------------------

DOCUMENTED = (ValueError, TypeError, NotImplementedError)


def assert_deliberate(e: BaseException) -> None:
    """``e`` was raised by a ``raise`` statement in cudattn, with a message."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.realpath(tb.tb_frame.f_code.co_filename)
    line = linecache.getline(path, tb.tb_lineno).strip()
    where = f"{path}:{tb.tb_lineno}: {line}"
    assert path.startswith(PKG_DIR + os.sep), f"{type(e).__name__} ({e}) raised outside cudattn, at {where}"
    assert line.startswith("raise "), f"{type(e).__name__} ({e}) leaked from a statement that is not a raise: {where}"
    assert str(e).strip(), f"{type(e).__name__} without a message at {where}"


def outcome(fn, *args, **kwargs):
    """Call ``fn``: ("gpu", None) when it reached GPU work, ("ok", result) when it returned (CPU-only
    paths), (ExceptionType, message) for a documented error. Anything else propagates: a failure."""
    try:
        res = fn(*args, **kwargs)
    except ReachedGPU:
        return "gpu", None
    except DOCUMENTED as e:
        assert_deliberate(e)
        return type(e), str(e)
    return "ok", res


# ---------------------------------------------------------------------------------------------
# Strategies: junk values, dtypes, host arrays, device arrays
# ---------------------------------------------------------------------------------------------

_JUNK_VALUES = [
    None, True, False, np.bool_(True), 0, 1, -1, 2, 3, 2**31, 2**63, 2**64, -(2**70), 10**400,
    0.0, -0.0, 0.5, 1.5, -2.5, 1e-320, 1e-300, 1e-45, 1e38, 1e39, 1e300, math.nan, math.inf, -math.inf,
    1j, complex(math.nan, 1), "", "bshd", "bhsd", "BSHD", "yes", "1.0", "none", b"bshd",
    [], [1], [True], (), (1, 2), {}, {"a": 1}, set(), object(), type, print,
    np.float16(math.inf), np.float16(0.5), np.float32(1e-40), np.float64(math.nan), np.int64(3), np.int8(-1),
    np.uint64(2**64 - 1), np.longdouble("1e4000"), np.array(0.5), np.array([0.5]), np.array([True]),
    np.array(["bshd"]), np.array(["bshd", "bhsd"]), np.str_("bshd"), np.zeros((2, 2), np.float32),
    fractions.Fraction(1, 3), fractions.Fraction(10**400, 1), decimal.Decimal("1.5"), decimal.Decimal("nan"),
]
JUNK = st.sampled_from(_JUNK_VALUES)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)


#: Per example, the chance that each argument is made wrong: mostly small, so that most examples
#: carry zero to two faults and get deep into the checks (or all the way to the GPU).
RATES = st.sampled_from([0.0, 0.0, 0.02, 0.05, 0.05, 0.1, 0.2, 0.5])


def bad(draw, rate: float) -> bool:
    return rate > 0 and draw(st.integers(0, 999)) < rate * 1000


def arg(draw, rate: float, valid, wrong=None):
    """A value drawn from ``valid``, or (with probability ``rate``) from ``wrong`` (default: anything)."""
    if bad(draw, rate):
        return draw(wrong if wrong is not None else st.one_of(JUNK, ANY_FLOAT))
    return draw(valid)


_BAD_DTYPES = [
    np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32),
    np.dtype(np.bool_), np.dtype(np.complex64), np.dtype(object), np.dtype([("a", "<f2")]), np.dtype(">f2"),
    np.dtype(ml_dtypes.float8_e5m2), np.dtype("V2"), np.dtype("U1"), np.dtype("datetime64[s]"),
]
GOOD_DTYPES = [F16, BF16, FP8]
BAD_DTYPES = st.sampled_from(_BAD_DTYPES)

OUT_DTYPE_JUNK = st.one_of(
    st.sampled_from([FP8, np.float64, np.int8, "i4, ,", ",", "f2,f2", "(2)f2", "O", "V3", "U-1", "M8[xx]",
                     np.dtype([("a", "<f2")]), np.dtype("V0"), "float", "half"]),
    st.text(max_size=6),
    JUNK,
)
LAYOUT_JUNK = st.one_of(JUNK, st.text(max_size=5), st.sampled_from(["BSHD", "sbhd", " bshd", "bshd\0"]))


def _shapes(layout, B, Sq, Sk, Hq, Hkv, D):
    if layout == "bhsd":
        return (B, Hq, Sq, D), (B, Hkv, Sk, D)
    return (B, Sq, Hq, D), (B, Sk, Hkv, D)


@st.composite
def perturbed_shape(draw, shape, rate):
    """``shape``, or (with probability ``rate``) with one size replaced, an axis dropped or one added."""
    if not bad(draw, rate):
        return tuple(shape)
    shape = list(shape)
    how = draw(st.sampled_from(["size", "size", "drop", "add"]))
    if how == "size" and shape:
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.sampled_from([0, 1, 2, 3, 5, 7, 9, 12, 264]))
    elif how == "drop" and shape:
        del shape[draw(st.integers(0, len(shape) - 1))]
    else:
        shape.insert(draw(st.integers(0, len(shape))), draw(st.sampled_from([1, 2])))
    return tuple(shape)


#: NumPy views the NumPy path must take (it copies them to the device anyway) ...
GOOD_VIEWS = ["contiguous", "contiguous", "padded", "step", "reversed", "broadcast", "last_stride", "fortran",
              "readonly", "transposed", "misaligned"]
#: ... and ones it may refuse.
ODD_VIEWS = ["masked", "subclass"]


class _Sub(np.ndarray):
    pass


def host_tensor(shape, dtype, mode, fill=1):
    """A NumPy array of ``shape`` and ``dtype`` made as ``mode`` says (values ``fill``)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)

    def make(s):
        try:
            return np.full(s, fill, dtype)
        except Exception:  # structured, void, datetime ...: zeros will do
            return np.zeros(s, dtype)

    if len(shape) == 0 or mode == "contiguous" or (mode == "misaligned" and (dtype.hasobject or not dtype.itemsize)):
        return make(shape)
    if mode == "padded":
        return make(shape[:-1] + (shape[-1] + 3,))[..., : shape[-1]]
    if mode == "step" and len(shape) >= 2:
        return make(shape[:1] + (2 * shape[1],) + shape[2:])[:, ::2]
    if mode == "reversed" and len(shape) >= 2:
        return make(shape)[:, ::-1]
    if mode == "broadcast" and len(shape) >= 3:
        return np.broadcast_to(make(shape[:2] + (1,) + shape[3:]), shape)
    if mode == "last_stride":
        return make(shape[:-1] + (2 * shape[-1],))[..., ::2]
    if mode == "misaligned":
        n = math.prod(shape) * dtype.itemsize
        raw = np.zeros(n + 64, np.uint8)
        off = (16 - raw.ctypes.data % 16) % 16 + dtype.itemsize * (1 + (n % 3))
        a = raw[off:off + n].view(dtype).reshape(shape)
        a[...] = make(())
        return a
    if mode == "fortran":
        return np.asfortranarray(make(shape))
    if mode == "readonly":
        a = make(shape)
        a.flags.writeable = False
        return a
    if mode == "masked":
        with warnings.catch_warnings():  # NumPy's default fill value (1e20) overflows 16- and 8-bit floats
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.ma.masked_array(make(shape))
    if mode == "subclass":
        return make(shape).view(_Sub)
    if mode == "transposed" and len(shape) == 4:
        return make((shape[0], shape[2], shape[1], shape[3])).transpose(0, 2, 1, 3)
    return make(shape)


@st.composite
def numpy_tensor(draw, shape, dtype, rate):
    """A NumPy input: its shape, dtype and view each perturbed with probability ``rate``."""
    shape = draw(perturbed_shape(shape, rate))
    dtype = draw(BAD_DTYPES) if bad(draw, rate) else dtype
    mode = draw(st.sampled_from(ODD_VIEWS)) if bad(draw, rate) else draw(st.sampled_from(GOOD_VIEWS))
    return host_tensor(shape, dtype, mode)


# ---- fake device arrays --------------------------------------------------------------------


class FakeCAI:
    """A foreign device array: only a ``__cuda_array_interface__`` (maybe malformed, maybe raising)."""

    def __init__(self, cai):
        self._cai = cai

    @property
    def __cuda_array_interface__(self):
        if isinstance(self._cai, BaseException):
            raise self._cai
        return self._cai


class FakeDLPack:
    """A foreign DLPack producer: ``__dlpack_device__`` returns ``device``; ``__dlpack__`` returns a
    capsule of ``array`` (a DeviceArray, exported as cudattn exports its own; FP8 relabelled as
    PyTorch sends it), or ``capsule`` as is, or raises BufferError (the protocol's refusal)."""

    def __init__(self, device, array=None, capsule=None, refuse=False, fp8=False):
        self.device, self.array, self.capsule, self.refuse, self.fp8 = device, array, capsule, refuse, fp8

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None):
        if self.refuse:
            raise BufferError("this producer cannot export")
        if self.array is None:
            return self.capsule
        cap = self.array.__dlpack__(stream=-1)
        if self.fp8:  # cudattn exports FP8 as uint8; PyTorch sends kDLFloat8_e4m3fn
            addr = _dlpack._PyCapsule_GetPointer(cap, b"dltensor")
            _dlpack.DLManagedTensor.from_address(addr).dl_tensor.dtype.code = _dlpack.kDLFloat8_e4m3fn
        return cap


def _c_strides(shape, itemsize):
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


_ptrs = st.integers(1 << 20, 1 << 40).map(lambda p: p * 16)


@st.composite
def device_strides(draw, shape, itemsize, may_broadcast=True):
    """Byte strides of a view of a device buffer: C order, maybe padded rows, a stepped axis,
    transposed middle axes, or (inputs only) a broadcast axis."""
    if len(shape) != 4:
        return _c_strides(shape, itemsize)
    pad = draw(st.sampled_from([0, 0, 0, 16 // itemsize, 64 // itemsize]))
    alloc = list(shape[:3]) + [shape[3] + pad]
    transposed = draw(st.booleans()) and draw(st.booleans())
    if transposed:
        alloc[1], alloc[2] = alloc[2], alloc[1]
    step = draw(st.integers(0, 2)) if draw(st.booleans()) and draw(st.booleans()) else None
    if step is not None:  # a view taking every other index of this axis of the buffer
        alloc[step] *= 2
    s = list(_c_strides(tuple(alloc), itemsize))
    if step is not None:
        s[step] *= 2
    if transposed:
        s[1], s[2] = s[2], s[1]
    if may_broadcast and draw(st.integers(0, 9)) == 0:
        s[draw(st.integers(1, 2))] = 0
    return tuple(s)


_CAI_JUNK = {
    "version": st.sampled_from([0, 1, 2, 4, -1, "3", 3.0, None, True, 2**70]),
    "shape": st.sampled_from([None, "abc", 5, [1, 2, 3, 4], (1, -4, 2, 64), (1.5, 2, 2, 8), (math.inf, 1, 1, 8),
                              (math.nan, 1, 1, 8), (2**40, 2**40, 1, 8), (np.int64(2), 3, 1, 8), (True, 2, 1, 8),
                              ((1,), 2, 3, 4), (1, 2), ()]),
    "typestr": st.sampled_from(["<f4", "|u1", "<i1", "|b1", "<c8", "|O", "V2", "<V2", ">f2", "<U3", "", "zz", None, 5,
                                b"<f2", [("a", "<f2")], "f2,f2", ",", "i4, ,", "<f2"]),
    "data": st.one_of(
        st.sampled_from([None, (), (0x10000,), (0x10000, False, 1), 0x10000, ("abc", False), (1.5, False),
                         (None, False), (0, False), [0x10000, True], (np.uint64(0x10000), False), (0x10000, None),
                         (0x10000, np.array([1, 2])), (0x10000, "no")]),
        st.tuples(st.sampled_from([-16, -1, 1, 2, 8, 2**64 - 16, 2**64, 2**80, 0x10008, 0x10002]), st.booleans()),
    ),
    "strides": st.sampled_from([None, (2,), (0, 0, 0, 0), (2, 2, 2, 2), (-2, -2, -2, -2), (1.5, 2, 2, 2),
                                ("a", 1, 2, 3), 5, (2**80, 2, 2, 2), (2**63, 512, 128, 2), [512, 128, 64, 2]]),
    "mask": st.sampled_from([None, object(), np.zeros(2, bool)]),
    "stream": st.sampled_from([None, 0, 1, 2, 0x1234, -1, "s", 1.5, True, 2**64, 2**70]),
    "descr": st.sampled_from([None, 5, "x"]),
}


@st.composite
def cai_dict(draw, shape, typestr="<f2", itemsize=2, rate=0.3):
    """A CAI v3 dict describing ``shape`` (maybe strided); with probability ``rate`` some keys are
    dropped or replaced by junk."""
    strides = draw(st.one_of(st.none(), device_strides(shape, itemsize)))
    stream = draw(st.sampled_from([None, None, 1, 2, 0x1234]))
    d = dict(version=3, shape=tuple(shape), typestr=typestr, data=(draw(_ptrs), False), strides=strides,
             descr=[("", typestr)], mask=None, stream=stream)
    if not bad(draw, rate):
        return d
    for key in draw(st.lists(st.sampled_from(sorted(_CAI_JUNK)), min_size=1, max_size=3, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            d.pop(key, None)
        else:
            d[key] = draw(_CAI_JUNK[key])
    return d


@st.composite
def device_tensor(draw, shape, dtype, rate, *, may_broadcast=True):
    """A device array for ``shape``/``dtype``: a cudattn DeviceArray (any dtype), a CAI object
    (float16 only: CAI has no bfloat16/FP8), or a DLPack producer; with probability ``rate``
    malformed (a bad shape, dtype, pointer, interface dict or producer)."""
    shape = draw(perturbed_shape(shape, rate))
    dtype = np.dtype(draw(BAD_DTYPES) if bad(draw, rate) else dtype)
    kind = draw(st.sampled_from(["device_array", "device_array", "cai", "dlpack"]))
    if kind == "cai" and dtype == F16:
        if bad(draw, rate / 4):
            return FakeCAI(draw(st.sampled_from([None, [1, 2], "cai", RuntimeError("boom"), AttributeError("no"), {}])))
        return FakeCAI(draw(cai_dict(shape, "<f2", 2, rate)))
    strides = draw(device_strides(shape, max(dtype.itemsize, 1), may_broadcast)) if len(shape) == 4 else None
    ptr = draw(_ptrs)
    if bad(draw, rate / 2):
        ptr += draw(st.sampled_from([1, 2, 8]))  # misaligned
    try:
        arr = DeviceArray(ptr, shape, dtype, strides, device_id=0)
    except (TypeError, ValueError):  # a shape DeviceArray itself refuses: hand over a CAI object instead
        return FakeCAI(draw(cai_dict(shape, "<f2", 2, 1.0)))
    if kind == "dlpack":
        if bad(draw, rate):
            how = draw(st.sampled_from(["device", "capsule", "refuse", "cpu"]))
            if how == "device":
                dev = draw(st.sampled_from([None, (2,), (2, 0, 1), (2, "a"), (2, 5), (2, -1), "cuda", (2, 1.5)]))
                return FakeDLPack(dev, arr)
            if how == "capsule":
                return FakeDLPack((2, 0), capsule=draw(st.sampled_from([None, 5, "capsule", object()])))
            if how == "refuse":
                return FakeDLPack((2, 0), refuse=True)
            return FakeDLPack((1, 0), arr)  # host memory
        return FakeDLPack((2, 0), arr, fp8=dtype == FP8)
    return arr


class _Stream:
    """An object speaking the ``__cuda_stream__`` protocol, maybe badly."""

    def __init__(self, answer):
        self.answer = answer

    def __cuda_stream__(self):
        return self.answer


STREAM_ARG = st.one_of(st.none(), st.sampled_from([0, 1, 2, 0x5EED, np.int64(7)]),
                       st.builds(_Stream, st.just((0, 7))))
STREAM_JUNK = st.one_of(st.integers(-2, 2**70), JUNK, st.builds(
    _Stream, st.sampled_from([(1, 7), (0, "x"), (0, -3), (0, 2**64), 7, None, (0,)])))


# ---------------------------------------------------------------------------------------------
# cudattn.attention
# ---------------------------------------------------------------------------------------------


@st.composite
def problem_sizes(draw, rate, sizes=(0, 1, 1, 2, 3, 5)):
    """(layout, B, Sq, Sk, Hq, Hkv, D, dtype): valid, but for faults drawn with probability ``rate``."""
    layout = draw(st.sampled_from(["bshd", "bhsd"]))
    B, Sq, Sk = (draw(st.sampled_from(sizes)) for _ in range(3))
    Hkv = draw(st.sampled_from([1, 1, 2, 3]))
    Hq = Hkv * draw(st.sampled_from([1, 1, 2, 4]))
    if bad(draw, rate):
        Hq = draw(st.sampled_from([0, Hkv + 1, 2 * Hkv + 1]))
    dtype = draw(st.sampled_from(GOOD_DTYPES))
    D = draw(st.sampled_from([16, 32, 64, 128, 256] if dtype == FP8 else [8, 16, 40, 64, 72, 128, 256]))
    if bad(draw, rate):
        D = draw(st.sampled_from([0, 4, 12, 24, 264, 512]))
    return layout, B, Sq, Sk, Hq, Hkv, D, dtype


@st.composite
def descale_arg(draw, host: bool, B: int, Hkv: int, rate):
    """q/k/v_descale: None, a float, or a float32 (B, Hkv) array (NumPy for NumPy calls, else a device
    array); with probability ``rate`` anything else (non-finite, huge, wrong shape or dtype, junk)."""
    kind = "junk" if bad(draw, rate) else draw(st.sampled_from(["none", "scalar", "array"]))
    if kind == "none":
        return None
    if kind == "scalar":
        return draw(st.floats(1e-3, 1e3) | st.integers(1, 9))
    if kind == "array":
        if host:
            value = np.float32(draw(st.floats(1e-3, 1e3)))
            if B * Hkv > 1 << 20:  # huge logical shapes: a (B, Hkv) array would be gigabytes, and checking
                return float(value)  # its values (finite, > 0) reads them all, so a scalar stands in
            return np.full((B, Hkv), value, F32)
        return DeviceArray(draw(_ptrs), (B, Hkv), F32, device_id=0)
    kind = draw(st.sampled_from(["scalar", "array", "junk"]))
    if kind == "scalar":
        return draw(ANY_FLOAT)
    if kind == "junk":
        return draw(JUNK)
    shape = draw(st.sampled_from([(B, Hkv), (B, Hkv), (B + 1, Hkv), (B, Hkv + 1), (Hkv,), (), (1, B, Hkv)]))
    dtype = np.dtype(draw(st.sampled_from([F32, F32, np.float64, np.float16, np.int32, object, BF16])))
    if host == (draw(st.integers(0, 9)) > 0) and math.prod(shape) < 10**6:  # (mostly) NumPy for NumPy calls
        value = draw(st.sampled_from([1.0, 0.5, 0.0, -1.0, 1e-30, 1e300, math.nan, math.inf, 3e38, 1e-45]))
        if dtype == object:
            return np.full(shape, value, object)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.full(shape, value).astype(dtype)
    return DeviceArray(draw(_ptrs), shape, dtype, draw(st.sampled_from([None, (0,) * len(shape)])), device_id=0)


@st.composite
def attention_kwargs(draw, host: bool, sizes, rate):
    """Keyword arguments of one attention call: valid for these sizes unless a fault is drawn."""
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    fp8 = dtype == FP8
    kw = {"layout": arg(draw, rate, st.just(layout), LAYOUT_JUNK)}
    for name in ("causal", "return_lse"):
        if draw(st.booleans()):
            kw[name] = arg(draw, rate, st.sampled_from([True, False, np.bool_(True)]))
    if draw(st.booleans()):
        kw["scale"] = arg(draw, rate, st.one_of(st.none(), st.floats(-100, 100), st.integers(-3, 3)))
    if draw(st.booleans()):
        kw["num_splits"] = arg(draw, rate, st.just(None) if fp8 else st.one_of(st.none(), st.integers(1, 128)),
                               st.one_of(st.integers(-2, 200), JUNK))
    if draw(st.booleans()):
        valid = st.sampled_from([None, BF16, F16, F32, "bfloat16", "fp16", np.float32]) if fp8 else st.sampled_from(
            [None, dtype, dtype.name])
        kw["out_dtype"] = arg(draw, rate, valid, st.one_of(OUT_DTYPE_JUNK, st.sampled_from([F16, BF16, F32])))
    for name in ("q_descale", "k_descale", "v_descale"):
        if fp8 and draw(st.booleans()) or bad(draw, rate / 3):
            kw[name] = draw(descale_arg(host, B, Hkv, rate if fp8 else 1.0))
    return kw


@fuzz(400)
@given(st.data())
def test_attention_numpy_arguments(data):
    """cudattn.attention with NumPy arrays (small: the NumPy path copies strided input to be
    contiguous before its checks)."""
    rate = data.draw(RATES, label="rate")
    sizes = data.draw(problem_sizes(rate))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(numpy_tensor(s, dtype, rate), label=n) for n, s in (("q", qs), ("k", ks), ("v", ks)))
    kw = data.draw(attention_kwargs(True, sizes, rate), label="kwargs")
    if data.draw(st.booleans()):
        odt = np.dtype(_validate.resolve_out_dtype(None, dtype))
        out_dt = data.draw(st.sampled_from([F16, BF16, F32, FP8])) if bad(data.draw, rate) else odt
        kw["out"] = (data.draw(numpy_tensor(qs, out_dt, rate)) if kw.get("out_dtype") is None
                     else None)
        if bad(data.draw, rate / 2):
            kw["out"] = data.draw(st.one_of(JUNK, st.just(DeviceArray(16 << 20, qs, F16, device_id=0))))
    if bad(data.draw, rate / 3):  # one of q, k, v not a NumPy array at all
        args = [q, k, v]
        args[data.draw(st.integers(0, 2))] = data.draw(st.one_of(JUNK, st.just(DeviceArray(16 << 20, qs, F16,
                                                                                            device_id=0))))
        q, k, v = args
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome(cudattn.attention, q, k, v, **kw)


@fuzz(200)
@given(st.data())
def test_validate_large_shapes(data):
    """The validation layer (what the NumPy path calls) on broadcast NumPy views of large logical
    shapes (no memory behind them): 32-bit sizes, 2**62-element spans."""
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    big = st.sampled_from([1, 2, 2**16, 2**31 - 1, 2**31, 2**32 + 1, 2**40])
    B, Sq, Sk, Hkv = (data.draw(big) for _ in range(4))
    Hq = Hkv * data.draw(st.sampled_from([1, 2]))
    dtype = data.draw(st.sampled_from(GOOD_DTYPES))
    D = data.draw(st.sampled_from([16, 64, 256]))
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    try:
        q, k = (np.broadcast_to(np.ones((1, 1, 1, D), dtype), s) for s in (qs, ks))
    except ValueError:  # beyond NumPy's own limits (its sizes are signed 64-bit)
        return
    kw = data.draw(attention_kwargs(True, (layout, B, Sq, Sk, Hq, Hkv, D, dtype), 0.05))
    res = outcome(_validate.validate, q, k, k, host=True, **kw)
    if res[0] == "ok":
        p = res[1]
        assert max(p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv) < 2**31


@fuzz(400)
@given(st.data())
def test_attention_device_arguments(data):
    """cudattn.attention with device arrays: DeviceArrays, CAI objects and DLPack producers, some
    malformed; every scalar argument and `out` and `stream` fuzzed too."""
    rate = data.draw(RATES, label="rate")
    sizes = data.draw(problem_sizes(rate))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    if bad(data.draw, max(rate, 0.1)):  # large but cheap: nothing is allocated
        B, Sq, Sk = (data.draw(st.sampled_from([1, 2**20, 2**31 - 1, 2**31, 2**33])) for _ in range(3))
        sizes = (layout, B, Sq, Sk, Hq, Hkv, D, dtype)
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(device_tensor(s, dtype, rate), label=n) for n, s in (("q", qs), ("k", ks), ("v", ks)))
    kw = data.draw(attention_kwargs(False, sizes, rate), label="kwargs")
    if data.draw(st.booleans()):
        odt = np.dtype(_validate.resolve_out_dtype(None, dtype))
        if kw.get("out_dtype") is None:
            kw["out"] = data.draw(device_tensor(qs, odt, rate, may_broadcast=False))
        if bad(data.draw, rate / 2):
            kw["out"] = data.draw(st.one_of(JUNK, st.just(np.zeros((1, 2, 2, 8), F16)),
                                            st.just(DeviceArray(16 << 20, qs, odt, device_id=0, readonly=True))))
    if data.draw(st.booleans()):
        kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
    if bad(data.draw, rate / 3):
        args = [q, k, v]
        args[data.draw(st.integers(0, 2))] = data.draw(st.one_of(JUNK, st.just(np.zeros((1, 2, 2, 8), F16))))
        q, k, v = args
    outcome(cudattn.attention, q, k, v, **kw)


@fuzz(150)
@given(st.data())
def test_valid_device_calls_reach_the_gpu(data):
    """No false refusals: every valid combination (sizes including 0 and 1, both layouts, GQA,
    every dtype, strided, transposed and broadcast inputs, descales, out) reaches the GPU."""
    sizes = data.draw(problem_sizes(0.0, sizes=(0, 1, 2, 7, 300)))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(device_tensor(s, dtype, 0.0)) for s in (qs, ks, ks))
    kw = data.draw(attention_kwargs(False, sizes, 0.0))
    if data.draw(st.booleans()):
        odt = cudattn._spec.dtypes.resolve_out_dtype(kw.get("out_dtype"), dtype)
        kw["out"] = data.draw(device_tensor(qs, odt, 0.0, may_broadcast=False))
    kw["stream"] = data.draw(STREAM_ARG)
    res = outcome(cudattn.attention, q, k, v, **kw)
    # The stand-ins share one fake address, so a drawn out overlaps the inputs: refused, by rule.
    assert res[0] == "gpu" or ("out" in kw and res[0] is ValueError and "out overlaps" in str(res[1])), res


@fuzz(100)
@given(st.data())
def test_valid_numpy_calls_reach_the_gpu(data):
    """No false refusals on the NumPy path: any strides (the NumPy path copies them to the device)."""
    sizes = data.draw(problem_sizes(0.0, sizes=(0, 1, 2, 7)))
    layout, B, Sq, Sk, Hq, Hkv, D, dtype = sizes
    qs, ks = _shapes(layout, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (data.draw(numpy_tensor(s, dtype, 0.0)) for s in (qs, ks, ks))
    kw = data.draw(attention_kwargs(True, sizes, 0.0))
    if data.draw(st.booleans()):
        kw["out"] = np.empty(qs, cudattn._spec.dtypes.resolve_out_dtype(kw.get("out_dtype"), dtype))
    res = outcome(cudattn.attention, q, k, v, **kw)
    assert res[0] == "gpu", res


# ---------------------------------------------------------------------------------------------
# Foreign arrays: CUDA Array Interface and DLPack
# ---------------------------------------------------------------------------------------------


@fuzz(400)
@given(st.data())
def test_as_device_array_cai(data):
    """Wrapping a CAI object (device_id_of, then as_device_array, as the API does): a documented
    error naming the argument, or a DeviceArray that describes a real view (non-negative int sizes,
    strides of the right length, a 64-bit pointer, a numeric dtype)."""
    shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 2**40]), max_size=4).map(tuple))
    obj = FakeCAI(data.draw(cai_dict(shape, "<f2", 2, 0.8)))
    handle = data.draw(st.sampled_from([None, 0, 1, 0x5EED]))
    res = outcome(_importer.device_id_of, obj, name="x")
    if res[0] != "ok":
        assert res[1].startswith("x: "), res
        return
    res = outcome(_importer.as_device_array, obj, name="x", stream_handle=handle)
    if res[0] == "ok":
        a = res[1]
        assert all(type(n) is int and n >= 0 for n in a.shape)
        assert len(a.strides) == len(a.shape) and all(type(s) is int for s in a.strides)
        assert 0 <= a.ptr < 2**64 and a.dtype.kind in "biufc"
    else:
        assert res[1].startswith("x: "), res


@fuzz(150)
@given(st.data())
def test_as_device_array_dlpack(data):
    """DLPack producers: capsules of any exportable dtype, shape and strides; junk devices and capsules."""
    dtype = data.draw(st.sampled_from(list(_dlpack._EXPORT)))
    shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 5]), max_size=4).map(tuple))
    strides = tuple(s * data.draw(st.sampled_from([1, -1, 0, 2])) for s in _c_strides(shape, dtype.itemsize))
    arr = DeviceArray(data.draw(_ptrs), shape, dtype, strides, device_id=0)
    obj = data.draw(st.one_of(
        st.just(FakeDLPack((2, 0), arr)),
        st.builds(FakeDLPack, st.sampled_from([(2, 0), (13, 0), (1, 0), (2, 3), (2,), None, (2, "0"), "x"]),
                  st.just(arr)),
        st.builds(FakeDLPack, st.just((2, 0)), st.none(), st.sampled_from([None, 3, "capsule"])),
        st.just(FakeDLPack((2, 0), refuse=True)),
    ))
    res = outcome(_importer.device_id_of, obj, name="x")
    if res[0] == "ok":
        res = outcome(_importer.as_device_array, obj, name="x")
    if res[0] == "ok":
        a = res[1]
        expect = np.dtype(np.uint8) if dtype == FP8 else dtype  # FP8 crosses DLPack as uint8
        assert (a.ptr, a.shape, a.strides, a.dtype) == (arr.ptr, arr.shape, arr.strides, expect)
    else:
        assert res[1].startswith("x: "), res


# ---------------------------------------------------------------------------------------------
# attention_with_kvcache
# ---------------------------------------------------------------------------------------------


@st.composite
def kvcache_call(draw, host: bool):
    """Keyword arguments of one attention_with_kvcache call (valid unless faults are drawn: shapes,
    dtypes, lengths and page ids out of range, shared appended pages, junk arguments)."""
    rate = draw(RATES)
    B = draw(st.sampled_from([1, 1, 2, 3]))
    Sq = draw(st.sampled_from([1, 1, 2, 16]))
    Hkv = draw(st.sampled_from([1, 2]))
    Hq = Hkv * draw(st.sampled_from([1, 2]))
    D = draw(st.sampled_from([8, 64, 64, 128]))
    if bad(draw, rate):
        D = 12
    dtype = draw(st.sampled_from([FP8, F32])) if bad(draw, rate) else draw(st.sampled_from([F16, BF16]))
    s_new = draw(st.sampled_from([0, 0, 1, 2, 5]))
    paged = draw(st.booleans())
    if paged:
        page_size = 8 if bad(draw, rate) else draw(st.sampled_from([16, 32]))
        max_pages = draw(st.sampled_from([1, 2, 3]))
        num_pages = B * max_pages + draw(st.sampled_from([0, 1, 3]))
        if bad(draw, rate):
            num_pages = draw(st.sampled_from([1, 2]))
        cache_shape = (num_pages, page_size, Hkv, D)
        capacity = page_size * max_pages
    else:
        capacity = draw(st.sampled_from([5, 16, 33]))
        cache_shape = (B, capacity, Hkv, D)
        num_pages = B
    shapes = dict(q=(B, Sq, Hq, D), k_cache=cache_shape, v_cache=cache_shape)
    if s_new:
        shapes.update(k_new=(B, s_new, Hkv, D), v_new=(B, s_new, Hkv, D))
    args = {}
    for name, shape in shapes.items():
        if host:
            mode = "contiguous"
            if bad(draw, rate):
                mode = draw(st.sampled_from(["readonly", "padded", "misaligned", "broadcast", "masked"]))
            elif name not in ("k_cache", "v_cache"):
                mode = draw(st.sampled_from(["contiguous", "contiguous", "padded", "step"]))
            dt = draw(BAD_DTYPES) if bad(draw, rate / 2) else dtype
            args[name] = host_tensor(draw(perturbed_shape(shape, rate / 2)), dt, mode)
        else:
            args[name] = draw(device_tensor(shape, dtype, rate / 2, may_broadcast=name not in ("k_cache", "v_cache")))
    if bad(draw, rate / 2):
        args.pop(draw(st.sampled_from(["k_new", "v_new", "q"])), None)
        if "q" not in args:
            args["q"] = draw(JUNK)
    # cache_seqlens (and block_table): NumPy arrays (values checked) on either path, or (device path) device arrays
    lens = [draw(st.integers(0, capacity - s_new)) if capacity >= s_new else 0 for _ in range(B)]
    if bad(draw, rate):
        lens[draw(st.integers(0, B - 1))] = draw(st.sampled_from([-1, -3, capacity - s_new + 1, capacity + 3,
                                                                   2**31 - 1]))
    seqlens = np.array(lens, np.int64)
    if bad(draw, rate / 2):
        seqlens = draw(st.sampled_from([seqlens[:-1], np.append(seqlens, 0), seqlens[None]]))
    bad_dtype = bad(draw, rate / 2)
    seqlens = seqlens.astype(draw(st.sampled_from([np.int64, np.uint32, np.float32])) if bad_dtype else np.int32)
    kinds = ["numpy"] if host else ["numpy", "device"]
    kind = draw(st.sampled_from(kinds))
    if bad(draw, rate / 2):
        kind = draw(st.sampled_from(["none", "junk"]))
    args["cache_seqlens"] = {"numpy": seqlens, "none": None, "junk": draw(JUNK),
                             "device": DeviceArray(draw(_ptrs), seqlens.shape, seqlens.dtype, device_id=0)}[kind]
    if paged:
        table = np.array(draw(st.permutations(range(num_pages)))[: B * max_pages] if num_pages >= B * max_pages
                         else [draw(st.integers(0, num_pages - 1)) for _ in range(B * max_pages)], np.int64)
        table = np.resize(table, B * max_pages).reshape(B, max_pages)
        if bad(draw, rate):
            table[draw(st.integers(0, B - 1)), draw(st.integers(0, max_pages - 1))] = draw(
                st.sampled_from([-1, num_pages, num_pages + 5, 2**31 - 1, 0]))
        if bad(draw, rate / 2):
            table = draw(st.sampled_from([table[:, :0], table.reshape(-1), table[:-1], table.T]))
        table = table.astype(draw(st.sampled_from([np.int64, np.float32])) if bad(draw, rate / 2) else np.int32)
        kind = draw(st.sampled_from(kinds))
        if bad(draw, rate / 2):
            kind = draw(st.sampled_from(["none", "junk"]))
        strides = table.strides[::-1] if bad(draw, rate) else None
        args["block_table"] = {"numpy": table, "none": None, "junk": draw(JUNK),
                               "device": DeviceArray(draw(_ptrs), table.shape, table.dtype, strides,
                                                     device_id=0)}[kind]
    elif bad(draw, rate / 2):
        args["block_table"] = np.zeros((B, 1), np.int32)
    for name, valid, junk in (
            ("causal", st.booleans(), None), ("return_lse", st.booleans(), None),
            ("scale", st.one_of(st.none(), st.floats(-10, 10)), None),
            ("num_splits", st.one_of(st.none(), st.integers(1, 128)), st.one_of(st.integers(-1, 130), JUNK)),
            ("stream", STREAM_ARG, STREAM_JUNK)):
        if draw(st.booleans()) and (name != "stream" or not host):
            args[name] = arg(draw, rate, valid, junk)
    return args


def _shape(x) -> tuple:
    return tuple(x.shape) if hasattr(x, "shape") else _importer.as_device_array(x).shape


def _kv_invariants(args) -> None:
    """What an accepted call with NumPy lengths / table promised to have checked (README, KV caches):
    each length (appended keys included) within the capacity, every page a sequence uses a page of
    the cache, and no cache slot appended to by two sequences."""
    sl, bt, kn = args.get("cache_seqlens"), args.get("block_table"), args.get("k_new")
    cache = _shape(args["k_cache"])
    paged = bt is not None
    page_size = cache[1]
    capacity = page_size * (_shape(bt)[1] if paged else 1)
    s_new = 0 if kn is None else _shape(kn)[1]
    if isinstance(sl, np.ndarray):
        lens = sl.astype(np.int64)
        assert np.all(lens >= 0) and np.all(lens + s_new <= capacity), (lens, s_new, capacity)
    if isinstance(bt, np.ndarray):
        used = np.full(bt.shape[0], capacity) if not isinstance(sl, np.ndarray) else sl.astype(np.int64) + s_new
        for b, n in enumerate(-(-used // page_size)):
            assert np.all((bt[b, :n] >= 0) & (bt[b, :n] < cache[0])), (b, bt[b], cache[0])
        if s_new and isinstance(sl, np.ndarray):
            slots = [int(bt[b, p // page_size]) * page_size + p % page_size
                     for b in range(bt.shape[0]) for p in range(int(sl[b]), int(sl[b]) + s_new)]
            assert len(slots) == len(set(slots)), "two sequences append to one cache slot"


@fuzz(300)
@given(kvcache_call(host=True))
def test_kvcache_numpy_arguments(args):
    res = outcome(cudattn.attention_with_kvcache, **args)
    if res[0] == "gpu":
        _kv_invariants(args)


@fuzz(300)
@given(kvcache_call(host=False))
def test_kvcache_device_arguments(args):
    res = outcome(cudattn.attention_with_kvcache, **args)
    if res[0] == "gpu":
        _kv_invariants(args)


# ---------------------------------------------------------------------------------------------
# merge_attention_states
# ---------------------------------------------------------------------------------------------

LSE_VALUES = st.one_of(st.floats(-80, 80, width=32), st.just(-math.inf))


@fuzz(300)
@given(st.data())
def test_merge_numpy(data):
    """NumPy parts: a documented error, or a result of the right shape and dtype, finite where the
    inputs are (LSEs finite or -inf), equal to the single part when there is one, with no
    RuntimeWarning."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    n = 0 if bad(data.draw, rate / 2) else data.draw(st.sampled_from([1, 1, 2, 3, 5]))
    B, Sq, H, D = (data.draw(st.sampled_from([0, 1, 2, 3])) for _ in range(4))
    oshape = (B, Sq, H, D) if layout == "bshd" else (B, H, Sq, D)
    dtype = data.draw(st.sampled_from([F16, BF16, F32]))
    outs, lses = [], []
    for _ in range(n):
        vals = data.draw(st.lists(st.floats(-4, 4, width=16), min_size=1, max_size=4))
        dt = data.draw(st.sampled_from([F16, F32, np.int32, np.float64, object])) if bad(data.draw, rate) else dtype
        outs.append(np.resize(np.array(vals, np.float32), data.draw(perturbed_shape(oshape, rate))).astype(dt))
        lv = data.draw(st.lists(LSE_VALUES, min_size=1, max_size=4))
        ldt = data.draw(st.sampled_from([np.float64, F16])) if bad(data.draw, rate) else F32
        lses.append(np.resize(np.array(lv, np.float32), data.draw(perturbed_shape((B, H, Sq), rate))).astype(ldt))
    if (data.draw(st.integers(0, 4)) == 0 and n and len({(o.shape, o.dtype) for o in outs}) == 1
            and len({(x.shape, x.dtype) for x in lses}) == 1):
        outs, lses = np.stack(outs), np.stack(lses)  # one array with a leading N axis
    elif data.draw(st.booleans()):
        outs, lses = tuple(outs), tuple(lses)
    if bad(data.draw, rate / 2):
        outs = data.draw(st.one_of(JUNK, st.just(iter(outs))))
    if bad(data.draw, rate / 2):
        lses = data.draw(st.one_of(JUNK, st.just(lses[:-1])))
    kw = {"layout": arg(data.draw, rate / 2, st.just(layout), LAYOUT_JUNK)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.merge_attention_states, outs, lses, **kw)
    if res[0] != "ok":
        return
    out, lse = res[1]
    first = outs[0]
    b, s, h, _ = first.shape if kw["layout"] == "bshd" else np.array(first.shape)[[0, 2, 1, 3]]
    assert out.shape == first.shape and out.dtype == first.dtype
    assert lse.dtype == F32 and lse.shape == (b, h, s)
    assert np.all(np.isfinite(out.astype(np.float32))) and not np.isnan(lse).any() and not np.any(lse == np.inf)
    if len(outs) == 1:  # a single part comes back unchanged (but for rows that saw no key: 0)
        assert np.array_equal(lse, np.asarray(lses[0]))
        empty = np.isneginf(lse).transpose(0, 2, 1) if kw["layout"] == "bshd" else np.isneginf(lse)
        want = np.where(empty[..., None], 0, np.asarray(first, np.float64))
        assert np.array_equal(out.astype(np.float64), want)


@fuzz(150)
@given(st.data())
def test_merge_device(data):
    """Device parts (as lists, stacked, mixed with NumPy, empty, junk): documented error or GPU."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    n = data.draw(st.sampled_from([1, 2, 3, 16, 17] + ([0, 20] if bad(data.draw, rate) else [])))
    B, Sq, H = (data.draw(st.sampled_from([1, 2, 3])) for _ in range(3))
    D = data.draw(st.sampled_from([8, 64]))
    oshape = (B, Sq, H, D) if layout == "bshd" else (B, H, Sq, D)
    dtype = data.draw(st.sampled_from([F16, BF16, F32]))
    if data.draw(st.integers(0, 3)) == 0:  # stacked, evenly spaced
        outs = DeviceArray(data.draw(_ptrs), data.draw(perturbed_shape((n,) + oshape, rate)), dtype, device_id=0)
        lses = DeviceArray(data.draw(_ptrs), data.draw(perturbed_shape((n, B, H, Sq), rate)), F32, device_id=0)
    else:  # a list of parts with one set of strides (the device path wants them alike)
        o_strides = data.draw(device_strides(oshape, dtype.itemsize, False))
        base_o, base_l = data.draw(_ptrs), data.draw(_ptrs)
        outs = [DeviceArray(base_o + 4096 * (i * i + 1), oshape, dtype, o_strides, device_id=0) for i in range(n)]
        lses = [DeviceArray(base_l + 4096 * (i * i + 1), (B, H, Sq), F32, device_id=0) for i in range(n)]
        for parts, shape, dt in ((outs, oshape, dtype), (lses, (B, H, Sq), F32)):
            if n and bad(data.draw, rate):
                parts[data.draw(st.integers(0, n - 1))] = data.draw(device_tensor(shape, dt, 0.5))
    if bad(data.draw, rate / 2):
        outs = data.draw(st.one_of(JUNK, st.just([np.zeros(oshape, dtype)] * max(n, 1)), st.just([])))
    if bad(data.draw, rate / 2):
        lses = data.draw(st.one_of(JUNK, st.just([np.zeros((B, H, Sq), F32)] * max(n, 1)), st.just([])))
    kw = {"layout": arg(data.draw, rate / 2, st.just(layout), LAYOUT_JUNK)}
    if data.draw(st.booleans()):
        kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
    outcome(cudattn.merge_attention_states, outs, lses, **kw)


# ---------------------------------------------------------------------------------------------
# quantize_fp8 / dequantize
# ---------------------------------------------------------------------------------------------

E4M3_MAX = 448.0


@fuzz(250)
@given(st.data())
def test_quantize_numpy(data):
    """Host quantize_fp8: a documented error (bad arguments, non-finite input), or e4m3 values that
    are never NaN and saturate at +-448, positive finite float32 descales of shape (B, G) (1 for an
    all-zero group, equal everywhere per tensor), the largest value mapped to +-448, and
    dequantize(x8, descale) within half an e4m3 step of x."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 3, 4])) for _ in range(4))
    shape = data.draw(perturbed_shape((B, S, H, D) if layout == "bshd" else (B, H, S, D), rate))
    dtype = data.draw(st.sampled_from([F32, F32, np.float64, F16, BF16]))
    if bad(data.draw, rate):
        dtype = data.draw(st.sampled_from([FP8, np.int32, object, np.complex64, np.bool_]))
    exponent = data.draw(st.sampled_from([0, 0, -140, -40, -10, 10, 30, 37, 100]))
    vals = data.draw(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6))
    x = np.resize(np.array(vals, np.float64) * 2.0**exponent, shape)
    if bad(data.draw, rate) and x.size:
        x.flat[data.draw(st.integers(0, x.size - 1))] = data.draw(st.sampled_from([math.nan, math.inf, 0.0, 1e300]))
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        x = x.astype(dtype)
    if data.draw(st.integers(0, 5)) == 0 and x.ndim == 4:
        x = host_tensor(x.shape, x.dtype, data.draw(st.sampled_from(["reversed", "step", "padded", "transposed",
                                                                     "broadcast", "fortran", "subclass"])))
    if bad(data.draw, rate / 2):  # its mask would be ignored (a masked NaN used to come out as a NaN e4m3 value)
        x = np.ma.masked_array(x, mask=np.ones(x.shape, bool))
    kw = {"layout": arg(data.draw, rate, st.just(layout), LAYOUT_JUNK)}
    if data.draw(st.booleans()):
        kw["per"] = arg(data.draw, rate, st.sampled_from(["tensor", "head"]))
    if data.draw(st.booleans()):
        kw["heads_kv"] = arg(data.draw, rate, st.sampled_from([None, 1, 2, 4, np.int64(2)]),
                             st.one_of(st.sampled_from([3, 0, -1, 2**70]), JUNK))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.quantize_fp8, x, **kw)
    if res[0] != "ok":
        return
    x8, d = res[1]
    Bx, Sx, Hx, Dx = x.shape if kw["layout"] == "bshd" else (x.shape[0], x.shape[2], x.shape[1], x.shape[3])
    G = Hx if kw.get("heads_kv") is None else int(kw["heads_kv"])
    assert x8.dtype == FP8 and x8.shape == x.shape and x8.flags.c_contiguous
    assert d.dtype == F32 and d.shape == (Bx, G)
    v8 = x8.astype(np.float32)
    assert not np.isnan(v8).any() and np.all(np.abs(v8) <= E4M3_MAX)
    assert np.all(np.isfinite(d)) and np.all(d > 0)
    if kw.get("per", "tensor") == "tensor" and d.size:
        assert np.all(d == d.flat[0])
    if not x.size:
        return
    xf = x.astype(np.float64)
    back = cudattn.dequantize(x8, d, layout=kw["layout"]).astype(np.float64)
    # per element: |back - x| <= 2^-4 |x| (3 mantissa bits, rounded to nearest) + half the subnormal
    # step, 2^-10 * descale
    dh = np.repeat(d.astype(np.float64), Hx // G, axis=1)  # (B, H)
    dfull = dh[:, None, :, None] if kw["layout"] == "bshd" else dh[:, :, None, None]
    tol = 2.0**-4 * np.abs(xf) + 2.0**-10 * dfull + 1e-30
    assert np.all(np.abs(back - xf) <= tol * (1 + 1e-5)), float(np.max(np.abs(back - xf) / tol))
    if kw.get("per", "tensor") == "tensor" and np.abs(xf).max() > 2.0**-100:
        assert np.abs(v8).max() == E4M3_MAX  # the largest |x| lands on 448 (descale above its 2^-126 floor)


@fuzz(150)
@given(st.data())
def test_dequantize_numpy(data):
    """Host dequantize: documented error, or exactly float32(e4m3) * descale rounded to out_dtype."""
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 4])) for _ in range(4))
    shape = data.draw(perturbed_shape((B, S, H, D) if layout == "bshd" else (B, H, S, D), rate))
    codes = np.resize(np.array(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=8)), np.uint8), shape)
    x8 = codes if data.draw(st.integers(0, 3)) == 0 else codes.view(FP8)
    if bad(data.draw, rate):
        x8 = x8.astype(data.draw(st.sampled_from([F16, F32, object])))
    G = data.draw(st.sampled_from([1, 2, 4]))
    dshape = (B, G)
    if bad(data.draw, rate):
        dshape = data.draw(st.sampled_from([(B, 3), (B, 0), (G,), (B + 1, G), ()]))
    dval = data.draw(st.sampled_from([1.0, 0.5, 2.0**-126, 1e30, -3.0, 0.0]))
    ddt = data.draw(st.sampled_from([np.float64, np.int32, F16])) if bad(data.draw, rate) else F32
    with np.errstate(over="ignore", invalid="ignore"):
        descale = np.full(dshape, dval).astype(ddt)
    if bad(data.draw, rate / 2):
        descale = data.draw(JUNK)
    out_dtype = arg(data.draw, rate, st.sampled_from([np.float32, F16, BF16, "float16", "bf16"]), OUT_DTYPE_JUNK)
    kw = dict(layout=arg(data.draw, rate, st.just(layout), LAYOUT_JUNK), out_dtype=out_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = outcome(cudattn.dequantize, x8, descale, **kw)
    if res[0] != "ok":
        return
    y = res[1]
    odt = cudattn._spec.dtypes.as_dtype(out_dtype)
    assert y.shape == x8.shape and y.dtype == odt and y.flags.c_contiguous
    xs = x8.view(FP8).astype(np.float32)
    Hx = x8.shape[2] if kw["layout"] == "bshd" else x8.shape[1]
    dh = np.repeat(descale, Hx // descale.shape[1], axis=1)
    dfull = dh[:, None, :, None] if kw["layout"] == "bshd" else dh[:, :, None, None]
    with np.errstate(over="ignore", invalid="ignore"):
        want = (xs * dfull.astype(np.float32)).astype(odt)
    assert np.array_equal(y.astype(np.float64), want.astype(np.float64), equal_nan=True)


@fuzz(150)
@given(st.data())
def test_quantize_and_dequantize_device_arguments(data):
    rate = data.draw(RATES)
    layout = data.draw(st.sampled_from(["bshd", "bhsd"]))
    B, S, H, D = (data.draw(st.sampled_from([0, 1, 2, 4] + ([2**31] if bad(data.draw, rate) else [])))
                  for _ in range(4))
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    kw = dict(layout=arg(data.draw, rate, st.just(layout), LAYOUT_JUNK))
    if data.draw(st.booleans()):
        dtype = data.draw(st.sampled_from([F32, F16, BF16]))
        x = data.draw(device_tensor(shape, dtype, rate))
        if data.draw(st.booleans()):
            kw["per"] = arg(data.draw, rate, st.sampled_from(["tensor", "head"]))
        if data.draw(st.booleans()):
            kw["heads_kv"] = arg(data.draw, rate, st.sampled_from([None, 1, 2]))
        if data.draw(st.booleans()):
            kw["stream"] = arg(data.draw, rate, STREAM_ARG, STREAM_JUNK)
        outcome(cudattn.quantize_fp8, x, **kw)
    else:
        x = data.draw(device_tensor(shape, data.draw(st.sampled_from([FP8, np.uint8])), rate))
        G = data.draw(st.sampled_from([1, 2]))
        descale = data.draw(device_tensor((B, G), F32, rate, may_broadcast=False))
        if bad(data.draw, rate / 2):
            descale = data.draw(st.one_of(JUNK, st.just(np.ones((B, G), F32))))
        kw["out_dtype"] = arg(data.draw, rate, st.sampled_from([np.float32, F16, BF16]), OUT_DTYPE_JUNK)
        outcome(cudattn.dequantize, x, descale, **kw)


# ---------------------------------------------------------------------------------------------
# Regression tests: each bug the fuzzing found, as a plain test
# ---------------------------------------------------------------------------------------------


def _cai(shape=(1, 4, 2, 64), typestr="<f2", ptr=0x7F00_0000_0000, **kw):
    d = dict(version=3, shape=shape, typestr=typestr, data=(ptr, False), strides=None)
    d.update(kw)
    return FakeCAI(d)


GOOD = _cai()


def _fails(exc, pattern, fn, *args, **kwargs):
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kwargs)
    assert_deliberate(info.value)


@pytest.mark.parametrize("cai,exc,pattern", [
    # was KeyError 'data' (device_id_of read the pointer before any check)
    (dict(data=KeyError), TypeError, r"^q: malformed __cuda_array_interface__ \(no 'data'"),
    # was TypeError "'NoneType' object is not subscriptable"
    (dict(data=None), TypeError, r"^q: malformed .*'data' must be \(pointer int, readonly bool\)"),
    # was ValueError "invalid literal for int()"
    (dict(data=("x", False)), TypeError, r"^q: malformed .*'data'"),
    # was OverflowError "cannot convert float infinity to integer"
    (dict(shape=(1, 4, 2, math.inf)), TypeError, r"^q: malformed .*'shape' must be a tuple of ints"),
    # were ValueError / TypeError from int() and iter()
    (dict(strides=("a", 1, 2, 3)), TypeError, r"^q: malformed .*'strides' must be a tuple of ints"),
    (dict(strides=5), TypeError, r"^q: malformed .*'strides'"),
    (dict(strides=(2, 2)), ValueError, r"^q: __cuda_array_interface__ strides \(2, 2\) and shape .* differ in length"),
    # was TypeError "'>=' not supported between instances of 'str' and 'int'"
    (dict(version="3"), TypeError, r"^q: malformed .*'version' must be an int"),
    # was accepted as float64 (np.dtype(None)), then refused as "q has dtype float64"
    (dict(typestr=None), TypeError, r"^q: CUDA Array Interface typestr must be a string"),
    # was SyntaxError from np.dtype(",")
    (dict(typestr=","), TypeError, r"^q: unsupported CUDA Array Interface typestr ','"),
    # was ValueError "invalid literal for int()"
    (dict(stream="s"), TypeError, r"^q: malformed .*'stream' must be None or an int"),
    (dict(stream=-1), ValueError, r"^q: __cuda_array_interface__ stream handle must be >= 0"),
    # were accepted, then OverflowError in the driver (cuPointerGetAttribute, kernel parameters)
    (dict(data=(-16, False)), ValueError, r"^q: __cuda_array_interface__ data pointer -0x10 is not a 64-bit"),
    (dict(data=(2**64, False)), ValueError, r"^q: __cuda_array_interface__ data pointer 0x10000000000000000"),
    (dict(shape=(1, -4, 2, 64)), ValueError, r"^q: __cuda_array_interface__ shape .* has a negative dimension"),
])
def test_malformed_cuda_array_interface(cai, exc, pattern):
    d = dict(version=3, shape=(1, 4, 2, 64), typestr="<f2", data=(0x7F00_0000_0000, False), strides=None)
    d = {key: val for key, val in {**d, **cai}.items() if val is not KeyError}  # KeyError: drop the key
    _fails(exc, pattern, cudattn.attention, FakeCAI(d), GOOD, GOOD)


@pytest.mark.parametrize("cai", [None, [1, 2], "cai"])
def test_cuda_array_interface_not_a_dict(cai):
    # was TypeError "'NoneType' object is not subscriptable" / "list indices must be integers"
    _fails(TypeError, r"^q: malformed __cuda_array_interface__ \(expected a dict", cudattn.attention,
           FakeCAI(cai), GOOD, GOOD)


@pytest.mark.parametrize("dev", [(2, 0, 1), (2, "a"), None, "cuda"])
def test_malformed_dlpack_device(dev):
    # was ValueError "too many values to unpack" / "invalid literal for int()"
    arr = DeviceArray(0x7F00_0000_0000, (1, 4, 2, 64), F16, device_id=0)
    q = FakeDLPack(dev, arr)
    if dev in (None, "cuda"):  # not a CUDA device by any reading: not a device array
        _fails(TypeError, r"^q", cudattn.attention, q, arr, arr)
    else:
        _fails(TypeError, r"^q: FakeDLPack.__dlpack_device__\(\) must return \(device_type, device_id\)",
               cudattn.attention, q, arr, arr)


def test_dlpack_refusal_is_a_type_error_naming_the_argument():
    # was BufferError, which §2 does not document
    arr = DeviceArray(0x7F00_0000_0000, (1, 4, 2, 64), F16, device_id=0)
    _fails(TypeError, r"^k: FakeDLPack could not be imported through DLPack", cudattn.attention,
           arr, FakeDLPack((2, 0), refuse=True), arr)


@pytest.mark.parametrize("spelling", ["i4, ,", ","])
def test_out_dtype_strings_numpy_cannot_parse(spelling):
    # was SyntaxError from np.dtype
    q = np.ones((1, 4, 2, 16), F16)
    _fails(TypeError, r"^out_dtype must be a dtype", cudattn.attention, q, q, q, out_dtype=spelling)
    x8 = np.zeros((1, 4, 2, 16), FP8)
    _fails(TypeError, r"^out_dtype must be a dtype", cudattn.dequantize, x8, np.ones((1, 2), F32), out_dtype=spelling)


def test_descales_beyond_float():
    q = np.ones((1, 4, 2, 16), FP8)
    # was OverflowError "int too large to convert to float"
    _fails(ValueError, r"^q_descale must be finite", cudattn.attention, q, q, q, q_descale=10**400)
    _fails(ValueError, r"^k_descale must be finite", cudattn.attention, q, q, q, k_descale=fractions.Fraction(10**400))
    # was accepted: float64 1e300 passes isfinite, then becomes inf as the float32 the kernels read
    _fails(ValueError, r"^v_descale must be finite in float32", cudattn.attention, q, q, q,
           v_descale=np.full((1, 2), 1e300))


def test_sizes_beyond_int32_are_refused():
    # was accepted: a broadcast (stride 0) k of 2**33 keys reached the kernels' int32 seqlen_k as 0
    q = DeviceArray(0x7F00_0000_0000, (1, 4, 2, 64), F16, device_id=0)
    k = DeviceArray(0x7F00_0000_0000, (1, 2**33, 2, 64), F16, (0, 0, 128, 2), device_id=0)
    _fails(ValueError, r"^batch, seqlen and heads must each be at most 2\*\*31 - 1", cudattn.attention, q, k, k)
    big = np.broadcast_to(np.ones((1, 1, 1, 8), F16), (2**31, 1, 1, 8))
    _fails(ValueError, r"^batch, seqlen and heads", _validate.validate, big, big, big)


def test_extent_one_axis_with_a_huge_stride_is_recorded_as_zero():
    # an unused stride beyond int64 went into the kernels' parameters as is
    q = DeviceArray(0x7F00_0000_0000, (1, 4, 2, 64), F16, (2**80, 256, 128, 2), device_id=0)
    assert _validate.validate(q, q, q, host=False).q_strides.batch == 0


@pytest.mark.parametrize("scale", [1e300, -1e39, 2.0**128])
def test_scale_beyond_float32_is_refused(scale):
    # was accepted: scale * log2(e) is inf as a float32 kernel parameter, so 0 * inf scores made NaN
    q = np.ones((1, 4, 2, 16), F16)
    _fails(ValueError, r"^scale must be at most 2\*\*127 in magnitude", cudattn.attention, q, q, q, scale=scale)


@pytest.mark.parametrize("scale", [1e-300, -1e-46, 2.0**-127])
def test_scale_below_float32_becomes_zero(scale):
    # was kept: scale * log2(e) rounded to 0 as a float32 parameter, and masked scores (-inf * 0) became
    # NaN; 0 takes the kernels' zero-scale path instead (every exp2(tiny * s) is 1 anyway)
    q = np.ones((1, 4, 2, 16), F16)
    p = _validate.validate(q, q, q, scale=scale)
    assert p.scale == 0.0 and ctypes.c_float(_params.scale_log2(p.scale)).value != 0
    q8 = np.ones((1, 4, 2, 16), FP8)
    p = _validate.validate(q8, q8, q8, scale=1e-30, q_descale=1e-30, k_descale=1e-30)
    assert p.scale == 0.0
    _fails(ValueError, r"^scale \* q_descale \* k_descale", _validate.validate, q8, q8, q8, q_descale=1e200,
           k_descale=1e200)


@pytest.mark.parametrize("layout", [np.array(["bshd"]), np.array(["bshd", "bhsd"]), ["bshd"]])
def test_layout_that_is_not_a_string(layout):
    # was accepted by ==, then TypeError "unhashable type" (or ValueError "truth value of an array is
    # ambiguous") from the layout tables
    q = np.ones((1, 4, 2, 16), F16)
    _fails(TypeError, r"^layout must be the string 'bshd' or 'bhsd'", cudattn.attention, q, q, q, layout=layout)


@pytest.mark.parametrize("outs,lses,exc,pattern", [
    ([], [], ValueError, r"outs must hold at least one part \(N >= 1\); got 0"),  # was IndexError
    (None, None, TypeError, r"outs must be a sequence"),  # was TypeError "'NoneType' object is not subscriptable"
    ({"a": 1}, [], TypeError, r"outs must be a sequence .*got dict"),  # was KeyError 0
    ([np.zeros((1, 2, 2, 8), F16)], [], ValueError, r"outs and lses must hold the same number of parts"),
    ([np.zeros((1, 2, 2, 8), F16)], "ab", TypeError, r"lses must be a sequence"),  # was "outs: ... host memory"
    ([], [DeviceArray(0x7F00_0000_0000, (1, 2, 2), F32, device_id=0)], ValueError, r"outs must hold at least one"),
    (None, [DeviceArray(0x7F00_0000_0000, (1, 2, 2), F32, device_id=0)], TypeError, r"outs must be a sequence"),
])
def test_merge_inputs_that_are_not_lists_of_arrays(outs, lses, exc, pattern):
    _fails(exc, r"^merge_attention_states: " + pattern, cudattn.merge_attention_states, outs, lses)


def test_kvcache_append_into_read_only_numpy_cache():
    # was NumPy's ValueError "assignment destination is read-only", from inside the append
    q = np.ones((2, 1, 4, 16), F16)
    kc = np.ones((2, 32, 2, 16), F16)
    ro = kc.copy()
    ro.flags.writeable = False
    kn = np.ones((2, 1, 2, 16), F16)
    lens = np.array([3, 5], np.int32)
    _fails(ValueError, r"^v_cache must be writeable: k_new/v_new are appended", cudattn.attention_with_kvcache,
           q, kc, ro, cache_seqlens=lens, k_new=kn, v_new=kn)
    rod = DeviceArray(0x7F00_0000_0000, kc.shape, F16, device_id=0, readonly=True)
    dq, dkn = (DeviceArray(0x7F00_0000_0000, x.shape, F16, device_id=0) for x in (q, kn))
    _fails(ValueError, r"^k_cache must be writeable", cudattn.attention_with_kvcache, dq, rod, rod,
           cache_seqlens=lens, k_new=dkn, v_new=dkn)
    # and more new keys than a sequence holds can never be appended (with device lengths too)
    kn_big = DeviceArray(0x7F00_0000_0000, (2, 33, 2, 16), F16, device_id=0)
    dkc = DeviceArray(0x7F00_0000_0000, kc.shape, F16, device_id=0)
    dsl = DeviceArray(0x7F00_0000_0000, (2,), np.int32, device_id=0)
    _fails(ValueError, r"^k_new and v_new hold 33 keys per sequence, more than the cache's capacity of 32",
           cudattn.attention_with_kvcache, dq, dkc, dkc, cache_seqlens=dsl, k_new=kn_big, v_new=kn_big)


@pytest.mark.parametrize("stream", [2**64, 2**70, _Stream((0, 2**64))])
def test_stream_handles_beyond_64_bits(stream):
    # was accepted, then OverflowError converting the handle for the driver
    q = DeviceArray(0x7F00_0000_0000, (1, 4, 2, 64), F16, device_id=0)
    _fails(ValueError, r"stream", cudattn.attention, q, q, q, stream=stream)


def test_device_array_pointer_must_be_64_bit():
    with pytest.raises(ValueError, match=r"^ptr -0x10 is not a 64-bit device address"):
        DeviceArray(-16, (2,), F16, device_id=0)
    with pytest.raises(ValueError, match=r"is not a 64-bit device address"):
        DeviceArray(2**64, (2,), F16, device_id=0)


def test_numpy_path_takes_misaligned_contiguous_arrays():
    q = host_tensor((1, 4, 2, 16), F16, "misaligned")
    assert q.flags.c_contiguous and q.ctypes.data % 16
    assert outcome(cudattn.attention, q, q, q)[0] == "gpu"


def test_quantize_refuses_masked_arrays():
    # was accepted: the finiteness check and the amax skipped masked values but the division did not,
    # so a masked NaN came out as a NaN e4m3 value and masked large values silently saturated
    x = np.ma.masked_array(np.ones((1, 2, 2, 8), np.float32))
    x[0, 0, 0, 0] = np.ma.masked
    x.data[0, 0, 0, 0] = np.nan
    _fails(TypeError, r"^x is a masked array; quantize_fp8 would ignore its mask", cudattn.quantize_fp8, x)
