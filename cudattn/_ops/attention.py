"""`cudattn.attention`: adapt operands -> validate -> plan -> get kernel -> launch (-> copy back)."""

from __future__ import annotations

from typing import Literal, overload

import numpy as np

from .._kernels import attention as _device_path
from .._numpy import attention as _numpy_attention
from .._calls.call import Call
from .._calls.operands import array_key, array_or_none, check_not_mixed, tag
from .._runtime import device as _device
from . import varlen as _varlen_api
from .._arrays.array import DeviceArray
from .._arrays.types import ArrayLike, DescaleLike, DTypeLike, Layout, StreamLike
from .._arrays.array import ArrayResult
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
              alibi_slopes: ArrayLike | None = ...) -> ArrayResult: ...


@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., scale: float | None = ...,
              layout: Layout = ..., return_lse: Literal[True], q_descale: DescaleLike = ...,
              k_descale: DescaleLike = ..., v_descale: DescaleLike = ..., out_dtype: DTypeLike | None = ...,
              num_splits: int | None = ..., out: ArrayLike | None = ...,
              stream: StreamLike = ..., cu_seqlens_q: ArrayLike | None = ..., cu_seqlens_k: ArrayLike | None = ...,
              max_seqlen_q: int | None = ..., max_seqlen_k: int | None = ...,
              window_size: tuple[int, int] | None = ..., softcap: float | None = ..., sinks: ArrayLike | None = ...,
              alibi_slopes: ArrayLike | None = ...) -> tuple[ArrayResult, ArrayResult]: ...


@overload
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., scale: float | None = ...,
              layout: Layout = ..., return_lse: bool, q_descale: DescaleLike = ...,
              k_descale: DescaleLike = ..., v_descale: DescaleLike = ..., out_dtype: DTypeLike | None = ...,
              num_splits: int | None = ..., out: ArrayLike | None = ...,
              stream: StreamLike = ..., cu_seqlens_q: ArrayLike | None = ..., cu_seqlens_k: ArrayLike | None = ...,
              max_seqlen_q: int | None = ...,
              max_seqlen_k: int | None = ..., window_size: tuple[int, int] | None = ...,
              softcap: float | None = ..., sinks: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
              ) -> ArrayResult | tuple[ArrayResult, ArrayResult]: ...


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False, scale: float | None = None,
              layout: Layout = "bshd", return_lse: bool = False, q_descale: DescaleLike = None,
              k_descale: DescaleLike = None, v_descale: DescaleLike = None, out_dtype: DTypeLike | None = None,
              num_splits: int | None = None, out: ArrayLike | None = None,
              stream: StreamLike = None, cu_seqlens_q: ArrayLike | None = None, cu_seqlens_k: ArrayLike | None = None,
              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
              window_size: tuple[int, int] | None = None, softcap: float | None = None,
              sinks: ArrayLike | None = None,
              alibi_slopes: ArrayLike | None = None) -> ArrayResult | tuple[ArrayResult, ArrayResult]:
    """Fused scaled-dot-product attention: ``softmax(scale · q kᵀ) v`` per head.

    Layouts: ``"bshd"`` (default, as FlashAttention) q ``(B, Sq, Hq, D)``, k/v ``(B, Sk, Hkv, D)``;
    ``"bhsd"`` (as torch SDPA) ``(B, H, S, D)``. Any strides with a unit-stride last axis.
    GQA/MQA: ``Hq % Hkv == 0``; query head ``h`` reads kv head ``h // (Hq // Hkv)``.

    ``causal=True`` is aligned to the bottom right (FlashAttention >= 2.1): query ``i`` sees key
    ``j`` iff ``j <= i + Sk - Sq``. This differs from torch SDPA's ``is_causal`` (top-left) when
    ``Sq != Sk``. A query row that sees no key gets output 0 and LSE ``-inf``; so does every row
    when ``Sk == 0`` (``B == 0`` or ``Sq == 0``: an empty result).

    Non-finite inputs follow ``cudattn.reference``: NaN in a row's q or in a seen key's k or v,
    or a ``+inf`` score, makes the row NaN; a ``-inf`` score drops its key (README: "Non-finite
    inputs", with the one causal exception). Out of device memory raises
    ``cudattn.OutOfMemoryError`` (a MemoryError) naming the bytes asked for.

    ``scale`` defaults to ``1/sqrt(D)``. ``return_lse=True`` also returns the float32 log-sum-exp
    ``(B, Hq, Sq)`` (natural log of the row sum of ``exp(scale · q kᵀ)``).

    NumPy inputs (float16 or ml_dtypes.bfloat16) give a NumPy result, synchronously; arrays in
    pinned memory (:func:`cudattn.empty_pinned`) are DMA'd with no host copy, the fastest way. Device
    inputs (a cudattn DeviceArray, or anything with ``__cuda_array_interface__`` / ``__dlpack__``
    on a CUDA device: CuPy, PyTorch, JAX, Numba) give a DeviceArray, computed asynchronously on
    ``stream`` (an int handle, a cuda.core Stream, or any object with ``__cuda_stream__``), with
    no copies. ``stream=None`` is the operands' current stream: torch's or CuPy's current stream,
    the stream that produced a cudattn DeviceArray, else cudattn's stream for the device. The call
    waits (on the GPU) for the streams that produced its inputs and keeps inputs alive until its
    kernels are done. While ``stream`` captures a CUDA graph, pass ``out=``. ``out`` must not
    overlap q, k or v.

    Decode (at most 16 query tokens) runs the split-KV kernel: the keys are cut into ``num_splits``
    ranges processed by separate blocks and merged by their LSEs. ``num_splits=None`` chooses the
    count from the GPU's SM count, the grid and the KV length (1 when the grid already fills the
    GPU); an int from 1 to 128 forces it, and sends any shape through the split-KV kernel.
    Results are deterministic: the same inputs give bit-identical outputs run after run.

    FP8: q, k, v typed ``ml_dtypes.float8_e4m3fn`` (NVIDIA's e4m3, +-448, no inf) run on the tensor
    cores' e4m3 instructions (sm_89+), fp32 accumulation. ``q_descale``, ``k_descale``, ``v_descale``
    (FlashAttention-3's names): None (1.0), a float, or float32 arrays of shape ``(B, Hkv)`` (query
    head h uses entry h // (Hq // Hkv)); NumPy arrays for NumPy calls, device arrays for device
    calls. The result is attention on the dequantised inputs ``x * descale``; make them with
    ``cudattn.quantize_fp8``. The output is bfloat16 unless ``out_dtype`` says float16 or float32
    (16-bit inputs: the output has the input dtype). P is rounded to e4m3 for the P V product,
    so FP8 results are less accurate than 16-bit ones (README: "FP8 accuracy"). FP8 takes no
    ``num_splits`` and no KV cache yet.

    ``window_size=(left, right)``: a sliding window, FlashAttention's convention: query ``i`` sees
    key ``j`` iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (-1: that side open;
    ``causal=True`` sets ``right = 0``). Key tiles outside every row's window are skipped, so the
    time follows the window.

    Score modifiers (FlashAttention's conventions; each in the float64 reference too), applied in
    this order: ``softcap`` (a float, 0 or None: off): scores ``s = scale · q·kᵀ`` become
    ``softcap · tanh(s / softcap)`` (Gemma 2, Grok). ``alibi_slopes``: float32 ``(Hq,)`` or
    ``(B, Hq)``; ``-slope · |i + Sk - Sq - j|`` is added to the capped score of query ``i`` and
    key ``j``. Then the masks (causal, window). ``sinks``: float32 ``(Hq,)`` logits, one per
    query head, that join every row's softmax denominator and carry no value (GPT-OSS's
    attention sinks, FlashAttention's ``s_aux``): ``out = Σ e^{s_j} v_j / (Σ e^{s_j} + e^{sink})``
    and the LSE includes the sink, so `merge_attention_states` of a sinked result with results
    over other keys (without sinks) stays exact; a row that sees no key gets output 0 and LSE
    ``sink``. Arrays follow the descales' rule: NumPy for NumPy calls, device arrays otherwise.
    FP8 inputs take them all, on the dequantised scores (``s = scale · q_descale · k_descale ·
    q·kᵀ``).

    Packed variable-length batches (FlashAttention's ``flash_attn_varlen_func`` convention): pass
    ``cu_seqlens_q``, ``cu_seqlens_k`` (int32 ``(B + 1,)`` offsets: start at 0, never decrease, end
    at the packed lengths) and ``max_seqlen_q``, ``max_seqlen_k`` (ints, at least the longest
    sequence), with q ``(total_q, Hq, D)`` and k, v ``(total_k, Hkv, D)``; sequence ``b`` is rows
    ``cu[b] .. cu[b + 1] - 1``. The output is ``(total_q, Hq, D)`` and the LSE ``(Hq, total_q)``
    (FlashAttention's varlen layout, not ``(B, Hq, Sq)``). Causal is bottom right per sequence;
    zero-length sequences are allowed; FP8 descale arrays are ``(B, Hkv)``. NumPy offsets are
    checked (each rule named) before any GPU work; device offsets are read only by the kernels,
    which clamp them into the packed tensors (a wrong offset gives a wrong result for its
    sequence, never an access outside q, k, v or out), as FlashAttention takes ``max_seqlen_*``
    from the caller so that nothing is read back to the host. With device offsets the caller also
    vouches for ``max_seqlen_*``: rows past ``max_seqlen_q`` of a longer sequence, and rows no
    sequence covers, are not written.
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None or \
            max_seqlen_k is not None:
        return _varlen_api.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale,
            layout=layout, return_lse=return_lse, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
            out_dtype=out_dtype, num_splits=num_splits, out=out, stream=stream, window_size=window_size,
            mods=(softcap, sinks, alibi_slopes))
    host_q, host_k, host_v = isinstance(q, np.ndarray), isinstance(k, np.ndarray), isinstance(v, np.ndarray)
    if host_q and host_k and host_v:
        return _numpy_attention.attention_host(
            q, k, v, causal=causal, scale=scale, layout=layout, return_lse=return_lse, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, num_splits=num_splits, out=out,
            stream=stream, window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    if host_q or host_k or host_v or type(q) is not DeviceArray and kind_of(q) == OTHER:
        check_not_mixed(q, k, v)  # the one message for host/device mixes and non-arrays
    # Operands: q, k, v, out, then (when any is given) the descales, sinks and slopes that are arrays;
    # a scalar or NumPy one stays out of the operands (the key holds it; the full path reads or refuses it).
    extra = (q_descale, k_descale, v_descale, sinks, alibi_slopes)
    has_x = q_descale is not None or k_descale is not None or v_descale is not None or sinks is not None or \
        alibi_slopes is not None
    call = Call("attention", [q, k, v, out, *map(array_or_none, extra)] if has_x else [q, k, v, out],
                _NAMES if has_x else _NAMES4, stream)
    return call.run((causal, scale, layout, return_lse, out_dtype, num_splits),
                    (None if window_size is None else tag(window_size), None if softcap is None else tag(softcap),
                     tuple(map(array_key, extra, call.ops[4:])) if has_x else None),
                    _full, (causal, scale, layout, return_lse, out_dtype, num_splits, window_size, softcap, extra),
                    tensors=4, out_index=3, allocates=out is None or return_lse is True)


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


