"""Regression tests for the bugs the argument fuzzing (test_fuzz_*_cpu.py, issue 7, part 6) found,
each as a plain test: a documented error raised on purpose by cudattn, or a call that reaches the
GPU (stood in for by `_fuzz_harness`). CPU only.
"""

from __future__ import annotations

import ctypes
import fractions
import math

import numpy as np
import pytest

import cudattn
from cudattn._kernels import params as _params
from cudattn._spec import validate as _validate
from cudattn._arrays.array import DeviceArray
from _fuzz_harness import F16, F32, FP8, assert_deliberate, host_tensor, outcome
from _fuzz_harness import _no_gpu as _no_gpu  # fixtures
from _fuzz_devices import FakeCAI, FakeDLPack, _Stream


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
