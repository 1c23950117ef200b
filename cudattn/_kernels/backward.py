"""Launch one validated backward problem on device arrays.

Four launches on the call's stream (cu_src/flash_bwd_sm80.cu, or on Hopper cu_src/flash_bwd_sm90.cu,
whose main kernel reads q, k, v and dout through TMA maps encoded here): the prepare pass (D = rowsum(dO * O),
the LSE in log2 units, the float32 dQ accumulator and, deterministic, the turn counters zeroed), the
main kernel over key blocks (dK, dV; dS.K added into the accumulator), the dQ conversion, and with
sinks their gradient. Workspace: O(B * H * S * D), never S x S.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .._arrays import array as _array
from .._arrays import transfer as _transfer
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.geometry import TensorGeom, contiguous_geom
from . import registry as _kernels
from . import plan as _plan
from . import tma as _tma
from .backward_traits import ROW_THREADS, row_lanes, select_for_device
from .params import BwdParams, BwdSm90Params, FwdParams, fill_params, scale_log2

__all__ = ["run_backward"]

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)


def run_backward(problem, bwd, dout, q, k, v, out, lse, dq, dk, dv, device, device_id, sref, cu_q=None, cu_k=None):
    """dq, dk, dv (and dsinks with sinks) as DeviceArrays: those given are written in place, the
    others allocated on the call's stream."""
    vl = problem.varlen
    packed = vl is not None
    Hq, Hkv, D = problem.heads_q, problem.heads_kv, problem.head_dim
    # (shape, seqlen, heads) of dq and of dk and dv, allocated C-contiguous where not given
    if packed:
        like = ((vl.total_q, Hq, D), 0, Hq), ((vl.total_k, Hkv, D), 0, Hkv)
    else:
        B, Sq, Sk = problem.batch, problem.seqlen_q, problem.seqlen_k
        bshd = problem.layout == "bshd"
        like = (((B, Sq, Hq, D) if bshd else (B, Hq, Sq, D)), Sq, Hq), \
            (((B, Sk, Hkv, D) if bshd else (B, Hkv, Sk, D)), Sk, Hkv)
    geoms = [bwd.dq, bwd.dk, bwd.dv]
    grads = []
    for i, (g, (shape, seqlen, heads)) in enumerate(zip((dq, dk, dv), (like[0], like[1], like[1]))):
        if g is None:
            g = _array.empty_on(shape, problem.dtype, device, sref)
            geoms[i] = TensorGeom(0, heads * D, D) if packed else contiguous_geom(seqlen, heads, D, problem.layout)
        grads.append(g)
    sinks = problem.mods is not None and problem.mods.sinks
    dsinks = _array.empty_on((Hq,), _F32, device, sref) if sinks else None
    rows_b, rows_s = (1, vl.total_q) if packed else (problem.batch, problem.seqlen_q)
    total_k = vl.total_k if packed else problem.seqlen_k
    if rows_b * rows_s == 0 or problem.batch == 0 or total_k == 0:
        for g in grads:  # no query rows or no keys: every gradient is 0
            if 0 not in g.shape:
                _transfer.zero_fill(g, stream=sref.handle)
        if dsinks is not None:
            _transfer.zero_fill(dsinks, stream=sref.handle)
        return (*grads, dsinks) if sinks else tuple(grads)

    props = _device.device_properties(device_id)
    kern = select_for_device(problem.dtype, D, problem.causal, props, problem.mods.bits if problem.mods is not None else 0,
                             tma=_plan.tma_can_map(problem, (bwd.dout,)))
    t = kern.tiles
    num_m = -(-problem.seqlen_q // t.block_m)
    num_n = -(-problem.seqlen_k // t.block_n)
    if Hkv > _launch.MAX_GRID_YZ or problem.batch > _launch.MAX_GRID_YZ:
        raise ValueError(f"heads_kv ({Hkv}) and batch ({problem.batch}) must each be at most "
                         f"{_launch.MAX_GRID_YZ} (CUDA grid limit); split the call")
    accum = _array.empty_on((rows_b * rows_s, Hq, kern.tile_dim), _F32, device, sref)
    dsum = _array.empty_on(tuple(lse.shape), _F32, device, sref)
    lse2 = _array.empty_on(tuple(lse.shape), _F32, device, sref)
    sems = _array.empty_on((problem.batch * Hq * num_m,), _I32, device, sref) if bwd.deterministic else None

    P = BwdParams()
    P.f = _fwd(problem, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, num_m, cu_q, cu_k)
    P.dout, P.dq, P.dk, P.dv = dout.ptr, grads[0].ptr, grads[1].ptr, grads[2].ptr
    P.dq_accum, P.dsum, P.lse2 = accum.ptr, dsum.ptr, lse2.ptr
    P.dsinks = 0 if dsinks is None else dsinks.ptr
    P.semaphores = 0 if sems is None else sems.ptr
    P.do_stride_b, P.do_stride_s, P.do_stride_h = bwd.dout.batch, bwd.dout.seq, bwd.dout.head
    for name, g in zip(("dq", "dk", "dv"), geoms):
        setattr(P, f"{name}_stride_b", g.batch)
        setattr(P, f"{name}_stride_s", g.seq)
        setattr(P, f"{name}_stride_h", g.head)
    P.rows_b, P.rows_s = rows_b, rows_s
    P.tile_dim = kern.tile_dim
    P.num_n_blocks = num_n
    P.scale = problem.scale
    P.deterministic = int(bwd.deterministic)

    arch = props.arch
    rows_per_block = ROW_THREADS // 32 * (32 // row_lanes(kern.tile_dim))
    row_grid = (-(-rows_s // rows_per_block), Hq, rows_b)
    main = _sm90_params(problem, bwd, P, kern, q.ptr, k.ptr, v.ptr, dout.ptr) if kern.family == "sm90" else P
    h = sref.handle
    for entry, grid, block, smem, args in (
            ("flash_bwd_prepare", row_grid, ROW_THREADS, 0, P),
            (kern.main, (num_n, Hkv, problem.batch), kern.threads, kern.smem_bytes, main),
            ("flash_bwd_finish_dq", row_grid, ROW_THREADS, 0, P),
            *((("flash_bwd_dsinks", (Hq, 1, 1), 256, 0, P),) if sinks else ())):
        kernel = _kernels.get_kernel(kern.entry_point(entry), device, device_id, arch)
        _launch.launch(kernel, grid, (block, 1, 1), smem, h, args)
    del accum, dsum, lse2, sems  # freed stream-ordered, after the launches
    return (*grads, dsinks) if sinks else tuple(grads)


def _sm90_params(problem, bwd, P: BwdParams, kern, q: int, k: int, v: int, dout: int) -> BwdSm90Params:
    """The Hopper kernel's argument: BwdParams behind the TMA maps of q, k, v and dout (4-D over
    head dim, seq, head, batch; a packed operand is one batch entry of all its rows), boxes of 64
    columns by the kernel's query or key block, and of the dQ accumulator it adds into."""
    S = BwdSm90Params()
    S.p = P
    t, D, dt = kern.tiles, problem.head_dim, problem.dtype
    (Sq, Bq), (Sk, Bk) = _plan.map_extents(problem)
    for field, ptr, seqlen, heads, batch, geom, rows in (
            ("tma_q", q, Sq, problem.heads_q, Bq, problem.q_strides, t.block_m),
            ("tma_k", k, Sk, problem.heads_kv, Bk, problem.k_strides, t.block_n),
            ("tma_v", v, Sk, problem.heads_kv, Bk, problem.v_strides, t.block_n),
            ("tma_do", dout, Sq, problem.heads_q, Bq, bwd.dout, t.block_m)):
        raw = _tma.encode_attention_operand(ptr, dt, D, seqlen, heads, batch, geom, rows)
        ctypes.memmove(ctypes.addressof(getattr(S, field)), raw, len(raw))
    raw = _tma.encode_dq_accum(P.dq_accum, kern.tile_dim, problem.heads_q, P.rows_s, P.rows_b, t.block_m)
    ctypes.memmove(ctypes.addressof(S.tma_dq), raw, len(raw))
    return S


def _fwd(problem, q, k, v, o, lse, num_m, cu_q, cu_k) -> FwdParams:
    """The forward's description of the call, as the backward kernels read it (mask.cuh, seqlen.cuh)."""
    vl = problem.varlen
    qs, ks, vs, os_ = problem.q_strides, problem.k_strides, problem.v_strides, problem.out_strides
    packed = vl is not None
    f = FwdParams(
        q, k, v, o, lse,
        qs.batch, qs.seq, qs.head, ks.batch, ks.seq, ks.head, vs.batch, vs.seq, vs.head,
        os_.batch, os_.seq, os_.head,
        problem.batch, vl.total_q if packed else problem.seqlen_q, vl.total_k if packed else problem.seqlen_k,
        problem.heads_q, problem.heads_kv, problem.group_size, problem.head_dim,
        0 if packed else problem.seqlen_k - problem.seqlen_q,
        scale_log2(problem.scale), num_m, 1, 0,
        0, 0, 0, 1.0,
    )
    if packed:
        f.cu_seqlens_q, f.cu_seqlens_k = cu_q.ptr, cu_k.ptr
    if problem.window is not None:
        f.has_window = 1
        f.window_left, f.window_right = problem.window
    if problem.mods is not None:
        fill_params(f, problem.mods, problem.scale)
    return f
