"""The rules of `cudattn.attention_with_kvcache`'s arguments, and the call described as a Problem.

Shapes, dtypes and strides of q, the caches, k_new/v_new and the index arrays; the values of NumPy
lengths and block tables (device ones cannot be read without a sync: the kernels clamp them);
FP8 caches' descales; a packed q. Everything here runs before any GPU work.
"""

from __future__ import annotations

import numpy as np

from .descales import parse_descales
from .dtypes import BFLOAT16, FLOAT16, FLOAT8_E4M3, RECOGNIZED, dtype_name, input_dtype_error
from .geometry import TensorGeom, share_bytes
from .modifiers import kernel_mods, window_of
from .problem import KvCache, Problem, Varlen
from .tensors import describe_array, tensor_geom
from .validate import check_bool, check_num_splits, check_scale
from .varlen import check_cu_seqlens, check_device_offsets, check_max_seqlen

_I32 = np.dtype(np.int32)

_PAGE_MULTIPLE = 16


def check_packed_q(cu_seqlens_q, max_seqlen_q, k_new, num_splits, host: bool) -> tuple:
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


def validate_kvcache(q, k_cache, v_cache, seqlens, table, k_new, v_new, causal, scale, return_lse, num_splits, *,
                     host: bool, cu_seqlens_q=None, max_seqlen_q=None, mods=(None, None, None, None),
                     descales=(None, None, None)) -> tuple[Problem, tuple[TensorGeom, TensorGeom] | None]:
    """Check one call and describe it as a `Problem` whose ``kv_cache`` has no pointers yet;
    also the strides of k_new and v_new (None without them). Raises ValueError/TypeError.
    A packed q (``cu_seqlens_q``) is checked as a batch of ``max_seqlen_q`` rows a sequence.
    ``mods``: (window_size, softcap, sinks, alibi_slopes); ``descales``: (q_descale, k_descale,
    v_descale) of an FP8 q and cache."""
    qs, qst, qdt, qptr = describe_array("q", q, host)
    varlen = None
    if cu_seqlens_q is not None:
        qs, qst, varlen = _packed_q(qs, qst, cu_seqlens_q, max_seqlen_q)
    ks, kst, kdt, kptr = describe_array("k_cache", k_cache, host)
    vs, vst, vdt, vptr = describe_array("v_cache", v_cache, host)
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
        kns, knst, kndt, knptr = describe_array("k_new", k_new, host)
        vns, vnst, vndt, vnptr = describe_array("v_new", v_new, host)
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

    causal = check_bool("causal", causal)
    return_lse = check_bool("return_lse", return_lse)
    scale = check_scale(scale, D)
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
