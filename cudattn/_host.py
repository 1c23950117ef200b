"""The NumPy path: copy in, run on the device, copy back, synchronously.

It is transfer-bound (PCIe moves bytes far slower than the kernel eats them); copies go through
pinned staging buffers inside `to_device` / `to_host`.
"""

from __future__ import annotations

import numpy as np

from . import _array, _device, _stream
from ._validate import validate


def attention_host(q, k, v, *, causal, scale, layout, return_lse, q_descale, k_descale, v_descale, out_dtype,
                   num_splits, out, stream):
    kw = dict(causal=causal, scale=scale, layout=layout, return_lse=return_lse, q_descale=q_descale,
              k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, num_splits=num_splits)
    # The data is copied to the device anyway, so any NumPy strides and alignment are fine: make
    # the copies' source contiguous here (a no-op for contiguous input) rather than refusing views.
    if type(q) is not np.ndarray or type(k) is not np.ndarray or type(v) is not np.ndarray:
        validate(q, k, v, **kw, out=out, host=True)  # subclasses (masked arrays): refused by their own rule
    q, k, v = np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v)
    validate(q, k, v, **kw, out=out, host=True)  # every argument error before any GPU work
    from ._api import run_device

    device = _device.get_device(None)
    device_id = _device.device_properties(device).device_id
    sref = _stream.as_stream(stream, device)
    qd = _array.to_device(q, device=device, stream=sref)
    kd = _array.to_device(k, device=device, stream=sref)
    vd = _array.to_device(v, device=device, stream=sref)
    problem = validate(qd, kd, vd, **kw, out=None, host=False)
    res = run_device(problem, qd, kd, vd, None, device, device_id, sref)
    o_dev, lse_dev = res if return_lse else (res, None)
    o = _array.to_host(o_dev, stream=sref)
    if out is not None:
        out[...] = o
        o = out
    if return_lse:
        return o, _array.to_host(lse_dev, stream=sref)
    return o
