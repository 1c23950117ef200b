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

from .._calls.call import Call, dispatch
from .._calls.operands import array_key, array_or_none, check_device_arg, check_not_mixed, tag
from .._runtime import device as _device
from .._arrays import importer as _importer
from .._arrays import host_io as _host_io
from .._spec.geometry import span
from .._arrays.importer import OTHER, kind_of
from .._spec.geometry import TensorGeom
from .._arrays.types import ArrayLike, DescaleLike, DeviceLike, StreamLike
from .._arrays.array import ArrayResult, DeviceArray
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
                           v_descale: DescaleLike = ..., device: DeviceLike = ...) -> ArrayResult: ...


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
                           v_descale: DescaleLike = ..., device: DeviceLike = ...) -> tuple[ArrayResult, ArrayResult]: ...


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
                           v_descale: DescaleLike = ..., device: DeviceLike = ...) -> ArrayResult | tuple[ArrayResult, ArrayResult]: ...


def attention_with_kvcache(q: ArrayLike, k_cache: ArrayLike, v_cache: ArrayLike, *,
                           cache_seqlens: ArrayLike | None = None, block_table: ArrayLike | None = None,
                           k_new: ArrayLike | None = None, v_new: ArrayLike | None = None,
                           cu_seqlens_q: ArrayLike | None = None, max_seqlen_q: int | None = None, causal: bool = False,
                           scale: float | None = None, return_lse: bool = False, num_splits: int | None = None,
                           out: ArrayLike | None = None, stream: StreamLike = None,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: ArrayLike | None = None, alibi_slopes: ArrayLike | None = None,
                           q_descale: DescaleLike = None, k_descale: DescaleLike = None,
                           v_descale: DescaleLike = None,
                           device: DeviceLike = None) -> ArrayResult | tuple[ArrayResult, ArrayResult]:
    """Attention of a few query tokens against a KV cache (FlashAttention's ``flash_attn_with_kvcache``).

    Parameters
    ----------
    q : array
        ``(B, Sq, Hq, D)`` (layout "bshd"; decode is ``Sq`` = 1..16, any ``Sq`` works), float16 or
        bfloat16; or FP8 (``float8_e4m3fn``, with an FP8 cache only, and ``q_descale``), converted
        to bfloat16 exactly before the kernels.
    k_cache, v_cache : array
        Contiguous ``(B, capacity, Hkv, D)``, or paged ``(num_pages, page_size, Hkv, D)`` with
        ``block_table`` (``page_size`` a multiple of 16). float16, bfloat16, or FP8
        (``float8_e4m3fn``, half the bytes; sm_89 and newer) holding ``x / descale``.
    cache_seqlens : int32 array, optional
        ``(B,)``: the valid keys of each sequence (0 allowed). None: every sequence fills the cache.
    block_table : int32 array, optional
        ``(B, max_pages)``: sequence ``b``'s key ``j`` is row ``j % page_size`` of page
        ``block_table[b, j // page_size]``; the capacity per sequence is ``max_pages * page_size``.
    k_new, v_new : array, optional
        ``(B, S_new, Hkv, D)``, float16 or bfloat16, written into the cache IN PLACE at positions
        ``cache_seqlens[b] .. cache_seqlens[b] + S_new - 1`` before attending (``cache_seqlens`` is
        then required, and is not changed); quantized on the way into an FP8 cache (divided by
        its descale, rounded to nearest even, saturated at ±448).
    cu_seqlens_q, max_seqlen_q : optional
        A packed q of ``(total_q, Hq, D)``: sequence ``b``'s queries are rows
        ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1`` (int32 ``(B + 1,)``, as in
        :func:`cudattn.attention`). Its keys must already be in the cache (no ``k_new``); no
        ``num_splits``.
    causal : bool
        Bottom right per sequence: query ``i`` sees key ``j`` iff ``j <= i + L_b - Sq``, with
        ``L_b`` the sequence's keys (appended ones included).
    scale, return_lse, num_splits, stream
        As in :func:`cudattn.attention`.
    out : device array, optional
        Device calls only: q's shape and the output dtype; required while ``stream`` captures a
        CUDA graph.
    window_size, softcap, sinks, alibi_slopes
        As in :func:`cudattn.attention`, with ``Sk`` the sequence's keys ``L_b`` (query ``i``'s
        diagonal key is ``i + L_b - Sq``); a sink counts once.
    q_descale, k_descale, v_descale : None, float or float32 array, optional
        None (1.0), a float, or float32 ``(B, Hkv)`` arrays, as in :func:`cudattn.attention`:
        ``k_descale``, ``v_descale`` for an FP8 cache, ``q_descale`` for an FP8 q.
    device : int or cuda.core Device, optional
        As in :func:`cudattn.attention`: the GPU of NumPy calls (device calls run where their
        operands are).

    Returns
    -------
    out : NumPy array or DeviceArray
        q's shape, in q's dtype (bfloat16 for an FP8 q).
    lse : NumPy array or DeviceArray, float32
        With ``return_lse=True`` only (the call then returns ``(out, lse)``): ``(B, Hq, Sq)``;
        ``(Hq, total_q)`` for a packed q.

    Raises
    ------
    TypeError
        An argument of the wrong type or dtype, or q, the caches and the new keys not all NumPy
        arrays or all device arrays; the message names each.
    ValueError
        Shapes, strides or values that break a rule (NumPy ``cache_seqlens`` and ``block_table``
        are checked: lengths in ``[0, capacity - S_new]``, page ids in ``[0, num_pages)``, no cache
        slot appended to twice), before any GPU work or cache write.
    NotImplementedError
        ``k_new`` or ``num_splits`` with a packed q; an FP8 cache on a GPU older than sm_89.
    cudattn.NoDeviceError, cudattn.OutOfMemoryError, cudattn.CudaError
        As in :func:`cudattn.attention`.

    Notes
    -----
    All of q, the caches and the new keys NumPy: NumPy results, synchronously, the NumPy caches
    updated in place. Device arrays: a DeviceArray, asynchronously on ``stream``.
    ``cache_seqlens`` and ``block_table`` may be NumPy arrays on either path, or device arrays on
    the device path; device values are not read on the host (that would stall the stream), so
    they are the caller's word: the kernels clamp lengths into ``[0, capacity]`` and page ids into
    ``[0, num_pages)``, so a bad value gives a wrong result for its sequence, never an access
    outside the cache.

    Up to 16 query tokens a sequence run the split-KV decode kernel (an FP8 cache converted to
    float16 tile by tile, in registers). More (chunked prefill), or a packed q, run the prefill
    kernels on the cache in place; a paged cache whose pages are shorter than the kernel's key
    tile, or an FP8 cache, is first copied (dequantized) into a contiguous 16-bit buffer.

    Examples
    --------
    >>> import numpy as np, cudattn
    >>> k_cache = np.zeros((2, 1024, 2, 128), np.float16)        # (B, capacity, Hkv, D)
    >>> v_cache = np.zeros_like(k_cache)
    >>> lens = np.array([100, 7], np.int32)                      # keys cached so far
    >>> q = np.random.randn(2, 1, 8, 128).astype(np.float16)     # one new token, 8 query heads
    >>> kv = np.random.randn(2, 1, 2, 128).astype(np.float16)
    >>> out = cudattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, k_new=kv, v_new=kv)
    >>> out.shape
    (2, 1, 8, 128)
    >>> bool((k_cache[0, 100] == kv[0, 0]).all())                # appended in place
    True
    >>> lens += 1                                                # the call leaves lens as it was
    """
    mods = (window_size, softcap, sinks, alibi_slopes)
    nd = np.ndarray
    any_host = isinstance(q, nd) or isinstance(k_cache, nd) or isinstance(v_cache, nd) or \
        isinstance(k_new, nd) or isinstance(v_new, nd)
    host = any_host and isinstance(q, nd) and isinstance(k_cache, nd) and isinstance(v_cache, nd) and \
        (k_new is None or isinstance(k_new, nd)) and (v_new is None or isinstance(v_new, nd))
    # q alone is asked its kind (a cache or new rows that are no array are named by the importer)
    if not host and (any_host or type(q) is not DeviceArray and kind_of(q) == OTHER):
        check_not_mixed((n, x) for i, (n, x) in enumerate(zip(_NAMES, (q, k_cache, v_cache, k_new, v_new)))
                        if i < 3 or x is not None)  # the one message for host/device mixes and non-arrays
    packed = None
    if cu_seqlens_q is not None or max_seqlen_q is not None:
        packed = check_packed_q(cu_seqlens_q, max_seqlen_q, k_new, num_splits, host)
    if host:
        if out is not None:
            raise TypeError("out is taken by device calls only; a NumPy call returns a new array (pass out=None)")
        return attention_with_kvcache_host(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal,
                                           scale, return_lse, num_splits, stream, packed, mods,
                                           (q_descale, k_descale, v_descale), device)
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
    flags = (causal, scale, return_lse, num_splits, max_seqlen_q)
    args = (cache_seqlens, block_table, cu_seqlens_q, causal, scale, return_lse, num_splits, max_seqlen_q,
            window_size, softcap, extra)
    mods = given_x or softcap is not None or window_size is not None  # the key's last part, else None
    allocates = out is None or return_lse is True
    if not has_x and device is None and k_new is None and dev_objs is objs:  # nothing asked of the adapted operands
        return dispatch("kvcache", objs, _NAMES, stream, flags,
                        (None, None, None, (tag(window_size), tag(softcap), *map(tag, extra)) if mods else None),
                        _full, args, tensors=6, out_index=5, allocates=allocates)
    call = Call("kvcache", (*dev_objs, *arrays) if has_x else dev_objs, _NAMES, stream)
    if device is not None:
        check_device_arg(device, call.ops[0].device_id)
    ka, va, kn = call.ops[1:4]
    # Appending into caches whose byte ranges meet: the full path's exact test of shared elements.
    suspect = kn is not None and _ranges_meet(ka, va)
    return call.run(flags,
                    # NumPy index arrays: unhashable, so such calls take the full path
                    (*((None, None, None) if dev_objs is objs else
                       (None if d is not None or x is None else x
                        for d, x in zip(dev_objs[6:9], (cache_seqlens, block_table, cu_seqlens_q)))),
                     (tag(window_size), tag(softcap), *map(array_key, extra, call.ops[9:] if has_x else (None,) * 5))
                     if mods else None),
                    _full, args, tensors=6, out_index=5, allocates=allocates, force_full=suspect)


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



