"""KV cache (decode): contiguous or paged caches, layout bshd only. `kvcache_append` writes new
tokens into copies of a cache, `gather_kv` returns each sequence's valid keys as contiguous
arrays, and `attention_with_kvcache` / `attention_with_kvcache_naive` run `attention` /
`attention_naive` per sequence over its gathered keys."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._arrays.types import DTypeLike, HostArrayLike
from ._common import _BF16, _FP8, _mods_kwargs, _parse_mods
from .dense import attention, attention_naive


def _cache_geometry(k_cache: np.ndarray, v_cache: np.ndarray, block_table):
    """(B or None, capacity per sequence, Hkv, D, block_table or None) of a contiguous cache
    ``(B, Sk_cache, Hkv, D)`` or a paged one ``(num_pages, page_size, Hkv, D)`` + ``block_table``
    ``(B, max_pages)``; key ``j`` of sequence ``b`` lives at
    ``cache[block_table[b, j // page_size], j % page_size]``."""
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache must be 4-D; got shape {k_cache.shape}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {k_cache.shape} and {v_cache.shape}")
    _, S, Hkv, D = k_cache.shape
    if block_table is None:
        return k_cache.shape[0], S, Hkv, D, None
    bt = np.asarray(block_table)
    if bt.ndim != 2 or bt.dtype.kind not in "iu":
        raise ValueError(f"block_table must be a 2-D integer array (B, max_pages); got {bt.dtype} of shape {bt.shape}")
    return bt.shape[0], bt.shape[1] * S, Hkv, D, bt.astype(np.int64)


def _seqlens(cache_seqlens, B: int, capacity: int) -> np.ndarray:
    sl = np.asarray(cache_seqlens)
    if sl.shape != (B,) or sl.dtype.kind not in "iu":
        raise ValueError(f"cache_seqlens must be a 1-D integer array of length B={B}; got {sl.dtype} of shape {sl.shape}")
    if B and (sl.min() < 0 or sl.max() > capacity):
        raise ValueError(f"cache_seqlens must lie in [0, {capacity}] (the cache's capacity); got {sl.min()}..{sl.max()}")
    return sl.astype(np.int64)


def _slots(bt, b: int, positions: np.ndarray, cache_shape: tuple):
    """Index tuple into the cache's first two axes for key positions of sequence ``b``. Only the
    block_table entries of pages actually used are checked (the rest may hold anything)."""
    if bt is None:
        return b, positions
    num_pages, page_size = cache_shape[:2]
    pages = bt[b, positions // page_size]
    if pages.size and (pages.min() < 0 or pages.max() >= num_pages):
        raise ValueError(f"block_table[{b}] uses page {pages.min() if pages.min() < 0 else pages.max()}, "
                         f"outside [0, num_pages={num_pages})")
    return pages, positions % page_size


def kvcache_append(k_cache: HostArrayLike, v_cache: HostArrayLike, k_new: HostArrayLike, v_new: HostArrayLike,
                   cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                   ) -> tuple[NDArray[Any], NDArray[Any]]:
    """Write ``k_new``/``v_new`` ``(B, S_new, Hkv, D)`` into copies of the cache.

    Token ``t`` of sequence ``b`` goes to key position ``cache_seqlens[b] + t`` (contiguous cache
    ``(B, Sk_cache, Hkv, D)``: ``cache[b, pos]``; paged cache ``(num_pages, page_size, Hkv, D)``:
    ``cache[block_table[b, pos // page_size], pos % page_size]``). ``cache_seqlens=None`` means a
    full cache, which has no room to append: ValueError. New values are cast to the cache's
    dtype. Returns ``(k_cache2, v_cache2)``; the inputs are left untouched.
    """
    k_cache = np.asarray(k_cache)
    v_cache = np.asarray(v_cache)
    k_new = np.asarray(k_new)
    v_new = np.asarray(v_new)
    B, capacity, Hkv, D, bt = _cache_geometry(k_cache, v_cache, block_table)
    if cache_seqlens is None:
        raise ValueError("kvcache_append needs cache_seqlens: without it the cache is taken as full, with no room to append")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must have the same shape; got {k_new.shape} and {v_new.shape}")
    if k_new.ndim != 4 or k_new.shape[0] != B or k_new.shape[2:] != (Hkv, D):
        raise ValueError(f"k_new must be (B={B}, S_new, Hkv={Hkv}, D={D}); got {k_new.shape}")
    sl = _seqlens(cache_seqlens, B, capacity)
    S_new = k_new.shape[1]
    if B and int(sl.max()) + S_new > capacity:
        raise ValueError(f"appending {S_new} tokens overflows the cache: max(cache_seqlens) + S_new = "
                         f"{int(sl.max()) + S_new} > capacity {capacity}")
    k2 = k_cache.copy()
    v2 = v_cache.copy()
    for b in range(B):
        at = _slots(bt, b, sl[b] + np.arange(S_new), k_cache.shape)
        k2[at] = k_new[b]
        v2[at] = v_new[b]
    return k2, v2


def gather_kv(k_cache: HostArrayLike, v_cache: HostArrayLike, cache_seqlens: HostArrayLike | None = None,
              block_table: HostArrayLike | None = None) -> list[tuple[NDArray[Any], NDArray[Any]]]:
    """Each sequence's valid keys and values as contiguous arrays.

    Returns a list of ``B`` pairs ``(k_b, v_b)``, each ``(L_b, Hkv, D)`` in the cache's dtype,
    with ``L_b = cache_seqlens[b]`` (None: the whole cache, ``Sk_cache`` contiguous,
    ``max_pages * page_size`` paged).
    """
    k_cache = np.asarray(k_cache)
    v_cache = np.asarray(v_cache)
    B, capacity, Hkv, D, bt = _cache_geometry(k_cache, v_cache, block_table)
    sl = np.full(B, capacity, dtype=np.int64) if cache_seqlens is None else _seqlens(cache_seqlens, B, capacity)
    pairs = []
    for b in range(B):
        at = _slots(bt, b, np.arange(sl[b]), k_cache.shape)
        pairs.append((np.ascontiguousarray(k_cache[at]), np.ascontiguousarray(v_cache[at])))
    return pairs


def _with_kvcache(fn, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, scale, kwargs,
                  mods_kw=None):
    """Per-sequence ``fn`` (`attention` or `attention_naive`) over each sequence's gathered keys;
    returns the per-sequence ``(out_b, lse_b)`` pairs (None for L_b == 0) and B."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D (B, Sq, Hq, D); got shape {q.shape}")
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together")
    if k_new is not None:
        if cache_seqlens is None:
            raise ValueError("k_new needs cache_seqlens: without it the cache is taken as full, with no room to append")
        k_cache, v_cache = kvcache_append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)
        cache_seqlens = np.asarray(cache_seqlens) + np.asarray(k_new).shape[1]
    pairs = gather_kv(k_cache, v_cache, cache_seqlens, block_table)
    B = len(pairs)
    if q.shape[0] != B:
        raise ValueError(f"q's batch ({q.shape[0]}) must match the cache's ({B})")
    Hkv, D = np.asarray(k_cache).shape[2:]
    if q.shape[3] != D:
        raise ValueError(f"q, k_cache, v_cache must have the same head_dim; got q {q.shape[3]}, cache {D}")
    if Hkv < 1 or q.shape[2] % Hkv:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({Hkv})")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    mods = None
    if mods_kw and any(x is not None for x in mods_kw.values()):
        mods = _parse_mods(*(mods_kw.get(n) for n in ("window_size", "softcap", "sinks", "alibi_slopes")), causal,
                           B, q.shape[2])
    results = []
    for b, (kb, vb) in enumerate(pairs):
        if kb.shape[0] == 0:
            results.append(None)  # no key: output 0, LSE -inf (the sink's logit with sinks)
        else:
            extra = {} if mods is None else _mods_kwargs(mods_kw.get("window_size"), mods_kw.get("softcap"),
                                                         mods_kw.get("sinks"), mods, b)
            results.append(fn(q[b:b + 1], kb[None], vb[None], causal=causal, scale=scale,
                              return_lse=True, **kwargs, **extra))
    return results, q, (None if mods is None else mods.sinks)


def _assemble(results, q: np.ndarray, out_dtype, lse_dtype, sinks=None):
    B, Sq, Hq, D = q.shape
    out = np.zeros(q.shape, dtype=out_dtype)
    lse = np.full((B, Hq, Sq), -np.inf, dtype=lse_dtype)
    if sinks is not None:  # sequences with no key: their sinks' logits
        lse[:] = sinks[None, :, None]
    for b, r in enumerate(results):
        if r is not None:
            out[b], lse[b] = r[0][0], r[1][0]
    return out, lse


def attention_with_kvcache(q: HostArrayLike, k_cache: HostArrayLike, v_cache: HostArrayLike, *,
                           cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                           k_new: HostArrayLike | None = None, v_new: HostArrayLike | None = None,
                           causal: bool = False, scale: float | None = None, return_lse: bool = False,
                           window_size: tuple[int, int] | None = None, softcap: float | None = None,
                           sinks: HostArrayLike | None = None, alibi_slopes: HostArrayLike | None = None,
                           ) -> NDArray[np.float64] | tuple[NDArray[np.float64], NDArray[np.float64]]:
    """`attention` (float64) of ``q`` ``(B, Sq, Hq, D)`` over a KV cache, layout bshd only.

    The cache is contiguous ``(B, Sk_cache, Hkv, D)`` or paged ``(num_pages, page_size, Hkv, D)``
    with ``block_table`` ``(B, max_pages)`` (see `kvcache_append`). With ``k_new``/``v_new``
    ``(B, S_new, Hkv, D)``, those are first appended (to copies) at ``cache_seqlens[b]``, and
    sequence ``b`` then holds ``L_b = cache_seqlens[b] + S_new`` keys; otherwise
    ``L_b = cache_seqlens[b]`` (None: the whole cache). Sequence ``b`` is then plain attention of
    ``q[b]`` over its ``L_b`` keys: causal is bottom-right w.r.t. ``L_b`` (query ``i`` sees key
    ``j`` iff ``j <= i + L_b - Sq``); ``L_b = 0`` gives output 0 and LSE ``-inf``.

    Returns ``out`` (float64, q's shape) and, with ``return_lse``, ``lse`` (float64,
    ``(B, Hq, Sq)``), as `attention` does; the score modifiers as in `attention`, per sequence
    over its ``L_b`` keys.
    """
    mods_kw = dict(window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    results, q, sk = _with_kvcache(attention, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new,
                                   causal, scale, {}, mods_kw)
    out, lse = _assemble(results, q, np.float64, np.float64, sk)
    return (out, lse) if return_lse else out


def attention_with_kvcache_naive(q: HostArrayLike, k_cache: HostArrayLike, v_cache: HostArrayLike, *,
                                 cache_seqlens: HostArrayLike | None = None, block_table: HostArrayLike | None = None,
                                 k_new: HostArrayLike | None = None, v_new: HostArrayLike | None = None,
                                 causal: bool = False, scale: float | None = None, return_lse: bool = False,
                                 dtype: DTypeLike | None = None, window_size: tuple[int, int] | None = None,
                                 softcap: float | None = None, sinks: HostArrayLike | None = None,
                                 alibi_slopes: HostArrayLike | None = None,
                                 ) -> NDArray[Any] | tuple[NDArray[Any], NDArray[np.float32]]:
    """`attention_with_kvcache` in low precision: `attention_naive` per sequence.

    ``dtype`` as in `attention_naive` (default: q's dtype, 16-bit or FP8). Returns ``out`` in the
    output dtype (``dtype``, bfloat16 for FP8) and, with ``return_lse``, a float32 LSE
    ``(B, Hq, Sq)``, as `attention_naive` does; ``L_b = 0`` gives 0 and ``-inf``.
    """
    low = np.dtype(np.asarray(q).dtype if dtype is None else dtype)
    if low.kind == "f" and low.itemsize >= 4:
        raise TypeError(
            f"attention_with_kvcache_naive needs a low-precision dtype (float16, bfloat16, float8_e4m3fn); "
            f"got {low}: pass dtype=np.float16 or dtype=ml_dtypes.bfloat16"
        )
    out_dtype = _BF16 if low == _FP8 else low
    mods_kw = dict(window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    results, q, sk = _with_kvcache(attention_naive, q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new,
                                   causal, scale, {"dtype": low}, mods_kw)
    out, lse = _assemble(results, q, out_dtype, np.float32, sk)
    return (out, lse) if return_lse else out
