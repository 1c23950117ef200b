"""The NumPy path of the backward pass: checked, uploaded (contiguous), run, copied back."""

from __future__ import annotations

import numpy as np

from .._arrays import host_io as _host_io
from .._kernels import backward as _device_path
from .._runtime import device as _device
from .._runtime import stream as _stream
from .._spec.backward import validate_backward
from .._runtime.device import restores_caller_context


@restores_caller_context
def backward_host(dout, q, k, v, out, lse, dq, dk, dv, sinks, alibi, varlen, flags, stream, device=None):
    """NumPy in, NumPy out: checked, uploaded (contiguous), run, copied back; synchronous."""
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv), ("sinks", sinks), ("alibi_slopes", alibi)):
        if x is not None and not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, as q, k, v are; got {type(x).__name__}")
    if varlen is not None:
        for name, c in zip(("cu_seqlens_q", "cu_seqlens_k"), varlen[:2]):
            if not isinstance(c, np.ndarray):
                raise TypeError(f"{name} must be an int32 NumPy array when q, k, v are NumPy arrays; got "
                                f"{type(c).__name__}")
    validate_backward(dout, q, k, v, out, lse, dq, dk, dv, host=True, sinks=sinks, alibi_slopes=alibi,
                      varlen=varlen, **flags)  # every rule, before any upload
    device = _device.get_device(device)
    sref = _stream.as_stream(stream, device)
    up = lambda x: None if x is None else _host_io.to_device(np.ascontiguousarray(x), device=device,  # noqa: E731
                                                             stream=sref)
    ops = [up(x) for x in (dout, q, k, v, out, lse, sinks, alibi)]
    if varlen is not None:
        varlen = (up(varlen[0]), up(varlen[1]), *varlen[2:])
    do, qa, ka, va, oa, la, sk, al = ops
    problem, bwd = validate_backward(do, qa, ka, va, oa, la, None, None, None, host=False, sinks=sk, alibi_slopes=al,
                                     varlen=varlen, **flags)
    device_id = qa.device_id
    res = _device_path.run_backward(problem, bwd, do, qa, ka, va, oa, la, None, None, None, device, device_id, sref,
                                    *(varlen[:2] if varlen is not None else (None, None)))
    host = [_host_io.to_host(r, stream=sref) for r in res]
    for i, given in enumerate((dq, dk, dv)):
        if given is not None:
            given[...] = host[i]
            host[i] = given
    return tuple(host)
