"""FP8 descales (FlashAttention-3's ``q_descale``, ``k_descale``, ``v_descale``), and the metadata of
the small float32 device arrays that calls take beside q, k and v (descales, sinks, ALiBi slopes).

A descale is None (1.0), a finite real number, or a float32 array of shape ``(batch, heads_kv)``:
NumPy for NumPy calls (its values checked finite), a device array for device calls (the call path
has adapted it to a DeviceArray by then; only its shape, dtype, strides and address are read).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Descales", "device_meta", "fp8_descales", "parse_descales"]

_F32 = np.dtype(np.float32)
#: float32's range for the folded score scale (validate.py explains the two bounds).
_SCALE_MAX = 2.0**127
_SCALE_TINY = 2.0**-126


@dataclass(frozen=True)
class Descales:
    """FP8 descales (FlashAttention-3's q/k/v_descale): each a scalar, or a device address of a
    float32 (batch, heads_kv) C-contiguous array (then the scalar is 1 and the kernel reads it)."""

    q: float = 1.0
    k: float = 1.0
    v: float = 1.0
    q_ptr: int = 0
    k_ptr: int = 0
    v_ptr: int = 0


def device_meta(x, name: str, expected: str) -> tuple:
    """``(shape, dtype, strides, ptr)`` of a small device array argument, as adapted by the call path
    (a DeviceArray or alike); TypeError "``{name} must be {expected}; got <type>``" for anything else."""
    if all(hasattr(x, f) for f in ("ptr", "shape", "strides", "dtype")):
        return tuple(x.shape), np.dtype(x.dtype), x.strides, int(x.ptr)
    raise TypeError(f"{name} must be {expected}; got {type(x).__name__}")


def fp8_descales(q_descale, k_descale, v_descale, batch: int, heads_kv: int, host: bool, scale: float):
    """``(Descales, scale)`` of an FP8 call: the descales parsed for ``(batch, heads_kv)``, and the
    softmax scale, 0 where its product with the scalar descales is below float32's normal range."""
    descales = parse_descales(q_descale, k_descale, v_descale, batch, heads_kv, host)
    folded = scale * descales.q * descales.k  # float scalars are folded into the float32 score scale
    if abs(folded) > _SCALE_MAX or abs(descales.v) > _SCALE_MAX:
        raise ValueError(f"scale * q_descale * k_descale ({folded!r}) and v_descale ({descales.v!r}) must be at "
                         f"most 2**127 in magnitude (the kernels compute in float32)")
    return descales, (0.0 if abs(folded) < _SCALE_TINY else scale)


def parse_descales(q_descale, k_descale, v_descale, batch: int, heads_kv: int, host: bool) -> Descales:
    """Each descale: None (1.0), a finite real number, or a float32 array of shape (batch, heads_kv)
    — a NumPy array for NumPy calls (its values checked finite), a device array for device calls."""
    vals: dict = {}
    for name, x in (("q", q_descale), ("k", k_descale), ("v", v_descale)):
        scalar, ptr = _one(f"{name}_descale", x, batch, heads_kv, host)
        vals[name], vals[f"{name}_ptr"] = scalar, ptr
    return Descales(**vals)


def _one(name: str, x, batch: int, heads_kv: int, host: bool) -> tuple[float, int]:
    if x is None:
        return 1.0, 0
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be None, a float, or a float32 array of shape (batch, heads_kv); got {x!r}")
    if isinstance(x, numbers.Real):
        try:
            v = float(x)
        except OverflowError:  # an int or Fraction beyond float's range
            v = math.inf
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite; got {x!r}")
        return v, 0
    want = f"({batch}, {heads_kv})"
    if isinstance(x, np.ndarray):
        if not host:
            raise TypeError(f"{name} is a NumPy array but q, k, v are device arrays; pass a float32 device array "
                            f"of shape {want} (e.g. cudattn.to_device({name})) or a float")
        if x.shape != (batch, heads_kv):
            raise ValueError(f"{name} must have shape (batch, heads_kv) = {want}; got {x.shape}")
        if x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float32 array; got dtype {x.dtype}")
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf on the way up
            finite = np.all(np.isfinite(x.astype(_F32)))
        if not finite:
            raise ValueError(f"{name} must be finite in float32 (the kernels read float32 descales); it holds NaN, "
                             f"inf or a value beyond 3.4e38")
        return 1.0, 0  # uploaded by the NumPy path (as_device_descales)
    if host:
        raise TypeError(f"{name} must be None, a float, or a NumPy float32 array of shape {want} "
                        f"(q, k, v are NumPy arrays); got {type(x).__name__}")
    shape, dtype, strides, ptr = device_meta(x, name, f"None, a float, or a float32 device array of shape {want}")
    if shape != (batch, heads_kv):
        raise ValueError(f"{name} must have shape (batch, heads_kv) = {want}; got {shape}")
    if dtype != _F32:
        raise TypeError(f"{name} must be a float32 array; got dtype {dtype}")
    if strides is not None and tuple(strides) != (4 * heads_kv, 4) and batch * heads_kv > 1:
        raise ValueError(f"{name} must be C-contiguous (strides {(4 * heads_kv, 4)} bytes); got {tuple(strides)}")
    return 1.0, ptr
