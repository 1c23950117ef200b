"""FP8 plumbing of one attention call: V made K-major, and NumPy descales uploaded.

e4m3 tensor-core products take both shared-memory operands K-major, so for O += P V the keys must
be contiguous: V (keys x head dim) is transposed into a workspace Vt (batch, heads_kv, head_dim,
seq_pad) by `fp8_transpose_v.cu` before the attention kernel, on the same stream. Vt's keys are
permuted inside each 32-key group (cu_src/include/cudattn/fp8.cuh), which lets the kernels hand
P to the tensor cores straight from the S accumulators. The transpose reads and writes V once
(2 bytes per element of V); at S = 4096, D = 128 that is a few percent of the attention's time.
"""

from __future__ import annotations

import numpy as np

from .._arrays import array as _array
from . import registry as _kernels
from .._runtime import launch as _launch
from .._arrays import host_io as _host_io
from .decode_traits import HelperKernel
from .params import TransposeVParams
from .._spec.problem import Problem

_F32 = np.dtype(np.float32)

#: Vt's keys are padded to a multiple of this (the FP8 kernels' key tiles divide it), with zeros.
VT_KEY_ALIGN = 128
_TRANSPOSE_KEYS = 64  # keys per block of the transpose kernel

TRANSPOSE_V_KERNEL = HelperKernel("fp8_transpose_v.cu", "fp8_transpose_v", threads=256)


def seq_pad(seqlen_k: int) -> int:
    return -(-seqlen_k // VT_KEY_ALIGN) * VT_KEY_ALIGN


#: Zeros after each packed sequence's keys in Vt (VT_SEGMENT_PAD in seqlen.cuh).
VT_SEGMENT_PAD = 128


def packed_vt(problem: Problem) -> bool:
    """Whether V is a packed variable-length one: Vt then packs the sequences along its key rows."""
    return problem.varlen is not None and problem.varlen.total_k is not None


def vt_keys(problem: Problem) -> int:
    """Length of a Vt row: the padded key count, or for packed keys the end of the last sequence's
    segment (seqlen.cuh, vt_key_start(total, batch)): 128 * (ceil(total / 128) + 2 * batch)."""
    if packed_vt(problem):
        return VT_KEY_ALIGN * (-(-problem.varlen.total_k // VT_KEY_ALIGN) + 2 * problem.batch)
    return seq_pad(problem.seqlen_k)


def upload_descales(kw: dict, device, sref) -> dict:
    """The NumPy path: NumPy descale arrays -> float32 device arrays (asynchronous on ``sref``)."""
    out = dict(kw)
    for name in ("q_descale", "k_descale", "v_descale"):
        x = kw.get(name)
        if isinstance(x, np.ndarray):
            out[name] = _host_io.to_device(np.ascontiguousarray(x, dtype=_F32), device=device, stream=sref)
    return out


def transpose_v(problem: Problem, v_ptr: int, props, device, sref):
    """Vt for this call's V (a new device array, freed stream-ordered when dropped)."""
    B, Sk, H, D = problem.batch, problem.seqlen_k, problem.heads_kv, problem.head_dim
    pad = vt_keys(problem)
    kernel = _kernels.get_kernel(TRANSPOSE_V_KERNEL, device, props.device_id, props.arch)
    g = problem.v_strides
    if packed_vt(problem):  # one (1, H, D, pad) Vt, blocks over the longest sequence's keys and zeros
        vt = _array.empty_on((1, H, D, pad), problem.dtype, device, sref)
        p = TransposeVParams(v_ptr, vt.ptr, 0, g.seq, g.head, problem.varlen.total_k, pad, H, D,
                             problem.varlen.cu_k_ptr)
        blocks = (seq_pad(Sk) + VT_SEGMENT_PAD) // _TRANSPOSE_KEYS
    else:
        vt = _array.empty_on((B, H, D, pad), problem.dtype, device, sref)
        p = TransposeVParams(v_ptr, vt.ptr, g.batch, g.seq, g.head, Sk, pad, H, D, 0)
        blocks = pad // _TRANSPOSE_KEYS
    _launch.launch(kernel, (blocks, H, B), (TRANSPOSE_V_KERNEL.threads, 1, 1), 0, sref.handle, p)
    return vt
