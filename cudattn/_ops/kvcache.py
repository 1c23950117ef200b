"""`cudattn.attention_with_kvcache`: decode against a KV cache, contiguous or paged, with
per-sequence lengths and an optional append of new keys/values.

Flow: adapt operands -> validate (shapes, dtypes, strides; the table/length VALUES when they are
NumPy arrays) -> [append k_new/v_new into the cache] -> the split-KV decode kernel (`_decode`).

What is checked where. Shapes, dtypes, strides and alignment are always checked before any GPU
work. The values of ``cache_seqlens`` and ``block_table`` are checked when they are NumPy
arrays (on either path): lengths in ``[0, capacity - S_new]``, page ids of every page a
sequence uses in ``[0, num_pages)``, and no cache slot appended to by two sequences. When they
are device arrays their values are the caller's duty (reading them would stall the stream);
the kernels clamp lengths into ``[0, capacity]`` and page ids into ``[0, num_pages)``, so a bad
value gives a wrong result for that sequence but never a read or write outside the cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, overload

import numpy as np

from .._kernels import attention as _device_path
from .._calls import call as _callpath
from .._kernels import decode as _decode
from .._kernels import decode_traits as _decode_traits
from .._runtime import device as _device
from .._arrays import importer as _importer
from .._kernels import registry as _kernels
from .._runtime import launch as _launch
from .._kernels import plan as _plan
from .._runtime import stream as _stream
from .._kernels import traits as _traits
from .._arrays import host_io as _host_io
from .._arrays.array import empty_on
from .._calls import args as _args
from .._spec.modifiers import kernel_mods, window_of
from .._spec.dtypes import BFLOAT16, FLOAT16, FLOAT8_E4M3, RECOGNIZED, dtype_name, input_dtype_error
from .._spec.geometry import contiguous_geom, share_bytes, span
from .._arrays.importer import OTHER, kind_of
from .._kernels.params import AppendParams, KvCacheGeom
from .._kernels.quantize import e4m3_to_16bit
from .._numpy.quantize import saturate_to_e4m3
from .._spec.descales import parse_descales
from .._spec.problem import KvCache, Problem, Varlen
from .._spec.geometry import TensorGeom
from .._arrays.types import ArrayLike, ArrayResult, DescaleLike, StreamLike
from .._spec.varlen import check_cu_seqlens, check_device_offsets, check_max_seqlen
from .._spec.validate import _check_bool, _check_out, _check_scale, _describe, check_num_splits, tensor_geom

_I32 = np.dtype(np.int32)
_PAGE_MULTIPLE = 16


# The overloads only tell type checkers that return_lse=True gives a pair; the last def runs.
@overload
def attention_with_kvcache(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, *,
                           cache_seqlens: ArrayLike | None = ..., block_table: ArrayLike | None = ...,
                           k_new: ArrayLike | None = ..., v_new: ArrayLike | None = ...,
                           cu_seqlens_q: ArrayLike | None = ..., max_seqlen_q: int | None = ..., causal: bool = ...,
                           scale: float | None = ..., return_lse: Literal[False] = ..., num_splits: int | None = ...,
                           out: ArrayLike | None = ..., stream: StreamLike = ...,
                           window_size: tuple[int, int] | None = ..., softcap: float | None = ...,
                           sinks: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
                           q_descale: DescaleLike = ..., k_descale: DescaleLike = ...,
                           v_descale: DescaleLike = ...) -> ArrayResult: ...


@overload
def attention_with_kvcache(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, *,
                           cache_seqlens: ArrayLike | None = ..., block_table: ArrayLike | None = ...,
                           k_new: ArrayLike | None = ..., v_new: ArrayLike | None = ...,
                           cu_seqlens_q: ArrayLike | None = ..., max_seqlen_q: int | None = ..., causal: bool = ...,
                           scale: float | None = ..., return_lse: Literal[True], num_splits: int | None = ...,
                           out: ArrayLike | None = ..., stream: StreamLike = ...,
                           window_size: tuple[int, int] | None = ..., softcap: float | None = ...,
                           sinks: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
                           q_descale: DescaleLike = ..., k_descale: DescaleLike = ...,
                           v_descale: DescaleLike = ...) -> tuple[ArrayResult, ArrayResult]: ...


@overload
def attention_with_kvcache(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, *,
                           cache_seqlens: ArrayLike | None = ..., block_table: ArrayLike | None = ...,
                           k_new: ArrayLike | None = ..., v_new: ArrayLike | None = ...,
                           cu_seqlens_q: ArrayLike | None = ..., max_seqlen_q: int | None = ..., causal: bool = ...,
                           scale: float | None = ..., return_lse: bool, num_splits: int | None = ...,
                           out: ArrayLike | None = ..., stream: StreamLike = ...,
                           window_size: tuple[int, int] | None = ..., softcap: float | None = ...,
                           sinks: ArrayLike | None = ..., alibi_slopes: ArrayLike | None = ...,
                           q_descale: DescaleLike = ..., k_descale: DescaleLike = ...,
                           v_descale: DescaleLike = ...) -> ArrayResult | tuple[ArrayResult, ArrayResult]: ...


def attention_with_kvcache(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, *,
                           cache_seqlens: ArrayLike | None = None, block_table: ArrayLike | None = None,
                           k_new: ArrayLike | None = None, v_new: ArrayLike | None = None,
                           cu_seqlens_q: ArrayLike | None = None, max_seqlen_q: int | None = None, causal: bool = False,
                           scale: float | None = None, return_lse: bool = False, num_splits: int | None = None,
                           out: ArrayLike | None = None, stream: StreamLike = None,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: ArrayLike | None = None, alibi_slopes: ArrayLike | None = None,
                           q_descale: DescaleLike = None, k_descale: DescaleLike = None,
                           v_descale: DescaleLike = None) -> ArrayResult | tuple[ArrayResult, ArrayResult]:
    """Attention of a few query tokens against a KV cache (FlashAttention's ``flash_attn_with_kvcache``).

    - ``q``: ``(B, Sq, Hq, D)`` (layout "bshd"; decode is Sq = 1..16, any Sq works).
    - ``k_cache``, ``v_cache``: contiguous ``(B, capacity, Hkv, D)``, or paged
      ``(num_pages, page_size, Hkv, D)`` with ``block_table``: int32 ``(B, max_pages)``, sequence
      ``b``'s key ``j`` being row ``j % page_size`` of page ``block_table[b, j // page_size]``;
      ``page_size`` a multiple of 16. Capacity per sequence: ``max_pages * page_size`` when paged.
    - ``cache_seqlens``: int32 ``(B,)``, the valid keys of each sequence (0 allowed); None: every
      sequence fills the cache.
    - ``k_new``, ``v_new``: ``(B, S_new, Hkv, D)``, written into the cache IN PLACE at positions
      ``cache_seqlens[b] .. cache_seqlens[b] + S_new - 1`` before attending, which then covers
      ``cache_seqlens[b] + S_new`` keys (``cache_seqlens`` itself is not changed; it is required).
    - ``causal``: bottom right per sequence: query ``i`` sees key ``j`` iff ``j <= i + L_b - Sq``.
    - ``num_splits``, ``scale``, ``return_lse``, ``out``, ``stream``: as in `cudattn.attention`
      (``out``: device calls only, q's shape and dtype; required while ``stream`` captures a CUDA graph).
    - ``cu_seqlens_q``, ``max_seqlen_q``: a packed ``q`` of ``(total_q, Hq, D)``, sequence ``b``'s
      queries at rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1`` (int32 ``(B + 1,)``, as in
      `cudattn.attention`); the output is then ``(total_q, Hq, D)`` and the LSE ``(Hq, total_q)``.
      The chunk's keys must already be in the cache (no ``k_new``); ``num_splits`` does not apply.
    - ``window_size``, ``softcap``, ``sinks``, ``alibi_slopes``: as in `cudattn.attention`, with
      ``Sk`` the sequence's cached keys (appended ones included): query ``i``'s diagonal key is
      ``i + L_b - Sq``. The split-KV decode kernel skips the key tiles outside every row's window,
      and counts a sink once, when it merges the splits.
    - FP8 caches: ``k_cache`` and ``v_cache`` typed ``ml_dtypes.float8_e4m3fn`` (half the bytes of
      a 16-bit cache), with ``k_descale`` and ``v_descale`` (None: 1.0, a float, or float32
      ``(B, Hkv)`` arrays, as `cudattn.attention`'s): the cache holds ``x / descale``. q, and
      ``k_new``/``v_new``, stay in float16 or bfloat16; the new rows are quantized on append
      (divided by their descale, rounded to nearest even, saturated at ±448). The split-KV
      kernel converts each key tile to float16 in registers (exactly) and scales the scores
      and the output by the descales. More query tokens (chunked prefill, a packed q) first
      dequantize the used rows into a 16-bit copy for the prefill kernels. sm_89 and newer.
    - An FP8 ``q`` (``float8_e4m3fn``, with an FP8 cache only), with ``q_descale`` (as the
      others): converted to bfloat16 exactly before the kernels, its descale scaling the scores
      with k's; the output is bfloat16. ``k_new``/``v_new`` are then float16 or bfloat16.

    More than 16 query tokens a sequence (chunked prefill), or a packed ``q``, run the prefill
    kernels on the cache in place; a paged cache whose pages are shorter than the kernel's key
    tile is first copied into contiguous buffers (one read and one write of its used rows,
    memory of a contiguous cache held until the kernel is done).

    NumPy in (all of q, caches, new keys) -> NumPy out, synchronous, the NumPy caches updated in
    place; device arrays in -> DeviceArray out, asynchronous on ``stream``. ``cache_seqlens`` and
    ``block_table`` may be NumPy arrays on either path (their values are then checked) or device
    arrays on the device path (their values are then the caller's duty; see the module docs).
    """
    mods = (window_size, softcap, sinks, alibi_slopes)
    kv_host = [isinstance(x, np.ndarray) for x in (q, k_cache, v_cache)]
    new_host = [isinstance(x, np.ndarray) for x in (k_new, v_new) if x is not None]
    host = all(kv_host + new_host)
    if not host and any(kv_host + new_host):
        raise TypeError("q, k_cache, v_cache, k_new and v_new must all be NumPy arrays or all device arrays")
    packed = None
    if cu_seqlens_q is not None or max_seqlen_q is not None:
        packed = _check_packed(cu_seqlens_q, max_seqlen_q, k_new, num_splits, host)
    if host:
        return _run_host(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale, return_lse,
                         num_splits, stream, packed, mods, (q_descale, k_descale, v_descale))
    if out is not None and isinstance(out, np.ndarray):
        raise TypeError("out must be a device array for device calls (the NumPy path returns a new array)")
    objs = (q, k_cache, v_cache, k_new, v_new, out, cache_seqlens, block_table, cu_seqlens_q)
    for name, x in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if x is not None and kind_of(x) == OTHER and not isinstance(x, np.ndarray) and \
                not _importer.is_device_array_like(x):
            raise TypeError(f"{name} must be an int32 NumPy or device array; got {type(x).__name__}")
    dev_objs = objs  # NumPy index arrays are no operands: checked and uploaded by the full path
    if isinstance(cache_seqlens, np.ndarray) or isinstance(block_table, np.ndarray) or \
            isinstance(cu_seqlens_q, np.ndarray):
        dev_objs = tuple(None if isinstance(x, np.ndarray) else x for x in objs)
    # Five more operands when any is a device array: sinks, slopes, q, k and v descales (a NumPy
    # array or a scalar stays out of the operands: the key holds it, and the full path refuses or
    # reads it; scalars alone add no operand slots, which a warm call would carry for nothing).
    extra = (sinks, alibi_slopes, q_descale, k_descale, v_descale)
    given_x = sinks is not None or alibi_slopes is not None or q_descale is not None or k_descale is not None or \
        v_descale is not None
    arrays = tuple(_args.array_or_none(x) for x in extra) if given_x else None
    has_x = given_x and arrays != (None, None, None, None, None)  # scalars alone add no operand
    if has_x:
        dev_objs = (*dev_objs, *arrays)
    consumer, keep, ops, sig, unordered = _callpath.operands(dev_objs, _NAMES, stream)
    qa, ka, va, kn, vn, oa, sl, bt, cq = ops[:9]
    mkey = None
    if given_x or softcap is not None or window_size is not None:
        mkey = (_callpath.tag(window_size), _callpath.tag(softcap),
                *(_args.descale_key(g, a) for g, a in zip(extra, ops[9:] if has_x else (None,) * len(extra))))
    key = ("kvcache", sig, (causal, scale, return_lse, num_splits, max_seqlen_q),
           (causal.__class__, scale.__class__, return_lse.__class__, num_splits.__class__, max_seqlen_q.__class__),
           # NumPy index arrays: unhashable, so such calls take the full path
           *(None if d is not None or x is None else x for d, x in zip(dev_objs[6:9], (cache_seqlens, block_table,
                                                                                    cu_seqlens_q))), mkey)
    # Appending into caches whose byte ranges meet: the full path's exact test of shared elements.
    suspect = kn is not None and _ranges_meet(ka, va)

    def full(qa, ka, va, kn, vn, oa, sl, bt, cq, sk=None, al=None, dq=None, dk=None, dv=None):
        device_id = qa.device_id
        for name, a in zip(_NAMES[1:], (ka, va, kn, vn, oa, sl, bt, cq, sk, al, dq, dk, dv)):
            if a is not None and a.device_id != device_id:
                raise ValueError(f"{name} is on device {a.device_id} but q is on device {device_id}")
        sl = cache_seqlens if sl is None else sl
        bt = block_table if bt is None else bt
        cq = cu_seqlens_q if cq is None else cq
        ms = (window_size, softcap, sinks if sk is None else sk, alibi_slopes if al is None else al)
        ds = (q_descale if dq is None else dq, k_descale if dk is None else dk, v_descale if dv is None else dv)
        problem, new_geoms = validate_kvcache(qa, ka, va, sl, bt, kn, vn, causal, scale, return_lse, num_splits,
                                              host=False, cu_seqlens_q=cq, max_seqlen_q=max_seqlen_q, mods=ms,
                                              descales=ds)
        if oa is not None:
            geom = _check_out(oa if cq is None else oa[None], False, qa.shape if cq is None else (1, *qa.shape),
                              problem.out_dtype, "bshd")
            problem = replace(problem, out_strides=geom if cq is None else TensorGeom(0, geom.seq, geom.head))
        device = _device.get_device(device_id)
        sref = _stream.StreamRef(consumer, keep)
        # NumPy index arrays were checked; now they go up (stream-ordered, before the kernels).
        rows = _rows_used(problem, sl)
        sl, bt, cq = (_host_io.to_device(x, device=device, stream=sref) if isinstance(x, np.ndarray) else x
                      for x in (sl, bt, cq))
        return _run(problem, qa, ka, va, kn, vn, sl, bt, new_geoms, device, device_id, sref, oa, cq, rows)

    if has_x:  # the caller's arrays beside their adapted operands: ordered after and held like the rest
        objs = (*objs, *arrays)
    return _callpath.run(key, objs, ops, _NAMES, consumer, keep, full, tensors=6, out_index=5,
                         allocates=out is None or return_lse is True, unordered=unordered, force_full=suspect)


_NAMES = ("q", "k_cache", "v_cache", "k_new", "v_new", "out", "cache_seqlens", "block_table", "cu_seqlens_q", "sinks",
          "alibi_slopes", "q_descale", "k_descale", "v_descale")


def _check_packed(cu_seqlens_q, max_seqlen_q, k_new, num_splits, host: bool) -> tuple:
    """The arguments of a packed-q call that are checked before anything else."""
    if cu_seqlens_q is None or max_seqlen_q is None:
        raise TypeError("a packed q takes cu_seqlens_q and max_seqlen_q together")
    check_max_seqlen(max_seqlen_q, "max_seqlen_q", None)
    if k_new is not None:
        raise NotImplementedError("k_new/v_new with a packed q (cu_seqlens_q) are not supported: write the chunk's "
                                  "keys into the cache first (a call with a padded q and k_new, or your own copy) "
                                  "and pass cache_seqlens that include them")
    if num_splits is not None:
        raise NotImplementedError("num_splits (the split-KV decode kernel) does not take a packed q; pass None")
    if host and not isinstance(cu_seqlens_q, np.ndarray):
        raise TypeError(f"cu_seqlens_q must be an int32 NumPy array when q is a NumPy array; got "
                        f"{type(cu_seqlens_q).__name__}")
    return cu_seqlens_q, max_seqlen_q


def _ranges_meet(a, b) -> bool:
    alo, ahi = span(a.shape, a.strides, a.dtype.itemsize)
    blo, bhi = span(b.shape, b.strides, b.dtype.itemsize)
    return a.ptr + alo < b.ptr + bhi and b.ptr + blo < a.ptr + ahi


def _rows_used(problem: Problem, seqlens) -> int | None:
    """Keys a sequence uses at most, when NumPy lengths tell (sizes a gathered copy); else None."""
    if not isinstance(seqlens, np.ndarray) or seqlens.size == 0:
        return None
    return int(seqlens.max()) + problem.kv_cache.seqlen_add


def _run(problem, qa, ka, va, kn, vn, sl, bt, new_geoms, device, device_id, sref, oa=None, cq=None, rows=None):
    kv = problem.kv_cache
    _check_fp8_arch(kv, device_id)  # before the append writes into the cache
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


def _check_fp8_arch(kv: KvCache, device_id: int) -> None:
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


def _run_host(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale, return_lse, num_splits,
              stream, packed=None, mods=(None, None, None, None), descales=(None, None, None)):
    cu_q, max_q = packed if packed else (None, None)
    problem, _ = validate_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale,
                                  return_lse, num_splits, host=True, cu_seqlens_q=cu_q, max_seqlen_q=max_q,
                                  mods=mods, descales=descales)
    kv = problem.kv_cache
    device = _device.get_device(None)
    device_id = _device.device_properties(device).device_id
    _check_fp8_arch(kv, device_id)  # before the NumPy caches are changed
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
    res = _run(problem, qa, ka, va, None, None, sl, bt, None, device, device_id, sref, None, cq,
               _rows_used(problem, cache_seqlens))
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


# ---------------------------------------------------------------------- validation


def validate_kvcache(q, k_cache, v_cache, seqlens, table, k_new, v_new, causal, scale, return_lse, num_splits, *,
                     host: bool, cu_seqlens_q=None, max_seqlen_q=None, mods=(None, None, None, None),
                     descales=(None, None, None)) -> tuple[Problem, tuple[TensorGeom, TensorGeom] | None]:
    """Check one call and describe it as a `Problem` whose ``kv_cache`` has no pointers yet;
    also the strides of k_new and v_new (None without them). Raises ValueError/TypeError.
    A packed q (``cu_seqlens_q``) is checked as a batch of ``max_seqlen_q`` rows a sequence.
    ``mods``: (window_size, softcap, sinks, alibi_slopes); ``descales``: (q_descale, k_descale,
    v_descale) of an FP8 q and cache."""
    qs, qst, qdt, qptr = _describe("q", q, host)
    varlen = None
    if cu_seqlens_q is not None:
        qs, qst, varlen = _packed_q(qs, qst, cu_seqlens_q, max_seqlen_q)
    ks, kst, kdt, kptr = _describe("k_cache", k_cache, host)
    vs, vst, vdt, vptr = _describe("v_cache", v_cache, host)
    if len(qs) != 4:
        raise ValueError(f"q must be 4-D (batch, seqlen_q, heads_q, head_dim); got shape {qs}")
    for name, shp in (("k_cache", ks), ("v_cache", vs)):
        if len(shp) != 4:
            raise ValueError(f"{name} must be 4-D: (batch, capacity, heads_kv, head_dim), or with block_table "
                             f"(num_pages, page_size, heads_kv, head_dim); got shape {shp}")
    if qdt not in RECOGNIZED:
        raise input_dtype_error(qdt, "q")
    fp8 = kdt == FLOAT8_E4M3 and vdt == FLOAT8_E4M3
    q_fp8 = qdt == FLOAT8_E4M3
    if q_fp8 and not fp8:
        raise TypeError(f"an FP8 q (float8_e4m3fn) needs an FP8 cache: k_cache and v_cache float8_e4m3fn; got "
                        f"{dtype_name(kdt)}, {dtype_name(vdt)} (pass q in their dtype)")
    if not fp8 and (kdt != qdt or vdt != qdt):
        raise TypeError(f"k_cache and v_cache must have q's dtype, or both be float8_e4m3fn (an FP8 cache); got "
                        f"q {dtype_name(qdt)}, k_cache {dtype_name(kdt)}, v_cache {dtype_name(vdt)}")
    if ks != vs:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {ks} and {vs}")
    B, Sq, Hq, D = qs
    n0, n1, Hkv, Dk = ks
    if min(B, Sq if varlen is None else 1, Hq) < 1 or min(n0, n1, Hkv) < 1:  # a packed q may have no rows
        raise ValueError(f"every axis of q {qs} and of the caches {ks} must be >= 1")
    if Dk != D:
        raise ValueError(f"q and the caches must have the same head_dim; got q {D}, caches {Dk}")
    if D % 8 or not 8 <= D <= 256:
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 256; got {D}")
    if fp8 and D % 16:
        raise ValueError(f"an FP8 cache's head_dim must be a multiple of 16 (rows of whole 16-byte vectors); got {D}")
    if Hq % Hkv:
        raise ValueError(f"heads_q ({Hq}) must be a multiple of the caches' heads_kv ({Hkv})")
    if max(B, Sq, Hq, n0, Hkv) > 2**31 - 1:  # the kernels take 32-bit sizes
        raise ValueError(f"every axis of q {qs} and of the caches {ks} but head_dim must be at most 2**31 - 1")

    paged = table is not None
    if paged:
        tshape, tdtype = _index_meta(table, "block_table", host)
        if len(tshape) != 2 or tshape[0] != B or tshape[1] < 1:
            raise ValueError(f"block_table must be int32 (batch, max_pages) = ({B}, max_pages >= 1); got shape {tshape}")
        if n1 % _PAGE_MULTIPLE:
            raise ValueError(f"the page size (k_cache.shape[1] with block_table) must be a multiple of "
                             f"{_PAGE_MULTIPLE}; got {n1}")
        _check_dense_rows(table, "block_table", host)
        page_size, max_pages, num_pages = n1, tshape[1], n0
    else:
        if n0 != B:
            raise ValueError(f"k_cache's batch ({n0}) must equal q's ({B}) (a paged cache needs block_table)")
        page_size, max_pages, num_pages = n1, 1, B
    capacity = page_size * max_pages
    if capacity >= 2**31:
        raise ValueError(f"a sequence's capacity ({capacity} keys) must be below 2**31")

    if seqlens is not None:
        sshape, _ = _index_meta(seqlens, "cache_seqlens", host)
        if sshape != (B,):
            raise ValueError(f"cache_seqlens must be int32 (batch,) = ({B},); got shape {sshape}")

    s_new, new_geoms = 0, None
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None:
        if seqlens is None:
            raise ValueError("k_new/v_new need cache_seqlens: the position in each sequence to append at")
        kns, knst, kndt, knptr = _describe("k_new", k_new, host)
        vns, vnst, vndt, vnptr = _describe("v_new", v_new, host)
        if q_fp8 and (kndt != vndt or kndt not in (FLOAT16, BFLOAT16)):
            raise TypeError(f"with an FP8 q, k_new and v_new must both be float16 or both bfloat16 (quantized into "
                            f"the cache on append); got {dtype_name(kndt)}, {dtype_name(vndt)}")
        if not q_fp8 and (kndt != qdt or vndt != qdt):
            raise TypeError(f"k_new and v_new must have q's dtype {dtype_name(qdt)}; got {dtype_name(kndt)}, "
                            f"{dtype_name(vndt)}")
        if len(kns) != 4 or kns != vns or kns[0] != B or kns[2] != Hkv or kns[3] != D or kns[1] < 1:
            raise ValueError(f"k_new and v_new must both be (batch, S_new >= 1, heads_kv, head_dim) = "
                             f"({B}, S_new, {Hkv}, {D}); got {kns} and {vns}")
        s_new = kns[1]
        if s_new > capacity:
            raise ValueError(f"k_new and v_new hold {s_new} keys per sequence, more than the cache's capacity of "
                             f"{capacity} keys per sequence")
        readonly = [n for n, c in (("k_cache", k_cache), ("v_cache", v_cache))
                    if (not c.flags.writeable if host else getattr(c, "readonly", False))]
        if readonly:
            raise ValueError(f"{readonly[0]} must be writeable: k_new/v_new are appended into the caches in place "
                             f"(it is read-only)")
        if share_bytes(kptr, ks, kst, kdt.itemsize, vptr, vs, vst, kdt.itemsize):
            raise ValueError("k_cache and v_cache share memory: k_new and v_new are appended into them in place, so "
                             "v_new would overwrite keys; pass two caches (views of one buffer are fine if no "
                             "element is in both)")
        new_geoms = (tensor_geom("k_new", kns, knst, kndt.itemsize, knptr, "bshd"),
                     tensor_geom("v_new", vns, vnst, vndt.itemsize, vnptr, "bshd"))

    q_geom = tensor_geom("q", qs, qst, qdt.itemsize, qptr, "bshd")
    k_geom = tensor_geom("k_cache", ks, kst, kdt.itemsize, kptr, "bshd")
    v_geom = tensor_geom("v_cache", vs, vst, vdt.itemsize, vptr, "bshd")
    if isinstance(seqlens, np.ndarray) or isinstance(table, np.ndarray):
        _check_values(seqlens, table, B, s_new, page_size, max_pages, num_pages, capacity)

    causal = _check_bool("causal", causal)
    return_lse = _check_bool("return_lse", return_lse)
    scale = _check_scale(scale, D)
    num_splits = check_num_splits(num_splits)
    window = None if mods[0] is None else window_of(mods[0], causal)
    km = kernel_mods(*mods[1:], batch=B, heads_q=Hq, host=host)
    kv = KvCache(paged=paged, page_size=page_size, max_pages=max_pages, num_pages=num_pages, seqlen_add=s_new,
                 **_cache_descales(descales, fp8, q_fp8, B, Hkv, host))
    cdt = BFLOAT16 if q_fp8 else qdt  # the kernels' dtype: an FP8 q runs as its exact bfloat16 copy

    problem = Problem(batch=B, seqlen_q=Sq, seqlen_k=capacity, heads_q=Hq, heads_kv=Hkv, head_dim=D, dtype=cdt,
                      out_dtype=cdt, layout="bshd", causal=causal, scale=scale, return_lse=return_lse, host=host,
                      q_strides=q_geom, k_strides=k_geom, v_strides=v_geom, num_splits=num_splits, kv_cache=kv,
                      varlen=varlen, window=window, mods=km)
    return problem, new_geoms


def _cache_descales(descales, fp8: bool, q_fp8: bool, batch: int, heads_kv: int, host: bool) -> dict:
    """KvCache's descale fields: an FP8 cache's k/v descales and an FP8 q's (None, a float, or
    float32 (B, Hkv) arrays: NumPy for NumPy calls, checked finite; device arrays otherwise),
    refused on 16-bit caches and 16-bit q."""
    q_descale, k_descale, v_descale = descales
    if q_descale is not None and not q_fp8:
        raise ValueError("q_descale applies to an FP8 (float8_e4m3fn) q only; this q is 16-bit: pass None")
    if not fp8:
        for name, x in (("k_descale", k_descale), ("v_descale", v_descale)):
            if x is not None:
                raise ValueError(f"{name} applies to FP8 (float8_e4m3fn) caches only; these caches are 16-bit: "
                                 f"pass None")
        return {}
    d = parse_descales(q_descale, k_descale, v_descale, batch, heads_kv, host)
    return dict(fp8=True, k_scale=d.k, v_scale=d.v, k_descale_ptr=d.k_ptr, v_descale_ptr=d.v_ptr, q_fp8=q_fp8,
                q_scale=d.q, q_descale_ptr=d.q_ptr)


def _quantize_host(x: np.ndarray, descale) -> np.ndarray:
    """16-bit rows (S, H, D) -> e4m3 as the append kernel does: x / descale in float32, rounded to
    nearest even and saturated at +-448 (NaN stays NaN). ``descale``: a float or (H,) float32."""
    d = np.asarray(descale, np.float32).reshape(-1)[None, :, None] if np.ndim(descale) else np.float32(descale)
    return saturate_to_e4m3(x.astype(np.float32) / d)


def _packed_q(qs, qst, cu, max_seqlen_q):
    """A packed q (total_q, Hq, D) seen as (B, max_seqlen_q, Hq, D) with batch stride 0, and its Varlen."""
    if len(qs) != 3:
        raise ValueError(f"q must be 3-D (total_q, heads_q, head_dim) with cu_seqlens_q; got shape {qs}")
    total_q = qs[0]
    if isinstance(cu, np.ndarray):
        lengths = np.diff(check_cu_seqlens(cu, "cu_seqlens_q", total_q))
        batch = len(lengths)
    else:
        lengths, batch = None, check_device_offsets(cu, "cu_seqlens_q", None)
    max_q = min(check_max_seqlen(max_seqlen_q, "max_seqlen_q", lengths), total_q)
    if max_q == 0 and total_q > 0:
        raise ValueError(f"max_seqlen_q must be >= 1 (q has {total_q} rows)")
    return (batch, max_q, *qs[1:]), (0, *qst), Varlen(total_q, None)


def _index_meta(x, name: str, host: bool):
    if host and not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy int32 array when q is a NumPy array; got {type(x).__name__}")
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    if dtype != _I32:
        raise TypeError(f"{name} must be int32; got {dtype_name(dtype)} (cast with .astype(np.int32))")
    return shape, dtype


def _check_dense_rows(table, name: str, host: bool) -> None:
    """The kernel reads block_table as a C-contiguous (B, max_pages) array."""
    if isinstance(table, np.ndarray):
        return  # copied contiguous on the way up
    shape, strides = tuple(table.shape), getattr(table, "strides", None)
    if strides is not None and tuple(strides) != (shape[1] * 4, 4) and shape[0] > 1:
        raise ValueError(f"{name} must be C-contiguous (row stride {shape[1] * 4} bytes); got strides {strides}")


def _check_values(seqlens, table, B, s_new, page_size, max_pages, num_pages, capacity) -> None:
    """Lengths, page ids and append targets, when they are host arrays (no device sync needed)."""
    lens = None
    if isinstance(seqlens, np.ndarray):
        lens = seqlens.astype(np.int64)
        bad = np.flatnonzero((lens < 0) | (lens + s_new > capacity))
        if bad.size:
            b = int(bad[0])
            room = f" (and {s_new} appended keys)" if s_new else ""
            raise ValueError(f"cache_seqlens[{b}] = {int(seqlens[b])}: each length{room} must fit the cache's "
                             f"capacity of {capacity} keys per sequence (and be >= 0)")
    if not isinstance(table, np.ndarray):
        return
    used = np.full(B, capacity, np.int64) if lens is None else lens + s_new
    pages_used = -(-used // page_size)  # pages each sequence reads (and writes)
    cols = np.arange(max_pages)[None, :] < pages_used[:, None]
    bad = np.argwhere(cols & ((table < 0) | (table >= num_pages)))
    if bad.size:
        b, c = (int(i) for i in bad[0])
        raise ValueError(f"block_table[{b}, {c}] = {int(table[b, c])} is not a page of the cache "
                         f"(0 <= page < {num_pages}); sequence {b} uses its first {int(pages_used[b])} pages")
    if s_new and lens is not None:
        pos = lens[:, None] + np.arange(s_new)[None, :]  # (B, s_new) positions written
        slots = table[np.arange(B)[:, None], pos // page_size].astype(np.int64) * page_size + pos % page_size
        uniq, counts = np.unique(slots, return_counts=True)
        if (counts > 1).any():
            slot = int(uniq[counts > 1][0])
            raise ValueError(f"two sequences append to the same cache slot (page {slot // page_size}, row "
                             f"{slot % page_size}) through block_table; appended pages must not be shared")
