"""Strategies for the CPU fuzz tests' device-side arguments: fake foreign arrays (a
``__cuda_array_interface__`` object, a DLPack producer), their byte strides and interface dicts,
cudattn DeviceArrays at made-up addresses, and stream arguments.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from cudattn._arrays import dlpack as _dlpack
from cudattn._arrays.array import DeviceArray
from _fuzz_harness import BAD_DTYPES, F16, FP8, JUNK, bad, perturbed_shape


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
