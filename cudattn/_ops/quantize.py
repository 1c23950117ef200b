"""`cudattn.quantize_fp8` and `cudattn.dequantize`: float <-> FP8 e4m3 with per-tensor or per-head descales.

The rule (`cudattn._spec.quantize`) is the same on the host (`cudattn._numpy.quantize`) and on the
device (`cudattn._kernels.quantize`), bit for bit; this module checks the arguments and picks the path.
"""

from __future__ import annotations

import numpy as np

from .._calls.call import Call
from .._arrays import importer as _importer
from .._arrays.types import ArrayLike, DTypeLike, Layout, QuantizePer, StreamLike
from .._arrays.array import ArrayResult
from .._spec.quantize import _check_heads_kv, _check_layout, _check_out_dtype, _check_per
from .._kernels.quantize import _dequantize_device, _quantize_device
from .._numpy.quantize import _dequantize_host, _quantize_host

__all__ = ["dequantize", "quantize_fp8"]


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
    x_fp8 : NumPy array or DeviceArray
        ``ml_dtypes.float8_e4m3fn``, ``x``'s shape and layout, C-contiguous.
    descale : NumPy array or DeviceArray
        float32 ``(B, G)``, ``G`` being ``heads_kv`` (default ``H``).

    Raises
    ------
    TypeError
        ``x`` is no NumPy or device array, or has another dtype; ``heads_kv`` is no int.
    ValueError
        ``x`` is not 4-D, its heads are not a multiple of ``heads_kv``, ``per`` or ``layout`` is
        unknown, NumPy ``x`` holds NaN or inf, or device ``x`` is on a GPU older than sm_89.
    cudattn.NoDeviceError, cudattn.OutOfMemoryError, cudattn.CudaError
        Device input only, as in :func:`cudattn.attention`.

    Notes
    -----
    Rule (host and device give the same bits): in float32, ``descale = amax / 448`` (at least 2^-126;
    1 where ``amax == 0``) and ``x_fp8 = e4m3(x / descale)``, an IEEE division rounded to nearest
    even and saturated to +-448 (never NaN for finite x).

    Non-finite input: NumPy input raises ``ValueError`` before any work. Device input is not
    checked (that would need a host sync); NaN and inf propagate instead. A NaN makes the amax and
    descale of its group NaN and every e4m3 value of the group NaN; an inf makes them inf, the
    group's finite values 0 and its infs NaN. With ``per="tensor"`` the group is the whole tensor.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> k = np.random.randn(2, 1024, 4, 128).astype(np.float32)
    >>> k8, k_descale = cudattn.quantize_fp8(k, per="head")
    >>> k8.dtype, k_descale.shape
    (dtype(float8_e4m3fn), (2, 4))
    >>> q8, q_descale = cudattn.quantize_fp8(np.random.randn(2, 16, 8, 128), per="head", heads_kv=4)
    >>> q_descale.shape                           # (B, Hkv), as attention's q_descale takes it
    (2, 4)
    """
    per = _check_per(per)
    layout = _check_layout(layout)
    heads_kv = _check_heads_kv(heads_kv)
    if isinstance(x, np.ndarray):
        return _quantize_host(x, per, layout, heads_kv)
    if not _importer.is_device_array_like(x):
        raise TypeError("x must be a NumPy array or a device array (DeviceArray, or an object with "
                        f"__cuda_array_interface__ or __dlpack__ on a CUDA device); got {type(x).__name__}")
    call = Call("quantize_fp8", (x,), ("x",), stream)
    return call.run((per, layout, heads_kv), None, _quantize_full, (per, layout, heads_kv),
                    tensors=1, out_index=None, allocates=True)


def dequantize(x_fp8: ArrayLike, descale: ArrayLike, *, layout: Layout = "bshd", out_dtype: DTypeLike = np.float32,
               stream: StreamLike = None) -> ArrayResult:
    """The inverse of :func:`quantize_fp8`: ``x_fp8 * descale[b, g]`` per element.

    Both arrays NumPy: computed on the host, NumPy result. Both device arrays: computed on the GPU
    (sm_80+), asynchronously on ``stream``, DeviceArray result. Mixing raises ``TypeError``. The
    product is taken in float32 (IEEE) and rounded to nearest even into ``out_dtype``; host and
    device give the same bits.

    Parameters
    ----------
    x_fp8 : array, 4-D, ``ml_dtypes.float8_e4m3fn`` (or uint8 holding e4m3 bits)
        ``(B, S, H, D)`` for ``layout="bshd"``, ``(B, H, S, D)`` for ``"bhsd"``.
    descale : float32 array, shape ``(B, G)``
        ``G``, the number of descale columns, must divide ``H``; head ``h`` uses column ``h // (H // G)``.
    out_dtype : float32 (default), float16 or bfloat16
    stream : optional
        As in :func:`quantize_fp8` (device input only).

    Returns
    -------
    x : NumPy array or DeviceArray
        ``out_dtype``, ``x_fp8``'s shape, C-contiguous in ``layout``.

    Raises
    ------
    TypeError
        An argument that is no array, NumPy and device arrays mixed, or a wrong dtype.
    ValueError
        ``x_fp8`` not 4-D, ``descale`` not ``(B, G)`` with ``G`` dividing the heads, or an
        unknown ``layout``.
    cudattn.NoDeviceError, cudattn.OutOfMemoryError, cudattn.CudaError
        Device input only, as in :func:`cudattn.attention`.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> x = np.random.randn(2, 64, 4, 128).astype(np.float32)
    >>> x8, descale = cudattn.quantize_fp8(x)
    >>> y = cudattn.dequantize(x8, descale)
    >>> y.dtype, bool(np.abs(y - x).max() <= np.abs(x).max() / 16)   # e4m3: 3 mantissa bits
    (dtype('float32'), True)
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
        if not _importer.is_device_array_like(a):
            raise TypeError(f"{name} must be a NumPy array or a device array (DeviceArray, or an object with "
                            f"__cuda_array_interface__ or __dlpack__ on a CUDA device); got {type(a).__name__}")
    call = Call("dequantize", (x_fp8, descale), ("x_fp8", "descale"), stream)
    return call.run((layout, out_dt), None, _dequantize_full, (layout, out_dt),
                    tensors=2, out_index=None, allocates=True)


def _quantize_full(call: Call, args, xa):
    per, layout, heads_kv = args
    return _quantize_device(xa, per, layout, heads_kv, call.stream_ref())


def _dequantize_full(call: Call, args, xa, da):
    layout, out_dt = args
    return _dequantize_device(xa, da, layout, out_dt, call.stream_ref())
