"""Shared pieces of the validation tests (test_validate*.py): device arrays faked by a class with
shape / strides (bytes) / dtype / ptr, and q, k, v of either layout.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
F16 = np.dtype(np.float16)


class FakeDeviceArray:
    """What validate() reads from a device array: shape, byte strides, dtype, ptr."""

    def __init__(self, shape, dtype=np.float16, strides=None, ptr=0x7F00_0000_0000):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        if strides is None:
            strides, step = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(step)
                step *= n
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.ptr = ptr

    @classmethod
    def like(cls, a: np.ndarray, ptr=0x7F00_0000_0000):
        return cls(a.shape, a.dtype, a.strides, ptr)


def arrays(layout="bshd", B=2, Sq=5, Sk=7, Hq=4, Hkv=2, D=64, dtype=np.float16):
    if layout == "bshd":
        shapes = (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
    else:
        shapes = (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)
    return tuple(np.zeros(s, dtype=dtype) for s in shapes)


def device(*xs):
    return tuple(FakeDeviceArray.like(x, ptr=0x7F00_0000_0000 + 0x1000_0000 * i) for i, x in enumerate(xs))
