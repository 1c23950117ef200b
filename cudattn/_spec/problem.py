"""The validated description of one attention call: what `_spec.validate` produces and `_kernels.plan` consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .descales import Descales
from .geometry import TensorGeom
from .modifiers import KernelMods


@dataclass(frozen=True)
class KvCache:
    """How k/v are stored when they are a KV cache (`attention_with_kvcache`): contiguous
    ``(B, capacity, Hkv, D)`` or paged ``(num_pages, page_size, Hkv, D)`` through a block table,
    with per-sequence valid lengths. Pointers are device addresses (0: absent)."""

    paged: bool
    page_size: int  # keys per page; the capacity when contiguous
    max_pages: int  # block_table columns (1 when contiguous)
    num_pages: int  # pages in the cache (the batch when contiguous)
    seqlens_ptr: int = 0  # int32 (B,) valid keys before appending; 0: every sequence is full
    block_table_ptr: int = 0  # int32 (B, max_pages), C-contiguous
    seqlen_add: int = 0  # keys appended before attending (k_new's length)
    # FP8 (e4m3) caches: k and v descales, each a scalar times an optional float32 (B, Hkv)
    # C-contiguous device array (its address; 0: none).
    fp8: bool = False
    k_scale: float = 1.0
    v_scale: float = 1.0
    k_descale_ptr: int = 0
    v_descale_ptr: int = 0
    # An FP8 q (FP8 caches only): converted to bfloat16 exactly before the kernels; its descale
    # (a scalar times an optional (B, Hkv) array) scales the scores with k's.
    q_fp8: bool = False
    q_scale: float = 1.0
    q_descale_ptr: int = 0

    @property
    def capacity(self) -> int:
        return self.page_size * self.max_pages


@dataclass(frozen=True)
class Varlen:
    """A packed variable-length batch (FlashAttention's ``cu_seqlens``): q/out are ``(total_q, Hq, D)``
    and k/v ``(total_k, Hkv, D)`` (or padded ``(B, Sk, Hkv, D)``, ``total_k`` None: a KV cache);
    the Problem's ``batch`` is the sequence count and its ``seqlen_q``/``seqlen_k`` the
    caller's ``max_seqlen_q``/``max_seqlen_k``. Pointers: int32 ``(B + 1,)`` device offsets."""

    total_q: int
    total_k: int | None  # None: k/v are not packed (a padded KV cache)
    cu_q_ptr: int = 0
    cu_k_ptr: int = 0


@dataclass(frozen=True)
class Problem:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: np.dtype  # input dtype (float16, ml_dtypes.bfloat16 or ml_dtypes.float8_e4m3fn)
    out_dtype: np.dtype
    layout: str  # "bshd" or "bhsd"
    causal: bool
    scale: float
    return_lse: bool
    host: bool  # True: NumPy in / NumPy out
    q_strides: TensorGeom
    k_strides: TensorGeom
    v_strides: TensorGeom
    out_strides: TensorGeom | None = None  # strides of a caller-given `out`; None: cudattn allocates
    num_splits: int | None = None  # split-KV: None lets the heuristic choose (decode shapes)
    kv_cache: KvCache | None = None  # k/v are a KV cache (seqlen_k is then its capacity)
    descales: Descales | None = None  # FP8 inputs only
    varlen: Varlen | None = None  # a packed variable-length batch
    window: tuple[int, int] | None = None  # sliding window (left, right), -1 open; None: none
    mods: KernelMods | None = None  # softcap, sinks, ALiBi; None: none

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_kv
