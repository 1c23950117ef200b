"""The NumPy path of `cudattn.attention_with_kvcache`: the caches appended to in place on the host,
then uploaded, run on the device and copied back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._arrays import host_io as _host_io
from .._kernels import kvcache as _kv_launches
from .._runtime import device as _device
from .._runtime import stream as _stream
from .._spec.geometry import TensorGeom, contiguous_geom
from .._spec.kvcache import validate_kvcache
from .._spec.problem import KvCache
from .quantize import saturate_to_e4m3
from .._runtime.device import restores_caller_context

@restores_caller_context
def attention_with_kvcache_host(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale, return_lse, num_splits,
              stream, packed=None, mods=(None, None, None, None), descales=(None, None, None), device=None):
    cu_q, max_q = packed if packed else (None, None)
    problem, _ = validate_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale,
                                  return_lse, num_splits, host=True, cu_seqlens_q=cu_q, max_seqlen_q=max_q,
                                  mods=mods, descales=descales)
    kv = problem.kv_cache
    device = _device.get_device(device)
    device_id = _device.device_properties(device).device_id
    _kv_launches.check_fp8_arch(kv, device_id)  # before the NumPy caches are changed
    if k_new is not None:  # the NumPy caches are updated in place, here, before they go up
        _append_host(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, kv, descales[1:])
    sref = _stream.as_stream(stream, device)
    up = lambda x: None if x is None else _host_io.to_device(np.ascontiguousarray(x), device=device, stream=sref)  # noqa: E731
    qa, ka, va, sl, bt, cq = (up(x) for x in (q, k_cache, v_cache, cache_seqlens, block_table, cu_q))
    q_geom = _dense(qa) if cq is None else TensorGeom(0, q.shape[1] * q.shape[2], q.shape[2])
    problem = replace(problem, host=False, q_strides=q_geom, k_strides=_dense(ka), v_strides=_dense(va))
    if problem.mods is not None:  # NumPy sinks and slopes (checked by value) go up too
        sk, al = (up(x) for x in mods[2:])
        problem = replace(problem, mods=replace(problem.mods, sinks_ptr=0 if sk is None else sk.ptr,
                                                alibi_ptr=0 if al is None else al.ptr))
    if kv.fp8:  # and the NumPy descale arrays
        dq, dk, dv = (up(np.asarray(x, np.float32)) if isinstance(x, np.ndarray) else None for x in descales)
        problem = replace(problem, kv_cache=replace(kv, k_descale_ptr=0 if dk is None else dk.ptr,
                                                    v_descale_ptr=0 if dv is None else dv.ptr,
                                                    q_descale_ptr=0 if dq is None else dq.ptr))
    res = _kv_launches.run_kvcache(problem, qa, ka, va, None, None, sl, bt, None, device, device_id, sref, None, cq,
               _kv_launches.rows_used(problem, cache_seqlens))
    o_dev, lse_dev = res if return_lse else (res, None)
    out = _host_io.to_host(o_dev, stream=sref)
    return (out, _host_io.to_host(lse_dev, stream=sref)) if return_lse else out


def _dense(a) -> TensorGeom:
    _, s, h, d = a.shape
    return contiguous_geom(s, h, d, "bshd")


def _append_host(k_cache, v_cache, k_new, v_new, seqlens, table, kv: KvCache, descales=(None, None)) -> None:
    if kv.fp8:  # quantized as the append kernel does, by float32 descales (scalar times array entry)
        def rows(x, scalar, arr):
            return np.stack([_quantize_host(x[b], np.float32(scalar) * (
                arr[b].astype(np.float32) if isinstance(arr, np.ndarray) else np.float32(1))) for b in range(len(x))])
        k_new, v_new = rows(k_new, kv.k_scale, descales[0]), rows(v_new, kv.v_scale, descales[1])
    for b in range(k_new.shape[0]):
        pos = int(seqlens[b]) + np.arange(k_new.shape[1])
        if kv.paged:
            pages, rows = table[b, pos // kv.page_size], pos % kv.page_size
            k_cache[pages, rows] = k_new[b]
            v_cache[pages, rows] = v_new[b]
        else:
            k_cache[b, pos] = k_new[b]
            v_cache[b, pos] = v_new[b]


def _quantize_host(x: np.ndarray, descale) -> np.ndarray:
    """16-bit rows (S, H, D) -> e4m3 as the append kernel does: x / descale in float32, rounded to
    nearest even and saturated at +-448 (NaN stays NaN). ``descale``: a float or (H,) float32."""
    d = np.asarray(descale, np.float32).reshape(-1)[None, :, None] if np.ndim(descale) else np.float32(descale)
    return saturate_to_e4m3(x.astype(np.float32) / d)
