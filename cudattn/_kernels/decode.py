"""The split-KV (flash-decoding) path: which calls take it, the plan memoised, and the launch.

Few query tokens against a long KV sequence: the work is reading K and V once, so the grid must
fill the GPU even when batch x kv heads is small. Each kv head's query heads are packed into one
block's rows (GQA packing: every K/V byte is read once per kv head), the keys are cut into
``num_splits`` ranges of whole tiles, one block per (packed row block, split, kv head, batch),
and with more than one split the last block of each packed row block to finish merges the
normalised partial outputs by their LSEs (arrival counters, `_arrays.stream_memory`): one launch. Data flow:
plan (variant, splits, grid: `_kernels.decode_plan`) -> flash_decode. `cudattn.merge_attention_states`
(`_ops.merge`) merges parts given by the caller with the same math.
"""

from __future__ import annotations

import numpy as np
from .._arrays import array as _array
from . import decode_plan as _decode_plan
from . import registry as _kernels
from .._runtime import launch as _launch
from .._arrays import stream_memory as _stream_memory
from .params import fill_params
from .params import DecodeParams, KvCacheGeom, scale_log2
from .._spec.problem import Problem
from .._spec.geometry import TensorGeom

_F32 = np.dtype(np.float32)

#: Up to this many query tokens a call is decode and takes the split-KV kernel.
DECODE_MAX_SQ = 16


def takes_split_kv(problem: Problem) -> bool:
    if problem.descales is not None:  # FP8: the prefill kernels serve every shape (no FP8 decode kernel yet)
        return False
    # Longer queries against a KV cache (chunked prefill) take the prefill kernels, which read the
    # cache in place (seqlen.cuh) and fill the GPU with query tiles.
    return problem.num_splits is not None or problem.seqlen_q <= DECODE_MAX_SQ


_plans: dict = {}


def make_plan(problem: Problem, props, device) -> tuple[_decode_plan.DecodePlan, object]:
    """(plan, loaded kernel) for this problem (memoised per shape)."""
    kv = problem.kv_cache
    capacity = problem.seqlen_k
    key = (problem.dtype, problem.head_dim, problem.seqlen_q, problem.heads_q, problem.heads_kv, problem.batch,
           capacity, problem.num_splits, kv is not None and kv.paged, props.device_id, props.max_shared_memory_per_block_optin,
           problem.window, problem.mods.bits if problem.mods is not None else 0, kv is not None and kv.fp8)
    hit = _plans.get(key)
    if hit is not None:
        return hit
    plan = _decode_plan.choose_plan(problem, props)
    kernel = _kernels.get_kernel(plan.variant, device, props.device_id, props.arch)
    if len(_plans) > 4096:
        _plans.clear()
    _plans[key] = (plan, kernel)
    return plan, kernel


def kv_geom(problem: Problem) -> KvCacheGeom:
    kv = problem.kv_cache
    if kv is None:  # plain k/v: one "page" per sequence, every sequence full
        return KvCacheGeom(0, 0, problem.seqlen_k, 1, problem.batch, problem.seqlen_k, 0, 0)
    return KvCacheGeom(kv.block_table_ptr, kv.seqlens_ptr, kv.page_size, kv.max_pages, kv.num_pages, kv.capacity,
                       kv.seqlen_add, 0)


def run(problem: Problem, q: int, k: int, v: int, o: int, lse: int, o_geom: TensorGeom, props, device, sref):
    """Queue the decode kernel (and the combine) for one validated problem on stream `sref`."""
    plan, kernel = make_plan(problem, props, device)
    B, Sq, Hq, D = problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim
    splits = plan.num_splits
    o_part = lse_part = counters = None
    if splits > 1:
        o_part = _array.empty_on((splits, B, Hq, Sq, D), _F32, device, sref)
        lse_part = _array.empty_on((splits, B, Hq, Sq), _F32, device, sref)
        counters = _stream_memory.counters(props.device_id, sref.handle, plan.num_m_blocks * problem.heads_kv * B, sref.obj)
    qs, ks, vs = problem.q_strides, problem.k_strides, problem.v_strides
    scale = problem.scale
    params = DecodeParams(
        q, k, v, o, lse,
        0 if o_part is None else o_part.ptr, 0 if lse_part is None else lse_part.ptr,
        0 if counters is None else counters.ptr,
        qs.batch, qs.seq, qs.head,
        ks.batch, ks.seq, ks.head,
        vs.batch, vs.seq, vs.head,
        o_geom.batch, o_geom.seq, o_geom.head,
        kv_geom(problem),
        B, Sq, Hq, problem.heads_kv, problem.group_size, D, plan.rows, plan.num_m_blocks,
        splits, plan.tiles_per_split, int(problem.causal),
        scale_log2(scale),
        int(lse != 0), 0,
    )
    params.window_left, params.window_right = problem.window or (-1, -1)
    kv = problem.kv_cache
    if kv is not None and kv.fp8:
        params.k_scale, params.v_scale = kv.k_scale * kv.q_scale, kv.v_scale  # q's scales the scores with k's
        params.k_descale, params.v_descale, params.q_descale = kv.k_descale_ptr, kv.v_descale_ptr, kv.q_descale_ptr
    params.has_window = int(problem.window is not None)
    params.merge_ctas = plan.merge_ctas
    if problem.mods is not None:
        fill_params(params, problem.mods, scale)
    _launch.launch(kernel, plan.grid, plan.block, plan.smem, sref.handle, params)
    del counters  # held until the launch is queued (`_arrays.stream_memory`)
