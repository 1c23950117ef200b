"""The launches of a KV-cache call: the append of new keys, the gather of a paged or FP8 cache into
contiguous 16-bit buffers where the prefill kernels need one, then the attention itself."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._arrays.array import empty_on
from .._runtime import device as _device
from .._runtime import launch as _launch
from .._spec.dtypes import BFLOAT16
from .._spec.geometry import contiguous_geom
from .._spec.problem import KvCache, Problem
from . import attention as _device_path
from . import decode as _decode
from . import decode_traits as _decode_traits
from . import plan as _plan
from . import registry as _kernels
from . import traits as _traits
from .params import AppendParams, KvCacheGeom
from .quantize import e4m3_to_16bit

def rows_used(problem: Problem, seqlens) -> int | None:
    """Keys a sequence uses at most, when NumPy lengths tell (sizes a gathered copy); else None."""
    if not isinstance(seqlens, np.ndarray) or seqlens.size == 0:
        return None
    return int(seqlens.max()) + problem.kv_cache.seqlen_add


def run_kvcache(problem, qa, ka, va, kn, vn, sl, bt, new_geoms, device, device_id, sref, oa=None, cq=None, rows=None):
    kv = problem.kv_cache
    check_fp8_arch(kv, device_id)  # before the append writes into the cache
    kv = replace(kv, seqlens_ptr=0 if sl is None else sl.ptr, block_table_ptr=0 if bt is None else bt.ptr)
    if kn is not None:
        _append(problem, kv, ka, va, kn, vn, new_geoms, device, device_id, sref)
    problem = replace(problem, kv_cache=kv)
    if kv.q_fp8:  # the kernels read a 16-bit q: an exact bfloat16 copy, held until they are done
        qa = e4m3_to_16bit(qa if problem.varlen is None else qa[None], BFLOAT16, sref)
        qa = qa if problem.varlen is None else qa[0]
        q_geom = contiguous_geom(problem.seqlen_q, problem.heads_q, problem.head_dim, "bshd")
        problem = replace(problem, q_strides=q_geom if problem.varlen is None else replace(q_geom, batch=0))
    if (kv.paged or kv.fp8) and _gathers(problem, device_id):
        problem, ka, va = _gather(problem, ka, va, device, device_id, sref, rows)
    if problem.varlen is not None:  # a packed q: the prefill kernels, whatever its length
        return _device_path.run_varlen(problem, qa, ka, va, oa, cq, None, device, device_id, sref)
    return _device_path.run_device(problem, qa, ka, va, oa, device, device_id, sref)  # drops a gathered copy stream-ordered


def check_fp8_arch(kv: KvCache, device_id: int) -> None:
    """FP8 caches need sm_89+ (the e4m3 conversions); refused before anything is written."""
    if kv.fp8:
        arch = _device.device_properties(device_id).arch
        if arch not in _traits.FP8_ARCHS:
            raise NotImplementedError(f"FP8 KV caches need an sm_89 or newer GPU (e4m3 conversions); this one is {arch}")


def _gathers(problem: Problem, device_id: int) -> bool:
    """Whether a paged cache is first copied into contiguous buffers (kv_cache_gather.cu): for the
    prefill kernels (chunked prefill), unless the Hopper kernel reads it in place, which it does
    fast only when a page holds a whole key tile (a TMA box per page: page 16 ran at 0.36x and
    page 64 at 0.79x of a dense prefill, page >= 128 at 0.94x, H200). The portable kernel reads
    contiguous caches only. An FP8 cache is always copied (dequantized) for them: the prefill
    kernels read 16-bit keys."""
    if problem.varlen is None and _decode.takes_split_kv(problem) or problem.varlen and not problem.varlen.total_q:
        return False
    if problem.kv_cache.fp8:
        return True
    plan = _plan.make_plan(problem, _device.device_properties(device_id))
    return plan.variant.family != "sm90" or _plan.paged_box_rows(problem, plan.variant.tiles.block_n) < \
        plan.variant.tiles.block_n


def _gather(problem: Problem, ka, va, device, device_id, sref, rows: int | None = None):
    """``(problem, k, v)`` with the cache's used rows copied into new contiguous (B, rows, Hkv, D)
    buffers, described as a contiguous cache of the same lengths (an FP8 cache dequantized into
    q's dtype). ``rows``: the most keys a sequence uses, when NumPy lengths say (else the
    capacity: device lengths are not read)."""
    kv = problem.kv_cache
    B, H, D = problem.batch, problem.heads_kv, problem.head_dim
    cap = kv.capacity if rows is None else max(1, min(kv.capacity, rows))
    wk, wv = (empty_on((B, cap, H, D), problem.dtype, device, sref) for _ in range(2))
    dense = contiguous_geom(cap, H, D, "bshd")
    ks, vs = problem.k_strides, problem.v_strides
    geom = _decode.kv_geom(problem)  # the grown lengths: seqlens + the keys just appended
    p = AppendParams(wk.ptr, wv.ptr, ka.ptr, va.ptr, dense.batch, dense.seq, dense.head, dense.batch, dense.seq,
                     dense.head, ks.batch, ks.seq, ks.head, vs.batch, vs.seq, vs.head, geom, B, cap, H, D,
                     kv.k_descale_ptr, kv.v_descale_ptr, kv.k_scale * kv.q_scale, kv.v_scale, kv.q_descale_ptr)
    props = _device.device_properties(device_id)
    spec = _decode_traits.gather_fp8_kernel(problem.dtype.name) if kv.fp8 else _decode_traits.GATHER_KERNEL
    kernel = _kernels.get_kernel(spec, device, device_id, props.arch)
    threads = spec.threads
    _launch.launch(kernel, (-(-(B * cap * H * (D // 8)) // threads), 1, 1), (threads, 1, 1), 0, sref.handle, p)
    flat = replace(kv, paged=False, page_size=cap, max_pages=1, num_pages=B, block_table_ptr=0, fp8=False)
    return replace(problem, seqlen_k=cap, kv_cache=flat, k_strides=dense, v_strides=dense), wk, wv


def _append(problem: Problem, kv: KvCache, ka, va, kn, vn, new_geoms, device, device_id, sref) -> None:
    props = _device.device_properties(device_id)
    spec = _decode_traits.append_fp8_kernel(np.dtype(kn.dtype).name) if kv.fp8 else _decode_traits.APPEND_KERNEL
    kernel = _kernels.get_kernel(spec, device, device_id, props.arch)
    kg, vg = new_geoms
    ks, vs = problem.k_strides, problem.v_strides
    geom = KvCacheGeom(kv.block_table_ptr, kv.seqlens_ptr, kv.page_size, kv.max_pages, kv.num_pages, kv.capacity,
                       0, 0)
    B, s_new, H = problem.batch, kv.seqlen_add, problem.heads_kv
    p = AppendParams(kn.ptr, vn.ptr, ka.ptr, va.ptr, kg.batch, kg.seq, kg.head, vg.batch, vg.seq, vg.head,
                     ks.batch, ks.seq, ks.head, vs.batch, vs.seq, vs.head, geom, B, s_new, H, problem.head_dim,
                     kv.k_descale_ptr, kv.v_descale_ptr, kv.k_scale, kv.v_scale)
    rows = B * s_new * H
    _launch.launch(kernel, (-(-rows // 4), 1, 1), (128, 1, 1), 0, sref.handle, p)
