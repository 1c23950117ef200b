"""Shared pieces of the quantize_fp8 / dequantize CPU tests (test_quantize_*cpu.py): the dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
