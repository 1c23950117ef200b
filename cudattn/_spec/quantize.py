"""The FP8 quantization rule, and the argument checks `cudattn.quantize_fp8` and `cudattn.dequantize` share.

The rule, the same on the host (NumPy) and on the device (cu_src/fp8_quantize.cu), bit for bit:

- every step is float32 arithmetic: the input is converted to float32 first (exact for float16,
  bfloat16 and float32; float64 is rounded to nearest);
- ``amax`` = max |x| over the tensor (``per="tensor"``) or over one ``(batch, head group)``
  (``per="head"``);
- ``descale = amax / 448`` (448 = e4m3's largest finite value; IEEE float32 division), raised to
  2^-126 (the smallest normal float32) when smaller, which only happens for ``amax < 5.3e-36`` and
  keeps ``x / descale`` within e4m3's range; ``descale = 1`` where ``amax == 0``;
- ``x_fp8 = e4m3(x / descale)``: an IEEE float32 **division** by the descale (not a product with a
  rounded reciprocal: one rounding instead of two), then rounding to nearest even into e4m3,
  **saturating** to +-448. NumPy's ``astype(float8_e4m3fn)`` gives NaN above 464, so the host clips
  to +-448 first; the device uses ``cvt.rn.satfinite.e4m3x2.f32``, which saturates;
- dequantization: ``float32(x_fp8) * descale`` (IEEE float32 product), rounded to nearest even into
  the output dtype.

Heads are grouped as FlashAttention-3's ``(B, Hkv)`` descales expect: with ``G`` groups of
``H // G`` heads, head ``h`` uses descale column ``h // (H // G)``.

The device kernels that implement it are `_kernels.quantize`'s; the host's, `_numpy.quantize`'s.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .dtypes import BFLOAT16, FLOAT16, as_dtype, dtype_name
from .dtypes import FLOAT8_E4M3

E4M3_MAX = 448.0

_E4M3_MAX32 = np.float32(E4M3_MAX)

_DESCALE_FLOOR = np.float32(np.finfo(np.float32).tiny)  # 2^-126

_F32 = np.dtype(np.float32)

_F64 = np.dtype(np.float64)

_U8 = np.dtype(np.uint8)

_U32 = np.dtype(np.uint32)

_LAYOUTS = ("bshd", "bhsd")

_PERS = ("tensor", "head")

_HOST_X_DTYPES = (FLOAT16, BFLOAT16, _F32, _F64)

_DEVICE_X_DTYPES = (FLOAT16, BFLOAT16, _F32)

_OUT_DTYPES = (_F32, FLOAT16, BFLOAT16)

#: Compute capability the quantize kernels need (``cvt.rn.satfinite.e4m3x2.f32``).
QUANTIZE_MIN_CC = (8, 9)


@dataclass(frozen=True)
class _Geom:
    """Sizes of a 4-D input in (batch, seq, heads, head_dim) terms, and its head grouping."""

    batch: int
    seq: int
    heads: int
    head_dim: int
    groups: int  # G: descale columns
    layout: str

    @property
    def group_size(self) -> int:
        return self.heads // self.groups if self.groups else 0


def _check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bshd' ((B, S, H, D)) or 'bhsd' ((B, H, S, D)); got {layout!r}")
    return layout


def _check_per(per) -> str:
    if not isinstance(per, str) or per not in _PERS:
        raise ValueError(f"per must be 'tensor' (one amax for the whole tensor) or 'head' (one amax per "
                         f"(batch, head group)); got {per!r}")
    return per


def _check_heads_kv(heads_kv) -> int | None:
    if heads_kv is None:
        return None
    if isinstance(heads_kv, (bool, np.bool_)) or not isinstance(heads_kv, numbers.Integral):
        raise TypeError(f"heads_kv must be None or a positive int; got {heads_kv!r}")
    if heads_kv < 1:
        raise ValueError(f"heads_kv must be a positive int; got {heads_kv}")
    return int(heads_kv)


def _geometry(name: str, shape, layout: str) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        want = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
        raise ValueError(f"{name} must be 4-D {want} for layout {layout!r}; got shape {tuple(shape)}")
    if layout == "bshd":
        B, S, H, D = shape
    else:
        B, H, S, D = shape
    return int(B), int(S), int(H), int(D)


def _x_geom(shape, layout: str, heads_kv: int | None) -> _Geom:
    B, S, H, D = _geometry("x", shape, layout)
    G = H if heads_kv is None else heads_kv
    if heads_kv is not None and H % heads_kv:
        some = f" (one of {', '.join(str(d) for d in range(1, H + 1) if H % d == 0)})" if H <= 1024 else ""
        raise ValueError(f"x has {H} heads, which is not a multiple of heads_kv={heads_kv}: heads_kv is the number "
                         f"of descale columns, each shared by x's heads / heads_kv consecutive heads, so it must "
                         f"divide {H}{some}")
    return _Geom(B, S, H, D, G, layout)


def _check_x_dtype(dtype: np.dtype, host: bool) -> None:
    allowed = _HOST_X_DTYPES if host else _DEVICE_X_DTYPES
    if dtype in allowed:
        return
    names = "float16, bfloat16 (ml_dtypes.bfloat16), float32" + (" or float64" if host else "")
    if dtype == FLOAT8_E4M3:
        raise TypeError("x is already float8_e4m3fn; quantize_fp8 takes " + names)
    if not host and dtype == _F64:
        raise TypeError("x is a float64 device array; quantize_fp8 on the device takes float16, bfloat16 or "
                        "float32 (cast first; float64 is accepted for NumPy input only)")
    raise TypeError(f"x has dtype {dtype_name(dtype)}; quantize_fp8 takes {names}")


def _check_fp8_dtype(dtype: np.dtype) -> None:
    if dtype not in (FLOAT8_E4M3, _U8):
        raise TypeError(f"x_fp8 has dtype {dtype_name(dtype)}; dequantize takes ml_dtypes.float8_e4m3fn "
                        "(or uint8 holding e4m3 bits, as FP8 crosses DLPack and CAI)")


def _descale_geom(shape, dtype: np.dtype, B: int, H: int) -> int:
    """Checks descale against x_fp8's (B, H); returns G."""
    if dtype != _F32:
        raise TypeError(f"descale has dtype {dtype_name(dtype)}; it must be float32, shape (B, G): batch by "
                        "descale columns")
    if len(shape) != 2 or shape[0] != B or shape[1] < 1 or H % shape[1]:
        raise ValueError(f"descale has shape {tuple(shape)}; it must be (B, G) = ({B}, G): B x_fp8's batch and "
                         f"G >= 1 descale columns dividing x_fp8's {H} heads (head h uses column h // ({H} // G))")
    return int(shape[1])


def _check_out_dtype(out_dtype) -> np.dtype:
    dt = as_dtype(out_dtype, arg="out_dtype")
    if dt not in _OUT_DTYPES:
        raise TypeError(f"out_dtype={dtype_name(dt)} is not supported; use float32, float16 or bfloat16")
    return dt


def _element_strides(name: str, a, g: _Geom) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of device array ``a`` (0 along axes of extent 1, whose
    strides are never used); checks the unit last stride and the alignment."""
    item = a.dtype.itemsize
    if a.ptr % item:
        raise ValueError(f"{name}'s address {a.ptr:#x} is not a multiple of its itemsize {item}")
    st = tuple(a.strides)
    if g.head_dim > 1 and st[3] != item:
        raise ValueError(f"{name} must have unit stride along its last axis (head_dim); its strides are {st} "
                         "bytes (make it contiguous first)")
    used = [s if n > 1 else 0 for n, s in zip(a.shape[:3], st[:3])]
    if any(s % item for s in used):
        raise ValueError(f"{name}'s strides {st} (bytes) must be multiples of its itemsize {item}")
    sb, s1, s2 = (s // item for s in used)
    return (sb, s1, s2) if g.layout == "bshd" else (sb, s2, s1)


def _check_sizes(name: str, shape, g: _Geom) -> None:
    if g.head_dim >= 2**31 or g.batch * g.groups >= 2**31:
        raise ValueError(f"{name} has shape {tuple(shape)}: head_dim and batch * descale columns must be "
                         "below 2**31 on the device")
