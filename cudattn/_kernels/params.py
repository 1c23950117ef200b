"""ctypes mirror of `FwdParams` in cu_src/include/cudattn/params.cuh (keep the two in step).

The kernel takes this struct by value as its only argument; tests compare the layout with the
header's field list so that a change on one side cannot slip through.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import alibi_shift as _alibi_shift

_c_ptr = ctypes.c_uint64
_c_i64 = ctypes.c_int64
_c_i32 = ctypes.c_int32


class KvCacheGeom(ctypes.Structure):
    _fields_ = [
        ("block_table", _c_ptr),
        ("seqlens", _c_ptr),
        ("page_size", _c_i32), ("max_pages", _c_i32), ("num_pages", _c_i32), ("capacity", _c_i32),
        ("seqlen_add", _c_i32), ("pad_", _c_i32),
    ]


class FwdParams(ctypes.Structure):
    _fields_ = [
        ("q", _c_ptr),
        ("k", _c_ptr),
        ("v", _c_ptr),
        ("o", _c_ptr),
        ("lse", _c_ptr),
        ("q_stride_b", _c_i64), ("q_stride_s", _c_i64), ("q_stride_h", _c_i64),
        ("k_stride_b", _c_i64), ("k_stride_s", _c_i64), ("k_stride_h", _c_i64),
        ("v_stride_b", _c_i64), ("v_stride_s", _c_i64), ("v_stride_h", _c_i64),
        ("o_stride_b", _c_i64), ("o_stride_s", _c_i64), ("o_stride_h", _c_i64),
        ("batch", _c_i32), ("seqlen_q", _c_i32), ("seqlen_k", _c_i32), ("heads_q", _c_i32), ("heads_kv", _c_i32),
        ("group", _c_i32),
        ("head_dim", _c_i32),
        ("causal_offset", _c_i32),
        ("scale_log2", ctypes.c_float),
        ("num_m_blocks", _c_i32),
        ("write_lse", _c_i32),
        ("pad_", _c_i32),
        ("q_descale", _c_ptr), ("k_descale", _c_ptr), ("v_descale", _c_ptr),
        ("out_scale", ctypes.c_float),
        ("pad2_", _c_i32),
        ("cu_seqlens_q", _c_ptr), ("cu_seqlens_k", _c_ptr),
        ("kv", KvCacheGeom),
        ("has_window", _c_i32), ("window_left", _c_i32), ("window_right", _c_i32), ("pad4_", _c_i32),
        ("sinks", _c_ptr), ("alibi", _c_ptr),
        ("alibi_stride_b", _c_i32), ("softcap_pre", ctypes.c_float), ("alibi_mul", ctypes.c_float),
        ("alibi_shift", _c_i32),
    ]


_TensorMap = ctypes.c_uint8 * 128


class FwdSm90Params(ctypes.Structure):
    """`FwdSm90Params` of cu_src/include/cudattn/sm90/params.cuh: four TMA maps (each at a 64-byte
    offset), the shared FwdParams, the causal tile order's section, whether O leaves through its map,
    the tile counter, padded to the C struct's 64-byte alignment."""

    _fields_ = [
        ("tma_q", _TensorMap), ("tma_k", _TensorMap), ("tma_v", _TensorMap), ("tma_o", _TensorMap),
        ("p", FwdParams),
        ("tile_order", _c_i32),
        ("o_tma", _c_i32),
        ("tile_counter", _c_ptr),
        ("pad_", ctypes.c_uint8 * (-(4 * 128 + ctypes.sizeof(FwdParams) + 16) % 64)),
    ]


class BwdParams(ctypes.Structure):
    """`BwdParams` of cu_src/include/cudattn/bwd/params.cuh: the forward's FwdParams, the gradients
    and the backward's workspace."""

    _fields_ = [
        ("f", FwdParams),
        ("dout", _c_ptr), ("dq", _c_ptr), ("dk", _c_ptr), ("dv", _c_ptr),
        ("dq_accum", _c_ptr), ("dsum", _c_ptr), ("lse2", _c_ptr), ("dsinks", _c_ptr), ("semaphores", _c_ptr),
        ("do_stride_b", _c_i64), ("do_stride_s", _c_i64), ("do_stride_h", _c_i64),
        ("dq_stride_b", _c_i64), ("dq_stride_s", _c_i64), ("dq_stride_h", _c_i64),
        ("dk_stride_b", _c_i64), ("dk_stride_s", _c_i64), ("dk_stride_h", _c_i64),
        ("dv_stride_b", _c_i64), ("dv_stride_s", _c_i64), ("dv_stride_h", _c_i64),
        ("rows_b", _c_i32), ("rows_s", _c_i32),
        ("tile_dim", _c_i32), ("num_n_blocks", _c_i32),
        ("scale", ctypes.c_float), ("deterministic", _c_i32),
    ]


class BwdSm90Params(ctypes.Structure):
    """`BwdSm90Params` of cu_src/include/cudattn/bwd/sm90_params.cuh: the TMA maps of q, k, v, dout
    and the dQ accumulator (each at a 64-byte offset), the shared BwdParams, padded to the C struct's
    64-byte alignment."""

    _fields_ = [
        ("tma_q", _TensorMap), ("tma_k", _TensorMap), ("tma_v", _TensorMap), ("tma_do", _TensorMap),
        ("tma_dq", _TensorMap),
        ("p", BwdParams),
        ("pad_", ctypes.c_uint8 * (-(5 * 128 + ctypes.sizeof(BwdParams)) % 64)),
    ]


# ------------------------------------------------------------ decode path (params_decode.cuh)


class DecodeParams(ctypes.Structure):
    _fields_ = [
        ("q", _c_ptr), ("k", _c_ptr), ("v", _c_ptr), ("o", _c_ptr), ("lse", _c_ptr),
        ("o_part", _c_ptr), ("lse_part", _c_ptr), ("counters", _c_ptr),
        ("q_stride_b", _c_i64), ("q_stride_s", _c_i64), ("q_stride_h", _c_i64),
        ("k_stride_page", _c_i64), ("k_stride_s", _c_i64), ("k_stride_h", _c_i64),
        ("v_stride_page", _c_i64), ("v_stride_s", _c_i64), ("v_stride_h", _c_i64),
        ("o_stride_b", _c_i64), ("o_stride_s", _c_i64), ("o_stride_h", _c_i64),
        ("kv", KvCacheGeom),
        ("batch", _c_i32), ("seqlen_q", _c_i32), ("heads_q", _c_i32), ("heads_kv", _c_i32),
        ("group", _c_i32), ("head_dim", _c_i32), ("rows", _c_i32), ("num_m_blocks", _c_i32),
        ("num_splits", _c_i32), ("tiles_per_split", _c_i32), ("causal", _c_i32),
        ("scale_log2", ctypes.c_float), ("write_lse", _c_i32), ("alibi_shift", _c_i32),
        ("window_left", _c_i32), ("window_right", _c_i32),
        ("softcap_pre", ctypes.c_float), ("alibi_mul", ctypes.c_float),
        ("sinks", _c_ptr), ("alibi", _c_ptr),
        ("alibi_stride_b", _c_i32), ("has_window", _c_i32),
        ("k_descale", _c_ptr), ("v_descale", _c_ptr), ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float),
        ("q_descale", _c_ptr), ("merge_ctas", _c_i32),
    ]


MERGE_MAX_TABLE = 16  # CUDATTN_MERGE_MAX_TABLE


class CombineParams(ctypes.Structure):
    _fields_ = [
        ("o_parts", _c_ptr), ("lse_parts", _c_ptr), ("o", _c_ptr), ("lse", _c_ptr),
        ("o_table", _c_ptr * MERGE_MAX_TABLE), ("lse_table", _c_ptr * MERGE_MAX_TABLE),
        ("o_part_stride", _c_i64), ("lse_part_stride", _c_i64),
        ("in_stride_b", _c_i64), ("in_stride_s", _c_i64), ("in_stride_h", _c_i64),
        ("lse_stride_b", _c_i64), ("lse_stride_h", _c_i64), ("lse_stride_s", _c_i64),
        ("o_stride_b", _c_i64), ("o_stride_s", _c_i64), ("o_stride_h", _c_i64),
        ("batch", _c_i32), ("seqlen_q", _c_i32), ("heads", _c_i32), ("head_dim", _c_i32),
        ("num_parts", _c_i32), ("use_table", _c_i32),
    ]


class AppendParams(ctypes.Structure):
    _fields_ = [
        ("k_new", _c_ptr), ("v_new", _c_ptr), ("k", _c_ptr), ("v", _c_ptr),
        ("kn_stride_b", _c_i64), ("kn_stride_s", _c_i64), ("kn_stride_h", _c_i64),
        ("vn_stride_b", _c_i64), ("vn_stride_s", _c_i64), ("vn_stride_h", _c_i64),
        ("k_stride_page", _c_i64), ("k_stride_s", _c_i64), ("k_stride_h", _c_i64),
        ("v_stride_page", _c_i64), ("v_stride_s", _c_i64), ("v_stride_h", _c_i64),
        ("kv", KvCacheGeom),
        ("batch", _c_i32), ("seqlen_new", _c_i32), ("heads_kv", _c_i32), ("head_dim", _c_i32),
        ("k_descale", _c_ptr), ("v_descale", _c_ptr), ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float),
        ("q_descale", _c_ptr),
    ]


class TransposeVParams(ctypes.Structure):
    """`TransposeVParams` of cu_src/fp8_transpose_v.cu."""

    _fields_ = [
        ("v", _c_ptr), ("vt", _c_ptr),
        ("v_stride_b", _c_i64), ("v_stride_s", _c_i64), ("v_stride_h", _c_i64),
        ("seqlen_k", _c_i32), ("seq_pad", _c_i32), ("heads_kv", _c_i32), ("head_dim", _c_i32),
        ("cu_seqlens", _c_ptr),
    ]


LOG2E = 1.4426950408889634


def scale_log2(scale: float) -> float:
    """The kernels' ``scale_log2`` field: scores are exponentiated with exp2, so the softmax scale is
    carried times log2(e). The kernel masks scores with an infinity that the scale turns into -inf;
    a zero scale would make NaN of it. 1e-30 gives the same float32 softmax as 0 (every
    exp2(1e-30 * s) rounds to 1 for |s| < 1e22), so it stands in for zero."""
    return scale * LOG2E if scale != 0 else 1e-30


def fill_params(params, mods, scale: float) -> None:
    """Softcap, sinks and ALiBi into FwdParams or DecodeParams (the fields are alike; mods.cuh).
    A softcap's kernels compute tanh(s * scale / softcap) and softmax it with softcap as the scale;
    ALiBi's bias goes into the same units as the scores the softmax scales (hence alibi_mul)."""
    # A softcap whose scale / softcap is 0 in float32 (scale 0, or underflow) caps every score to
    # softcap * tanh(~0) = the uncapped scale * s: the plain path computes exactly that, and the
    # decode kernel reads softcap_pre = 0 as "no softcap".
    if mods.softcap and np.float32(scale / mods.softcap) != 0:
        params.softcap_pre = scale / mods.softcap
        params.scale_log2 = scale_log2(mods.softcap)
        params.alibi_mul = -1.0 / mods.softcap
    else:
        params.alibi_mul = -LOG2E / params.scale_log2  # -1 / scale, as the kernel's scale_log2 has it
    params.sinks = mods.sinks_ptr
    params.alibi = mods.alibi_ptr
    params.alibi_stride_b = params.heads_q if mods.alibi_per_batch else 0
    params.alibi_shift = _alibi_shift.local.n  # 0 but in a ring's local calls (alibi_shift.py)
