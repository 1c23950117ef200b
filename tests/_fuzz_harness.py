"""The harness of the CPU fuzz tests of every public entry point's argument checks (issue 7, part 6;
test_fuzz_attention_cpu.py, test_fuzz_kvcache_cpu.py, test_fuzz_merge_quantize_cpu.py, and the
regressions in test_fuzz_cpu.py): the GPU stand-ins, the property, and the host-side strategies.

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

No GPU here, so the module fixture `_no_gpu` (autouse; each fuzz module imports it, so it applies
to that module only) replaces:

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

Reproducible: ``derandomize=True`` and ``database=None``; each module runs in a few seconds.
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
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import cudattn
from cudattn._kernels import attention as _launches
from cudattn._kernels import kvcache as _kv_launches
from cudattn._arrays import array as _array
from cudattn._calls import call as _callpath
from cudattn._runtime import device as _device
from cudattn._arrays import protocols as _protocols
from cudattn._kernels import params as _params
from cudattn._runtime import stream as _stream
from cudattn._arrays import host_io as _host_io
from cudattn._arrays import transfer as _transfer
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
# Strategies: junk values, dtypes, host arrays (device arrays: _fuzz_devices)
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
