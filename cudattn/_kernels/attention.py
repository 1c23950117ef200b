"""Launch one validated attention problem on device arrays: the split-KV decode path or the prefill kernels.

Every device path ends here (padded, packed and KV-cache calls, from the call object or the NumPy
path): the problem is already checked, so what is left is the output's allocation, the choice of
path and the launch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._arrays import array as _array
from .._arrays import stream_memory as _stream_memory
from .._arrays import transfer as _transfer
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.geometry import TensorGeom
from . import decode as _decode
from . import fp8 as _fp8
from . import plan as _plan
from . import registry as _kernels

__all__ = ["run_device"]

_F32 = np.dtype(np.float32)


def run_device(problem, qa, ka, va, oa, device, device_id, sref):
    """Launch one validated problem on device arrays; returns out (and lse) as DeviceArrays.

    Decode shapes (at most ``_kernels.decode.DECODE_MAX_SQ`` query tokens) or an explicit ``num_splits``
    take the split-KV path; everything else (KV caches included: chunked prefill) the prefill
    kernels."""
    sinks = problem.mods is not None and problem.mods.sinks
    if problem.batch == 0 or problem.seqlen_q == 0 or problem.seqlen_k == 0 and not sinks:
        return _run_empty(problem, oa, device, sref)  # (no keys but sinks: the kernels write LSE = sink)
    props = _device.device_properties(device_id)
    decode = _decode.takes_split_kv(problem)
    if not decode:
        plan = _plan.make_plan(problem, props)
        kernel = _kernels.get_kernel(plan.variant, device, device_id, props.arch)
    if oa is None:
        oa = _array.empty_on(_out_shape(problem), problem.out_dtype, device, sref)
        o_geom = _plan.contiguous_geom(problem)
    else:
        o_geom = problem.out_strides
    lse = None
    if problem.return_lse:
        lse = _array.empty_on((problem.batch, problem.heads_q, problem.seqlen_q), _F32, device, sref)
    lse_ptr = 0 if lse is None else lse.ptr
    if decode:
        _decode.run(problem, qa.ptr, ka.ptr, va.ptr, oa.ptr, lse_ptr, o_geom, props, device, sref)
    else:
        # FP8: V goes in as Vt (keys contiguous), made on the same stream; dropping it after the
        # launch frees it stream-ordered, once the kernel is done with it.
        # (no keys, a call with sinks: nothing to transpose, and the kernel reads no V)
        fp8_v = problem.descales is not None and problem.seqlen_k > 0
        vt = _fp8.transpose_v(problem, va.ptr, props, device, sref) if fp8_v else None
        params = _plan.make_params(problem, plan, qa.ptr, ka.ptr, va.ptr if vt is None else vt.ptr, oa.ptr, lse_ptr,
                                   o_geom)
        _launch_prefill(plan, kernel, params, props, sref)
        del vt
    return (oa, lse) if problem.return_lse else oa


def _launch_prefill(plan, kernel, params, props, sref) -> None:
    """Queue the prefill kernel. A Hopper call whose tiles differ in length (`plan.dynamic_order`)
    takes them in the dynamic order (sm90/tile_scheduler.cuh): from two of the stream's zeroed
    counters, which it leaves zeroed (none while the stream captures a graph: the fixed rounds)."""
    counters = None
    if plan.dynamic_order:
        counters = _stream_memory.counters(props.device_id, sref.handle, 2, sref.obj, optional=True)
        params.tile_counter = counters.ptr
    _launch.launch(kernel, plan.grid, plan.block, plan.smem, sref.handle, params)
    del counters  # held until the launch is queued


def _run_empty(problem, oa, device, sref):
    """No kernel: an empty result, or (no keys) every row gets O = 0 and LSE -inf, as a row that
    sees no key does in the kernels."""
    if oa is None:
        oa = _array.empty_on(_out_shape(problem), problem.out_dtype, device, sref)
    lse = None
    if problem.return_lse:
        lse = _array.empty_on((problem.batch, problem.heads_q, problem.seqlen_q), _F32, device, sref)
        _transfer.memset(lse, _NEG_INF_F32_BITS, stream=sref.handle)
    _transfer.zero_fill(oa, stream=sref.handle)
    return (oa, lse) if problem.return_lse else oa

_NEG_INF_F32_BITS = 0xFF800000


def _out_shape(problem) -> tuple[int, int, int, int]:
    if problem.layout == "bshd":
        return (problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim)
    return (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)


def run_varlen(problem, qa, ka, va, oa, cu_q, cu_k, device, device_id, sref):
    """Launch one validated packed problem on device arrays; returns out (and lse) as DeviceArrays:
    out ``(total_q, Hq, D)``, lse ``(Hq, total_q)``. ``cu_k`` None: k/v are a KV cache (its
    lengths in ``problem.kv_cache``)."""
    vl = replace(problem.varlen, cu_q_ptr=cu_q.ptr, cu_k_ptr=0 if cu_k is None else cu_k.ptr)
    problem = replace(problem, varlen=vl)
    Hq, D = problem.heads_q, problem.head_dim
    if oa is None:
        oa = _array.empty_on((vl.total_q, Hq, D), problem.out_dtype, device, sref)
        o_geom = TensorGeom(0, Hq * D, D)
    else:
        o_geom = problem.out_strides
    lse = _array.empty_on((Hq, vl.total_q), _F32, device, sref) if problem.return_lse else None
    if vl.total_q == 0:
        pass  # nothing to compute
    elif problem.batch == 0 or vl.total_k == 0 and not (problem.mods and problem.mods.sinks):
        # no key (or no sequence; sinks: the kernels write LSE = sink): O = 0, LSE = -inf, as a
        _transfer.zero_fill(oa[None], stream=sref.handle)  # row that sees no key gets in the kernels
        if lse is not None:
            _transfer.memset(lse, _NEG_INF_F32_BITS, stream=sref.handle)
    else:
        props = _device.device_properties(device_id)
        plan = _plan.make_plan(problem, props)
        kernel = _kernels.get_kernel(plan.variant, device, device_id, props.arch)
        fp8_v = problem.descales is not None and vl.total_k > 0  # no keys (sinks): no V to transpose
        vt = _fp8.transpose_v(problem, va.ptr, props, device, sref) if fp8_v else None
        params = _plan.make_params(problem, plan, qa.ptr, ka.ptr, va.ptr if vt is None else vt.ptr, oa.ptr,
                                   0 if lse is None else lse.ptr, o_geom)
        _launch_prefill(plan, kernel, params, props, sref)
        del vt
    return (oa, lse) if problem.return_lse else oa
