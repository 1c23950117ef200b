"""The dtypes cudattn computes in, and the messages for the ones it does not.

q, k and v share one dtype: float16, bfloat16 (``ml_dtypes.bfloat16``) or FP8 e4m3
(``ml_dtypes.float8_e4m3fn``, computed on the tensor cores' e4m3 instructions, sm_89+).
float32/float64 inputs are rejected, never down-cast silently: the cast loses precision,
so the caller has to ask for it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "FLOAT16",
    "BFLOAT16",
    "FLOAT8_E4M3",
    "SUPPORTED",
    "RECOGNIZED",
    "dtype_name",
    "as_dtype",
    "input_dtype_error",
    "check_input_dtype",
    "default_out_dtype",
    "resolve_out_dtype",
]

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

#: Input dtypes the kernels compute in.
SUPPORTED: frozenset[np.dtype] = frozenset({FLOAT16, BFLOAT16, FLOAT8_E4M3})
#: Input dtypes the API knows about (the same set: kept for the paths that take fewer, e.g. KV caches).
RECOGNIZED: frozenset[np.dtype] = SUPPORTED

_SUPPORTED_TEXT = "float16 (numpy.float16), bfloat16 (ml_dtypes.bfloat16) or float8_e4m3fn (ml_dtypes)"

# Spellings accepted for a dtype given by name (out_dtype="bf16" and friends).
_NAMES: dict[str, np.dtype] = {
    "float16": FLOAT16,
    "fp16": FLOAT16,
    "half": FLOAT16,
    "f2": FLOAT16,
    "bfloat16": BFLOAT16,
    "bf16": BFLOAT16,
    "float8_e4m3fn": FLOAT8_E4M3,
    "float8_e4m3": FLOAT8_E4M3,
    "fp8_e4m3": FLOAT8_E4M3,
    "fp8": FLOAT8_E4M3,
    "e4m3": FLOAT8_E4M3,
    "float32": np.dtype(np.float32),
    "fp32": np.dtype(np.float32),
    "float": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "fp64": np.dtype(np.float64),
    "double": np.dtype(np.float64),
}

# Output dtypes a kernel epilogue can write (FP8 inputs: any of them; 16-bit inputs: their own dtype).
_OUTPUT_CANDIDATES = frozenset({FLOAT16, BFLOAT16, np.dtype(np.float32)})


def dtype_name(dt: object) -> str:
    """Short name of a dtype for messages: 'float16', 'bfloat16', 'float8_e4m3fn', ..."""
    try:
        dt = np.dtype(dt)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return repr(dt)
    if not dt.isnative and dt.kind in "fciu":
        return f"{dt.name} ({dt.str}, non-native byte order)"
    return dt.name


def as_dtype(x: object, *, arg: str = "out_dtype") -> np.dtype:
    """Normalize a dtype given as a numpy dtype, a scalar type, or a name ("bfloat16", "fp16", ...).

    ``None`` is not a dtype here (``np.dtype(None)`` would silently mean float64): callers
    treat ``None`` as "the default" before calling this.
    """
    if isinstance(x, np.dtype):
        return x
    if x is None or isinstance(x, bool):
        raise TypeError(f"{arg} must be a dtype (e.g. np.float16, ml_dtypes.bfloat16 or 'bfloat16'); got {x!r}")
    if isinstance(x, str):
        known = _NAMES.get(x.strip().lower())
        if known is not None:
            return known
    try:
        return np.dtype(x)  # type: ignore[arg-type]
    except Exception:  # TypeError, ValueError, and SyntaxError from comma strings such as "i4, ,"
        raise TypeError(
            f"{arg} must be a dtype (e.g. np.float16, ml_dtypes.bfloat16 or 'bfloat16'); got {x!r}"
        ) from None


def input_dtype_error(dt: object, arg: str) -> Exception:
    """The exception for an input (q, k, v) of dtype ``dt`` outside SUPPORTED (returned, not raised)."""
    if not isinstance(dt, np.dtype):
        try:
            dt = np.dtype(dt)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return TypeError(f"{arg} has dtype {dt!r}, which is not a NumPy dtype; cudattn computes in {_SUPPORTED_TEXT}")
    if dt.kind == "f" and not dt.isnative and dt.newbyteorder("=") in SUPPORTED:
        return TypeError(
            f"{arg} has dtype {dtype_name(dt)}; cudattn needs native byte order — "
            f"pass {arg}.astype({arg}.dtype.newbyteorder('='))"
        )
    if dt.kind == "f" and dt.itemsize > 2:  # float32, float64, longdouble
        return TypeError(
            f"{arg} has dtype {dt.name}; cudattn computes in float16, bfloat16 or FP8 e4m3 — cast first "
            f"with {arg}.astype(np.float16) or {arg}.astype(ml_dtypes.bfloat16), or quantize with "
            f"cudattn.quantize_fp8 (this never happens silently because it loses precision)"
        )
    return TypeError(
        f"{arg} has dtype {dtype_name(dt)}, which cudattn does not compute in; use {_SUPPORTED_TEXT}"
    )


def check_input_dtype(dt: object, arg: str) -> np.dtype:
    """Return ``dt`` if cudattn computes in it now, else raise ``input_dtype_error``."""
    if dt in SUPPORTED:
        return dt  # type: ignore[return-value]
    raise input_dtype_error(dt, arg)


def default_out_dtype(in_dtype: np.dtype) -> np.dtype:
    """Output dtype when ``out_dtype=None``: the input dtype for 16-bit inputs, bfloat16 for FP8."""
    return BFLOAT16 if in_dtype == FLOAT8_E4M3 else in_dtype


def resolve_out_dtype(out_dtype: object, in_dtype: np.dtype) -> np.dtype:
    """The output dtype for a call with inputs of ``in_dtype`` and the user's ``out_dtype`` argument.

    FP8 inputs: float16, bfloat16 (the default) or float32. 16-bit inputs: their own dtype only
    (another valid choice raises NotImplementedError).
    """
    default = default_out_dtype(in_dtype)
    if out_dtype is None:
        return default
    dt = as_dtype(out_dtype, arg="out_dtype")
    if dt == default:
        return dt
    if dt not in _OUTPUT_CANDIDATES:
        raise TypeError(
            f"out_dtype={dtype_name(dt)} is not an attention output dtype; pass None (the default: "
            f"{default.name} for {in_dtype.name} inputs), or float16, bfloat16 or float32 for FP8 inputs"
        )
    if in_dtype == FLOAT8_E4M3:
        return dt
    raise NotImplementedError(
        f"out_dtype={dt.name} is not supported yet: for now the output dtype is {default.name} "
        f"for {in_dtype.name} inputs; pass out_dtype=None (or convert the result afterwards)"
    )
