"""`cudattn.quantize_fp8` and `cudattn.dequantize`: float <-> FP8 e4m3 with per-tensor or per-head descales.

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

Device path: ``fp8_amax`` (a block max, then ``atomicMax`` on the float bits into a zeroed buffer)
then ``fp8_quantize`` (writes the descales and the e4m3 values), both on the caller's stream;
``fp8_dequantize`` for the reverse. Quantizing needs sm_89+ (the e4m3 conversion instruction);
dequantizing runs on sm_80+ (it decodes e4m3 arithmetically).
"""

from __future__ import annotations

import ctypes
import numbers
from dataclasses import dataclass

import numpy as np

from .._arrays import array as _array
from .._calls import call as _callpath
from .._runtime import device as _device
from .._arrays import foreign as _foreign
from .._kernels import registry as _kernels
from .._runtime import launch as _launch
from .._runtime import stream as _stream
from .._arrays import transfer as _transfer
from .._kernels.decode_traits import HelperKernel
from .._spec.dtypes import BFLOAT16, FLOAT16, FLOAT8_E4M3, as_dtype, dtype_name
from .._arrays.types import ArrayLike, ArrayResult, DTypeLike, Layout, QuantizePer, StreamLike

__all__ = [
    "E4M3_MAX",
    "Fp8QuantParams",
    "all_quantize_kernels",
    "amax_kernel",
    "dequantize",
    "dequantize_kernel",
    "descale_from_amax",
    "quantize_fp8",
    "quantize_kernel",
    "saturate_to_e4m3",
]

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

# ---------------------------------------------------------------------- kernel specs

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


# ---------------------------------------------------------------------- argument checks


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
        raise ValueError(f"x has {H} heads, which is not a multiple of heads_kv={heads_kv} "
                         "(heads h*H/G .. (h+1)*H/G-1 share descale column h)")
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
        raise TypeError(f"descale has dtype {dtype_name(dtype)}; it must be float32, shape (B, G)")
    if len(shape) != 2 or shape[0] != B or shape[1] < 1 or H % shape[1]:
        raise ValueError(f"descale has shape {tuple(shape)}; it must be (B, G) = ({B}, G) with G >= 1 dividing "
                         f"x_fp8's {H} heads")
    return int(shape[1])


def _check_out_dtype(out_dtype) -> np.dtype:
    dt = as_dtype(out_dtype, arg="out_dtype")
    if dt not in _OUT_DTYPES:
        raise TypeError(f"out_dtype={dtype_name(dt)} is not supported; use float32, float16 or bfloat16")
    return dt


# ---------------------------------------------------------------------- public API


def quantize_fp8(x: ArrayLike, *, per: QuantizePer = "tensor", layout: Layout = "bshd", heads_kv: int | None = None,
                 stream: StreamLike = None) -> tuple[ArrayResult, ArrayResult]:
    """Quantize ``x`` to FP8 e4m3 with FlashAttention-3-style descales: ``x ≈ x_fp8 * descale``.

    Parameters
    ----------
    x : array, 4-D
        ``(B, S, H, D)`` for ``layout="bshd"`` (default), ``(B, H, S, D)`` for ``"bhsd"``; float16,
        ``ml_dtypes.bfloat16`` or float32 (NumPy input may also be float64). A NumPy array is
        quantized on the host, synchronously, giving NumPy arrays; a device array (a
        :class:`cudattn.DeviceArray`, or anything with ``__cuda_array_interface__`` /
        ``__dlpack__`` on a CUDA device) on the GPU, asynchronously on ``stream``, giving
        DeviceArrays (any strides with a unit-stride last axis; needs sm_89 or newer).
    per : "tensor" or "head"
        ``"tensor"``: one amax over the whole tensor, its descale repeated in every ``(b, g)``
        entry. ``"head"``: one amax per ``(batch, head group)``.
    layout : "bshd" or "bhsd"
    heads_kv : int, optional
        Number of descale columns ``G`` (default: ``H``, one per head). ``H`` must be a multiple of
        it; heads ``g*H/G .. (g+1)*H/G - 1`` share column ``g``. This is the ``(B, Hkv)`` shape
        :func:`cudattn.attention`'s ``q_descale`` / ``k_descale`` / ``v_descale`` take, q under GQA
        included (pass the kv head count).
    stream : optional
        For device input: the stream to work on (an int handle, a cuda.core Stream, or anything
        with ``__cuda_stream__``). None: the operands' current stream, as in
        :func:`cudattn.attention` (torch's or CuPy's current stream, the stream that produced a
        DeviceArray, else cudattn's stream); the call waits on the GPU for the stream that produced
        ``x``. Unused for NumPy input, which is computed by NumPy on the host. The device path
        allocates its outputs, so it cannot run on a stream that captures a CUDA graph.

    Returns
    -------
    x_fp8 : ``ml_dtypes.float8_e4m3fn``, ``x``'s shape and layout, C-contiguous.
    descale : float32, shape ``(B, G)``.

    Rule (host and device give the same bits): in float32, ``descale = amax / 448`` (at least 2^-126;
    1 where ``amax == 0``) and ``x_fp8 = e4m3(x / descale)``, an IEEE division rounded to nearest
    even and saturated to +-448 (never NaN for finite x).

    Non-finite input: NumPy input raises ``ValueError`` before any work. Device input is not
    checked (that would need a host sync); NaN and inf propagate instead. A NaN makes the amax and
    descale of its group NaN and every e4m3 value of the group NaN; an inf makes them inf, the
    group's finite values 0 and its infs NaN. With ``per="tensor"`` the group is the whole tensor.
    """
    per = _check_per(per)
    layout = _check_layout(layout)
    heads_kv = _check_heads_kv(heads_kv)
    if isinstance(x, np.ndarray):
        return _quantize_host(x, per, layout, heads_kv)
    if not _foreign.is_device_array_like(x):
        raise TypeError("x must be a NumPy array or a device array (DeviceArray, or an object with "
                        f"__cuda_array_interface__ or __dlpack__ on a CUDA device); got {type(x).__name__}")
    consumer, keep, ops, sig, unordered = _callpath.operands((x,), ("x",), stream)
    key = ("quantize_fp8", sig, per, layout, heads_kv)
    return _callpath.run(key, (x,), ops, ("x",), consumer, keep,
                         lambda xa: _quantize_device(xa, per, layout, heads_kv, _stream.StreamRef(consumer, keep)),
                         tensors=1, out_index=None, allocates=True, unordered=unordered)


def dequantize(x_fp8: ArrayLike, descale: ArrayLike, *, layout: Layout = "bshd", out_dtype: DTypeLike = np.float32,
               stream: StreamLike = None) -> ArrayResult:
    """The inverse of :func:`quantize_fp8`: ``x_fp8 * descale[b, g]`` per element.

    Parameters
    ----------
    x_fp8 : array, 4-D, ``ml_dtypes.float8_e4m3fn`` (or uint8 holding e4m3 bits)
        ``(B, S, H, D)`` for ``layout="bshd"``, ``(B, H, S, D)`` for ``"bhsd"``.
    descale : float32 array, shape ``(B, G)``
        ``G`` must divide ``H``; head ``h`` uses column ``h // (H // G)``.
    out_dtype : float32 (default), float16 or bfloat16
    stream : optional
        As in :func:`quantize_fp8` (device input only).

    Both arrays NumPy: computed on the host, NumPy result. Both device arrays: computed on the GPU
    (sm_80+), asynchronously on ``stream``, DeviceArray result. Mixing raises ``TypeError``. The
    product is taken in float32 (IEEE) and rounded to nearest even into ``out_dtype``; host and
    device give the same bits. The result is C-contiguous in ``layout``.
    """
    layout = _check_layout(layout)
    out_dt = _check_out_dtype(out_dtype)
    host_x, host_d = isinstance(x_fp8, np.ndarray), isinstance(descale, np.ndarray)
    if host_x and host_d:
        return _dequantize_host(x_fp8, descale, layout, out_dt)
    if host_x != host_d:
        which, other = ("x_fp8", "descale") if host_x else ("descale", "x_fp8")
        raise TypeError(f"{which} is a NumPy (host) array but {other} is not; pass both as NumPy arrays or both "
                        "as device arrays (copy with cudattn.to_device or cudattn.to_host first)")
    for name, a in (("x_fp8", x_fp8), ("descale", descale)):
        if not _foreign.is_device_array_like(a):
            raise TypeError(f"{name} must be a NumPy array or a device array (DeviceArray, or an object with "
                            f"__cuda_array_interface__ or __dlpack__ on a CUDA device); got {type(a).__name__}")
    objs, names = (x_fp8, descale), ("x_fp8", "descale")
    consumer, keep, ops, sig, unordered = _callpath.operands(objs, names, stream)
    key = ("dequantize", sig, layout, out_dt)
    return _callpath.run(key, objs, ops, names, consumer, keep,
                         lambda xa, da: _dequantize_device(xa, da, layout, out_dt, _stream.StreamRef(consumer, keep)),
                         tensors=2, out_index=None, allocates=True, unordered=unordered)


# ---------------------------------------------------------------------- host (NumPy)


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


# ---------------------------------------------------------------------- device


@dataclass(frozen=True)
class _Rows:
    """A 4-D tensor as (batch, group, outer, inner) rows of ``head_dim`` elements, strides in elements."""

    stride_b: int
    stride_g: int
    stride_outer: int
    stride_inner: int
    n_outer: int
    n_inner: int


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


def _check_sizes(name: str, shape, g: _Geom) -> None:
    if g.head_dim >= 2**31 or g.batch * g.groups >= 2**31:
        raise ValueError(f"{name} has shape {tuple(shape)}: head_dim and batch * descale columns must be "
                         "below 2**31 on the device")


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
    """The device path on an adapted ``xa``, on the call path's stream ``sref`` (`_callpath`)."""
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
