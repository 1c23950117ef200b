"""`cudattn.attention`: adapt operands -> validate -> plan -> get kernel -> launch (-> copy back)."""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

from .._kernels import attention as _device_path
from .._numpy import attention as _numpy_attention
from .._calls.call import Call, dispatch
from .._calls.operands import array_key, array_or_none, check_device_arg, check_not_mixed, tag
from .._runtime import device as _device
from . import varlen as _varlen_api
from .._arrays.types import ArrayLike, DescaleLike, DeviceLike, DTypeLike, Layout, StreamLike
from .._arrays.array import ArrayResult, DeviceArray
from .._arrays.importer import OTHER, kind_of
from .._spec.validate import validate

_F32 = np.dtype(np.float32)


# The overloads only tell type checkers that return_lse=True gives a pair; the last def runs.
@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., scale: float | None = ...,
              layout: Layout = ..., return_lse: Literal[False] = ..., q_descale: DescaleLike = ...,
              k_descale: DescaleLike = ..., v_descale: DescaleLike = ..., out_dtype: DTypeLike | None = ...,
              num_splits: int | None = ..., out: ArrayLike | None = ..., stream: StreamLike = ...,
              cu_seqlens_q: ArrayLike | None = ..., cu_seqlens_k: ArrayLike | None = ...,
              max_seqlen_q: int | None = ..., max_seqlen_k: int | None = ...,
              window_size: tuple[int, int] | None = ..., softcap: float | None = ..., sinks: ArrayLike | None = ...,
              alibi_slopes: ArrayLike | None = ..., device: DeviceLike = ...) -> ArrayResult: ...


@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., scale: float | None = ...,
              layout: Layout = ..., return_lse: Literal[True], q_descale: DescaleLike = ...,
              k_descale: DescaleLike = ..., v_descale: DescaleLike = ..., out_dtype: DTypeLike | None = ...,
              num_splits: int | None = ..., out: ArrayLike | None = ...,
              stream: StreamLike = ..., cu_seqlens_q: ArrayLike | None = ..., cu_seqlens_k: ArrayLike | None = ...,
              max_seqlen_q: int | None = ..., max_seqlen_k: int | None = ...,
              window_size: tuple[int, int] | None = ..., softcap: float | None = ..., sinks: ArrayLike | None = ...,
              alibi_slopes: ArrayLike | None = ..., device: DeviceLike = ...) -> tuple[ArrayResult, ArrayResult]: ...


@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., scale: float | None = ...,
              layout: Layout = ..., return_lse: bool, q_descale: DescaleLike = ...,
              k_descale: DescaleLike = ..., v_descale: DescaleLike = ..., out_dtype: DTypeLike | None = ...,
              num_splits: int | None = ..., out: ArrayLike | None = ...,
              stream: StreamLike = ..., cu_seqlens_q: ArrayLike | None = ..., cu_seqlens_k: ArrayLike | None = ...,
              max_seqlen_q: int | None = ...,
              max_seqlen_k: int | None = ..., window_size: tuple[int, int] | None = ...,
              softcap: float | None = ..., sinks: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
              device: DeviceLike = ...) -> ArrayResult | tuple[ArrayResult, ArrayResult]: ...


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False, scale: float | None = None,
              layout: Layout = "bshd", return_lse: bool = False, q_descale: DescaleLike = None,
              k_descale: DescaleLike = None, v_descale: DescaleLike = None, out_dtype: DTypeLike | None = None,
              num_splits: int | None = None, out: ArrayLike | None = None,
              stream: StreamLike = None, cu_seqlens_q: ArrayLike | None = None, cu_seqlens_k: ArrayLike | None = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
              window_size: tuple[int, int] | None = None, softcap: float | None = None,
              sinks: ArrayLike | None = None, alibi_slopes: ArrayLike | None = None,
              device: DeviceLike = None) -> ArrayResult | tuple[ArrayResult, ArrayResult]:
    """Fused scaled-dot-product attention: ``softmax(scale · q kᵀ) v`` per head.

    Parameters
    ----------
    q, k, v : array
        ``layout="bshd"`` (default, as FlashAttention): q ``(B, Sq, Hq, D)``, k and v
        ``(B, Sk, Hkv, D)``; ``"bhsd"`` (as torch SDPA): ``(B, H, S, D)``. Any strides with a
        unit-stride last axis. float16, ``ml_dtypes.bfloat16`` or ``ml_dtypes.float8_e4m3fn``
        (FP8, below). GQA/MQA: ``Hq % Hkv == 0``; query head ``h`` reads kv head
        ``h // (Hq // Hkv)``. All three NumPy arrays: the call copies them to the GPU and returns
        NumPy results, synchronously (arrays from :func:`cudattn.empty_pinned` skip a host copy).
        All three device arrays (a :class:`cudattn.DeviceArray`, or anything with
        ``__cuda_array_interface__`` / ``__dlpack__`` on a CUDA device: CuPy, PyTorch, JAX,
        Numba): DeviceArray results, computed asynchronously on ``stream`` with no copies.
    causal : bool
        Aligned to the bottom right (FlashAttention >= 2.1): query ``i`` sees key ``j`` iff
        ``j <= i + Sk - Sq`` (torch SDPA's ``is_causal`` is top left; they differ when
        ``Sq != Sk``). A row that sees no key gets output 0 and LSE ``-inf``.
    scale : float, optional
        Multiplies ``q kᵀ``; default ``1/sqrt(D)``.
    layout : "bshd" or "bhsd"
    return_lse : bool
        Also return the log-sum-exp of each row.
    q_descale, k_descale, v_descale : None, float or float32 array, optional
        FP8 inputs only (FlashAttention-3's names): None (1.0), a float, or float32 ``(B, Hkv)``
        arrays (query head ``h`` uses entry ``h // (Hq // Hkv)``), NumPy for NumPy calls and
        device arrays for device calls. The result is attention on the dequantised inputs
        ``x * descale``; :func:`cudattn.quantize_fp8` makes such inputs.
    out_dtype : dtype, optional
        FP8 inputs: bfloat16 (default), float16 or float32. 16-bit inputs: their own dtype.
    num_splits : int, optional
        Decode (at most 16 query tokens) runs the split-KV kernel: the keys are cut into
        ``num_splits`` ranges merged by their LSEs. None chooses the count from the GPU's SM
        count, the grid and the KV length; an int from 1 to 128 forces it, for any shape. Not with
        FP8 inputs (FP8 KV caches are :func:`cudattn.attention_with_kvcache`'s).
    out : array, optional
        Written in place and returned: q's shape, the output dtype, the kind of q (NumPy or
        device); it must not overlap q, k or v. Required while ``stream`` captures a CUDA graph.
    stream : optional
        Device calls: an int handle, a cuda.core Stream, or any object with ``__cuda_stream__``.
        None: the operands' current stream (torch's or CuPy's, the stream that produced a
        DeviceArray, else cudattn's stream for the device). The call waits on the GPU for the
        streams that produced its inputs and keeps them alive until its kernels are done.
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k : optional
        Packed variable-length batches (FlashAttention's ``flash_attn_varlen_func``): int32
        ``(B + 1,)`` offsets (start at 0, never decrease, end at the packed lengths) and ints at
        least the longest sequence, with q ``(total_q, Hq, D)`` and k, v ``(total_k, Hkv, D)``;
        sequence ``b`` is rows ``cu[b] .. cu[b + 1] - 1`` (zero-length ones allowed). Causal is
        bottom right per sequence; layout "bshd" only, no ``num_splits``. NumPy offsets are
        checked before any GPU work; device offsets and ``max_seqlen_*`` are the caller's word
        (never read back to the host): the kernels clamp a wrong offset into the packed tensors
        (a wrong result for its sequence, never an access outside them), and rows past
        ``max_seqlen_q`` or covered by no sequence are not written.
    window_size : (int, int), optional
        A sliding window ``(left, right)``: query ``i`` sees key ``j`` iff
        ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (-1: that side open; ``causal=True``
        sets ``right = 0``). Key tiles outside every row's window are skipped.
    softcap : float, optional
        Scores ``s = scale · q kᵀ`` become ``softcap · tanh(s / softcap)`` (Gemma 2); 0 or None: off.
    sinks : float32 array, optional
        ``(Hq,)`` logits that join every row's softmax denominator and carry no value (GPT-OSS):
        ``out = Σ e^{s_j} v_j / (Σ e^{s_j} + e^{sink})``; the LSE includes the sink, so merging a
        sinked result with results over other keys stays exact. A row that sees no key gets
        output 0 and LSE ``sink``.
    alibi_slopes : float32 array, optional
        ``(Hq,)`` or ``(B, Hq)``; ``-slope · |i + Sk - Sq - j|`` is added to the capped score.
        The modifiers apply in the order softcap, ALiBi, masks; their arrays are NumPy for NumPy
        calls and device arrays otherwise; FP8 inputs take them on the dequantised scores.
    device : int or cuda.core Device, optional
        NumPy calls: the GPU that computes; None: the thread's current device (device 0 where
        none is current). Device calls run on their operands' device: None or that device.

    Returns
    -------
    out : NumPy array or DeviceArray
        q's shape, in the input dtype (FP8: ``out_dtype``); ``out`` itself when given.
    lse : NumPy array or DeviceArray, float32
        With ``return_lse=True`` only (then the call returns ``(out, lse)``): ``(B, Hq, Sq)``, the
        natural log of each row's sum of ``exp(scale · q kᵀ)``; varlen: ``(Hq, total_q)``.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype, or q, k, v (and out, the descales, sinks, slopes)
        not all NumPy arrays or all device arrays; the message names each.
    ValueError
        Shapes, strides, layouts, offsets or values that break a rule, named before any GPU work.
    NotImplementedError
        A valid combination not supported yet: ``num_splits`` with FP8 inputs or packed batches,
        ``out_dtype`` other than the input's for 16-bit inputs.
    cudattn.NoDeviceError
        No usable CUDA GPU (no driver library, or the driver sees no device).
    cudattn.OutOfMemoryError
        Out of device memory (also a MemoryError), naming the bytes asked for.
    cudattn.CudaError
        Any other failed driver call.

    Notes
    -----
    Non-finite inputs follow :func:`cudattn.reference.attention` (IEEE arithmetic over the keys a
    row sees): NaN in a row's q or in a seen key's k or v, or a ``+inf`` score, makes the row NaN;
    a ``-inf`` score drops its key. One exception: NaN or inf in v can also reach a causal row that
    does not see that key when both fall in one tile (its weight there is an exact 0, and
    ``0 · NaN = NaN`` in the tensor-core product).

    FP8 (sm_89 and newer) runs on the tensor cores' e4m3 instructions with float32 accumulation;
    P is rounded to e4m3 for the P V product, so FP8 results are less accurate than 16-bit ones
    (a relative RMSE near 2 % on N(0, 1) inputs, against 0.05 %).

    ``B == 0`` or ``Sq == 0`` gives an empty result, ``Sk == 0`` output 0 and LSE ``-inf`` on every
    row. Results are deterministic: the same inputs give bit-identical outputs run after run.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> q = np.random.randn(2, 128, 8, 64).astype(np.float16)
    >>> k = np.random.randn(2, 128, 2, 64).astype(np.float16)   # GQA: 2 kv heads
    >>> v = np.random.randn(2, 128, 2, 64).astype(np.float16)
    >>> out = cudattn.attention(q, k, v, causal=True)
    >>> out.shape, out.dtype
    ((2, 128, 8, 64), dtype('float16'))
    >>> out, lse = cudattn.attention(cudattn.to_device(q), cudattn.to_device(k), cudattn.to_device(v),
    ...                              return_lse=True)
    >>> lse.shape
    (2, 8, 128)
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None or \
            max_seqlen_k is not None:
        return _varlen_api.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale,
            layout=layout, return_lse=return_lse, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            out_dtype=out_dtype, num_splits=num_splits, out=out, stream=stream, window_size=window_size,
            mods=(softcap, sinks, alibi_slopes), device=device)
    host_q, host_k, host_v = isinstance(q, np.ndarray), isinstance(k, np.ndarray), isinstance(v, np.ndarray)
    if host_q and host_k and host_v:
        return _numpy_attention.attention_host(
            q, k, v, causal=causal, scale=scale, layout=layout, return_lse=return_lse, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, num_splits=num_splits, out=out,
            stream=stream, window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
            device=device)
    # q alone is asked its kind (a k or v that is no array is named by the importer as it adapts them)
    if host_q or host_k or host_v or type(q) is not DeviceArray and kind_of(q) == OTHER:
        check_not_mixed((("q", q), ("k", k), ("v", v)))  # the one message for host/device mixes and non-arrays
    # Operands: q, k, v, out, then (when any is given) the descales, sinks and slopes that are arrays;
    # a scalar or NumPy one stays out of the operands (the key holds it; the full path reads or refuses it).
    extra = (q_descale, k_descale, v_descale, sinks, alibi_slopes)
    has_x = q_descale is not None or k_descale is not None or v_descale is not None or sinks is not None or \
        alibi_slopes is not None
    flags = (causal, scale, layout, return_lse, out_dtype, num_splits)
    args = (*flags, window_size, softcap, extra)
    mods = (None if window_size is None else tag(window_size), None if softcap is None else tag(softcap))
    allocates = out is None or return_lse is True
    if not has_x and device is None:  # the signature needs nothing of the adapted operands
        return dispatch("attention", [q, k, v, out], _NAMES4, stream, flags, (*mods, None), _full, args,
                        tensors=4, out_index=3, allocates=allocates)
    call = Call("attention", [q, k, v, out, *map(array_or_none, extra)] if has_x else [q, k, v, out],
                _NAMES if has_x else _NAMES4, stream)
    if device is not None:
        check_device_arg(device, call.ops[0].device_id)
    return call.run(flags, (*mods, tuple(map(array_key, extra, call.ops[4:])) if has_x else None), _full, args,
                    tensors=4, out_index=3, allocates=allocates)


def _full(call: Call, args, qa, ka, va, oa, dq=None, dk=None, dv=None, sk=None, al=None):
    """The full path of a device call: validate, plan and launch (operands absent from the call: the
    caller's values, scalars or None)."""
    causal, scale, layout, return_lse, out_dtype, num_splits, window_size, softcap, extra = args
    q_descale, k_descale, v_descale, sinks, alibi_slopes = extra
    problem = validate(qa, ka, va, causal=causal, scale=scale, layout=layout, return_lse=return_lse,
                       q_descale=q_descale if dq is None else dq, k_descale=k_descale if dk is None else dk,
                       v_descale=v_descale if dv is None else dv, out_dtype=out_dtype,
                       num_splits=num_splits, out=oa, host=False, window_size=window_size, softcap=softcap,
                       sinks=sinks if sk is None else sk, alibi_slopes=alibi_slopes if al is None else al)
    device_id = qa.device_id
    return _device_path.run_device(problem, qa, ka, va, oa, _device.get_device(device_id), device_id,
                                   call.stream_ref())


_NAMES = ("q", "k", "v", "out", "q_descale", "k_descale", "v_descale", "sinks", "alibi_slopes")
_NAMES4 = _NAMES[:4]


