"""FP8 plumbing of one attention call: the descale arguments, and V made K-major.

e4m3 tensor-core products take both shared-memory operands K-major, so for O += P V the keys must
be contiguous: V (keys x head dim) is transposed into a workspace Vt (batch, heads_kv, head_dim,
seq_pad) by `fp8_transpose_v.cu` before the attention kernel, on the same stream. Vt's keys are
permuted inside each 32-key group (cu_src/include/cudattn/fp8.cuh), which lets the kernels hand
P to the tensor cores straight from the S accumulators. The transpose reads and writes V once
(2 bytes per element of V); at S = 4096, D = 128 that is a few percent of the attention's time.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._calls import args as _args
from .._arrays import array as _array
from . import registry as _kernels
from .._runtime import launch as _launch
from .._arrays import transfer as _transfer
from .decode_traits import HelperKernel
from .params import TransposeVParams
from .._spec.problem import Descales, Problem

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


def parse_descales(q_descale, k_descale, v_descale, batch: int, heads_kv: int, host: bool) -> Descales:
    """Each descale: None (1.0), a finite real number, or a float32 array of shape (batch, heads_kv)
    — a NumPy array for NumPy calls (its values checked finite), a device array for device calls."""
    vals: dict = {}
    for name, x in (("q", q_descale), ("k", k_descale), ("v", v_descale)):
        scalar, ptr = _one(f"{name}_descale", x, batch, heads_kv, host)
        vals[name], vals[f"{name}_ptr"] = scalar, ptr
    return Descales(**vals)


def _one(name: str, x, batch: int, heads_kv: int, host: bool) -> tuple[float, int]:
    if x is None:
        return 1.0, 0
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be None, a float, or a float32 array of shape (batch, heads_kv); got {x!r}")
    if isinstance(x, numbers.Real):
        try:
            v = float(x)
        except OverflowError:  # an int or Fraction beyond float's range
            v = math.inf
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite; got {x!r}")
        return v, 0
    want = f"({batch}, {heads_kv})"
    if isinstance(x, np.ndarray):
        if not host:
            raise TypeError(f"{name} is a NumPy array but q, k, v are device arrays; pass a float32 device array "
                            f"of shape {want} (e.g. cudattn.to_device({name})) or a float")
        if x.shape != (batch, heads_kv):
            raise ValueError(f"{name} must have shape (batch, heads_kv) = {want}; got {x.shape}")
        if x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float32 array; got dtype {x.dtype}")
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf on the way up
            finite = np.all(np.isfinite(x.astype(_F32)))
        if not finite:
            raise ValueError(f"{name} must be finite in float32 (the kernels read float32 descales); it holds NaN, "
                             f"inf or a value beyond 3.4e38")
        return 1.0, 0  # uploaded by the NumPy path (as_device_descales)
    if host:
        raise TypeError(f"{name} must be None, a float, or a NumPy float32 array of shape {want} "
                        f"(q, k, v are NumPy arrays); got {type(x).__name__}")
    shape, dtype, strides, ptr = _args.device_meta(x, name, f"None, a float, or a float32 device array of shape {want}")
    if shape != (batch, heads_kv):
        raise ValueError(f"{name} must have shape (batch, heads_kv) = {want}; got {shape}")
    if dtype != _F32:
        raise TypeError(f"{name} must be a float32 array; got dtype {dtype}")
    if strides is not None and tuple(strides) != (4 * heads_kv, 4) and batch * heads_kv > 1:
        raise ValueError(f"{name} must be C-contiguous (strides {(4 * heads_kv, 4)} bytes); got {tuple(strides)}")
    return 1.0, ptr


def upload_descales(kw: dict, device, sref) -> dict:
    """The NumPy path: NumPy descale arrays -> float32 device arrays (asynchronous on ``sref``)."""
    out = dict(kw)
    for name in ("q_descale", "k_descale", "v_descale"):
        x = kw.get(name)
        if isinstance(x, np.ndarray):
            out[name] = _transfer.to_device(np.ascontiguousarray(x, dtype=_F32), device=device, stream=sref)
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
