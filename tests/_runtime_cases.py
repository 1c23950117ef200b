"""Shared pieces of the runtime layer's CPU tests (test_runtime_*cpu.py): dtypes and a fake
device address.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FAKE_PTR = 0x7F00_0000_1000
