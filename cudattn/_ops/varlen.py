"""`cudattn.attention` on packed variable-length batches (FlashAttention's varlen convention).

Flow: the arguments' checks (`_spec.varlen` for NumPy offsets; device offsets by dtype and shape
only) -> the call validated as one padded batch entry of the packed rows (`_spec.validate`), then
re-described as B sequences -> plan -> launch of the prefill kernels (`_kernels.attention.run_varlen`),
which find each sequence through the offsets (cu_src/include/cudattn/seqlen.cuh).

Device offsets are operands of the call (their addresses, never their values, are read here),
so warm calls replay like any other; NumPy offsets are checked and uploaded on every call.
"""

from __future__ import annotations


import numpy as np

from .._arrays import array as _array
from .._calls.call import Call
from .._kernels import attention as _device_path
from .._numpy import varlen as _numpy_varlen
from .._calls.operands import array_key, array_or_none, check_device_arg, check_not_mixed, tag
from .._runtime import device as _device
from .._arrays import importer as _importer
from .._arrays import host_io as _host_io
from .._arrays.importer import OTHER, kind_of
from .._spec.varlen import check_varlen_call, validate_varlen

__all__ = ["attention_varlen"]

_F32 = np.dtype(np.float32)
_NEG_INF_F32_BITS = 0xFF800000
_NAMES = ("q", "k", "v", "out", "cu_seqlens_q", "cu_seqlens_k", "q_descale", "k_descale", "v_descale", "sinks",
          "alibi_slopes")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale, layout,
                     return_lse, q_descale, k_descale, v_descale, out_dtype, num_splits, out, stream,
                     window_size=None, mods=(None, None, None), device=None):
    """`cudattn.attention` with ``cu_seqlens_q``/``cu_seqlens_k`` (its docstring has the contract).
    ``mods``: its (softcap, sinks, alibi_slopes)."""
    check_varlen_call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, num_splits)
    flags = dict(causal=causal, scale=scale, return_lse=return_lse, out_dtype=out_dtype, window_size=window_size)
    descales = (q_descale, k_descale, v_descale)
    host = [isinstance(x, np.ndarray) for x in (q, k, v)]
    if all(host):
        return _numpy_varlen.attention_varlen_host(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                   descales, flags, out, stream, mods, device)
    if any(host) or type(q) is not _array.DeviceArray and kind_of(q) == OTHER:  # (k, v: see attention)
        check_not_mixed((("q", q), ("k", k), ("v", v)))
    host_offsets = False
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if type(x) is np.ndarray:
            host_offsets = True
        elif type(x) is not _array.DeviceArray and kind_of(x) == OTHER and not _importer.is_device_array_like(x):
            raise TypeError(f"{name} must be an int32 NumPy or device array of shape (batch + 1,); "
                            f"got {type(x).__name__}")
    # NumPy offsets are no operands: the full path checks and uploads them on every call.
    cq_obj = None if type(cu_seqlens_q) is np.ndarray else cu_seqlens_q
    ck_obj = None if type(cu_seqlens_k) is np.ndarray else cu_seqlens_k
    # Operands: six, then (when any is given) the descales, sinks and slopes that are arrays.
    softcap, sinks, alibi = mods
    extra = (*descales, sinks, alibi)
    has_x = not (q_descale is None and k_descale is None and v_descale is None and sinks is None and alibi is None)
    objs = [q, k, v, out, cq_obj, ck_obj]
    call = Call("varlen", [*objs, *map(array_or_none, extra)] if has_x else objs, _NAMES, stream)
    check_device_arg(device, call.ops[0].device_id)
    # NumPy offsets make the key unhashable: such calls always take the full path.
    return call.run((causal, scale, return_lse, out_dtype, max_seqlen_q, max_seqlen_k),
                    ((cu_seqlens_q, cu_seqlens_k) if host_offsets else None, tag(window_size), tag(softcap),
                     tuple(map(array_key, extra, call.ops[6:])) if has_x else None),
                    _full, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, descales, flags, mods),
                    tensors=4, out_index=3, allocates=out is None or return_lse is True)


def _full(call: Call, args, qa, ka, va, oa, cq, ck, dq=None, dk=None, dv=None, sk=None, al=None):
    """The full path of a device call: validate, upload NumPy offsets, plan and launch."""
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, descales, flags, (softcap, sinks, alibi) = args
    cq = cu_seqlens_q if cq is None else cq
    ck = cu_seqlens_k if ck is None else ck
    ds = tuple(g if a is None else a for g, a in zip(descales, (dq, dk, dv)))
    ms = (softcap, sinks if sk is None else sk, alibi if al is None else al)
    problem = validate_varlen(qa, ka, va, cq, ck, max_seqlen_q, max_seqlen_k, ds, flags, oa, host=False, mods=ms)
    device_id = qa.device_id
    device = _device.get_device(device_id)
    sref = call.stream_ref()
    cq, ck = (_host_io.to_device(c, device=device, stream=sref) if isinstance(c, np.ndarray) else c
              for c in (cq, ck))
    return _device_path.run_varlen(problem, qa, ka, va, oa, cq, ck, device, device_id, sref)


