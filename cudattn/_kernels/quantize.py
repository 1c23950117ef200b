"""The FP8 quantize, amax and dequantize kernels (cu_src/fp8_quantize.cu): their builds, parameter
block, launch shapes and launches.

``fp8_amax`` (a block max, then ``atomicMax`` on the float bits into a zeroed buffer) then
``fp8_quantize`` (writes the descales and the e4m3 values), both on the caller's stream;
``fp8_dequantize`` for the reverse. Quantizing needs sm_89+ (the e4m3 conversion instruction);
dequantizing runs on sm_80+ (it decodes e4m3 arithmetically).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .._arrays import array as _array
from .._arrays import transfer as _transfer
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.dtypes import BFLOAT16, FLOAT16, FLOAT8_E4M3
from .._spec.quantize import _F32, _U32, _Geom, _descale_geom, _x_geom
from . import registry as _kernels
from .decode_traits import HelperKernel
from .._spec.quantize import QUANTIZE_MIN_CC, _DEVICE_X_DTYPES, _OUT_DTYPES, _check_fp8_dtype, _check_sizes, _check_x_dtype, _element_strides, _geometry

SOURCE = "fp8_quantize.cu"

THREADS = 256  # fp8_quantize.cu: THREADS

_WARPS = THREADS // 32

_ELEM_CODES = {_F32: 0, FLOAT16: 1, BFLOAT16: 2}  # CUDATTN_QX / CUDATTN_DQ_OUT

_BLOCKS_PER_SM = 8  # enough blocks of 256 threads to fill an SM; each block then walks its rows


def amax_kernel(dtype) -> HelperKernel:
    """``fp8_amax`` for inputs of ``dtype`` (float32, float16 or bfloat16)."""
    return HelperKernel(SOURCE, "fp8_amax", (("CUDATTN_QX", _ELEM_CODES[np.dtype(dtype)]),), threads=THREADS)


def quantize_kernel(dtype) -> HelperKernel:
    """``fp8_quantize`` for inputs of ``dtype`` (same build, so same cubin, as ``amax_kernel``)."""
    return HelperKernel(SOURCE, "fp8_quantize", (("CUDATTN_QX", _ELEM_CODES[np.dtype(dtype)]),), threads=THREADS)


def dequantize_kernel(out_dtype) -> HelperKernel:
    """``fp8_dequantize`` writing ``out_dtype`` (float32, float16 or bfloat16)."""
    return HelperKernel(SOURCE, "fp8_dequantize", (("CUDATTN_DQ_OUT", _ELEM_CODES[np.dtype(out_dtype)]),),
                        threads=THREADS)


def all_quantize_kernels(arch: str | None = None) -> list[HelperKernel]:
    """Every quantize/dequantize kernel spec (CI compiles them all).

    With ``arch`` (an NVRTC target such as ``"sm_80"``), only those that target can run: the
    quantize kernels need sm_89 or newer, the dequantize kernels sm_80 or newer.
    """
    quant = arch is None or _arch_cc(arch) >= QUANTIZE_MIN_CC
    out: list[HelperKernel] = []
    if quant:
        for dt in _DEVICE_X_DTYPES:
            out += [amax_kernel(dt), quantize_kernel(dt)]
    out += [dequantize_kernel(dt) for dt in _OUT_DTYPES]
    return out


def _arch_cc(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


class Fp8QuantParams(ctypes.Structure):
    """``Fp8QuantParams`` of cu_src/fp8_quantize.cu, field for field."""

    _fields_ = [
        ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("amax", ctypes.c_void_p), ("descale", ctypes.c_void_p),
        ("x_stride_b", ctypes.c_longlong), ("x_stride_g", ctypes.c_longlong),
        ("x_stride_outer", ctypes.c_longlong), ("x_stride_inner", ctypes.c_longlong),
        ("y_stride_b", ctypes.c_longlong), ("y_stride_g", ctypes.c_longlong),
        ("y_stride_outer", ctypes.c_longlong), ("y_stride_inner", ctypes.c_longlong),
        ("descale_stride_b", ctypes.c_longlong), ("descale_stride_g", ctypes.c_longlong),
        ("n_outer", ctypes.c_longlong), ("n_inner", ctypes.c_longlong),
        ("groups", ctypes.c_int), ("head_dim", ctypes.c_int), ("per_head", ctypes.c_int), ("vec", ctypes.c_int),
        ("lanes_per_row", ctypes.c_int),
    ]  # fmt: skip


@dataclass(frozen=True)
class _Rows:
    """A 4-D tensor as (batch, group, outer, inner) rows of ``head_dim`` elements, strides in elements."""

    stride_b: int
    stride_g: int
    stride_outer: int
    stride_inner: int
    n_outer: int
    n_inner: int


def _rows(strides_bsh: tuple[int, int, int], g: _Geom, inner_is_seq: bool) -> _Rows:
    sb, ss, sh = strides_bsh
    r = g.group_size
    if inner_is_seq:
        so, si, n_outer, n_inner = sh, ss, r, g.seq
    else:
        so, si, n_outer, n_inner = ss, sh, g.seq, r
    if n_outer * n_inner == 0:
        n_outer, n_inner = 0, 1
    return _Rows(sb, sh * r, so, si, n_outer, n_inner)


def _inner_is_seq(strides_bsh: tuple[int, int, int], g: _Geom) -> bool:
    """Rows are walked along the axis of smaller stride (seq or head within a group)."""
    _, ss, sh = strides_bsh
    if g.seq <= 1:
        return False
    if g.group_size <= 1:
        return True
    return abs(ss) < abs(sh)


def _contiguous_strides(g: _Geom) -> tuple[int, int, int]:
    S, H, D = g.seq, g.heads, g.head_dim
    return (S * H * D, H * D, D) if g.layout == "bshd" else (H * S * D, D, S * D)


def _vec_ok(ptr: int, itemsize: int, rows: _Rows, D: int) -> bool:
    """Rows can be read 4 elements at a time: D % 4 == 0 and every row starts 4-element aligned."""
    if D % 4 or ptr % (4 * itemsize):
        return False
    return all(s % 4 == 0 for s in (rows.stride_b, rows.stride_g, rows.stride_outer, rows.stride_inner))


def _launch_shape(g: _Geom, rows: _Rows, vec: bool, sm_count: int) -> tuple[int, tuple[int, int, int]]:
    """(lanes_per_row, grid): a power-of-two number of lanes covers a row's 4-element (or 1-element)
    chunks; blocks per group fill the GPU about ``_BLOCKS_PER_SM`` times without idling a block."""
    chunks = -(-g.head_dim // 4) if vec else g.head_dim
    lpr = 1
    while lpr < min(chunks, 32):
        lpr *= 2
    rows_per_block = _WARPS * (32 // lpr)
    n_groups = g.batch * g.groups
    need = max(1, -(-(rows.n_outer * rows.n_inner) // rows_per_block))
    per_group = max(1, min(need, -(-(sm_count * _BLOCKS_PER_SM) // n_groups), 65535))
    return lpr, (n_groups, per_group, 1)


def _params(x_ptr: int, y_ptr: int, xr: _Rows, yr: _Rows, g: _Geom, vec: bool, lpr: int) -> Fp8QuantParams:
    p = Fp8QuantParams()
    p.x, p.y = x_ptr, y_ptr
    p.x_stride_b, p.x_stride_g, p.x_stride_outer, p.x_stride_inner = (
        xr.stride_b, xr.stride_g, xr.stride_outer, xr.stride_inner)
    p.y_stride_b, p.y_stride_g, p.y_stride_outer, p.y_stride_inner = (
        yr.stride_b, yr.stride_g, yr.stride_outer, yr.stride_inner)
    p.n_outer, p.n_inner = xr.n_outer, xr.n_inner
    p.groups, p.head_dim, p.vec, p.lanes_per_row = g.groups, g.head_dim, int(vec), lpr
    return p


def _quantize_device(xa, per: str, layout: str, heads_kv: int | None, sref):
    """The device path on an adapted ``xa``, on the call path's stream ``sref`` (`_calls.call`)."""
    device_id = xa.device_id
    device = _device.get_device(device_id)
    g = _x_geom(xa.shape, layout, heads_kv)
    _check_x_dtype(xa.dtype, host=False)
    _check_sizes("x", xa.shape, g)
    strides = _element_strides("x", xa, g)
    inner_seq = _inner_is_seq(strides, g)
    xr, yr = _rows(strides, g, inner_seq), _rows(_contiguous_strides(g), g, inner_seq)
    props = _device.device_properties(device_id)
    if props.compute_capability < QUANTIZE_MIN_CC:
        raise ValueError(f"quantize_fp8 on the device needs compute capability 8.9 or newer (the e4m3 conversion "
                         f"instruction); x is on device {device_id} ({props.name}, "
                         f"{props.compute_capability[0]}.{props.compute_capability[1]}): quantize a NumPy array "
                         "on the host instead")
    y = _array.empty_on(xa.shape, FLOAT8_E4M3, device, sref)
    descale = _array.empty_on((g.batch, g.groups), _F32, device, sref)
    if g.batch * g.groups == 0:
        return y, descale
    vec = _vec_ok(xa.ptr, xa.itemsize, xr, g.head_dim)
    lpr, grid = _launch_shape(g, xr, vec, props.sm_count)
    amax = _array.empty_on((g.batch * g.groups if per == "head" else 1,), _U32, device, sref)
    _transfer.memset(amax, 0, stream=sref)
    p = _params(xa.ptr, y.ptr, xr, yr, g, vec, lpr)
    p.amax, p.descale, p.per_head = amax.ptr, descale.ptr, int(per == "head")
    for spec in (amax_kernel(xa.dtype), quantize_kernel(xa.dtype)):
        kernel = _kernels.get_kernel(spec, device, device_id, props.arch)
        _launch.launch(kernel, grid, (THREADS, 1, 1), 0, sref.handle, p)
    del amax  # freed stream-ordered, after the kernels that use it
    return y, descale


def _dequantize_device(xa, da, layout: str, out_dt: np.dtype, sref):
    device_id = xa.device_id
    if da.device_id != device_id:
        raise ValueError(f"descale is on device {da.device_id} but x_fp8 is on device {device_id}; "
                         "both must be on one device")
    B, S, H, D = _geometry("x_fp8", xa.shape, layout)
    _check_fp8_dtype(xa.dtype)
    G = _descale_geom(da.shape, da.dtype, B, H)
    d_strides = [s if n > 1 else 0 for n, s in zip(da.shape, da.strides)]
    if da.ptr % 4 or any(s % 4 for s in d_strides):
        raise ValueError(f"descale's address and strides {tuple(da.strides)} must be multiples of 4 bytes")
    return _run_dequantize(xa, _Geom(B, S, H, D, G, layout), da.ptr, d_strides[0] // 4, d_strides[1] // 4, out_dt,
                           sref)


def e4m3_to_16bit(xa, out_dt: np.dtype, sref):
    """A new C-contiguous copy of the e4m3 device array ``xa`` ((B, S, H, D), "bshd") in
    ``out_dt``, converted exactly (every e4m3 value is a float16 and a bfloat16), no scale."""
    B, S, H, D = _geometry("x_fp8", xa.shape, "bshd")
    return _run_dequantize(xa, _Geom(B, S, H, D, 1, "bshd"), 0, 0, 0, out_dt, sref)


def _run_dequantize(xa, g: _Geom, d_ptr: int, d_stride_b: int, d_stride_g: int, out_dt: np.dtype, sref):
    """``fp8_dequantize`` of ``xa`` by the descales at ``d_ptr`` (0: none, an exact conversion)."""
    device_id = xa.device_id
    device = _device.get_device(device_id)
    _check_sizes("x_fp8", xa.shape, g)
    strides = _element_strides("x_fp8", xa, g)
    inner_seq = _inner_is_seq(strides, g)
    xr, yr = _rows(strides, g, inner_seq), _rows(_contiguous_strides(g), g, inner_seq)
    props = _device.device_properties(device_id)
    y = _array.empty_on(xa.shape, out_dt, device, sref)
    if g.batch * g.groups == 0 or xr.n_outer == 0 or g.head_dim == 0:
        return y
    vec = _vec_ok(xa.ptr, 1, xr, g.head_dim)
    lpr, grid = _launch_shape(g, xr, vec, props.sm_count)
    p = _params(xa.ptr, y.ptr, xr, yr, g, vec, lpr)
    p.descale, p.descale_stride_b, p.descale_stride_g = d_ptr, d_stride_b, d_stride_g
    kernel = _kernels.get_kernel(dequantize_kernel(out_dt), device, device_id, props.arch)
    _launch.launch(kernel, grid, (THREADS, 1, 1), 0, sref.handle, p)
    return y
