"""`cudattn.attention_backward`: the gradients of attention, through the same call path as the forward."""

from __future__ import annotations

import numpy as np

from .._arrays import host_io as _host_io
from .._arrays.array import ArrayResult, DeviceArray
from .._arrays.importer import OTHER, kind_of
from .._arrays.types import ArrayLike, DeviceLike, Layout, StreamLike
from .._calls.call import Call
from .._calls.operands import check_device_arg, check_not_mixed, tag
from .._kernels import backward as _device_path
from .._numpy import backward as _numpy_backward
from .._runtime import device as _device
from .._spec.backward import validate_backward
from .._spec.varlen import check_varlen_call

__all__ = ["attention_backward"]

_NAMES = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "sinks", "alibi_slopes", "cu_seqlens_q",
          "cu_seqlens_k")


def attention_backward(dout: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike, *,
                       causal: bool = False, scale: float | None = None, layout: Layout = "bshd",
                       window_size: tuple[int, int] | None = None, softcap: float | None = None,
                       alibi_slopes: ArrayLike | None = None, sinks: ArrayLike | None = None,
                       cu_seqlens_q: ArrayLike | None = None, cu_seqlens_k: ArrayLike | None = None,
                       max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                       deterministic: bool = False, dq: ArrayLike | None = None, dk: ArrayLike | None = None,
                       dv: ArrayLike | None = None, stream: StreamLike = None,
                       device: DeviceLike = None) -> tuple[ArrayResult, ...]:
    """Gradients of :func:`cudattn.attention` with respect to q, k and v (and the sinks).

    Parameters
    ----------
    dout : array
        The gradient of the loss with respect to the forward's output: q's shape and dtype.
    q, k, v : array
        The forward's inputs (float16 or bfloat16; head_dim up to 256).
    out, lse : array
        What ``attention(q, k, v, ..., return_lse=True)`` returned for them.
    causal, scale, layout, window_size, softcap, alibi_slopes, sinks
        The forward call's own arguments, as :func:`cudattn.attention` takes them.
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k : optional
        A packed variable-length batch, as the forward took it (q ``(total_q, Hq, D)``, lse
        ``(Hq, total_q)``).
    deterministic : bool
        False (default): dQ's float32 sums are added with atomics, so their last bits may differ
        from run to run. True: the key blocks add in a fixed order, and dq, dk, dv (and dsinks)
        are bit-identical run to run. dk, dv and dsinks are always deterministic.
    dq, dk, dv : array, optional
        Written in place and returned: the shapes and dtype of q, k and v; they must share no
        memory with any input or with each other. Required while ``stream`` captures a CUDA graph.
    stream : optional
        As :func:`cudattn.attention`: device calls are asynchronous on it.
    device : int or cuda.core Device, optional
        As in :func:`cudattn.attention`: the GPU of NumPy calls (device calls run where their
        operands are).

    Returns
    -------
    (dq, dk, dv), or (dq, dk, dv, dsinks) when ``sinks`` is given (dsinks: float32 ``(Hq,)``).
    NumPy arrays for NumPy inputs (synchronous), DeviceArrays otherwise. With GQA/MQA, dk and dv
    are summed over the query heads that share a KV head.

    Raises
    ------
    TypeError, ValueError
        An argument that breaks the forward's rules, or ``dout``/``out``/``lse``/gradients whose
        shapes or dtypes do not belong to q, k, v, gradients that overlap an input, a
        non-bool ``deterministic``, a packed call without its offsets; all before any GPU work.
    NotImplementedError
        FP8 inputs.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> q, k, v = (np.random.randn(1, 256, 4, 64).astype(np.float16) for _ in range(3))
    >>> out, lse = cudattn.attention(q, k, v, causal=True, return_lse=True)
    >>> dout = np.random.randn(*out.shape).astype(np.float16)
    >>> dq, dk, dv = cudattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    >>> dq.shape, dk.shape
    ((1, 256, 4, 64), (1, 256, 4, 64))
    """
    varlen = None
    if cu_seqlens_q is not None or cu_seqlens_k is not None or max_seqlen_q is not None or max_seqlen_k is not None:
        check_varlen_call(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, None)
        varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = dict(causal=causal, scale=scale, layout=layout, window_size=window_size, softcap=softcap,
                 deterministic=deterministic)
    named = (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse))
    if all(isinstance(x, np.ndarray) for _, x in named):
        return _numpy_backward.backward_host(dout, q, k, v, out, lse, dq, dk, dv, sinks, alibi_slopes, varlen, flags,
                                             stream, device)
    if any(isinstance(x, np.ndarray) for _, x in named) or any(
            x is None or type(x) is not DeviceArray and kind_of(x) == OTHER for _, x in named):
        check_not_mixed(named)
    host_offsets = varlen is not None and any(type(c) is np.ndarray for c in varlen[:2])
    cu_objs = [None, None] if varlen is None else [None if type(c) is np.ndarray else c for c in varlen[:2]]
    call = Call("backward", [dout, q, k, v, out, lse, dq, dk, dv, sinks, alibi_slopes, *cu_objs], _NAMES, stream)
    check_device_arg(device, call.ops[1].device_id)
    # Operands 0-5 are read, 6-8 written: a warm call checks that the gradients given touch no input
    # and none of each other (its recorded spans), else the full path judges (validate_backward).
    return call.run((causal, scale, layout, deterministic, max_seqlen_q, max_seqlen_k),
                    (tag(window_size), tag(softcap), varlen[:2] if host_offsets else None),
                    _full, (varlen, flags, sinks, alibi_slopes), tensors=9, out_index=6, more_outs=(7, 8),
                    allocates=dq is None or dk is None or dv is None or sinks is not None)


def _full(call: Call, args, do, qa, ka, va, oa, la, dqa, dka, dva, sk, al, cq, ck):
    """The full path of a device call: validate (gradients checked against every input), plan and launch."""
    varlen, flags, sinks, alibi = args
    if varlen is not None:
        cq = varlen[0] if cq is None else cq
        ck = varlen[1] if ck is None else ck
        varlen = (cq, ck, *varlen[2:])
    problem, bwd = validate_backward(do, qa, ka, va, oa, la, dqa, dka, dva, host=False, sinks=sinks if sk is None else sk,
                                     alibi_slopes=alibi if al is None else al, varlen=varlen, **flags)
    device_id = qa.device_id
    device = _device.get_device(device_id)
    sref = call.stream_ref()
    if varlen is not None:
        cq, ck = (_host_io.to_device(c, device=device, stream=sref) if isinstance(c, np.ndarray) else c
                  for c in (cq, ck))
    return _device_path.run_backward(problem, bwd, do, qa, ka, va, oa, la, dqa, dka, dva, device, device_id, sref,
                                     cq, ck)
