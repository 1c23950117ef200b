"""The NumPy path of packed variable-length attention: checked, uploaded (contiguous), run, copied back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._arrays import array as _array
from .._arrays import host_io as _host_io
from .._kernels import attention as _device_path
from .._kernels import fp8 as _fp8
from .._runtime import device as _device
from .._runtime import stream as _stream
from .._spec.varlen import validate_varlen
from .._runtime.device import restores_caller_context


@restores_caller_context
def attention_varlen_host(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags, out, stream, mods=(None, None, None),
                          device=None):
    """NumPy in, NumPy out: checked, uploaded (contiguous), run, copied back; synchronous."""
    for name, x in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be an int32 NumPy array when q, k, v are NumPy arrays; got "
                            f"{type(x).__name__}")
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError("out must be a NumPy array (q, k, v are NumPy arrays)")
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    problem = validate_varlen(q, k, v, cu_q, cu_k, max_q, max_k, descales, flags, out, host=True, mods=mods)
    device = _device.get_device(device)
    device_id = _device.device_properties(device).device_id
    sref = _stream.as_stream(stream, device)
    up = lambda x: _host_io.to_device(np.ascontiguousarray(x), device=device, stream=sref)  # noqa: E731
    qa, ka, va, cq, ck = (up(x) for x in (q, k, v, cu_q, cu_k))
    if problem.descales is not None:
        d = _fp8.upload_descales(dict(zip(("q_descale", "k_descale", "v_descale"), descales)), device, sref)
        ptrs = [getattr(d[n], "ptr", 0) if isinstance(d[n], _array.DeviceArray) else 0
                for n in ("q_descale", "k_descale", "v_descale")]
        problem = replace(problem, descales=replace(problem.descales, q_ptr=ptrs[0], k_ptr=ptrs[1], v_ptr=ptrs[2]))
    if problem.mods is not None:  # NumPy sinks and slopes (checked by value) go up too
        sk, al = (None if x is None else up(x) for x in mods[1:])
        problem = replace(problem, mods=replace(problem.mods, sinks_ptr=0 if sk is None else sk.ptr,
                                                alibi_ptr=0 if al is None else al.ptr))
    problem = replace(problem, host=False, out_strides=None)
    res = _device_path.run_varlen(problem, qa, ka, va, None, cq, ck, device, device_id, sref)
    o_dev, lse_dev = res if problem.return_lse else (res, None)
    o = _host_io.to_host(o_dev, stream=sref)
    if out is not None:
        out[...] = o
        o = out
    return (o, _host_io.to_host(lse_dev, stream=sref)) if problem.return_lse else o
