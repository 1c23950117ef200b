"""The NumPy path of `cudattn.quantize_fp8` and `cudattn.dequantize`: the quantization rule in float32 NumPy,
bit for bit what the device kernels compute (`cudattn._spec.quantize` states the rule)."""

from __future__ import annotations

import numpy as np

from .._spec.dtypes import FLOAT8_E4M3
from .._spec.quantize import _DESCALE_FLOOR, _E4M3_MAX32, _F32, _Geom, _x_geom
from .._spec.quantize import _F64, _U8, _check_fp8_dtype, _check_x_dtype, _descale_geom, _geometry


def descale_from_amax(amax) -> np.ndarray:
    """float32 descales for float32 amaxes: ``amax / 448`` raised to 2^-126, 1 where ``amax == 0``.

    The device's ``descale_of`` (cu_src/fp8_quantize.cu) computes the same.
    """
    amax = np.asarray(amax, dtype=np.float32)
    d = np.maximum(amax / _E4M3_MAX32, _DESCALE_FLOOR)  # np.maximum keeps NaN, as the device does
    return np.where(amax == 0, np.float32(1), d).astype(np.float32)


def saturate_to_e4m3(a: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """float32 -> e4m3, rounded to nearest even and saturated to +-448, as the device's
    ``cvt.rn.satfinite.e4m3x2.f32`` does for finite values (NumPy's ``astype`` alone gives NaN above
    464). ``out`` (float32, may be ``a``) receives the clipped values; NaN stays NaN."""
    clipped = np.clip(a, -_E4M3_MAX32, _E4M3_MAX32, out=out)
    return clipped.astype(FLOAT8_E4M3)


def _grouped(a: np.ndarray, g: _Geom) -> tuple[np.ndarray, tuple[int, ...], tuple]:
    """``a`` (float32, C-contiguous) viewed with the head axis split into (G, H/G); the axes that an
    amax of one group reduces; the index that broadcasts a (B, G) array against the view."""
    B, S, G, r, D = g.batch, g.seq, g.groups, g.group_size, g.head_dim
    if g.layout == "bshd":
        return a.reshape(B, S, G, r, D), (1, 3, 4), (slice(None), None, slice(None), None, None)
    return a.reshape(B, G, r, S, D), (2, 3, 4), (slice(None), slice(None), None, None, None)


def _quantize_host(x: np.ndarray, per: str, layout: str, heads_kv: int | None):
    if isinstance(x, np.ma.MaskedArray):  # its amax and finiteness check would skip masked values, its data not
        raise TypeError("x is a masked array; quantize_fp8 would ignore its mask, so pass x.filled(0) or "
                        "np.asarray(x) to say what you mean")
    g = _x_geom(x.shape, layout, heads_kv)
    _check_x_dtype(x.dtype, host=True)
    finite = np.isfinite(x)
    if not finite.all():
        bad = int(x.size - np.count_nonzero(finite))
        raise ValueError(f"x has {bad} non-finite value(s) (NaN or inf); quantize_fp8 needs finite input "
                         "(an inf or NaN amax would make every value of its group meaningless)")
    del finite
    with np.errstate(over="ignore"):
        xf = x.astype(np.float32, order="C")  # exact for 16-bit and float32; float64 rounds
    if x.dtype == _F64 and not np.isfinite(xf).all():
        raise ValueError("x (float64) has values beyond float32's range (|x| > 3.4e38); quantize_fp8 computes "
                         "in float32")
    B, G = g.batch, g.groups
    if B * G == 0 or xf.size == 0:
        descale = np.ones((B, G), np.float32)
        return np.zeros(x.shape, FLOAT8_E4M3), descale
    xg, axes, bcast = _grouped(xf, g)
    ax = np.abs(xg)
    if per == "tensor":
        amax = np.full((B, G), ax.max(), np.float32)
    else:
        amax = ax.max(axis=axes)
    del ax
    descale = descale_from_amax(amax)
    scaled = np.divide(xg, descale[bcast], out=xg)  # IEEE float32 division, in place
    return np.ascontiguousarray(saturate_to_e4m3(scaled, out=scaled).reshape(x.shape)), descale


def _dequantize_host(x_fp8: np.ndarray, descale: np.ndarray, layout: str, out_dt: np.dtype) -> np.ndarray:
    B, S, H, D = _geometry("x_fp8", x_fp8.shape, layout)
    _check_fp8_dtype(x_fp8.dtype)
    G = _descale_geom(descale.shape, descale.dtype, B, H)
    g = _Geom(B, S, H, D, G, layout)
    if x_fp8.size == 0:
        return np.zeros(x_fp8.shape, out_dt)
    codes = x_fp8.view(FLOAT8_E4M3) if x_fp8.dtype == _U8 else x_fp8
    xg, _, bcast = _grouped(codes.astype(np.float32, order="C"), g)  # exact
    prod = np.multiply(xg, descale[bcast], out=xg)  # IEEE float32 product
    with np.errstate(over="ignore"):  # float16 overflows to inf, as the device's conversion does
        out = prod.astype(out_dt) if out_dt != _F32 else prod
    return np.ascontiguousarray(out.reshape(x_fp8.shape))
