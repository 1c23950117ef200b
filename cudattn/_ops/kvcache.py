"""`cudattn.attention_with_kvcache`: decode against a KV cache, contiguous or paged, with
per-sequence lengths and an optional append of new keys/values.

Flow: adapt operands -> validate (shapes, dtypes, strides; the table/length VALUES when they are
NumPy arrays) -> [append k_new/v_new into the cache] -> the split-KV decode kernel (`_kernels.decode`).

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

from .._calls.call import Call
from .._calls.operands import array_key, array_or_none, tag
from .._runtime import device as _device
from .._arrays import importer as _importer
from .._arrays import host_io as _host_io
from .._spec.geometry import span
from .._arrays.importer import OTHER, kind_of
from .._spec.geometry import TensorGeom
from .._arrays.types import ArrayLike, DescaleLike, StreamLike
from .._arrays.array import ArrayResult
from .._spec.validate import check_out
from .._numpy.kvcache import attention_with_kvcache_host
from .._spec.kvcache import check_packed_q, validate_kvcache
from .._kernels import kvcache as _kv_launches



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
        packed = check_packed_q(cu_seqlens_q, max_seqlen_q, k_new, num_splits, host)
    if host:
        return attention_with_kvcache_host(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal,
                                           scale, return_lse, num_splits, stream, packed, mods,
                                           (q_descale, k_descale, v_descale))
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
    arrays = tuple(map(array_or_none, extra)) if given_x else None
    has_x = given_x and arrays != (None, None, None, None, None)
    call = Call("kvcache", (*dev_objs, *arrays) if has_x else dev_objs, _NAMES, stream)
    ka, va, kn = call.ops[1:4]
    # Appending into caches whose byte ranges meet: the full path's exact test of shared elements.
    suspect = kn is not None and _ranges_meet(ka, va)
    return call.run((causal, scale, return_lse, num_splits, max_seqlen_q),
                    # NumPy index arrays: unhashable, so such calls take the full path
                    (*(None if d is not None or x is None else x
                       for d, x in zip(dev_objs[6:9], (cache_seqlens, block_table, cu_seqlens_q))),
                     (tag(window_size), tag(softcap), *map(array_key, extra, call.ops[9:] if has_x else (None,) * 5))
                     if given_x or softcap is not None or window_size is not None else None),
                    _full, (cache_seqlens, block_table, cu_seqlens_q, causal, scale, return_lse, num_splits,
                            max_seqlen_q, window_size, softcap, extra),
                    tensors=6, out_index=5, allocates=out is None or return_lse is True, force_full=suspect)


def _full(call: Call, args, qa, ka, va, kn, vn, oa, sl, bt, cq, sk=None, al=None, dq=None, dk=None, dv=None):
    """The full path of a device call: validate, upload NumPy index arrays, plan and launch."""
    (cache_seqlens, block_table, cu_seqlens_q, causal, scale, return_lse, num_splits, max_seqlen_q, window_size,
     softcap, (sinks, alibi_slopes, q_descale, k_descale, v_descale)) = args
    sl = cache_seqlens if sl is None else sl
    bt = block_table if bt is None else bt
    cq = cu_seqlens_q if cq is None else cq
    ms = (window_size, softcap, sinks if sk is None else sk, alibi_slopes if al is None else al)
    ds = (q_descale if dq is None else dq, k_descale if dk is None else dk, v_descale if dv is None else dv)
    problem, new_geoms = validate_kvcache(qa, ka, va, sl, bt, kn, vn, causal, scale, return_lse, num_splits,
                                          host=False, cu_seqlens_q=cq, max_seqlen_q=max_seqlen_q, mods=ms,
                                          descales=ds)
    if oa is not None:
        geom = check_out(oa if cq is None else oa[None], False, qa.shape if cq is None else (1, *qa.shape),
                         problem.out_dtype, "bshd")
        problem = replace(problem, out_strides=geom if cq is None else TensorGeom(0, geom.seq, geom.head))
    device_id = qa.device_id
    device = _device.get_device(device_id)
    sref = call.stream_ref()
    # NumPy index arrays were checked; now they go up (stream-ordered, before the kernels).
    rows = _kv_launches.rows_used(problem, sl)
    sl, bt, cq = (_host_io.to_device(x, device=device, stream=sref) if isinstance(x, np.ndarray) else x
                  for x in (sl, bt, cq))
    return _kv_launches.run_kvcache(problem, qa, ka, va, kn, vn, sl, bt, new_geoms, device, device_id, sref, oa,
                                    cq, rows)


_NAMES = ("q", "k_cache", "v_cache", "k_new", "v_new", "out", "cache_seqlens", "block_table", "cu_seqlens_q", "sinks",
          "alibi_slopes", "q_descale", "k_descale", "v_descale")


def _ranges_meet(a, b) -> bool:
    alo, ahi = span(a.shape, a.strides, a.dtype.itemsize)
    blo, bhi = span(b.shape, b.strides, b.dtype.itemsize)
    return a.ptr + alo < b.ptr + bhi and b.ptr + blo < a.ptr + ahi



